"""x-requeue-delay across a SIGKILL of `warren serve`: a message nacked with requeue still
waits out its delay after the restart (the queue's ack log holds it with its due time), and
the messages behind it flow past it meanwhile."""

from __future__ import annotations

import signal
import time

import pika
from brokers import WarrenProcess

DELAY_MS = 3_000


def _consume(channel, queue: str, count: int) -> list[tuple[bytes, bool, float]]:
    """The next `count` deliveries (acked): body, redelivered, when it came (monotonic)."""
    got: list[tuple[bytes, bool, float]] = []
    deadline = time.monotonic() + 60
    for method, _, body in channel.consume(queue, inactivity_timeout=1):
        assert time.monotonic() < deadline, got
        if method is None:
            continue
        got.append((body, method.redelivered, time.monotonic()))
        channel.basic_ack(method.delivery_tag)
        if len(got) == count:
            break
    channel.cancel()
    return got


def test_a_requeue_delay_survives_a_sigkill(tmp_path):
    process = WarrenProcess(tmp_path / "data")
    try:
        process.start()
        connection = process.connect()
        channel = connection.channel()
        channel.queue_declare("q", durable=True, arguments={"x-requeue-delay": DELAY_MS})
        channel.confirm_delivery()
        persistent = pika.BasicProperties(delivery_mode=2)
        channel.basic_publish("", "q", b"poison", persistent)
        method, _, body = channel.basic_get("q")
        assert body == b"poison"
        channel.basic_nack(method.delivery_tag, requeue=True)
        nacked = time.monotonic()
        # Each confirm follows a commit of the queue; the second one's tick came after the
        # nack's, whose commit wrote the hold.
        channel.basic_publish("", "q", b"next", persistent)
        channel.basic_publish("", "q", b"last", persistent)
        process.stop(signal.SIGKILL)

        process.start()
        connection = process.connect()
        channel = connection.channel()
        got = _consume(channel, "q", 3)
        connection.close()
    finally:
        process.kill()
    # ("next" and "last" may be flagged redelivered too: after a crash, every message below
    # the delivered mark may have been delivered.)
    assert [body for body, _, _ in got] == [b"next", b"last", b"poison"]
    assert got[2][1]
    # Its delay counts from the nack, before the kill: a lower bound, whatever the restart took.
    assert got[2][2] - nacked >= DELAY_MS / 1000 * 0.95

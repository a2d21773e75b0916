"""Dead-lettering in a running broker: the hand-off between a queue and its dead-letter
targets (a dead letter leaves its queue only once every target holds it durably)."""

from __future__ import annotations

import threading
import time

import pika

SOURCE, TARGET = "dl-source", "dl-target"


def wait_for(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_dead_letter_leaves_its_queue_only_once_its_target_committed(start_broker, tmp_path):
    running = start_broker(tmp_path)
    connection = running.connect()
    channel = connection.channel()
    channel.queue_declare(TARGET, durable=True)
    channel.queue_declare(
        SOURCE,
        durable=True,
        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": TARGET},
    )
    channel.confirm_delivery()
    channel.basic_publish("", SOURCE, b"doomed", pika.BasicProperties(delivery_mode=2))
    queues = running.broker.vhosts["/"].queues
    source, target = queues[SOURCE], queues[TARGET]
    # The target's fsync waits until the test lets it through.
    release = threading.Event()
    commit = target.commit

    async def held_commit() -> None:
        await running.loop.run_in_executor(None, release.wait)
        await commit()

    target.commit = held_commit
    try:
        method, _, _ = channel.basic_get(SOURCE)
        channel.basic_reject(method.delivery_tag, requeue=False)
        wait_for(lambda: target.ready_count == 1)
        time.sleep(0.2)
        # Written to the target, not yet durable there: still in flight in the source.
        assert source.engine.unacked_count == 1
    finally:
        release.set()
    wait_for(lambda: source.engine.unacked_count == 0)
    method, properties, body = channel.basic_get(TARGET, auto_ack=True)
    assert body == b"doomed"
    assert properties.headers["x-death"][0]["queue"] == SOURCE
    connection.close()

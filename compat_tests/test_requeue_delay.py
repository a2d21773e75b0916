"""x-requeue-delay and x-requeue-delay-max, a Warren extension: a message nacked with
requeue comes back only after base * 2^(deliveries - 1) ms (at most the max), and other
messages flow past it meanwhile.

warren_only: RabbitMQ 3.10 has no requeue backoff (4.3's quorum queues have a linear
x-delayed-retry-* of their own)."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.warren_only

DELAY_MS = 400


def test_a_nacked_message_waits_while_others_flow_past(connection, channel, uid):
    queue = f"{uid}-q"
    channel.queue_declare(queue, arguments={"x-requeue-delay": DELAY_MS})
    delivered: list[tuple[bytes, float]] = []

    def on_message(ch, method, _properties, body):
        delivered.append((body, time.monotonic()))
        if body == b"poison" and len(delivered) == 1:
            ch.basic_nack(method.delivery_tag, requeue=True)
        else:
            ch.basic_ack(method.delivery_tag)

    channel.basic_consume(queue, on_message)
    started = time.monotonic()
    channel.basic_publish("", queue, b"poison")
    channel.basic_publish("", queue, b"next")
    while len(delivered) < 3 and time.monotonic() - started < 5:
        connection.process_data_events(0.02)
    assert [body for body, _ in delivered] == [b"poison", b"next", b"poison"]
    # "next" went by at once; the nacked message came back only after its delay.
    assert delivered[1][1] - delivered[0][1] < DELAY_MS / 1000
    assert delivered[2][1] - delivered[0][1] >= DELAY_MS / 1000 * 0.95

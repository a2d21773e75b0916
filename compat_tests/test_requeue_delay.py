"""x-requeue-delay and x-requeue-delay-max, a Warren extension: a message nacked with
requeue comes back only after base * 2^(deliveries - 1) ms (at most the max), and other
messages flow past it meanwhile.

warren_only: RabbitMQ 3.10 has no requeue backoff (4.3's quorum queues have a linear
x-delayed-retry-* of their own)."""

from __future__ import annotations

import time

import pytest
from pika_helpers import run_events_until

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
    channel.basic_publish("", queue, b"poison")
    channel.basic_publish("", queue, b"next")
    run_events_until(connection, lambda: len(delivered) == 3)
    # "next" went by first; the nacked message came back only after its delay.
    assert [body for body, _ in delivered] == [b"poison", b"next", b"poison"]
    assert delivered[2][1] - delivered[0][1] >= DELAY_MS / 1000 * 0.95

"""Delayed returns: a requeued message comes back only after a delay, and other messages flow
past it meanwhile.

* x-requeue-delay and x-requeue-delay-max, a Warren extension: base * 2^(deliveries - 1) ms,
  at most the max, after any return;
* x-delayed-retry-type, -min and -max, RabbitMQ 4.3's quorum queues' own
  (https://www.rabbitmq.com/docs/4.3/quorum-queues): min * failed deliveries, at most max,
  after the returns the type names (all, failed or returned).

warren_only: RabbitMQ 3.10, the reference, has neither."""

from __future__ import annotations

import time

import pytest
from pika_helpers import run_events_until

pytestmark = pytest.mark.warren_only

DELAY_MS = 400


@pytest.mark.parametrize(
    ("arguments", "queue_type", "settle"),
    [
        ({"x-requeue-delay": DELAY_MS}, "classic", "nack"),
        (
            {"x-delayed-retry-type": "failed", "x-delayed-retry-min": DELAY_MS},
            "quorum",
            "reject",
        ),
        (
            {"x-delayed-retry-type": "returned", "x-delayed-retry-min": DELAY_MS},
            "quorum",
            "nack",
        ),
    ],
)
def test_a_returned_message_waits_while_others_flow_past(
    connection, channel, uid, arguments, queue_type, settle
):
    queue = f"{uid}-q"
    channel.queue_declare(queue, durable=True, arguments={"x-queue-type": queue_type, **arguments})
    delivered: list[tuple[bytes, float]] = []

    def on_message(ch, method, _properties, body):
        delivered.append((body, time.monotonic()))
        if body == b"poison" and len(delivered) == 1:
            if settle == "nack":
                ch.basic_nack(method.delivery_tag, requeue=True)
            else:
                ch.basic_reject(method.delivery_tag, requeue=True)
        else:
            ch.basic_ack(method.delivery_tag)

    channel.basic_consume(queue, on_message)
    channel.basic_publish("", queue, b"poison")
    channel.basic_publish("", queue, b"next")
    run_events_until(connection, lambda: len(delivered) == 3)
    # "next" went by first; the nacked message came back only after its delay.
    assert [body for body, _ in delivered] == [b"poison", b"next", b"poison"]
    assert delivered[2][1] - delivered[0][1] >= DELAY_MS / 1000 * 0.95
    channel.queue_delete(queue)

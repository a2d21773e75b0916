"""x-visibility-timeout, a Warren extension (as SQS's visibility timeout and Kafka's share
groups' acquisition lock): a delivery unacked for that long gives its message back to the
queue alone, redelivered and counted, without touching the consumer or its channel; a later
ack of the stale delivery is ignored. A consumer keeps a delivery longer by publishing to the
pseudo-queue amq.warren.visibility (header x-delivery-tag, optionally x-visibility-timeout).

warren_only: RabbitMQ has no visibility timeout (and would route the extension publish to
no queue)."""

from __future__ import annotations

import pika
import pika.exceptions
import pytest
from pika_helpers import run_events, run_events_until

pytestmark = pytest.mark.warren_only

VISIBILITY_MS = 300


def consume(connection, channel, queue: str, count: int) -> list[tuple[int, bytes, bool]]:
    """Consume `queue`; returns the list its deliveries go to, once `count` have come."""
    delivered: list[tuple[int, bytes, bool]] = []
    channel.basic_consume(
        queue, lambda _ch, m, _p, body: delivered.append((m.delivery_tag, body, m.redelivered))
    )
    run_events_until(connection, lambda: len(delivered) >= count)
    return delivered


def test_an_unacked_delivery_comes_back_alone_after_its_visibility_timeout(
    connection, channel, uid
):
    queue = f"{uid}-q"
    channel.queue_declare(queue, arguments={"x-visibility-timeout": VISIBILITY_MS})
    channel.basic_publish("", queue, b"slow")
    channel.basic_publish("", queue, b"fast")
    cancelled: list = []
    channel.add_on_cancel_callback(cancelled.append)
    delivered = consume(connection, channel, queue, 2)
    assert delivered == [(1, b"slow", False), (2, b"fast", False)]
    channel.basic_ack(2)
    run_events_until(connection, lambda: len(delivered) == 3)
    # The same consumer gets "slow" again, redelivered; nothing was cancelled or closed.
    assert delivered[2][1:] == (b"slow", True)
    assert cancelled == [] and channel.is_open
    # The stale delivery's ack is ignored; the new one's ack settles the message.
    channel.basic_ack(1)
    channel.basic_ack(delivered[2][0])
    run_events(connection, 0.1)
    assert channel.is_open
    check = connection.channel()
    assert check.queue_declare(queue, passive=True).method.message_count == 0


def test_extending_keeps_a_delivery_invisible(connection, channel, uid):
    queue = f"{uid}-q"
    channel.queue_declare(queue, arguments={"x-visibility-timeout": VISIBILITY_MS})
    channel.basic_publish("", queue, b"long job")
    delivered = consume(connection, channel, queue, 1)
    channel.confirm_delivery()
    extend = pika.BasicProperties(headers={"x-delivery-tag": 1, "x-visibility-timeout": 30_000})
    channel.basic_publish("", "amq.warren.visibility", b"", extend)
    run_events(connection, VISIBILITY_MS / 1000 + 0.4)
    assert delivered == [(1, b"long job", False)]
    channel.basic_ack(1)
    run_events(connection, 0.1)
    assert channel.queue_declare(queue, passive=True).method.message_count == 0


def test_extending_an_unknown_delivery_is_nacked(connection, channel, uid):
    queue = f"{uid}-q"
    channel.queue_declare(queue, arguments={"x-visibility-timeout": VISIBILITY_MS})
    channel.confirm_delivery()
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish(
            "",
            "amq.warren.visibility",
            b"",
            pika.BasicProperties(headers={"x-delivery-tag": 42}),
        )
    assert channel.is_open

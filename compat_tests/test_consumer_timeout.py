"""The consumer timeout with RabbitMQ 4.3's semantics (x-consumer-timeout and the broker's
consumer_timeout): a consumer whose delivery stays unacked too long is cancelled with
basic.cancel and its deliveries requeued, the channel stays open and a late ack of a
taken-back delivery is ignored; a client without consumer_cancel_notify, or a basic.get
delivery, has its channel closed with 406.

All warren_only: the reference RabbitMQ 3.10 has no x-consumer-timeout argument (3.12 added
it) and closes the channel in every case (4.3 added the cancel; rabbitmq-server 4.3.7's
release notes, `consumer_timeout_response = notify_consumer`).
"""

from __future__ import annotations

import time

import pytest
from pamqp import commands
from pika_helpers import run_events, run_events_until
from raw_client import RawClient

pytestmark = pytest.mark.warren_only

TIMEOUT_MS = 300


def test_a_timed_out_consumer_is_cancelled_and_its_deliveries_requeued(connection, channel, uid):
    queue = f"{uid}-q"
    channel.queue_declare(queue, arguments={"x-consumer-timeout": TIMEOUT_MS})
    for body in (b"a", b"b", b"c"):
        channel.basic_publish("", queue, body)
    delivered, cancelled = [], []
    channel.basic_qos(prefetch_count=2)
    channel.add_on_cancel_callback(lambda frame: cancelled.append(time.monotonic()))
    channel.basic_consume(queue, lambda _ch, m, _p, body: delivered.append((m.delivery_tag, body)))
    run_events_until(connection, lambda: len(delivered) == 2)
    delivered_at = time.monotonic()
    run_events_until(connection, lambda: cancelled)
    # Not before its timeout; the channel stays open; "c" never reached the cancelled consumer.
    assert cancelled[0] - delivered_at >= TIMEOUT_MS / 1000 * 0.9
    assert channel.is_open
    assert [body for _, body in delivered] == [b"a", b"b"]
    # The late ack of a delivery the timeout took back is ignored: no 406.
    channel.basic_ack(delivered[0][0])
    run_events(connection, 0.1)
    assert channel.is_open
    got = []
    for _ in range(3):
        method, _, body = channel.basic_get(queue, auto_ack=True)
        got.append((body, method.redelivered))
    assert sorted(got) == [(b"a", True), (b"b", True), (b"c", False)]


def test_acked_in_time_nothing_happens(connection, channel, uid):
    queue = f"{uid}-q"
    # A longer timeout here: the acks must beat it even on a busy machine.
    timeout_ms = 2000
    channel.queue_declare(queue, arguments={"x-consumer-timeout": timeout_ms})
    cancelled = []
    acked = []

    def ack(ch, method, _properties, _body):
        ch.basic_ack(method.delivery_tag)
        acked.append(method.delivery_tag)

    channel.add_on_cancel_callback(cancelled.append)
    channel.basic_consume(queue, ack)
    for count in range(1, 5):
        channel.basic_publish("", queue, b"x")
        run_events_until(connection, lambda count=count: len(acked) == count)
    run_events(connection, timeout_ms / 1000 + 0.5)
    assert cancelled == []
    assert channel.is_open


def closed_channel(raw: RawClient, channel: int) -> commands.Channel.Close:
    """Read past deliveries until the broker closes `channel`; answer close-ok."""
    while True:
        number, value = raw.recv()
        if isinstance(value, commands.Channel.Close):
            assert number == channel
            raw.send(channel, commands.Channel.CloseOk())
            return value


def test_a_basic_get_delivery_past_the_timeout_closes_the_channel(broker, channel, uid):
    queue = f"{uid}-q"
    channel.queue_declare(queue, arguments={"x-consumer-timeout": TIMEOUT_MS})
    channel.basic_publish("", queue, b"x")
    with RawClient(broker.host, broker.port) as raw:
        raw.handshake()
        raw.open_channel(1)
        raw.send(1, commands.Basic.Get(queue=queue))
        raw.expect(commands.Basic.GetOk)
        close = closed_channel(raw, 1)
    assert close.reply_code == 406
    assert close.reply_text == (
        f"PRECONDITION_FAILED - delivery acknowledgement on channel 1 timed out. Timeout value "
        f"used: {TIMEOUT_MS} ms. This timeout value can be configured, see consumers doc guide "
        "to learn more"
    )
    method, _, body = channel.basic_get(queue, auto_ack=True)
    assert body == b"x" and method.redelivered


def test_without_consumer_cancel_notify_the_channel_is_closed(broker, channel, uid):
    queue = f"{uid}-q"
    channel.queue_declare(queue, arguments={"x-consumer-timeout": TIMEOUT_MS})
    channel.basic_publish("", queue, b"x")
    with RawClient(broker.host, broker.port) as raw:
        # No client properties: consumer_cancel_notify is not announced.
        raw.handshake()
        raw.open_channel(1)
        raw.send(1, commands.Basic.Consume(queue=queue, consumer_tag="old-client"))
        raw.expect(commands.Basic.ConsumeOk)
        close = closed_channel(raw, 1)
    assert close.reply_code == 406
    assert "timed out" in close.reply_text

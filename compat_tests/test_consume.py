"""Consumers and acknowledgements: qos, consume/cancel, get, ack/nack/reject, recover, returns."""

from __future__ import annotations

import re
import time
from datetime import UTC

import pika
import pytest
from pamqp import commands
from pika_helpers import (
    channel_error,
    connection_error,
    drain,
    run_events,
    run_events_until,
    sync,
    wait_get,
)
from raw_client import RawClient

SETTLE_S = 0.3


class Recorder:
    """A pika consumer callback that keeps (delivery_tag, redelivered, body, consumer_tag)."""

    def __init__(self) -> None:
        self.deliveries: list[tuple[int, bool, bytes, str]] = []

    def __call__(self, channel, method, properties, body) -> None:
        self.deliveries.append((method.delivery_tag, method.redelivered, body, method.consumer_tag))

    @property
    def bodies(self) -> list[bytes]:
        return [body for _, _, body, _ in self.deliveries]

    def wait(self, connection, count: int, timeout_s: float = 5.0) -> None:
        run_events_until(connection, lambda: len(self.deliveries) >= count, timeout_s)

    def settle(self, connection, seconds: float = SETTLE_S) -> None:
        """Let anything still in flight arrive (to check that nothing more does)."""
        run_events(connection, seconds)


def _fill(channel, queue: str, count: int, prefix: str = "") -> None:
    for i in range(count):
        channel.basic_publish("", queue, f"{prefix}{i}".encode())
    sync(channel)


def test_server_generated_consumer_tag(broker, uid):
    with RawClient(broker.host, broker.port) as raw:
        raw.handshake()
        raw.open_channel(1)
        raw.send(1, commands.Queue.Declare(queue=f"{uid}-q", exclusive=True))
        raw.expect(commands.Queue.DeclareOk)
        raw.send(1, commands.Basic.Consume(queue=f"{uid}-q", consumer_tag=""))
        _, ok = raw.expect(commands.Basic.ConsumeOk)
    assert re.fullmatch(r"amq\.ctag-[A-Za-z0-9_-]{22}", ok.consumer_tag), ok.consumer_tag


def test_consume_no_ack(connection, channel, uid):
    channel.queue_declare(f"{uid}-q", exclusive=True)
    _fill(channel, f"{uid}-q", 3)
    got = Recorder()
    tag = channel.basic_consume(f"{uid}-q", got, auto_ack=True)
    got.wait(connection, 3)
    assert got.bodies == [b"0", b"1", b"2"]
    assert [d[0] for d in got.deliveries] == [1, 2, 3]
    assert {d[3] for d in got.deliveries} == {tag}
    assert channel.queue_declare(f"{uid}-q", passive=True).method.message_count == 0


def test_consume_from_missing_queue_is_404(channel, uid):
    code, text = channel_error(channel.basic_consume, f"{uid}-nope", lambda *a: None)
    assert (code, text) == (404, f"NOT_FOUND - no queue '{uid}-nope' in vhost '/'")


def test_reused_consumer_tag_is_530(connection, uid):
    ch = connection.channel()
    ch.queue_declare(f"{uid}-q", exclusive=True)
    ch.basic_consume(f"{uid}-q", lambda *a: None, consumer_tag="mine")
    with pytest.raises(pika.exceptions.DuplicateConsumerTag):
        ch.basic_consume(f"{uid}-q", lambda *a: None, consumer_tag="mine")


def test_reused_consumer_tag_raw(broker, uid):
    with RawClient(broker.host, broker.port) as raw:
        raw.handshake()
        raw.open_channel(1)
        raw.send(1, commands.Queue.Declare(queue=f"{uid}-q", exclusive=True))
        raw.expect(commands.Queue.DeclareOk)
        raw.send(1, commands.Basic.Consume(queue=f"{uid}-q", consumer_tag="mine"))
        raw.expect(commands.Basic.ConsumeOk)
        raw.send(1, commands.Basic.Consume(queue=f"{uid}-q", consumer_tag="mine"))
        close = raw.expect_connection_close()
    assert (close.reply_code, close.reply_text) == (
        530,
        "NOT_ALLOWED - attempt to reuse consumer tag 'mine'",
    )


def test_exclusive_consumer(connection, uid):
    ch = connection.channel()
    ch.queue_declare(f"{uid}-q", auto_delete=True)
    ch.basic_consume(f"{uid}-q", lambda *a: None, exclusive=True)
    code, text = channel_error(connection.channel().basic_consume, f"{uid}-q", lambda *a: None)
    assert (code, text) == (403, f"ACCESS_REFUSED - queue '{uid}-q' in vhost '/' in exclusive use")


def test_exclusive_consume_on_queue_with_consumers(connection, uid):
    ch = connection.channel()
    ch.queue_declare(f"{uid}-q", auto_delete=True)
    ch.basic_consume(f"{uid}-q", lambda *a: None)
    code, text = channel_error(
        connection.channel().basic_consume, f"{uid}-q", lambda *a: None, exclusive=True
    )
    assert (code, text) == (403, f"ACCESS_REFUSED - queue '{uid}-q' in vhost '/' in exclusive use")


def test_per_consumer_prefetch(connection, channel, uid):
    channel.queue_declare(f"{uid}-q", exclusive=True)
    _fill(channel, f"{uid}-q", 10)
    channel.basic_qos(prefetch_count=3)
    got = Recorder()
    channel.basic_consume(f"{uid}-q", got)
    got.wait(connection, 3)
    got.settle(connection)
    assert len(got.deliveries) == 3
    channel.basic_ack(got.deliveries[1][0])
    got.wait(connection, 4)
    got.settle(connection)
    assert len(got.deliveries) == 4
    channel.basic_ack(got.deliveries[-1][0], multiple=True)
    got.wait(connection, 7)
    got.settle(connection)
    assert got.bodies == [str(i).encode() for i in range(7)]


def test_global_prefetch_is_shared_by_the_channel(connection, channel, uid):
    # RabbitMQ reads global=true as a limit shared by all consumers on the channel.
    for name in ("a", "b"):
        channel.queue_declare(f"{uid}-{name}", exclusive=True)
        _fill(channel, f"{uid}-{name}", 10)
    channel.basic_qos(prefetch_count=4, global_qos=True)
    got = Recorder()
    channel.basic_consume(f"{uid}-a", got)
    channel.basic_consume(f"{uid}-b", got)
    got.wait(connection, 4)
    got.settle(connection)
    assert len(got.deliveries) == 4


def test_per_consumer_and_global_prefetch_together(connection, channel, uid):
    for name in ("a", "b"):
        channel.queue_declare(f"{uid}-{name}", exclusive=True)
        _fill(channel, f"{uid}-{name}", 10)
    channel.basic_qos(prefetch_count=5, global_qos=True)
    channel.basic_qos(prefetch_count=2)
    got = Recorder()
    tag_a = channel.basic_consume(f"{uid}-a", got)
    tag_b = channel.basic_consume(f"{uid}-b", got)
    got.wait(connection, 4)
    got.settle(connection)
    tags = [d[3] for d in got.deliveries]
    assert (tags.count(tag_a), tags.count(tag_b)) == (2, 2)


def test_qos_applies_to_consumers_started_after_it(connection, channel, uid):
    channel.queue_declare(f"{uid}-q", exclusive=True)
    _fill(channel, f"{uid}-q", 10)
    unlimited = Recorder()
    channel.basic_consume(f"{uid}-q", unlimited)
    unlimited.wait(connection, 10)
    channel.basic_qos(prefetch_count=1)
    _fill(channel, f"{uid}-q", 5, prefix="late-")
    unlimited.wait(connection, 15)


def test_prefetch_size_is_not_implemented(connection):
    code, text = connection_error(connection.channel().basic_qos, prefetch_size=1000)
    assert (code, text) == (540, "NOT_IMPLEMENTED - prefetch_size!=0 (1000)")


def test_consumer_priority(connection, channel, uid):
    channel.queue_declare(f"{uid}-q", exclusive=True)
    channel.basic_qos(prefetch_count=3)
    low, high = Recorder(), Recorder()
    channel.basic_consume(f"{uid}-q", low, arguments={"x-priority": 1})
    channel.basic_consume(f"{uid}-q", high, arguments={"x-priority": 10})
    _fill(channel, f"{uid}-q", 5)
    low.wait(connection, 2)
    high.wait(connection, 3)
    low.settle(connection)
    assert (len(high.deliveries), len(low.deliveries)) == (3, 2)
    assert high.bodies == [b"0", b"1", b"2"]


def test_cancel_stops_deliveries(connection, channel, uid):
    channel.queue_declare(f"{uid}-q", exclusive=True)
    got = Recorder()
    tag = channel.basic_consume(f"{uid}-q", got, auto_ack=True)
    _fill(channel, f"{uid}-q", 2)
    got.wait(connection, 2)
    channel.basic_cancel(tag)
    _fill(channel, f"{uid}-q", 2, prefix="after-")
    got.settle(connection)
    assert got.bodies == [b"0", b"1"]
    assert drain(channel, f"{uid}-q") == [b"after-0", b"after-1"]


def test_cancel_of_unknown_tag_is_ok(broker):
    with RawClient(broker.host, broker.port) as raw:
        raw.handshake()
        raw.open_channel(1)
        raw.send(1, commands.Basic.Cancel(consumer_tag="never-seen"))
        _, ok = raw.expect(commands.Basic.CancelOk)
        assert ok.consumer_tag == "never-seen"


def test_server_cancels_consumer_when_queue_deleted(connection, open_connection, uid):
    ch = connection.channel()
    ch.queue_declare(f"{uid}-q")
    cancelled = []
    ch.add_on_cancel_callback(lambda frame: cancelled.append(frame.method.consumer_tag))
    tag = ch.basic_consume(f"{uid}-q", lambda *a: None)
    open_connection().channel().queue_delete(f"{uid}-q")
    deadline = time.monotonic() + 5
    while not cancelled and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    assert cancelled == [tag]
    assert ch.is_open


def test_mandatory_unroutable_is_returned(connection, channel, uid):
    returned = []
    channel.add_on_return_callback(
        lambda ch, method, props, body: returned.append(
            (
                method.reply_code,
                method.reply_text,
                method.exchange,
                method.routing_key,
                props.content_type,
                props.headers,
                body,
            )
        )
    )
    props = pika.BasicProperties(content_type="text/plain", headers={"k": "v"})
    channel.basic_publish("amq.direct", f"{uid}-nowhere", b"lost", props, mandatory=True)
    channel.basic_publish("amq.direct", f"{uid}-nowhere", b"dropped", props, mandatory=False)
    sync(channel)
    connection.process_data_events(time_limit=0.2)
    assert returned == [
        (312, "NO_ROUTE", "amq.direct", f"{uid}-nowhere", "text/plain", {"k": "v"}, b"lost")
    ]


def test_get_and_get_empty(channel, uid):
    channel.queue_declare(f"{uid}-q", exclusive=True)
    method, _, _ = channel.basic_get(f"{uid}-q")
    assert method is None
    _fill(channel, f"{uid}-q", 3)
    method, props, body = channel.basic_get(f"{uid}-q")
    assert (method.delivery_tag, method.redelivered, method.message_count, body) == (
        1,
        False,
        2,
        b"0",
    )
    assert (method.exchange, method.routing_key) == ("", f"{uid}-q")
    channel.basic_ack(method.delivery_tag)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("queue_type", "no_ack"),
    [
        ("classic", True),
        ("classic", False),
        ("quorum", True),
    ],
    ids=["classic-no-ack", "classic-manual-ack", "quorum-no-ack"],
)
def test_get_drains_a_deep_queue(broker, channel, uid, queue_type, no_ack):
    """Polling workers (kombu's Queue.get) take a deep durable queue one basic.get at a time:
    every message comes back, none is answered with get-empty while the queue holds it."""
    count = 20_000
    channel.queue_declare(f"{uid}-q", durable=True, arguments={"x-queue-type": queue_type})
    with RawClient(broker.host, broker.port) as raw:
        raw.handshake()
        raw.open_channel(1)
        raw.publish_confirmed(1, f"{uid}-q", [str(i).encode() for i in range(count)])
    bodies = []
    for _ in range(count):
        method, _, body = channel.basic_get(f"{uid}-q", auto_ack=no_ack)
        if method is None:
            break
        if not no_ack:
            channel.basic_ack(method.delivery_tag)
        bodies.append(body)
    assert bodies == [str(i).encode() for i in range(count)]
    assert channel.basic_get(f"{uid}-q")[0] is None
    assert channel.queue_declare(f"{uid}-q", passive=True).method.message_count == 0
    channel.queue_delete(f"{uid}-q")


def test_get_from_missing_queue_is_404(channel, uid):
    code, text = channel_error(channel.basic_get, f"{uid}-nope")
    assert (code, text) == (404, f"NOT_FOUND - no queue '{uid}-nope' in vhost '/'")


def test_properties_round_trip(channel, uid):
    channel.queue_declare(f"{uid}-q", exclusive=True)
    sent = pika.BasicProperties(
        content_type="application/json",
        content_encoding="utf-8",
        headers={"a": 1, "b": "two"},
        delivery_mode=2,
        priority=3,
        correlation_id="c-1",
        reply_to="r",
        expiration="60000",
        message_id="m-1",
        timestamp=1_700_000_000,
        type="t",
        user_id="guest",
        app_id="compat",
    )
    channel.basic_publish("", f"{uid}-q", b"\x00\xff" * 70_000, sent)
    _, props, body = wait_get(channel, f"{uid}-q")
    assert body == b"\x00\xff" * 70_000
    for field in (
        "content_type",
        "content_encoding",
        "headers",
        "delivery_mode",
        "priority",
        "correlation_id",
        "reply_to",
        "expiration",
        "message_id",
        "timestamp",
        "type",
        "user_id",
        "app_id",
    ):
        assert getattr(props, field) == getattr(sent, field), field


def test_user_id_must_match_the_connection(channel, uid):
    channel.queue_declare(f"{uid}-q", exclusive=True)
    channel.basic_publish("", f"{uid}-q", b"x", pika.BasicProperties(user_id="someone-else"))
    code, text = channel_error(sync, channel)
    assert (code, text) == (
        406,
        "PRECONDITION_FAILED - user_id property set to "
        "'someone-else' but authenticated user was 'guest'",
    )


def test_empty_body(channel, uid):
    channel.queue_declare(f"{uid}-q", exclusive=True)
    channel.basic_publish("", f"{uid}-q", b"")
    _, _, body = wait_get(channel, f"{uid}-q")
    assert body == b""


def test_ack_multiple(connection, channel, uid):
    channel.queue_declare(f"{uid}-q", exclusive=True)
    _fill(channel, f"{uid}-q", 5)
    got = Recorder()
    channel.basic_consume(f"{uid}-q", got)
    got.wait(connection, 5)
    channel.basic_ack(3, multiple=True)
    channel.close()
    again = connection.channel()
    assert drain(again, f"{uid}-q") == [b"3", b"4"]


def test_nack_multiple_requeue_redelivers_in_order(connection, channel, uid):
    channel.queue_declare(f"{uid}-q", exclusive=True)
    _fill(channel, f"{uid}-q", 4)
    got = Recorder()
    channel.basic_consume(f"{uid}-q", got)
    got.wait(connection, 4)
    assert [d[1] for d in got.deliveries] == [False] * 4
    channel.basic_nack(3, multiple=True, requeue=True)
    got.wait(connection, 7)
    got.settle(connection)
    redelivered = got.deliveries[4:]
    assert [(d[1], d[2]) for d in redelivered] == [(True, b"0"), (True, b"1"), (True, b"2")]
    assert [d[0] for d in redelivered] == [5, 6, 7]


def test_reject_without_requeue_drops(connection, channel, uid):
    channel.queue_declare(f"{uid}-q", exclusive=True)
    _fill(channel, f"{uid}-q", 2)
    method, _, _ = wait_get(channel, f"{uid}-q")
    channel.basic_reject(method.delivery_tag, requeue=False)
    method, _, _ = wait_get(channel, f"{uid}-q")
    channel.basic_nack(method.delivery_tag, requeue=False)
    sync(channel)
    assert channel.queue_declare(f"{uid}-q", passive=True).method.message_count == 0


def test_reject_with_requeue_sets_redelivered(channel, uid):
    channel.queue_declare(f"{uid}-q", exclusive=True)
    _fill(channel, f"{uid}-q", 1)
    method, _, _ = wait_get(channel, f"{uid}-q")
    channel.basic_reject(method.delivery_tag, requeue=True)
    method, _, body = wait_get(channel, f"{uid}-q")
    assert (method.redelivered, body) == (True, b"0")


@pytest.mark.parametrize("ack", ["basic_ack", "basic_nack", "basic_reject"])
def test_unknown_delivery_tag_is_406(channel, uid, ack):
    channel.queue_declare(f"{uid}-q", exclusive=True)
    getattr(channel, ack)(42)
    code, text = channel_error(sync, channel)
    assert (code, text) == (406, "PRECONDITION_FAILED - unknown delivery tag 42")


def test_double_ack_is_406(channel, uid):
    channel.queue_declare(f"{uid}-q", exclusive=True)
    _fill(channel, f"{uid}-q", 1)
    method, _, _ = wait_get(channel, f"{uid}-q")
    channel.basic_ack(method.delivery_tag)
    channel.basic_ack(method.delivery_tag)
    code, text = channel_error(sync, channel)
    assert (code, text) == (
        406,
        f"PRECONDITION_FAILED - unknown delivery tag {method.delivery_tag}",
    )


def test_ack_of_no_ack_delivery_is_406(connection, channel, uid):
    channel.queue_declare(f"{uid}-q", exclusive=True)
    _fill(channel, f"{uid}-q", 1)
    got = Recorder()
    channel.basic_consume(f"{uid}-q", got, auto_ack=True)
    got.wait(connection, 1)
    channel.basic_ack(got.deliveries[0][0])
    code, text = channel_error(sync, channel)
    assert (code, text) == (
        406,
        f"PRECONDITION_FAILED - unknown delivery tag {got.deliveries[0][0]}",
    )


def test_multiple_ack_of_zero_acks_everything(connection, channel, uid):
    channel.queue_declare(f"{uid}-q", exclusive=True)
    _fill(channel, f"{uid}-q", 3)
    got = Recorder()
    channel.basic_consume(f"{uid}-q", got)
    got.wait(connection, 3)
    channel.basic_ack(0, multiple=True)
    channel.close()
    assert connection.channel().queue_declare(f"{uid}-q", passive=True).method.message_count == 0


def test_unacked_messages_return_when_channel_closes(connection, uid):
    ch = connection.channel()
    ch.queue_declare(f"{uid}-q", exclusive=True)
    _fill(ch, f"{uid}-q", 2)
    wait_get(ch, f"{uid}-q")
    ch.close()
    ch = connection.channel()
    method, _, body = wait_get(ch, f"{uid}-q")
    assert (method.redelivered, body) == (True, b"0")
    method, _, body = wait_get(ch, f"{uid}-q")
    assert (method.redelivered, body) == (False, b"1")


def test_recover_requeue_redelivers(connection, channel, uid):
    channel.queue_declare(f"{uid}-q", exclusive=True)
    _fill(channel, f"{uid}-q", 2)
    got = Recorder()
    channel.basic_consume(f"{uid}-q", got)
    got.wait(connection, 2)
    channel.basic_recover(requeue=True)
    got.wait(connection, 4)
    assert [(d[1], d[2]) for d in got.deliveries[2:]] == [(True, b"0"), (True, b"1")]
    channel.basic_ack(0, multiple=True)


def test_requeued_message_goes_to_another_consumer(connection, open_connection, uid):
    ch = connection.channel()
    ch.queue_declare(f"{uid}-q", auto_delete=True)
    _fill(ch, f"{uid}-q", 1)
    method, _, _ = wait_get(ch, f"{uid}-q")
    other = open_connection()
    other_ch = other.channel()
    got = Recorder()
    other_ch.basic_consume(f"{uid}-q", got)
    ch.basic_nack(method.delivery_tag, requeue=True)
    got.wait(other, 1)
    assert got.deliveries[0][1:3] == (True, b"0")


def test_header_table_types_round_trip(channel, uid):
    from datetime import datetime
    from decimal import Decimal

    headers = {
        "str": "text ü",
        "int": -5,
        "long": 2**40,
        "bool": True,
        "none": None,
        "bytes": b"\x00\x01",
        "decimal": Decimal("1.23"),
        "timestamp": datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC),
        "nested": {"list": [1, "two", False, {"deep": "x"}], "empty": {}},
        "array": [],
    }
    channel.queue_declare(f"{uid}-q", exclusive=True)
    channel.basic_publish("", f"{uid}-q", b"h", pika.BasicProperties(headers=headers))
    _, props, _ = wait_get(channel, f"{uid}-q")
    assert props.headers == headers

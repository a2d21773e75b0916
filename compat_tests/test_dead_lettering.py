"""Dead-lettering and delivery limits, pinned to what RabbitMQ writes, header by header.

Every dead letter's headers are compared whole, with each value's Python type, which pika
chooses by the AMQP field type: a long string 'S' is a str, a signed 64-bit long 'l' a
``pika.compat.long`` (an int subclass; a 32-bit 'I' is a plain int), a timestamp 'T' an aware
UTC datetime of whole seconds, an array 'A' a list, a table 'F' a dict. The raw-frame tests
pin the field types on the wire as well.

RabbitMQ 3.10 (the reference) and the 4.x documentation that Warren follows differ in a few
places; the shared tests assert only what both agree on, and each 4.x-only behaviour has its
own ``warren_only`` test citing the 4.x docs:

* 4.x adds ``x-last-death-queue``, ``x-last-death-reason`` and ``x-last-death-exchange``
  (https://www.rabbitmq.com/docs/dlx#effects); 3.10 writes none of them, so the shared tests
  compare the headers without those three keys.
* Warren writes ``x-delivery-count`` on redeliveries from classic queues too (issue 8), where
  RabbitMQ never does: shared tests never assert its absence on a classic redelivery.
* Delivery counting: 3.10 counts every return (``basic.reject``, ``basic.nack``, a closed
  channel) in ``x-delivery-count`` and against ``x-delivery-limit``. Warren counts as RabbitMQ
  4.3 does (rabbitmq-server PR 15387, https://www.rabbitmq.com/docs/4.3/nack and
  https://www.rabbitmq.com/docs/quorum-queues#poison-message-handling): ``x-delivery-count``
  counts failed deliveries (``basic.reject``, a lost channel) and only those count toward the
  limit, ``x-acquired-count`` counts every return (``basic.nack`` and ``basic.recover`` too).
  A test whose redeliveries differ is split: the 3.10 observation ``reference_only``, Warren's
  ``warren_only``.
* A quorum queue's first ``basic.get`` carries ``x-delivery-count: 0`` on 3.10 and no such
  header on 4.3, so the counting tests consume rather than get.
"""

from __future__ import annotations

import math
import struct
import time
from datetime import datetime, timedelta

import pika
import pytest
from pamqp import commands
from pika.compat import long
from pika_helpers import (
    channel_error,
    drain,
    run_events,
    run_events_until,
    sync,
    wait_get,
)
from raw_client import RawClient

TTL_MS = 100
# How long to wait for something that must NOT happen (a second copy, a dead letter).
SETTLE_S = 0.5
# Headers 4.x adds on every dead-lettering and 3.10 never writes.
LAST_DEATH_KEYS = ("x-last-death-exchange", "x-last-death-queue", "x-last-death-reason")


class Within:
    """Matches a broker timestamp taken between two instants: pika decodes an AMQP timestamp
    (whole seconds since the epoch) as an aware UTC datetime."""

    def __init__(self, start: float, end: float) -> None:
        self.low = math.floor(start)
        self.high = math.ceil(end)

    def __eq__(self, other) -> bool:
        return (
            isinstance(other, datetime)
            and other.utcoffset() == timedelta(0)
            and other.microsecond == 0
            and self.low <= other.timestamp() <= self.high
        )

    def __repr__(self) -> str:
        return f"<timestamp in [{self.low}, {self.high}]>"


class Clock:
    """Brackets the dead-letterings of a test: ``clock.time`` matches any timestamp taken
    between the clock's creation and the last ``clock.stop()``."""

    def __init__(self) -> None:
        self.start = time.time()
        self.end = self.start

    def stop(self) -> None:
        self.end = time.time()

    @property
    def time(self) -> Within:
        return Within(self.start, self.end)


def typed(value):
    """``value`` with every leaf paired with its type name, so that long(1) != 1 != True."""
    if isinstance(value, dict):
        return {key: typed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [typed(item) for item in value]
    if isinstance(value, Within):
        return ("datetime", value)
    return (type(value).__name__, value)


def death(queue, reason, exchange, routing_keys, time, count=1, original_expiration=None):
    """One x-death entry as pika decodes it."""
    entry = {
        "count": long(count),
        "reason": reason,
        "queue": queue,
        "time": time,
        "exchange": exchange,
        "routing-keys": routing_keys,
    }
    if original_expiration is not None:
        entry["original-expiration"] = original_expiration
    return entry


def first_death(queue, reason, exchange) -> dict:
    return {
        "x-first-death-exchange": exchange,
        "x-first-death-queue": queue,
        "x-first-death-reason": reason,
    }


def shared_headers(properties) -> dict:
    """A dead letter's headers without the x-last-death-* keys that only 4.x writes."""
    headers = dict(properties.headers or {})
    for key in LAST_DEATH_KEYS:
        headers.pop(key, None)
    return headers


def assert_headers(properties, expected: dict) -> None:
    assert typed(shared_headers(properties)) == typed(expected)


def take(channel, queue: str, timeout_s: float = 5.0):
    """basic.get (auto-ack) until a message arrives: (method, properties, body)."""
    return wait_get(channel, queue, timeout_s, auto_ack=True)


def message_count(channel, queue: str) -> int:
    return channel.queue_declare(queue, passive=True).method.message_count


def settle(seconds: float = SETTLE_S) -> None:
    time.sleep(seconds)


def dead_letter_to(queue: str) -> dict:
    """Arguments that dead-letter to ``queue`` through the default exchange."""
    return {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": queue}


@pytest.fixture
def declare(broker, channel):
    """Declares queues for one test: classic ones exclusive, quorum ones (which cannot be
    exclusive) and ``shared`` classic ones durable or plain, deleted after the test."""
    created: list[str] = []

    def factory(name: str, arguments=None, queue_type: str = "classic", shared=False) -> str:
        arguments = dict(arguments or {})
        if queue_type == "quorum":
            arguments["x-queue-type"] = "quorum"
            created.append(name)
            channel.queue_declare(name, durable=True, arguments=arguments)
        elif shared:
            created.append(name)
            channel.queue_declare(name, arguments=arguments)
        else:
            channel.queue_declare(name, exclusive=True, arguments=arguments)
        return name

    yield factory
    if created:
        conn = pika.BlockingConnection(broker.params())
        try:
            cleanup = conn.channel()
            for name in created:
                cleanup.queue_delete(name)
        finally:
            conn.close()


class Recorder:
    """A pika consumer callback keeping (redelivered, headers, body); rejects with requeue
    when ``reject`` is set, else leaves the delivery unacked."""

    def __init__(self, reject: bool = False) -> None:
        self.deliveries: list[tuple[bool, dict | None, bytes]] = []
        self.reject = reject

    def __call__(self, channel, method, properties, body) -> None:
        self.deliveries.append((method.redelivered, properties.headers, body))
        if self.reject:
            channel.basic_reject(method.delivery_tag, requeue=True)

    def wait(self, connection, count: int, timeout_s: float = 5.0) -> None:
        run_events_until(connection, lambda: len(self.deliveries) >= count, timeout_s)

    def settle(self, connection, seconds: float = SETTLE_S) -> None:
        run_events(connection, seconds)


# --- reason "rejected" ---------------------------------------------------------------------


ALL_PROPERTIES = dict(
    content_type="text/plain",
    content_encoding="utf-8",
    delivery_mode=2,
    priority=3,
    correlation_id="corr",
    reply_to="replies",
    message_id="m-1",
    timestamp=1_700_000_000,
    type="order",
    user_id="guest",
    app_id="compat",
)


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
@pytest.mark.parametrize("refusal", ["reject", "nack"])
def test_a_refused_message_is_dead_lettered_with_reason_rejected(
    connection, channel, declare, uid, refusal, queue_type
):
    channel.exchange_declare(f"{uid}-x", "direct", auto_delete=True)
    channel.exchange_declare(f"{uid}-dlx", "fanout", auto_delete=True)
    dlq = declare(f"{uid}-dlq")
    channel.queue_bind(dlq, f"{uid}-dlx")
    src = declare(f"{uid}-src", {"x-dead-letter-exchange": f"{uid}-dlx"}, queue_type)
    channel.queue_bind(src, f"{uid}-x", "orders.new")
    headers = {"zeta": "last", "Alpha": 7, "mid": ["a", 1]}
    published = pika.BasicProperties(headers=headers, **ALL_PROPERTIES)
    clock = Clock()
    channel.basic_publish(f"{uid}-x", "orders.new", b"the body", published)
    method, _, _ = wait_get(channel, src)
    if refusal == "reject":
        channel.basic_reject(method.delivery_tag, requeue=False)
    else:
        channel.basic_nack(method.delivery_tag, requeue=False)
    method, properties, body = take(channel, dlq)
    clock.stop()

    assert body == b"the body"
    # Delivered as a new message: from the DLX, with the original routing key, not redelivered.
    assert (method.exchange, method.routing_key, method.redelivered) == (
        f"{uid}-dlx",
        "orders.new",
        False,
    )
    # Every property but the headers as published.
    for name, value in ALL_PROPERTIES.items():
        assert getattr(properties, name) == value, name
    assert properties.expiration is None
    assert_headers(
        properties,
        {
            **headers,
            "x-death": [death(src, "rejected", f"{uid}-x", ["orders.new"], clock.time)],
            **first_death(src, "rejected", f"{uid}-x"),
        },
    )
    # Gone from the source: not ready, and not unacked either (a channel close would requeue).
    other = connection.channel()
    channel.close()
    assert message_count(other, src) == 0


def test_nack_multiple_dead_letters_each_message(connection, channel, declare, uid):
    dlq = declare(f"{uid}-dlq")
    src = declare(f"{uid}-src", dead_letter_to(dlq))
    for i in range(3):
        channel.basic_publish("", src, f"m{i}".encode())
    channel.basic_qos(prefetch_count=10)
    tags = []
    channel.basic_consume(src, lambda ch, method, props, body: tags.append(method.delivery_tag))
    clock = Clock()
    deadline = time.monotonic() + 5
    while len(tags) < 3 and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    assert len(tags) == 3
    channel.basic_nack(tags[-1], multiple=True, requeue=False)
    got = [take(channel, dlq) for _ in range(3)]
    clock.stop()
    assert [body for _, _, body in got] == [b"m0", b"m1", b"m2"]
    for method, properties, _ in got:
        assert (method.exchange, method.routing_key) == ("", dlq)
        assert_headers(
            properties,
            {
                "x-death": [death(src, "rejected", "", [src], clock.time)],
                **first_death(src, "rejected", ""),
            },
        )


def test_dead_letter_to_the_default_exchange_with_a_routing_key(channel, declare, uid):
    channel.exchange_declare(f"{uid}-x", "topic", auto_delete=True)
    dlq = declare(f"{uid}-dlq")
    src = declare(f"{uid}-src", dead_letter_to(dlq))
    channel.queue_bind(src, f"{uid}-x", "orders.*")
    clock = Clock()
    channel.basic_publish(f"{uid}-x", "orders.eu", b"x", pika.BasicProperties(type="t"))
    method, _, _ = wait_get(channel, src)
    channel.basic_reject(method.delivery_tag, requeue=False)
    method, properties, body = take(channel, dlq)
    clock.stop()
    assert (method.exchange, method.routing_key, method.redelivered, body) == ("", dlq, False, b"x")
    assert properties.type == "t"
    # x-death names the exchange and routing keys the message was published with.
    assert_headers(
        properties,
        {
            "x-death": [death(src, "rejected", f"{uid}-x", ["orders.eu"], clock.time)],
            **first_death(src, "rejected", f"{uid}-x"),
        },
    )


def test_without_a_dead_letter_routing_key_the_original_key_routes(channel, declare, uid):
    channel.exchange_declare(f"{uid}-x", "direct", auto_delete=True)
    channel.exchange_declare(f"{uid}-dlx", "direct", auto_delete=True)
    by_original = declare(f"{uid}-by-original")
    other = declare(f"{uid}-other")
    channel.queue_bind(by_original, f"{uid}-dlx", "invoice")
    channel.queue_bind(other, f"{uid}-dlx", "something-else")
    src = declare(f"{uid}-src", {"x-dead-letter-exchange": f"{uid}-dlx"})
    channel.queue_bind(src, f"{uid}-x", "invoice")
    channel.basic_publish(f"{uid}-x", "invoice", b"i")
    method, _, _ = wait_get(channel, src)
    channel.basic_reject(method.delivery_tag, requeue=False)
    method, _, body = take(channel, by_original)
    assert (method.exchange, method.routing_key, body) == (f"{uid}-dlx", "invoice", b"i")
    settle()
    assert drain(channel, other) == []


def test_a_dead_letter_routing_key_replaces_the_original(channel, declare, uid):
    channel.exchange_declare(f"{uid}-dlx", "direct", auto_delete=True)
    by_original = declare(f"{uid}-by-original")
    by_dlrk = declare(f"{uid}-by-dlrk")
    channel.queue_bind(by_original, f"{uid}-dlx", f"{uid}-src")
    channel.queue_bind(by_dlrk, f"{uid}-dlx", "dead")
    src = declare(
        f"{uid}-src",
        {"x-dead-letter-exchange": f"{uid}-dlx", "x-dead-letter-routing-key": "dead"},
    )
    clock = Clock()
    channel.basic_publish("", src, b"d")
    method, _, _ = wait_get(channel, src)
    channel.basic_reject(method.delivery_tag, requeue=False)
    method, properties, _ = take(channel, by_dlrk)
    clock.stop()
    assert (method.exchange, method.routing_key) == (f"{uid}-dlx", "dead")
    # routing-keys keeps the keys the message was published with, not the replacement.
    assert_headers(
        properties,
        {
            "x-death": [death(src, "rejected", "", [src], clock.time)],
            **first_death(src, "rejected", ""),
        },
    )
    settle()
    assert drain(channel, by_original) == []


def test_dead_letter_argument_validation(connection, uid):
    code, text = channel_error(
        connection.channel().queue_declare,
        f"{uid}-q",
        exclusive=True,
        arguments={"x-dead-letter-routing-key": "k"},
    )
    assert (code, text) == (
        406,
        f"PRECONDITION_FAILED - invalid arg 'x-dead-letter-routing-key' for queue '{uid}-q' "
        "in vhost '/': routing_key_but_no_dlx_defined",
    )
    # pika sends a small int as a signed 32-bit 'I', which RabbitMQ calls signedint.
    code, text = channel_error(
        connection.channel().queue_declare,
        f"{uid}-q",
        exclusive=True,
        arguments={"x-dead-letter-exchange": 5},
    )
    assert (code, text) == (
        406,
        f"PRECONDITION_FAILED - invalid type 'signedint' for arg 'x-dead-letter-exchange' "
        f"in queue '{uid}-q' in vhost '/'",
    )


# --- reason "expired" ----------------------------------------------------------------------


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_queue_ttl_dead_letters_with_reason_expired(channel, declare, uid, queue_type):
    dlq = declare(f"{uid}-dlq")
    src = declare(f"{uid}-src", {"x-message-ttl": TTL_MS, **dead_letter_to(dlq)}, queue_type)
    clock = Clock()
    channel.basic_publish("", src, b"old", pika.BasicProperties(content_type="a/b"))
    method, properties, body = take(channel, dlq)
    clock.stop()
    assert (method.exchange, method.routing_key, method.redelivered, body) == (
        "",
        dlq,
        False,
        b"old",
    )
    assert properties.content_type == "a/b"
    # No per-message TTL, so no original-expiration.
    assert_headers(
        properties,
        {
            "x-death": [death(src, "expired", "", [src], clock.time)],
            **first_death(src, "expired", ""),
        },
    )
    assert message_count(channel, src) == 0


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_per_message_ttl_moves_expiration_into_x_death(channel, declare, uid, queue_type):
    dlq = declare(f"{uid}-dlq")
    src = declare(f"{uid}-src", dead_letter_to(dlq), queue_type)
    clock = Clock()
    channel.basic_publish(
        "",
        src,
        b"brief",
        pika.BasicProperties(expiration=str(TTL_MS), headers={"keep": "me"}, priority=1),
    )
    method, properties, body = take(channel, dlq)
    clock.stop()
    assert (method.routing_key, body) == (dlq, b"brief")
    assert properties.priority == 1
    # The expiration property is removed (so the dead letter cannot expire again) and kept,
    # as the string it was, in x-death's original-expiration.
    assert properties.expiration is None
    assert_headers(
        properties,
        {
            "keep": "me",
            "x-death": [
                death(src, "expired", "", [src], clock.time, original_expiration=str(TTL_MS))
            ],
            **first_death(src, "expired", ""),
        },
    )


def test_original_expiration_is_recorded_when_the_queue_ttl_fires_first(channel, declare, uid):
    dlq = declare(f"{uid}-dlq")
    src = declare(f"{uid}-src", {"x-message-ttl": TTL_MS, **dead_letter_to(dlq)})
    clock = Clock()
    channel.basic_publish("", src, b"x", pika.BasicProperties(expiration="60000"))
    _, properties, _ = take(channel, dlq)
    clock.stop()
    assert properties.expiration is None
    assert_headers(
        properties,
        {
            "x-death": [death(src, "expired", "", [src], clock.time, original_expiration="60000")],
            **first_death(src, "expired", ""),
        },
    )


def test_a_dead_letter_does_not_expire_again(channel, declare, uid):
    dlq = declare(f"{uid}-dlq")
    src = declare(f"{uid}-src", dead_letter_to(dlq))
    channel.basic_publish("", src, b"x", pika.BasicProperties(expiration=str(TTL_MS)))
    deadline = time.monotonic() + 5
    while message_count(channel, dlq) == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    settle(3 * TTL_MS / 1000)
    assert message_count(channel, dlq) == 1


# --- reason "maxlen" -----------------------------------------------------------------------


@pytest.mark.parametrize("limit", ["x-max-length", "x-max-length-bytes"])
def test_drop_head_dead_letters_the_head(channel, declare, uid, limit):
    dlq = declare(f"{uid}-dlq")
    src = declare(f"{uid}-src", {limit: 2, **dead_letter_to(dlq)})
    clock = Clock()
    # The head carries a per-message TTL: original-expiration is written for every reason.
    channel.basic_publish("", src, b"1", pika.BasicProperties(expiration="60000"))
    channel.basic_publish("", src, b"2")
    channel.basic_publish("", src, b"3")
    method, properties, body = take(channel, dlq)
    clock.stop()
    assert (method.exchange, method.routing_key, body) == ("", dlq, b"1")
    assert properties.expiration is None
    assert_headers(
        properties,
        {
            "x-death": [death(src, "maxlen", "", [src], clock.time, original_expiration="60000")],
            **first_death(src, "maxlen", ""),
        },
    )
    assert drain(channel, src) == [b"2", b"3"]
    assert drain(channel, dlq) == []


def test_reject_publish_dlx_nacks_and_dead_letters_the_refused_message(channel, declare, uid):
    dlq = declare(f"{uid}-dlq")
    src = declare(
        f"{uid}-src",
        {"x-max-length": 1, "x-overflow": "reject-publish-dlx", **dead_letter_to(dlq)},
    )
    channel.confirm_delivery()
    clock = Clock()
    channel.basic_publish("", src, b"fits")
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", src, b"refused", pika.BasicProperties(headers={"n": 1}))
    method, properties, body = take(channel, dlq)
    clock.stop()
    assert (method.routing_key, method.redelivered, body) == (dlq, False, b"refused")
    assert_headers(
        properties,
        {
            "n": 1,
            "x-death": [death(src, "maxlen", "", [src], clock.time)],
            **first_death(src, "maxlen", ""),
        },
    )
    assert drain(channel, src) == [b"fits"]


def test_reject_publish_does_not_dead_letter(channel, declare, uid):
    dlq = declare(f"{uid}-dlq")
    src = declare(
        f"{uid}-src", {"x-max-length": 1, "x-overflow": "reject-publish", **dead_letter_to(dlq)}
    )
    channel.confirm_delivery()
    channel.basic_publish("", src, b"fits")
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", src, b"refused")
    settle()
    assert drain(channel, dlq) == []
    assert drain(channel, src) == [b"fits"]


# --- repeated dead-lettering and cycles ----------------------------------------------------


def test_dying_again_in_the_same_queue_for_the_same_reason_counts(channel, declare, uid):
    # The default exchange with no routing key dead-letters back to the queue itself: the
    # cycle RabbitMQ's docs describe, allowed because the message was rejected.
    src = declare(f"{uid}-src", {"x-dead-letter-exchange": ""})
    clock = Clock()
    channel.basic_publish("", src, b"again")
    method, _, _ = wait_get(channel, src)
    channel.basic_reject(method.delivery_tag, requeue=False)
    method, properties, _ = wait_get(channel, src)
    clock.stop()
    assert method.redelivered is False
    first_time = properties.headers["x-death"][0]["time"]
    assert first_time == clock.time
    # Die again in a later second: `time` stays the first death's.
    while time.time() < first_time.timestamp() + 1:
        time.sleep(0.05)
    channel.basic_reject(method.delivery_tag, requeue=False)
    method, properties, body = take(channel, src)
    assert (method.redelivered, body) == (False, b"again")
    assert_headers(
        properties,
        {
            "x-death": [death(src, "rejected", "", [src], first_time, count=2)],
            **first_death(src, "rejected", ""),
        },
    )


def test_x_death_is_newest_first_across_queues(channel, declare, uid):
    # src --rejected--> hop (fanout) --> mid --expired--> dlq
    channel.exchange_declare(f"{uid}-x", "direct", auto_delete=True)
    channel.exchange_declare(f"{uid}-hop", "fanout", auto_delete=True)
    dlq = declare(f"{uid}-dlq")
    mid = declare(f"{uid}-mid", {"x-message-ttl": TTL_MS, **dead_letter_to(dlq)})
    channel.queue_bind(mid, f"{uid}-hop")
    src = declare(f"{uid}-src", {"x-dead-letter-exchange": f"{uid}-hop"})
    channel.queue_bind(src, f"{uid}-x", "k")
    clock = Clock()
    channel.basic_publish(f"{uid}-x", "k", b"x", pika.BasicProperties(headers={"CC": ["c"]}))
    method, _, _ = wait_get(channel, src)
    channel.basic_reject(method.delivery_tag, requeue=False)
    method, properties, _ = take(channel, dlq)
    clock.stop()
    assert (method.exchange, method.routing_key) == ("", dlq)
    # The second death records the DLX as the exchange and the keys the first dead letter was
    # routed with (the original ones, CC included: no dead-letter routing key on src). mid's
    # dead-letter routing key then removes the CC header itself.
    assert_headers(
        properties,
        {
            "x-death": [
                death(mid, "expired", f"{uid}-hop", ["k", "c"], clock.time),
                death(src, "rejected", f"{uid}-x", ["k", "c"], clock.time),
            ],
            **first_death(src, "rejected", f"{uid}-x"),
        },
    )


def test_a_repeated_death_moves_its_entry_to_the_front(channel, declare, uid):
    a, b = f"{uid}-a", f"{uid}-b"
    declare(a, dead_letter_to(b))
    declare(b, dead_letter_to(a))
    clock = Clock()
    channel.basic_publish("", a, b"ping")
    for queue in (a, b, a):
        method, _, _ = wait_get(channel, queue)
        channel.basic_reject(method.delivery_tag, requeue=False)
    _, properties, _ = take(channel, b)
    clock.stop()
    assert_headers(
        properties,
        {
            "x-death": [
                death(a, "rejected", "", [a], clock.time, count=2),
                death(b, "rejected", "", [b], clock.time),
            ],
            **first_death(a, "rejected", ""),
        },
    )


def test_an_automatic_cycle_drops_the_message(channel, declare, uid):
    # c1 --expired--> c2 --expired--> fanout --> {c1, observer}: back into c1 would close a
    # cycle with no rejection in it, so only the observer gets the dead letter.
    channel.exchange_declare(f"{uid}-fan", "fanout", auto_delete=True)
    observer = declare(f"{uid}-observer")
    c1 = declare(f"{uid}-c1", {"x-message-ttl": TTL_MS // 2, **dead_letter_to(f"{uid}-c2")})
    c2 = declare(
        f"{uid}-c2", {"x-message-ttl": TTL_MS // 2, "x-dead-letter-exchange": f"{uid}-fan"}
    )
    channel.queue_bind(c1, f"{uid}-fan")
    channel.queue_bind(observer, f"{uid}-fan")
    clock = Clock()
    channel.basic_publish("", c1, b"loop")
    method, properties, body = take(channel, observer)
    clock.stop()
    assert (method.exchange, method.routing_key, body) == (f"{uid}-fan", c2, b"loop")
    assert_headers(
        properties,
        {
            "x-death": [
                death(c2, "expired", "", [c2], clock.time),
                death(c1, "expired", "", [c1], clock.time),
            ],
            **first_death(c1, "expired", ""),
        },
    )
    # Had it gone round again, the observer would have a second copy by now.
    settle()
    assert drain(channel, observer) == []
    assert (message_count(channel, c1), message_count(channel, c2)) == (0, 0)


def test_a_queue_expiring_into_itself_drops_the_message(channel, declare, uid):
    src = declare(f"{uid}-src", {"x-dead-letter-exchange": ""})
    channel.basic_publish("", src, b"x", pika.BasicProperties(expiration=str(TTL_MS)))
    sync(channel)
    assert message_count(channel, src) == 1
    settle(TTL_MS / 1000 + SETTLE_S)
    assert drain(channel, src) == []


def test_a_cycle_with_a_rejection_is_not_dropped(channel, declare, uid):
    # r1 --rejected--> r2 --expired--> r1: the rejection makes the cycle deliberate.
    r1, r2 = f"{uid}-r1", f"{uid}-r2"
    declare(r1, dead_letter_to(r2))
    declare(r2, {"x-message-ttl": TTL_MS, **dead_letter_to(r1)})
    clock = Clock()
    channel.basic_publish("", r1, b"round")
    method, _, _ = wait_get(channel, r1)
    channel.basic_reject(method.delivery_tag, requeue=False)
    method, properties, body = take(channel, r1)
    clock.stop()
    assert (method.routing_key, body) == (r1, b"round")
    assert_headers(
        properties,
        {
            "x-death": [
                death(r2, "expired", "", [r2], clock.time),
                death(r1, "rejected", "", [r1], clock.time),
            ],
            **first_death(r1, "rejected", ""),
        },
    )


# --- CC and BCC ----------------------------------------------------------------------------


def test_cc_and_bcc_keys_route_the_dead_letter(channel, declare, uid):
    channel.exchange_declare(f"{uid}-x", "direct", auto_delete=True)
    channel.exchange_declare(f"{uid}-dlx", "direct", auto_delete=True)
    src = declare(f"{uid}-src", {"x-dead-letter-exchange": f"{uid}-dlx"})
    dead = {}
    for key in ("k", "cc", "bcc"):
        channel.queue_bind(src, f"{uid}-x", key)
        dead[key] = declare(f"{uid}-dl-{key}")
        channel.queue_bind(dead[key], f"{uid}-dlx", key)
    clock = Clock()
    channel.basic_publish(
        f"{uid}-x",
        "k",
        b"x",
        pika.BasicProperties(headers={"CC": ["cc"], "BCC": ["bcc"], "h": "v"}),
    )
    method, properties, _ = wait_get(channel, src)
    # Routed once, by three keys; BCC stripped on publish, CC kept.
    assert properties.headers == {"CC": ["cc"], "h": "v"}
    channel.basic_reject(method.delivery_tag, requeue=False)
    for key in ("k", "cc", "bcc"):
        method, properties, body = take(channel, dead[key])
        clock.stop()
        # Each copy is delivered with the first routing key; routing-keys has CC, not BCC.
        assert (method.exchange, method.routing_key, body) == (f"{uid}-dlx", "k", b"x"), key
        assert_headers(
            properties,
            {
                "CC": ["cc"],
                "h": "v",
                "x-death": [death(src, "rejected", f"{uid}-x", ["k", "cc"], clock.time)],
                **first_death(src, "rejected", f"{uid}-x"),
            },
        )
    settle()
    assert [drain(channel, queue) for queue in dead.values()] == [[], [], []]
    assert message_count(channel, src) == 0


def test_a_publish_refused_by_reject_publish_dlx_is_dead_lettered_by_its_bcc_keys(
    channel, declare, uid
):
    channel.exchange_declare(f"{uid}-dlx", "direct", auto_delete=True)
    src = declare(
        f"{uid}-src",
        {
            "x-max-length": 0,
            "x-overflow": "reject-publish-dlx",
            "x-dead-letter-exchange": f"{uid}-dlx",
        },
    )
    dead = {}
    for key in (src, "bcc"):
        dead[key] = declare(f"{uid}-dl-{key}")
        channel.queue_bind(dead[key], f"{uid}-dlx", key)
    channel.confirm_delivery()
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", src, b"x", pika.BasicProperties(headers={"BCC": ["bcc"]}))
    for key in (src, "bcc"):
        method, properties, body = take(channel, dead[key])
        assert (method.routing_key, body) == (src, b"x"), key
        assert "BCC" not in properties.headers, key


def test_a_dead_letter_routing_key_removes_the_cc_header(channel, declare, uid):
    channel.exchange_declare(f"{uid}-dlx", "direct", auto_delete=True)
    dead = {}
    for key in ("dead", "cc", "bcc"):
        dead[key] = declare(f"{uid}-dl-{key}")
        channel.queue_bind(dead[key], f"{uid}-dlx", key)
    src = declare(
        f"{uid}-src",
        {"x-dead-letter-exchange": f"{uid}-dlx", "x-dead-letter-routing-key": "dead"},
    )
    clock = Clock()
    channel.basic_publish(
        "", src, b"x", pika.BasicProperties(headers={"CC": ["cc"], "BCC": ["bcc"]})
    )
    method, _, _ = wait_get(channel, src)
    channel.basic_reject(method.delivery_tag, requeue=False)
    method, properties, _ = take(channel, dead["dead"])
    clock.stop()
    assert (method.exchange, method.routing_key) == (f"{uid}-dlx", "dead")
    # CC removed from the dead letter, yet still listed in routing-keys.
    assert_headers(
        properties,
        {
            "x-death": [death(src, "rejected", "", [src, "cc"], clock.time)],
            **first_death(src, "rejected", ""),
        },
    )
    settle()
    assert drain(channel, dead["cc"]) == drain(channel, dead["bcc"]) == []


# --- dead letters that go nowhere ----------------------------------------------------------


def test_a_missing_dead_letter_exchange_drops_silently(connection, channel, declare, uid):
    src = declare(f"{uid}-src", {"x-dead-letter-exchange": f"{uid}-missing"})
    channel.basic_publish("", src, b"x")
    method, _, _ = wait_get(channel, src)
    channel.basic_reject(method.delivery_tag, requeue=False)
    sync(channel)
    assert channel.is_open
    other = connection.channel()
    channel.close()
    assert message_count(other, src) == 0
    assert connection.is_open


def test_an_unroutable_dead_letter_is_dropped(connection, channel, declare, uid):
    channel.exchange_declare(f"{uid}-dlx", "direct", auto_delete=True)
    unrelated = declare(f"{uid}-unrelated")
    channel.queue_bind(unrelated, f"{uid}-dlx", "not-the-key")
    src = declare(f"{uid}-src", {"x-dead-letter-exchange": f"{uid}-dlx"})
    returned = []
    channel.add_on_return_callback(lambda *args: returned.append(args))
    # Published mandatory: the dead letter is not, and no basic.return reaches the publisher.
    channel.basic_publish("", src, b"x", mandatory=True)
    method, _, _ = wait_get(channel, src)
    channel.basic_reject(method.delivery_tag, requeue=False)
    sync(channel)
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    assert returned == []
    assert drain(channel, unrelated) == []
    other = connection.channel()
    channel.close()
    assert message_count(other, src) == 0


def test_the_dead_letter_exchange_alternate_exchange_applies(channel, declare, uid):
    channel.exchange_declare(f"{uid}-ae", "fanout", auto_delete=True)
    caught = declare(f"{uid}-caught")
    channel.queue_bind(caught, f"{uid}-ae")
    channel.exchange_declare(
        f"{uid}-dlx", "direct", auto_delete=True, arguments={"alternate-exchange": f"{uid}-ae"}
    )
    src = declare(f"{uid}-src", {"x-dead-letter-exchange": f"{uid}-dlx"})
    clock = Clock()
    channel.basic_publish("", src, b"x")
    method, _, _ = wait_get(channel, src)
    channel.basic_reject(method.delivery_tag, requeue=False)
    method, properties, body = take(channel, caught)
    clock.stop()
    assert (method.exchange, method.routing_key, body) == (f"{uid}-dlx", src, b"x")
    assert_headers(
        properties,
        {
            "x-death": [death(src, "rejected", "", [src], clock.time)],
            **first_death(src, "rejected", ""),
        },
    )


# --- what never dead-letters ---------------------------------------------------------------


def test_requeue_never_dead_letters(channel, declare, uid):
    dlq = declare(f"{uid}-dlq")
    src = declare(f"{uid}-src", dead_letter_to(dlq))
    channel.basic_publish("", src, b"x")
    method, _, _ = wait_get(channel, src)
    channel.basic_reject(method.delivery_tag, requeue=True)
    method, properties, _ = wait_get(channel, src)
    assert method.redelivered is True
    channel.basic_nack(method.delivery_tag, requeue=True)
    method, properties, body = take(channel, src)
    assert (method.redelivered, body) == (True, b"x")
    # No x-death (Warren may add x-delivery-count to a classic redelivery: issue 8).
    assert "x-death" not in (properties.headers or {})
    settle()
    assert drain(channel, dlq) == []


def test_closing_a_channel_requeues_without_dead_lettering(connection, channel, declare, uid):
    dlq = declare(f"{uid}-dlq")
    src = declare(f"{uid}-src", dead_letter_to(dlq))
    channel.basic_publish("", src, b"x")
    sync(channel)
    consumer = connection.channel()
    got = Recorder()
    consumer.basic_consume(src, got)
    got.wait(connection, 1)
    consumer.close()
    method, properties, body = take(channel, src)
    assert (method.redelivered, body) == (True, b"x")
    assert "x-death" not in (properties.headers or {})
    settle()
    assert drain(channel, dlq) == []


def test_purge_and_delete_do_not_dead_letter(channel, declare, uid):
    dlq = declare(f"{uid}-dlq")
    purged = declare(f"{uid}-purged", dead_letter_to(dlq))
    deleted = declare(f"{uid}-deleted", dead_letter_to(dlq))
    channel.basic_publish("", purged, b"p")
    channel.basic_publish("", deleted, b"d")
    sync(channel)
    assert (message_count(channel, purged), message_count(channel, deleted)) == (1, 1)
    assert channel.queue_purge(purged).method.message_count == 1
    assert channel.queue_delete(deleted).method.message_count == 1
    settle()
    assert drain(channel, dlq) == []


# --- delivery counting and limits (quorum queues) ------------------------------------------


def poison_rejected_past_a_limit_of_2(connection, channel, declare, uid) -> list:
    """Consume a message rejected (requeue) at every delivery from a quorum queue with a
    delivery limit of 2: its deliveries, once the third rejection dead-lettered it."""
    dlq = declare(f"{uid}-dlq")
    src = declare(f"{uid}-src", {"x-delivery-limit": 2, **dead_letter_to(dlq)}, "quorum")
    clock = Clock()
    channel.basic_publish("", src, b"poison", pika.BasicProperties(headers={"h": "v"}))
    channel.basic_qos(prefetch_count=1)
    got = Recorder(reject=True)
    channel.basic_consume(src, got)
    got.wait(connection, 3)
    # The third rejection exceeds the limit of 2: dead-lettered, not delivered again.
    method, properties, body = take(channel, dlq)
    clock.stop()
    assert (method.exchange, method.routing_key, method.redelivered, body) == (
        "",
        dlq,
        False,
        b"poison",
    )
    # The dead letter carries no x-delivery-count: the count is added on delivery only.
    assert_headers(
        properties,
        {
            "h": "v",
            "x-death": [death(src, "delivery_limit", "", [src], clock.time)],
            **first_death(src, "delivery_limit", ""),
        },
    )
    got.settle(connection)
    assert len(got.deliveries) == 3
    return got.deliveries


@pytest.mark.reference_only
def test_x_delivery_count_and_the_delivery_limit(connection, channel, declare, uid):
    deliveries = poison_rejected_past_a_limit_of_2(connection, channel, declare, uid)
    # No header on the first delivery; then the number of returns so far.
    assert typed(deliveries) == typed(
        [
            (False, {"h": "v"}, b"poison"),
            (True, {"h": "v", "x-delivery-count": long(1)}, b"poison"),
            (True, {"h": "v", "x-delivery-count": long(2)}, b"poison"),
        ]
    )


@pytest.mark.warren_only
def test_x_delivery_count_x_acquired_count_and_the_delivery_limit(
    connection, channel, declare, uid
):
    # RabbitMQ 4.3 (PR 15387; https://www.rabbitmq.com/docs/quorum-queues#poison-message-
    # handling): x-acquired-count beside x-delivery-count; a rejection counts in both.
    deliveries = poison_rejected_past_a_limit_of_2(connection, channel, declare, uid)
    assert typed(deliveries) == typed(
        [
            (False, {"h": "v"}, b"poison"),
            (True, {"h": "v", "x-acquired-count": long(1), "x-delivery-count": long(1)}, b"poison"),
            (True, {"h": "v", "x-acquired-count": long(2), "x-delivery-count": long(2)}, b"poison"),
        ]
    )


def test_beyond_the_delivery_limit_without_a_dlx_the_message_is_dropped(channel, declare, uid):
    src = declare(f"{uid}-src", {"x-delivery-limit": 0}, "quorum")
    channel.basic_publish("", src, b"x")
    method, _, _ = wait_get(channel, src)
    channel.basic_reject(method.delivery_tag, requeue=True)
    sync(channel)
    settle()
    assert message_count(channel, src) == 0
    assert channel.basic_get(src)[0] is None


def delivered_again_after_a_closed_channel(connection, channel, declare, uid) -> list:
    """A message of a quorum queue delivered to a channel that closes, then delivered again:
    both deliveries."""
    src = declare(f"{uid}-src", {}, "quorum")
    channel.basic_publish("", src, b"x")
    sync(channel)
    first = connection.channel()
    got = Recorder()
    first.basic_consume(src, got)
    got.wait(connection, 1)
    first.close()
    channel.basic_consume(src, got)
    got.wait(connection, 2)
    return got.deliveries


@pytest.mark.reference_only
def test_a_closed_channel_counts_as_a_failed_delivery(connection, channel, declare, uid):
    deliveries = delivered_again_after_a_closed_channel(connection, channel, declare, uid)
    assert typed(deliveries) == typed(
        [(False, None, b"x"), (True, {"x-delivery-count": long(1)}, b"x")]
    )


@pytest.mark.warren_only
def test_a_closed_channel_counts_as_a_failed_delivery_and_an_acquisition(
    connection, channel, declare, uid
):
    # RabbitMQ 4.3: a consumer whose channel went down returns its messages as failed
    # deliveries (rabbit_fifo: return_all with delivery-failed on a down consumer).
    deliveries = delivered_again_after_a_closed_channel(connection, channel, declare, uid)
    assert typed(deliveries) == typed(
        [
            (False, None, b"x"),
            (True, {"x-acquired-count": long(1), "x-delivery-count": long(1)}, b"x"),
        ]
    )


def nacked_with_a_delivery_limit_of_0(channel, declare, uid) -> tuple[str, str]:
    """A message of a quorum queue with a delivery limit of 0, got and nacked with requeue
    once: (the queue, its dead-letter queue)."""
    dlq = declare(f"{uid}-dlq")
    src = declare(f"{uid}-src", {"x-delivery-limit": 0, **dead_letter_to(dlq)}, "quorum")
    channel.basic_publish("", src, b"x")
    method, _, _ = wait_get(channel, src)
    channel.basic_nack(method.delivery_tag, requeue=True)
    sync(channel)
    return src, dlq


@pytest.mark.reference_only
def test_a_nack_with_requeue_counts_toward_the_delivery_limit(channel, declare, uid):
    src, dlq = nacked_with_a_delivery_limit_of_0(channel, declare, uid)
    _, properties, _ = take(channel, dlq)
    assert properties.headers["x-death"][0]["reason"] == "delivery_limit"
    assert message_count(channel, src) == 0


@pytest.mark.warren_only
def test_nacks_never_count_toward_the_delivery_limit_and_a_reject_does(channel, declare, uid):
    # RabbitMQ 4.3 (PR 15387, https://www.rabbitmq.com/docs/4.3/nack): "unlimited explicit
    # message returns (via nack ...) are now allowed without counting towards the delivery
    # limit"; basic.reject with requeue counts, and so x-delivery-count does.
    src, dlq = nacked_with_a_delivery_limit_of_0(channel, declare, uid)
    headers = []
    for _ in range(3):
        method, properties, _ = wait_get(channel, src)
        headers.append(properties.headers)
        channel.basic_nack(method.delivery_tag, requeue=True)
    channel.basic_recover(requeue=True)
    method, properties, _ = wait_get(channel, src)
    headers.append(properties.headers)
    assert typed(headers) == typed([{"x-acquired-count": long(n)} for n in (1, 2, 3, 4)])
    assert drain(channel, dlq) == []
    channel.basic_reject(method.delivery_tag, requeue=True)
    _, properties, _ = take(channel, dlq)
    assert properties.headers["x-death"][0]["reason"] == "delivery_limit"
    assert message_count(channel, src) == 0


@pytest.mark.warren_only
def test_a_dead_letter_carries_its_failed_deliveries_round_a_retry_loop(channel, declare, uid):
    # RabbitMQ 4.x passes a quorum queue's delivery-count on to the dead letter, and a quorum
    # target starts from it (rabbit_fifo: annotate_msg, maybe_set_msg_delivery_count; 4.3
    # PR 16039 passes the acquired count too); 3.10 starts every queue from zero. A retry
    # loop through a TTL queue thus sees x-delivery-count grow with each rejection.
    work, retry = f"{uid}-work", f"{uid}-retry"
    declare(work, dead_letter_to(retry), "quorum")
    declare(retry, {"x-message-ttl": 1, **dead_letter_to(work)}, "quorum")
    channel.basic_publish("", work, b"job")
    counts = []
    for _ in range(3):
        method, properties, _ = wait_get(channel, work)
        counts.append((properties.headers or {}).get("x-delivery-count"))
        channel.basic_reject(method.delivery_tag, requeue=False)
    assert counts == [None, 1, 2]


def test_a_closed_channel_beyond_the_limit_dead_letters(connection, channel, declare, uid):
    dlq = declare(f"{uid}-dlq")
    src = declare(f"{uid}-src", {"x-delivery-limit": 0, **dead_letter_to(dlq)}, "quorum")
    clock = Clock()
    channel.basic_publish("", src, b"x")
    sync(channel)
    consumer = connection.channel()
    got = Recorder()
    consumer.basic_consume(src, got)
    got.wait(connection, 1)
    consumer.close()
    _, properties, body = take(channel, dlq)
    clock.stop()
    assert body == b"x"
    assert_headers(
        properties,
        {
            "x-death": [death(src, "delivery_limit", "", [src], clock.time)],
            **first_death(src, "delivery_limit", ""),
        },
    )
    assert message_count(channel, src) == 0


# --- the field types on the wire -----------------------------------------------------------


def _decode_value(data: bytes, offset: int):
    """One AMQP field value as (type char, value), tables and arrays decoded recursively."""
    kind = chr(data[offset])
    offset += 1
    if kind == "S":
        (size,) = struct.unpack_from(">I", data, offset)
        offset += 4
        return (kind, data[offset : offset + size].decode()), offset + size
    if kind in "lT":
        (value,) = struct.unpack_from(">q" if kind == "l" else ">Q", data, offset)
        return (kind, value), offset + 8
    if kind == "I":
        return (kind, struct.unpack_from(">i", data, offset)[0]), offset + 4
    if kind == "F":
        table, offset = _decode_table(data, offset)
        return (kind, table), offset
    if kind == "A":
        (size,) = struct.unpack_from(">I", data, offset)
        offset += 4
        end, items = offset + size, []
        while offset < end:
            item, offset = _decode_value(data, offset)
            items.append(item)
        return (kind, items), offset
    raise AssertionError(f"unexpected field type {kind!r}")


def _decode_table(data: bytes, offset: int) -> tuple[dict, int]:
    (size,) = struct.unpack_from(">I", data, offset)
    offset += 4
    end, table = offset + size, {}
    while offset < end:
        key = data[offset + 1 : offset + 1 + data[offset]].decode()
        offset += 1 + data[offset]
        table[key], offset = _decode_value(data, offset)
    return table, offset


# basic.get-empty's class and method ids, which open its method frame.
GET_EMPTY = struct.pack(">HH", 60, 72)


def raw_headers(broker, queue: str, no_ack: bool = True) -> dict:
    """basic.get from ``queue`` over a raw connection: the message's headers table with the
    type char of every field, as the broker encoded it."""
    with RawClient(broker.host, broker.port) as raw:
        raw.handshake()
        raw.open_channel(1)
        raw.send(1, commands.Basic.Get(queue=queue, no_ack=no_ack))
        frame_type = None
        while frame_type != 2:  # the content header frame
            frame_type, _, payload = raw.recv_raw()
            assert payload[:4] != GET_EMPTY, f"{queue} is empty"
    # class-id, weight, body-size, then the property flags and the properties in order.
    (flags,) = struct.unpack_from(">H", payload, 12)
    assert flags & 0x2000, "no headers"
    offset = 14
    for flag in (0x8000, 0x4000):  # content-type, content-encoding: short strings
        if flags & flag:
            offset += 1 + payload[offset]
    return _decode_table(payload, offset)[0]


def test_x_death_field_types_on_the_wire(broker, channel, declare, uid):
    dlq = declare(f"{uid}-dlq", shared=True)
    src = declare(f"{uid}-src", dead_letter_to(dlq))
    clock = Clock()
    channel.basic_publish(
        "", src, b"x", pika.BasicProperties(expiration=str(TTL_MS), headers={"CC": ["cc"]})
    )
    deadline = time.monotonic() + 5
    while message_count(channel, dlq) == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    clock.stop()
    headers = raw_headers(broker, dlq)
    # The broker-written headers only (4.x adds x-last-death-*, also long strings).
    for key in LAST_DEATH_KEYS:
        assert headers.pop(key, ("S", None))[0] == "S"
    ((kind, deaths),) = [headers.pop("x-death")]
    assert kind == "A" and [item_kind for item_kind, _ in deaths] == ["F"]
    entry = deaths[0][1]
    assert clock.start - 1 <= entry.pop("time")[1] <= clock.end + 1
    assert entry == {
        "count": ("l", 1),
        "reason": ("S", "expired"),
        "queue": ("S", src),
        "exchange": ("S", ""),
        "routing-keys": ("A", [("S", src), ("S", "cc")]),
        "original-expiration": ("S", str(TTL_MS)),
    }
    assert headers == {
        "x-first-death-exchange": ("S", ""),
        "x-first-death-queue": ("S", src),
        "x-first-death-reason": ("S", "expired"),
    }


def headers_after_one_return(broker, channel, declare, uid, give_back) -> dict:
    """The raw headers of a quorum queue's message redelivered after `give_back(channel,
    delivery_tag)` returned it once."""
    src = declare(f"{uid}-src", {}, "quorum")
    channel.basic_publish("", src, b"x")
    method, _, _ = wait_get(channel, src)
    give_back(channel, method.delivery_tag)
    sync(channel)
    return raw_headers(broker, src)


def test_x_delivery_count_field_type_on_the_wire(broker, channel, declare, uid):
    def reject(channel, tag):
        channel.basic_reject(tag, requeue=True)

    headers = headers_after_one_return(broker, channel, declare, uid, reject)
    assert headers.get("x-delivery-count") == ("l", 1)


@pytest.mark.warren_only
def test_x_acquired_count_field_type_on_the_wire(broker, channel, declare, uid):
    # RabbitMQ 4.3 writes x-acquired-count as a long, as x-delivery-count (mc_amqpl turns
    # integer x- annotations into 'l' headers); 3.10 has no such header.
    def nack(channel, tag):
        channel.basic_nack(tag, requeue=True)

    headers = headers_after_one_return(broker, channel, declare, uid, nack)
    assert headers.get("x-acquired-count") == ("l", 1) and "x-delivery-count" not in headers


# --- 4.x behaviour that RabbitMQ 3.10 lacks ------------------------------------------------


@pytest.mark.warren_only
def test_x_last_death_headers(channel, declare, uid):
    # 4.x writes x-last-death-{queue,reason,exchange} on every dead-lettering, x-first-death-*
    # on the first only (https://www.rabbitmq.com/docs/dlx#effects, "the following six ...
    # headers are added for the very first dead-lettering event ... Whenever a message is dead
    # lettered subsequently, the x-last-* annotations are updated"); 3.10 has no x-last-*.
    channel.exchange_declare(f"{uid}-x", "direct", auto_delete=True)
    channel.exchange_declare(f"{uid}-hop", "fanout", auto_delete=True)
    first_dlq = declare(f"{uid}-first-dlq")
    dlq = declare(f"{uid}-dlq")
    mid = declare(f"{uid}-mid", {"x-message-ttl": TTL_MS, **dead_letter_to(dlq)})
    channel.queue_bind(mid, f"{uid}-hop")
    channel.queue_bind(first_dlq, f"{uid}-hop")
    src = declare(f"{uid}-src", {"x-dead-letter-exchange": f"{uid}-hop"})
    channel.queue_bind(src, f"{uid}-x", "k")
    clock = Clock()
    channel.basic_publish(f"{uid}-x", "k", b"x")
    method, _, _ = wait_get(channel, src)
    channel.basic_reject(method.delivery_tag, requeue=False)
    _, once, _ = take(channel, first_dlq)
    _, twice, _ = take(channel, dlq)
    clock.stop()
    assert typed(once.headers) == typed(
        {
            "x-death": [death(src, "rejected", f"{uid}-x", ["k"], clock.time)],
            **first_death(src, "rejected", f"{uid}-x"),
            "x-last-death-exchange": f"{uid}-x",
            "x-last-death-queue": src,
            "x-last-death-reason": "rejected",
        }
    )
    assert typed(twice.headers) == typed(
        {
            "x-death": [
                death(mid, "expired", f"{uid}-hop", ["k"], clock.time),
                death(src, "rejected", f"{uid}-x", ["k"], clock.time),
            ],
            **first_death(src, "rejected", f"{uid}-x"),
            "x-last-death-exchange": f"{uid}-hop",
            "x-last-death-queue": mid,
            "x-last-death-reason": "expired",
        }
    )


@pytest.mark.warren_only
def test_quorum_queues_default_to_a_delivery_limit_of_20(channel, declare, uid):
    # "Starting with RabbitMQ 4.0, the delivery limit for quorum queues defaults to 20"
    # (https://www.rabbitmq.com/docs/quorum-queues#poison-message-handling); 3.10 has no
    # default limit.
    dlq = declare(f"{uid}-dlq")
    src = declare(f"{uid}-src", dead_letter_to(dlq), "quorum")
    channel.basic_publish("", src, b"x")
    counts = []
    for _ in range(21):
        method, properties, _ = wait_get(channel, src)
        counts.append((properties.headers or {}).get("x-delivery-count"))
        channel.basic_reject(method.delivery_tag, requeue=True)
    assert counts[1:] == list(range(1, 21))
    _, properties, _ = take(channel, dlq)
    assert properties.headers["x-death"][0]["reason"] == "delivery_limit"
    assert message_count(channel, src) == 0


@pytest.mark.warren_only
def test_a_delivery_limit_of_minus_one_disables_it(channel, declare, uid):
    # 4.x: "A value of -1 disables the limit" (https://www.rabbitmq.com/docs/quorum-queues
    # #poison-message-handling); 3.10 accepts -1 but then dead-letters on the first requeue
    # (its check is count > limit).
    dlq = declare(f"{uid}-dlq")
    src = declare(f"{uid}-src", {"x-delivery-limit": -1, **dead_letter_to(dlq)}, "quorum")
    channel.basic_publish("", src, b"x")
    for _ in range(25):
        method, _, _ = wait_get(channel, src)
        channel.basic_reject(method.delivery_tag, requeue=True)
    _, properties, _ = wait_get(channel, src)
    assert properties.headers["x-delivery-count"] == 25
    assert drain(channel, dlq) == []


@pytest.mark.warren_only
def test_classic_queues_count_deliveries_and_honour_the_delivery_limit(
    connection, channel, declare, uid
):
    # A Warren extension (issue 8: "x-delivery-limit ... on queues declared classic or quorum
    # alike"). RabbitMQ 3.10 refuses the argument on a classic queue (406 "invalid arg
    # 'x-delivery-limit' ... of queue type rabbit_classic_queue") and 4.x classic queues have
    # no poison message handling (https://www.rabbitmq.com/docs/quorum-queues#feature-matrix).
    dlq = declare(f"{uid}-dlq")
    src = declare(f"{uid}-src", {"x-delivery-limit": 1, **dead_letter_to(dlq)})
    clock = Clock()
    channel.basic_publish("", src, b"x")
    channel.basic_qos(prefetch_count=1)
    got = Recorder(reject=True)
    channel.basic_consume(src, got)
    got.wait(connection, 2)
    assert typed(got.deliveries) == typed(
        [
            (False, None, b"x"),
            (True, {"x-acquired-count": long(1), "x-delivery-count": long(1)}, b"x"),
        ]
    )
    _, properties, _ = take(channel, dlq)
    clock.stop()
    assert typed(properties.headers) == typed(
        {
            "x-death": [death(src, "delivery_limit", "", [src], clock.time)],
            **first_death(src, "delivery_limit", ""),
            "x-last-death-exchange": "",
            "x-last-death-queue": src,
            "x-last-death-reason": "delivery_limit",
        }
    )
    got.settle(connection)
    assert len(got.deliveries) == 2

"""Queue arguments with visible effects: TTLs, length limits and overflow, expiry, priorities."""

from __future__ import annotations

import time

import pika
import pytest
from pika_helpers import channel_error, drain, sync

# Long enough that a test sees its message (or queue) before it expires, even on a busy
# machine; then it waits past the expiry by a margin, for the broker's timer to have fired.
TTL_MS = 2000
EXPIRED_AFTER_S = TTL_MS / 1000 + 1.0


def message_count(channel, queue: str) -> int:
    return channel.queue_declare(queue, passive=True).method.message_count


def sleep_until(deadline: float) -> None:
    time.sleep(max(0.0, deadline - time.monotonic()))


def test_queue_message_ttl(channel, uid):
    channel.queue_declare(f"{uid}-q", exclusive=True, arguments={"x-message-ttl": TTL_MS})
    published = time.monotonic()
    channel.basic_publish("", f"{uid}-q", b"expires")
    sync(channel)
    # First there (a broker dropping every message must not pass), then gone.
    assert message_count(channel, f"{uid}-q") == 1
    sleep_until(published + EXPIRED_AFTER_S)
    assert drain(channel, f"{uid}-q") == []


def test_per_message_expiration(channel, uid):
    channel.queue_declare(f"{uid}-q", exclusive=True)
    published = time.monotonic()
    channel.basic_publish("", f"{uid}-q", b"short", pika.BasicProperties(expiration=str(TTL_MS)))
    channel.basic_publish("", f"{uid}-q", b"long", pika.BasicProperties(expiration="60000"))
    sync(channel)
    assert message_count(channel, f"{uid}-q") == 2
    sleep_until(published + EXPIRED_AFTER_S)
    assert drain(channel, f"{uid}-q") == [b"long"]


def test_zero_ttl_drops_what_no_consumer_waits_for(channel, uid):
    channel.queue_declare(f"{uid}-q", exclusive=True, arguments={"x-message-ttl": 0})
    channel.basic_publish("", f"{uid}-q", b"nobody waiting")
    sync(channel)
    assert drain(channel, f"{uid}-q") == []


def test_zero_ttl_delivers_to_a_waiting_consumer(connection, channel, uid):
    """What a zero TTL keeps: a broker that drops every such message fails here."""
    channel.queue_declare(f"{uid}-q", exclusive=True, arguments={"x-message-ttl": 0})
    got = []
    channel.basic_consume(
        f"{uid}-q", lambda _ch, _method, _properties, body: got.append(body), auto_ack=True
    )
    channel.basic_publish("", f"{uid}-q", b"someone waiting")
    deadline = time.monotonic() + 5
    while not got and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    assert got == [b"someone waiting"]


def test_invalid_expiration_is_406(channel, uid):
    channel.queue_declare(f"{uid}-q", exclusive=True)
    channel.basic_publish("", f"{uid}-q", b"x", pika.BasicProperties(expiration="soon"))
    code, text = channel_error(sync, channel)
    assert (code, text) == (406, "PRECONDITION_FAILED - invalid expiration 'soon': no_integer")


def test_max_length_drops_head(channel, uid):
    channel.queue_declare(f"{uid}-q", exclusive=True, arguments={"x-max-length": 2})
    for body in (b"1", b"2", b"3"):
        channel.basic_publish("", f"{uid}-q", body)
    sync(channel)
    assert drain(channel, f"{uid}-q") == [b"2", b"3"]


def test_max_length_bytes_drops_head(channel, uid):
    channel.queue_declare(f"{uid}-q", exclusive=True, arguments={"x-max-length-bytes": 10})
    for body in (b"aaaa", b"bbbb", b"cccc"):
        channel.basic_publish("", f"{uid}-q", body)
    sync(channel)
    assert drain(channel, f"{uid}-q") == [b"bbbb", b"cccc"]


def test_reject_publish_overflow_nacks(channel, uid):
    channel.confirm_delivery()
    channel.queue_declare(
        f"{uid}-q", exclusive=True, arguments={"x-max-length": 1, "x-overflow": "reject-publish"}
    )
    channel.basic_publish("", f"{uid}-q", b"fits")
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", f"{uid}-q", b"rejected")
    assert drain(channel, f"{uid}-q") == [b"fits"]


def test_unused_queue_expires(connection, uid):
    ch = connection.channel()
    ch.queue_declare(f"{uid}-q", arguments={"x-expires": TTL_MS})
    # There first. A passive declare counts as a use (it renews the lease, as RabbitMQ's
    # does), so the wait starts after it.
    ch.queue_declare(f"{uid}-q", passive=True)
    time.sleep(EXPIRED_AFTER_S)
    code, _ = channel_error(ch.queue_declare, f"{uid}-q", passive=True)
    assert code == 404


def test_a_passive_declare_renews_x_expires(connection, uid):
    ch = connection.channel()
    ch.queue_declare(f"{uid}-q", arguments={"x-expires": 2000})
    for _ in range(2):
        # 1.2 s twice: gone without the renewal in between.
        time.sleep(1.2)
        assert ch.queue_declare(f"{uid}-q", passive=True).method.queue == f"{uid}-q"
    ch.queue_delete(f"{uid}-q")


def test_priority_queue_delivers_highest_first(channel, uid):
    channel.queue_declare(f"{uid}-q", exclusive=True, arguments={"x-max-priority": 5})
    for body, priority in [(b"low", 1), (b"none", None), (b"high", 5), (b"mid", 3), (b"over", 9)]:
        channel.basic_publish("", f"{uid}-q", body, pika.BasicProperties(priority=priority))
    sync(channel)
    # Priorities above x-max-priority count as the maximum; no priority counts as 0.
    assert drain(channel, f"{uid}-q") == [b"high", b"over", b"mid", b"low", b"none"]


def test_max_length_spares_what_a_waiting_consumer_takes(connection, uid):
    """An arriving message goes to a consumer with credit before the length limit applies."""
    ch = connection.channel()
    ch.queue_declare(f"{uid}-q", exclusive=True, arguments={"x-max-length": 1})
    ch.basic_qos(prefetch_count=10)
    received = []
    ch.basic_consume(f"{uid}-q", lambda c, m, p, body: received.append(body))
    for body in (b"a", b"b", b"c"):
        ch.basic_publish("", f"{uid}-q", body)
    deadline = time.monotonic() + 5
    while len(received) < 3 and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.1)
    assert received == [b"a", b"b", b"c"]


def test_a_requeue_beyond_max_length_drops_the_head(channel, uid):
    channel.queue_declare(f"{uid}-q", exclusive=True, arguments={"x-max-length": 2})
    for body in (b"a", b"b"):
        channel.basic_publish("", f"{uid}-q", body)
    method, _, body = channel.basic_get(f"{uid}-q")
    assert body == b"a"
    channel.basic_publish("", f"{uid}-q", b"c")
    sync(channel)
    channel.basic_nack(method.delivery_tag, requeue=True)
    sync(channel)
    assert channel.queue_declare(f"{uid}-q", passive=True).method.message_count == 2
    assert drain(channel, f"{uid}-q") == [b"b", b"c"]

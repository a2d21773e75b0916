"""Queues: declare variants and argument checks, exclusivity, auto-delete, purge and delete."""

from __future__ import annotations

import re

import pika
import pytest
from pika_helpers import channel_error, sync, wait_get


def test_server_named_queue(channel):
    name = channel.queue_declare("", exclusive=True).method.queue
    assert re.fullmatch(r"amq\.gen-[A-Za-z0-9_-]{22}", name), name
    channel.queue_declare(name, passive=True)


def test_declare_ok_counts(connection, uid):
    ch = connection.channel()
    ok = ch.queue_declare(f"{uid}-q", exclusive=True).method
    assert (ok.queue, ok.message_count, ok.consumer_count) == (f"{uid}-q", 0, 0)
    for body in (b"1", b"2", b"3"):
        ch.basic_publish("", f"{uid}-q", body)
    ch.basic_consume(f"{uid}-q", lambda *args: None)
    sync(ch)
    ok = connection.channel().queue_declare(f"{uid}-q", passive=True).method
    assert ok.consumer_count == 1


def test_declare_ok_message_count(connection, uid):
    ch = connection.channel()
    ch.queue_declare(f"{uid}-q", exclusive=True)
    for body in (b"1", b"2", b"3"):
        ch.basic_publish("", f"{uid}-q", body)
    sync(ch)
    assert ch.queue_declare(f"{uid}-q", passive=True).method.message_count == 3


def test_passive_declare_of_missing_queue_is_404(channel, uid):
    code, text = channel_error(channel.queue_declare, f"{uid}-nope", passive=True)
    assert (code, text) == (404, f"NOT_FOUND - no queue '{uid}-nope' in vhost '/'")


# Names RabbitMQ accepts (any UTF-8 up to 255 bytes) that pamqp's name pattern refuses.
UNUSUAL_NAMES = {
    "accent": "café",
    "percent": "a%b",
    "star": "star*",
    "parens": "paren(1)",
    "tab": "tab\there",
    "emoji": "rabbit-\N{RABBIT}",
}


@pytest.mark.parametrize("suffix", list(UNUSUAL_NAMES.values()), ids=list(UNUSUAL_NAMES))
def test_any_utf8_queue_name_and_consumer_tag(connection, open_connection, uid, suffix):
    name = f"{uid}-{suffix}"
    try:
        ch = connection.channel()
        ok = ch.queue_declare(name, durable=True).method
        assert (ok.queue, ok.message_count, ok.consumer_count) == (name, 0, 0)
        ch.basic_publish("", name, b"body", pika.BasicProperties(delivery_mode=2))
        method, _, body = wait_get(ch, name)
        assert (method.routing_key, body) == (name, b"body")
        ch.basic_ack(method.delivery_tag)
        tag = ch.basic_consume(name, lambda *args: None, consumer_tag=f"ctag-{suffix}")
        assert tag == f"ctag-{suffix}"
        assert ch.queue_declare(name, passive=True).method.consumer_count == 1
        ch.basic_cancel(tag)
        assert ch.queue_delete(name).method.message_count == 0
        code, text = channel_error(ch.queue_declare, name, passive=True)
        assert (code, text) == (404, f"NOT_FOUND - no queue '{name}' in vhost '/'")
    finally:
        open_connection().channel().queue_delete(name)


def test_queue_names_end_at_255_bytes(channel, uid):
    # A shortstr's length is one octet: 255 bytes is the longest name a client can send. A
    # longer one never reaches the broker; pika refuses to encode it.
    prefix = f"{uid}-"
    name = prefix + "é" * ((255 - len(prefix)) // 2) + "a" * ((255 - len(prefix)) % 2)
    assert len(name.encode()) == 255
    assert channel.queue_declare(name, exclusive=True).method.queue == name
    with pytest.raises(pika.exceptions.ShortStringTooLong):
        channel.queue_declare(name + "é", exclusive=True)


def test_amq_prefix_is_reserved(channel):
    code, text = channel_error(channel.queue_declare, "amq.warren-compat")
    assert (code, text) == (
        403,
        "ACCESS_REFUSED - queue name 'amq.warren-compat' contains reserved prefix 'amq.*'",
    )


@pytest.mark.parametrize(
    "first,second,arg,received,current",
    [
        ({"durable": False}, {"durable": True}, "durable", "'true'", "'false'"),
        ({"auto_delete": True}, {"auto_delete": False}, "auto_delete", "'false'", "'true'"),
    ],
    ids=["durable", "auto_delete"],
)
def test_redeclare_inequivalent_flag_is_406(connection, uid, first, second, arg, received, current):
    name = f"{uid}-q"
    connection.channel().queue_declare(name, **first)
    code, text = channel_error(connection.channel().queue_declare, name, **second)
    assert code == 406
    assert text == (
        f"PRECONDITION_FAILED - inequivalent arg '{arg}' for queue '{name}' in vhost '/': "
        f"received {received} but current is {current}"
    )
    connection.channel().queue_delete(name)


def test_redeclare_inequivalent_argument_is_406(connection, uid):
    name = f"{uid}-q"
    connection.channel().queue_declare(name, exclusive=True, arguments={"x-max-length": 5})
    code, text = channel_error(
        connection.channel().queue_declare, name, exclusive=True, arguments={"x-max-length": 10}
    )
    assert code == 406
    assert text == (
        f"PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue '{name}' in vhost '/': "
        "received '10' but current is '5'"
    )
    code, text = channel_error(connection.channel().queue_declare, name, exclusive=True)
    assert code == 406
    assert text == (
        f"PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue '{name}' in vhost '/': "
        "received none but current is the value '5' of type 'signedint'"
    )


@pytest.mark.parametrize(
    "arguments,explanation",
    [
        ({"x-max-length": -1}, "{value_negative,-1}"),
        ({"x-message-ttl": "soon"}, '"expected integer, got longstr"'),
        ({"x-expires": 0}, "{value_zero,0}"),
        ({"x-max-priority": 300}, "{max_value_exceeded,300}"),
        ({"x-overflow": "drop-everything"}, "invalid_overflow"),
    ],
    ids=["negative-length", "ttl-type", "expires-zero", "priority-too-large", "overflow-value"],
)
def test_invalid_argument_is_406(channel, uid, arguments, explanation):
    (arg,) = arguments
    code, text = channel_error(
        channel.queue_declare, f"{uid}-q", exclusive=True, arguments=arguments
    )
    assert code == 406
    assert text == (
        f"PRECONDITION_FAILED - invalid arg '{arg}' for queue '{uid}-q' in vhost '/': {explanation}"
    )


def test_unknown_queue_type_is_406(channel, uid):
    code, text = channel_error(
        channel.queue_declare, f"{uid}-q", durable=True, arguments={"x-queue-type": "bogus"}
    )
    assert code == 406
    assert text == (
        f"PRECONDITION_FAILED - invalid arg 'x-queue-type' for queue '{uid}-q' in vhost '/': "
        "\"unsupported queue type 'bogus'\""
    )


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_classic_and_quorum_queues_round_trip(connection, uid, queue_type):
    ch = connection.channel()
    ch.confirm_delivery()
    name = f"{uid}-{queue_type}"
    ch.queue_declare(name, durable=True, arguments={"x-queue-type": queue_type})
    ch.basic_publish("", name, b"payload", pika.BasicProperties(delivery_mode=2))
    method, _, body = wait_get(ch, name)
    assert body == b"payload"
    ch.basic_ack(method.delivery_tag)
    assert ch.queue_delete(name).method.message_count == 0


def test_quorum_queue_cannot_be_exclusive(channel, uid):
    code, text = channel_error(
        channel.queue_declare,
        f"{uid}-q",
        durable=True,
        exclusive=True,
        arguments={"x-queue-type": "quorum"},
    )
    assert code == 406
    assert text == (
        f"PRECONDITION_FAILED - invalid property 'exclusive-owner' for queue '{uid}-q' in vhost '/'"
    )


def test_exclusive_queue_is_locked_to_its_connection(connection, open_connection, uid):
    connection.channel().queue_declare(f"{uid}-q", exclusive=True)
    locked = (
        f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{uid}-q' in vhost '/'. "
        "It could be originally declared on another connection or the exclusive property value "
        "does not match that of the original declaration."
    )
    other = open_connection()
    for call, args, kwargs in [
        ("queue_declare", (f"{uid}-q",), {"exclusive": True}),
        ("queue_declare", (f"{uid}-q",), {"passive": True}),
        ("basic_consume", (f"{uid}-q", lambda *a: None), {}),
        ("basic_get", (f"{uid}-q",), {}),
        ("queue_purge", (f"{uid}-q",), {}),
        ("queue_delete", (f"{uid}-q",), {}),
    ]:
        code, text = channel_error(getattr(other.channel(), call), *args, **kwargs)
        assert (code, text) == (405, locked), call


def test_exclusive_queue_goes_with_its_connection(open_connection, uid):
    owner = open_connection()
    owner.channel().queue_declare(f"{uid}-q", exclusive=True)
    owner.close()
    code, _ = channel_error(open_connection().channel().queue_declare, f"{uid}-q", passive=True)
    assert code == 404


def test_auto_delete_queue_goes_with_its_last_consumer(connection, open_connection, uid):
    ch = connection.channel()
    ch.queue_declare(f"{uid}-q", auto_delete=True)
    first = ch.basic_consume(f"{uid}-q", lambda *a: None)
    second = ch.basic_consume(f"{uid}-q", lambda *a: None)
    ch.basic_cancel(first)
    ch.queue_declare(f"{uid}-q", passive=True)
    ch.basic_cancel(second)
    code, _ = channel_error(open_connection().channel().queue_declare, f"{uid}-q", passive=True)
    assert code == 404


def test_auto_delete_queue_without_consumers_stays(connection, uid):
    ch = connection.channel()
    ch.queue_declare(f"{uid}-q", auto_delete=True)
    ch.basic_publish("", f"{uid}-q", b"x")
    sync(ch)
    assert ch.queue_declare(f"{uid}-q", passive=True).method.message_count == 1
    ch.queue_delete(f"{uid}-q")


def test_purge_removes_ready_but_not_unacked(connection, uid):
    ch = connection.channel()
    ch.queue_declare(f"{uid}-q", exclusive=True)
    for i in range(5):
        ch.basic_publish("", f"{uid}-q", str(i).encode())
    method, _, _ = wait_get(ch, f"{uid}-q")
    assert ch.queue_purge(f"{uid}-q").method.message_count == 4
    assert ch.queue_purge(f"{uid}-q").method.message_count == 0
    ch.basic_reject(method.delivery_tag, requeue=True)
    sync(ch)
    assert ch.queue_declare(f"{uid}-q", passive=True).method.message_count == 1


def test_purge_of_missing_queue_is_404(channel, uid):
    code, text = channel_error(channel.queue_purge, f"{uid}-nope")
    assert (code, text) == (404, f"NOT_FOUND - no queue '{uid}-nope' in vhost '/'")


def test_delete_returns_message_count(channel, uid):
    channel.queue_declare(f"{uid}-q")
    for _ in range(3):
        channel.basic_publish("", f"{uid}-q", b"x")
    sync(channel)
    assert channel.queue_delete(f"{uid}-q").method.message_count == 3


def test_delete_missing_queue_is_ok(channel, uid):
    assert channel.queue_delete(f"{uid}-nope").method.message_count == 0


def test_delete_if_empty(connection, uid):
    ch = connection.channel()
    ch.queue_declare(f"{uid}-q")
    ch.basic_publish("", f"{uid}-q", b"x")
    sync(ch)
    code, text = channel_error(ch.queue_delete, f"{uid}-q", if_empty=True)
    assert (code, text) == (406, f"PRECONDITION_FAILED - queue '{uid}-q' in vhost '/' not empty")
    connection.channel().queue_delete(f"{uid}-q")


def test_delete_if_unused(connection, uid):
    ch = connection.channel()
    ch.queue_declare(f"{uid}-q")
    ch.basic_consume(f"{uid}-q", lambda *a: None)
    code, text = channel_error(connection.channel().queue_delete, f"{uid}-q", if_unused=True)
    assert (code, text) == (406, f"PRECONDITION_FAILED - queue '{uid}-q' in vhost '/' in use")
    connection.channel().queue_delete(f"{uid}-q")


def test_unbind_stops_routing(channel, uid):
    channel.queue_declare(f"{uid}-q", exclusive=True)
    channel.queue_bind(f"{uid}-q", "amq.direct", "k")
    channel.basic_publish("amq.direct", "k", b"1")
    channel.queue_unbind(f"{uid}-q", "amq.direct", "k")
    channel.basic_publish("amq.direct", "k", b"2")
    sync(channel)
    assert channel.queue_declare(f"{uid}-q", passive=True).method.message_count == 1


def test_deleting_a_queue_removes_its_bindings(channel, uid):
    channel.exchange_declare(f"{uid}-x", "fanout", auto_delete=True)
    channel.queue_declare(f"{uid}-q")
    channel.queue_declare(f"{uid}-keep", exclusive=True)
    channel.queue_bind(f"{uid}-q", f"{uid}-x")
    channel.queue_bind(f"{uid}-keep", f"{uid}-x")
    channel.queue_delete(f"{uid}-q")
    channel.queue_declare(f"{uid}-q")
    channel.basic_publish(f"{uid}-x", "", b"x")
    sync(channel)
    assert channel.queue_declare(f"{uid}-q", passive=True).method.message_count == 0
    channel.queue_delete(f"{uid}-q")

"""Exchanges: declare/delete rules and texts, every routing type, e2e bindings, alternates."""

from __future__ import annotations

import pika
import pytest
from pika_helpers import channel_error, connection_error, drain, sync

BUILTIN = {
    "amq.direct": "direct",
    "amq.fanout": "fanout",
    "amq.topic": "topic",
    "amq.headers": "headers",
    "amq.match": "headers",
}


@pytest.mark.parametrize("name,kind", sorted(BUILTIN.items()))
def test_builtin_exchanges_exist(channel, name, kind):
    channel.exchange_declare(name, kind, passive=True)
    channel.exchange_declare(name, kind, durable=True)


def test_redeclare_equivalent_is_ok(channel, uid):
    channel.exchange_declare(f"{uid}-x", "topic", auto_delete=True)
    channel.exchange_declare(f"{uid}-x", "topic", auto_delete=True)
    channel.exchange_declare(f"{uid}-x", "topic", passive=True)
    channel.exchange_delete(f"{uid}-x")


@pytest.mark.parametrize(
    "first,second,arg,received,current",
    [
        ({"exchange_type": "direct"}, {"exchange_type": "fanout"}, "type", "'fanout'", "'direct'"),
        ({"durable": False}, {"durable": True}, "durable", "'true'", "'false'"),
        ({"auto_delete": True}, {"auto_delete": False}, "auto_delete", "'false'", "'true'"),
        ({"internal": False}, {"internal": True}, "internal", "'true'", "'false'"),
    ],
    ids=["type", "durable", "auto_delete", "internal"],
)
def test_redeclare_inequivalent_is_406(connection, uid, first, second, arg, received, current):
    name = f"{uid}-x"
    setup = connection.channel()
    setup.exchange_declare(name, **first)
    code, text = channel_error(connection.channel().exchange_declare, name, **second)
    assert code == 406
    assert text == (
        f"PRECONDITION_FAILED - inequivalent arg '{arg}' for exchange '{name}' in vhost '/': "
        f"received {received} but current is {current}"
    )
    setup.exchange_delete(name)


def test_redeclare_with_other_alternate_exchange_is_406(connection, uid):
    name = f"{uid}-x"
    setup = connection.channel()
    setup.exchange_declare(name, arguments={"alternate-exchange": "ae-one"})
    code, text = channel_error(
        connection.channel().exchange_declare, name, arguments={"alternate-exchange": "ae-two"}
    )
    assert code == 406
    assert text == (
        f"PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' for exchange '{name}' "
        "in vhost '/': received 'ae-two' but current is 'ae-one'"
    )
    setup.exchange_delete(name)


def test_passive_declare_of_missing_exchange_is_404(channel, uid):
    code, text = channel_error(channel.exchange_declare, f"{uid}-nope", passive=True)
    assert (code, text) == (404, f"NOT_FOUND - no exchange '{uid}-nope' in vhost '/'")


def test_amq_prefix_is_reserved(channel):
    code, text = channel_error(channel.exchange_declare, "amq.warren-compat", "direct")
    assert (code, text) == (
        403,
        "ACCESS_REFUSED - exchange name 'amq.warren-compat' contains reserved prefix 'amq.*'",
    )


def test_builtin_exchange_cannot_be_deleted(connection):
    code, text = channel_error(connection.channel().exchange_delete, "amq.direct")
    assert (code, text) == (
        403,
        "ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost '/' not allowed",
    )
    code, text = channel_error(connection.channel().exchange_delete, "")
    assert (code, text) == (403, "ACCESS_REFUSED - operation not permitted on the default exchange")


def test_unknown_exchange_type_closes_connection(connection, uid):
    code, text = connection_error(connection.channel().exchange_declare, f"{uid}-x", "bogus")
    assert (code, text) == (503, "COMMAND_INVALID - unknown exchange type 'bogus'")


def test_delete_missing_exchange_is_ok(channel, uid):
    channel.exchange_delete(f"{uid}-never-declared")


def test_delete_if_unused(connection, uid):
    ch = connection.channel()
    ch.exchange_declare(f"{uid}-x", "direct")
    ch.queue_declare(f"{uid}-q", exclusive=True)
    ch.queue_bind(f"{uid}-q", f"{uid}-x", "k")
    code, text = channel_error(ch.exchange_delete, f"{uid}-x", if_unused=True)
    assert (code, text) == (406, f"PRECONDITION_FAILED - exchange '{uid}-x' in vhost '/' in use")
    ch = connection.channel()
    ch.queue_unbind(f"{uid}-q", f"{uid}-x", "k")
    ch.exchange_delete(f"{uid}-x", if_unused=True)
    code, _ = channel_error(ch.exchange_declare, f"{uid}-x", passive=True)
    assert code == 404


def test_publish_to_missing_exchange_is_404(channel, uid):
    channel.basic_publish(f"{uid}-nope", "k", b"x")
    code, text = channel_error(sync, channel)
    assert (code, text) == (404, f"NOT_FOUND - no exchange '{uid}-nope' in vhost '/'")


def test_publish_to_internal_exchange_is_403(connection, uid):
    ch = connection.channel()
    ch.exchange_declare(f"{uid}-int", "fanout", internal=True, auto_delete=True)
    ch.queue_declare(f"{uid}-q", exclusive=True)
    ch.queue_bind(f"{uid}-q", f"{uid}-int")
    ch.basic_publish(f"{uid}-int", "", b"x")
    code, text = channel_error(sync, ch)
    assert (code, text) == (
        403,
        f"ACCESS_REFUSED - cannot publish to internal exchange '{uid}-int' in vhost '/'",
    )


def test_bind_errors(connection, uid):
    ch = connection.channel()
    ch.queue_declare(f"{uid}-q", exclusive=True)
    code, text = channel_error(ch.queue_bind, f"{uid}-q", f"{uid}-nope", "k")
    assert (code, text) == (404, f"NOT_FOUND - no exchange '{uid}-nope' in vhost '/'")
    ch = connection.channel()
    code, text = channel_error(ch.queue_bind, f"{uid}-nope", "amq.direct", "k")
    assert (code, text) == (404, f"NOT_FOUND - no queue '{uid}-nope' in vhost '/'")
    ch = connection.channel()
    code, text = channel_error(ch.queue_bind, f"{uid}-q", "", "k")
    assert (code, text) == (403, "ACCESS_REFUSED - operation not permitted on the default exchange")


def test_default_exchange_routes_by_queue_name(channel, uid):
    channel.queue_declare(f"{uid}-q", exclusive=True)
    channel.basic_publish("", f"{uid}-q", b"one")
    channel.basic_publish("", f"{uid}-elsewhere", b"lost")
    sync(channel)
    assert drain(channel, f"{uid}-q") == [b"one"]


def test_direct_and_fanout_routing(channel, uid):
    channel.exchange_declare(f"{uid}-d", "direct", auto_delete=True)
    channel.exchange_declare(f"{uid}-f", "fanout", auto_delete=True)
    for name in ("a", "b"):
        channel.queue_declare(f"{uid}-{name}", exclusive=True)
        channel.queue_bind(f"{uid}-{name}", f"{uid}-f", "ignored")
    channel.queue_bind(f"{uid}-a", f"{uid}-d", "red")
    channel.queue_bind(f"{uid}-b", f"{uid}-d", "blue")
    channel.queue_bind(f"{uid}-b", f"{uid}-d", "red")
    channel.basic_publish(f"{uid}-d", "red", b"red")
    channel.basic_publish(f"{uid}-d", "blue", b"blue")
    channel.basic_publish(f"{uid}-d", "green", b"green")
    channel.basic_publish(f"{uid}-f", "anything", b"fan")
    sync(channel)
    assert drain(channel, f"{uid}-a") == [b"red", b"fan"]
    assert drain(channel, f"{uid}-b") == [b"red", b"blue", b"fan"]


TOPIC_BINDINGS = {
    "star-middle": "*.orange.*",
    "star-end": "*.*.rabbit",
    "hash-end": "lazy.#",
    "hash-all": "#",
    "hash-middle": "a.#.z",
    "exact": "quick.orange.rabbit",
}
TOPIC_CASES = {
    "quick.orange.rabbit": {"star-middle", "star-end", "hash-all", "exact"},
    "lazy.orange.elephant": {"star-middle", "hash-end", "hash-all"},
    "quick.orange.fox": {"star-middle", "hash-all"},
    "lazy.brown.fox": {"hash-end", "hash-all"},
    "lazy": {"hash-end", "hash-all"},
    "quick.orange.male.rabbit": {"hash-all"},
    "a.z": {"hash-all", "hash-middle"},
    "a.b.c.z": {"hash-all", "hash-middle"},
    "": {"hash-all"},
}


def test_topic_routing(channel, uid):
    channel.exchange_declare(f"{uid}-t", "topic", auto_delete=True)
    for name, pattern in TOPIC_BINDINGS.items():
        channel.queue_declare(f"{uid}-{name}", exclusive=True)
        channel.queue_bind(f"{uid}-{name}", f"{uid}-t", pattern)
    for key in TOPIC_CASES:
        channel.basic_publish(f"{uid}-t", key, key.encode())
    sync(channel)
    for name in TOPIC_BINDINGS:
        got = drain(channel, f"{uid}-{name}")
        expected = [key.encode() for key, names in TOPIC_CASES.items() if name in names]
        assert got == expected, name


HEADER_BINDINGS = {
    "all": {"x-match": "all", "colour": "red", "size": 1},
    "any": {"x-match": "any", "colour": "red", "size": 1},
    "all-with-x": {"x-match": "all-with-x", "x-tag": "t"},
    "any-with-x": {"x-match": "any-with-x", "x-tag": "t", "colour": "blue"},
    "default-all": {"colour": "red"},
    # x-match all ignores x- keys in the binding, so an all-x binding matches everything.
    "x-ignored": {"x-match": "all", "x-tag": "t"},
}
HEADER_CASES = [
    ({"colour": "red", "size": 1}, {"all", "any", "default-all", "x-ignored"}),
    ({"colour": "red"}, {"any", "default-all", "x-ignored"}),
    ({"size": 1, "x-tag": "t"}, {"any", "all-with-x", "any-with-x", "x-ignored"}),
    ({"colour": "blue"}, {"any-with-x", "x-ignored"}),
    ({"size": "1"}, {"x-ignored"}),
    ({}, {"x-ignored"}),
]


def test_headers_routing(channel, uid):
    for name, arguments in HEADER_BINDINGS.items():
        channel.queue_declare(f"{uid}-{name}", exclusive=True)
        channel.queue_bind(f"{uid}-{name}", "amq.match", "", arguments=arguments)
    for index, (headers, _) in enumerate(HEADER_CASES):
        channel.basic_publish(
            "amq.match", "", str(index).encode(), pika.BasicProperties(headers=headers)
        )
    sync(channel)
    for name in HEADER_BINDINGS:
        got = drain(channel, f"{uid}-{name}")
        expected = [str(i).encode() for i, (_, names) in enumerate(HEADER_CASES) if name in names]
        assert got == expected, name


def test_headers_bad_x_match_is_406(channel, uid):
    channel.queue_declare(f"{uid}-q", exclusive=True)
    code, text = channel_error(
        channel.queue_bind, f"{uid}-q", "amq.headers", "", arguments={"x-match": "some"}
    )
    assert code == 406
    assert text == (
        'PRECONDITION_FAILED - Invalid x-match field value <<"some">>; '
        "expected all, any, all-with-x, or any-with-x"
    )


def test_exchange_to_exchange_bindings(channel, uid):
    channel.exchange_declare(f"{uid}-src", "topic")
    channel.exchange_declare(f"{uid}-dst", "fanout", auto_delete=True)
    channel.queue_declare(f"{uid}-q", exclusive=True)
    channel.queue_bind(f"{uid}-q", f"{uid}-dst")
    channel.exchange_bind(f"{uid}-dst", f"{uid}-src", "orders.*")
    channel.basic_publish(f"{uid}-src", "orders.new", b"routed")
    channel.basic_publish(f"{uid}-src", "invoices.new", b"not routed")
    sync(channel)
    assert drain(channel, f"{uid}-q") == [b"routed"]
    channel.exchange_unbind(f"{uid}-dst", f"{uid}-src", "orders.*")
    channel.basic_publish(f"{uid}-src", "orders.new", b"after unbind")
    sync(channel)
    assert drain(channel, f"{uid}-q") == []
    channel.exchange_delete(f"{uid}-src")


def test_auto_delete_source_goes_with_its_last_exchange_binding(channel, uid):
    channel.exchange_declare(f"{uid}-src", "topic", auto_delete=True)
    channel.exchange_declare(f"{uid}-dst", "fanout", auto_delete=True)
    channel.exchange_bind(f"{uid}-dst", f"{uid}-src", "k")
    channel.exchange_unbind(f"{uid}-dst", f"{uid}-src", "k")
    code, _ = channel_error(channel.exchange_declare, f"{uid}-src", passive=True)
    assert code == 404


def test_exchange_bind_to_missing_exchange_is_404(channel, uid):
    channel.exchange_declare(f"{uid}-dst", "fanout", auto_delete=True)
    code, text = channel_error(channel.exchange_bind, f"{uid}-dst", f"{uid}-nope", "k")
    assert (code, text) == (404, f"NOT_FOUND - no exchange '{uid}-nope' in vhost '/'")


def test_exchange_to_exchange_cycle_delivers_once(channel, uid):
    channel.exchange_declare(f"{uid}-a", "fanout", auto_delete=True)
    channel.exchange_declare(f"{uid}-b", "fanout", auto_delete=True)
    channel.exchange_bind(f"{uid}-b", f"{uid}-a")
    channel.exchange_bind(f"{uid}-a", f"{uid}-b")
    channel.queue_declare(f"{uid}-q", exclusive=True)
    channel.queue_bind(f"{uid}-q", f"{uid}-a")
    channel.queue_bind(f"{uid}-q", f"{uid}-b")
    channel.basic_publish(f"{uid}-a", "", b"once")
    sync(channel)
    assert drain(channel, f"{uid}-q") == [b"once"]


def test_alternate_exchange_takes_unroutable(channel, uid):
    returned = []
    channel.add_on_return_callback(lambda *args: returned.append(args[3]))
    channel.exchange_declare(f"{uid}-ae", "fanout", auto_delete=True)
    channel.queue_declare(f"{uid}-unrouted", exclusive=True)
    channel.queue_bind(f"{uid}-unrouted", f"{uid}-ae")
    channel.exchange_declare(
        f"{uid}-x", "direct", auto_delete=True, arguments={"alternate-exchange": f"{uid}-ae"}
    )
    channel.queue_declare(f"{uid}-routed", exclusive=True)
    channel.queue_bind(f"{uid}-routed", f"{uid}-x", "known")
    channel.basic_publish(f"{uid}-x", "known", b"a", mandatory=True)
    channel.basic_publish(f"{uid}-x", "unknown", b"b", mandatory=True)
    sync(channel)
    assert drain(channel, f"{uid}-routed") == [b"a"]
    assert drain(channel, f"{uid}-unrouted") == [b"b"]
    assert returned == []


def test_missing_alternate_exchange_means_unroutable(channel, uid):
    returned = []
    channel.add_on_return_callback(
        lambda ch, method, props, body: returned.append(
            (method.reply_code, method.reply_text, body)
        )
    )
    channel.exchange_declare(
        f"{uid}-x", "direct", auto_delete=True, arguments={"alternate-exchange": f"{uid}-absent"}
    )
    channel.basic_publish(f"{uid}-x", "k", b"lost", mandatory=True)
    sync(channel)
    channel.connection.process_data_events(time_limit=0.2)
    assert returned == [(312, "NO_ROUTE", b"lost")]


def test_auto_delete_exchange_goes_with_its_last_binding(connection, uid):
    ch = connection.channel()
    ch.exchange_declare(f"{uid}-x", "direct", auto_delete=True)
    ch.queue_declare(f"{uid}-q", exclusive=True)
    ch.queue_bind(f"{uid}-q", f"{uid}-x", "k")
    ch.exchange_declare(f"{uid}-x", "direct", passive=True)
    ch.queue_unbind(f"{uid}-q", f"{uid}-x", "k")
    code, _ = channel_error(ch.exchange_declare, f"{uid}-x", passive=True)
    assert code == 404


def test_unbind_of_missing_binding_is_ok(channel, uid):
    channel.queue_declare(f"{uid}-q", exclusive=True)
    channel.queue_unbind(f"{uid}-q", "amq.direct", "never-bound")

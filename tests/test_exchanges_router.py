"""Router: RabbitMQ's declare/delete/bind rules and texts, auto-delete, exchange-to-exchange
bindings, alternate exchanges (with cycles), the default exchange and the route cache."""

from __future__ import annotations

import pytest

from warrenmq.exchanges.binding import EXCHANGE, QUEUE, Destination
from warrenmq.exchanges.errors import (
    AccessRefused,
    CommandInvalid,
    NotFound,
    PreconditionFailed,
    RoutingError,
)
from warrenmq.exchanges.router import PREDECLARED, Change, Router


class Queues(set):
    """The queues that exist, as the broker would report them."""


@pytest.fixture
def queues() -> Queues:
    return Queues({"q1", "q2", "q3", "q4"})


@pytest.fixture
def router(queues: Queues) -> Router:
    return Router("/", queue_exists=queues.__contains__)


def refused(call, error: type[RoutingError], text: str) -> RoutingError:
    with pytest.raises(error) as caught:
        call()
    assert caught.value.reply_text == text
    return caught.value


# --- predeclared exchanges ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "type_name", "internal"),
    [
        ("", "direct", False),
        ("amq.direct", "direct", False),
        ("amq.fanout", "fanout", False),
        ("amq.topic", "topic", False),
        ("amq.headers", "headers", False),
        ("amq.match", "headers", False),
        ("amq.rabbitmq.trace", "topic", True),
    ],
)
def test_predeclared_exchanges(router: Router, name: str, type_name: str, internal: bool) -> None:
    exchange = router.get(name)
    assert exchange is not None
    assert (exchange.type, exchange.durable, exchange.auto_delete, exchange.internal) == (
        type_name,
        True,
        False,
        internal,
    )
    assert len(PREDECLARED) == 7


def test_redeclaring_amq_exchanges_equivalently_is_fine_and_otherwise_406(router: Router) -> None:
    declared = router.declare("amq.direct", "direct", durable=True)
    assert not declared.created and declared.exchange is router.get("amq.direct")
    refused(
        lambda: router.declare("amq.direct", "direct", durable=False),
        PreconditionFailed,
        "inequivalent arg 'durable' for exchange 'amq.direct' in vhost '/': "
        "received 'false' but current is 'true'",
    )
    refused(
        lambda: router.declare("amq.topic", "fanout", durable=True),
        PreconditionFailed,
        "inequivalent arg 'type' for exchange 'amq.topic' in vhost '/': "
        "received 'fanout' but current is 'topic'",
    )


def test_binding_to_and_from_amq_exchanges_is_allowed(router: Router) -> None:
    assert router.bind_queue("amq.direct", "q1", "k")
    assert router.bind_exchange("amq.fanout", "amq.direct", "k")
    assert router.route("amq.fanout", "k") == {"q1"}


# --- declare --------------------------------------------------------------------------------


def test_declare_creates_then_finds(router: Router) -> None:
    first = router.declare("x", "topic", durable=True, arguments={"a": 1})
    assert first.created
    assert (first.exchange.name, first.exchange.type, first.exchange.durable) == (
        "x",
        "topic",
        True,
    )
    again = router.declare("x", "topic", durable=True)
    assert not again.created and again.exchange is first.exchange


def test_passive_declare(router: Router) -> None:
    router.declare("x", "fanout")
    assert router.declare("x", "direct", passive=True, durable=True).exchange.type == "fanout"
    error = refused(
        lambda: router.declare("nope", "direct", passive=True),
        NotFound,
        "no exchange 'nope' in vhost '/'",
    )
    assert error.reply_code == 404 and not error.connection_level
    # passive skips the type check, as RabbitMQ does
    assert router.declare("x", "bogus", passive=True).exchange.name == "x"
    refused(
        lambda: router.declare("", "direct", passive=True),
        AccessRefused,
        "operation not permitted on the default exchange",
    )


@pytest.mark.parametrize(
    ("field", "kwargs", "received", "current"),
    [
        ("type", {"type_name": "fanout"}, "'fanout'", "'direct'"),
        ("durable", {"durable": True}, "'true'", "'false'"),
        ("auto_delete", {"auto_delete": True}, "'true'", "'false'"),
        ("internal", {"internal": True}, "'true'", "'false'"),
    ],
)
def test_inequivalent_fields(
    router: Router, field: str, kwargs: dict, received: str, current: str
) -> None:
    router.declare("x", "direct")
    arguments = {"type_name": "direct", **kwargs}
    error = refused(
        lambda: router.declare("x", **arguments),
        PreconditionFailed,
        f"inequivalent arg '{field}' for exchange 'x' in vhost '/': "
        f"received {received} but current is {current}",
    )
    assert error.reply_code == 406 and not error.connection_level


def test_fields_are_checked_in_rabbitmqs_order(router: Router) -> None:
    router.declare("x", "direct")
    with pytest.raises(PreconditionFailed, match="'type'"):
        router.declare("x", "topic", durable=True, internal=True)
    with pytest.raises(PreconditionFailed, match="'durable'"):
        router.declare("x", "direct", durable=True, auto_delete=True)
    with pytest.raises(PreconditionFailed, match="'auto_delete'"):
        router.declare("x", "direct", auto_delete=True, internal=True)


def test_alternate_exchange_argument_equivalence(router: Router) -> None:
    router.declare("x", "direct", arguments={"alternate-exchange": "ae1"})
    router.declare("x", "direct", arguments={"alternate-exchange": "ae1", "other": 5})
    router.declare("x", "direct", arguments={"alternate-exchange": b"ae1"})
    refused(
        lambda: router.declare("x", "direct", arguments={"alternate-exchange": "ae2"}),
        PreconditionFailed,
        "inequivalent arg 'alternate-exchange' for exchange 'x' in vhost '/': "
        "received 'ae2' but current is 'ae1'",
    )
    refused(
        lambda: router.declare("x", "direct"),
        PreconditionFailed,
        "inequivalent arg 'alternate-exchange' for exchange 'x' in vhost '/': "
        "received none but current is the value 'ae1' of type 'longstr'",
    )
    router.declare("y", "direct")
    refused(
        lambda: router.declare("y", "direct", arguments={"alternate-exchange": "ae"}),
        PreconditionFailed,
        "inequivalent arg 'alternate-exchange' for exchange 'y' in vhost '/': "
        "received the value 'ae' of type 'longstr' but current is none",
    )
    refused(
        lambda: router.declare("y", "direct", arguments={"alternate-exchange": None}),
        PreconditionFailed,
        "inequivalent arg 'alternate-exchange' for exchange 'y' in vhost '/': "
        "received the value 'undefined' of type 'void' but current is none",
    )


def test_other_arguments_are_not_compared(router: Router) -> None:
    router.declare("x", "direct", arguments={"foo": 1})
    router.declare("x", "direct", arguments={"foo": 2, "bar": "z"})


def test_alternate_exchange_of_wrong_type_is_refused_at_creation(router: Router) -> None:
    refused(
        lambda: router.declare("x", "direct", arguments={"alternate-exchange": 7}),
        PreconditionFailed,
        "invalid type 'signedint' for arg 'alternate-exchange' in exchange 'x' in vhost '/'",
    )
    assert router.get("x") is None


def test_unknown_type_is_a_connection_error(router: Router) -> None:
    error = refused(
        lambda: router.declare("x", "x-consistent-hash-nope"),
        CommandInvalid,
        "unknown exchange type 'x-consistent-hash-nope'",
    )
    assert error.reply_code == 503 and error.connection_level
    # the type is checked before the default-exchange rule, as in rabbit_channel
    refused(lambda: router.declare("", "nope"), CommandInvalid, "unknown exchange type 'nope'")


def test_default_exchange_cannot_be_declared(router: Router) -> None:
    error = refused(
        lambda: router.declare("", "direct", durable=True),
        AccessRefused,
        "operation not permitted on the default exchange",
    )
    assert error.reply_code == 403 and not error.connection_level


def test_new_amq_names_are_reserved(router: Router) -> None:
    refused(
        lambda: router.declare("amq.mine", "direct"),
        AccessRefused,
        "exchange name 'amq.mine' contains reserved prefix 'amq.*'",
    )
    refused(
        lambda: router.declare("amq.mine", "direct", passive=True),
        NotFound,
        "no exchange 'amq.mine' in vhost '/'",
    )


def test_names_lose_cr_and_lf(router: Router) -> None:
    assert router.declare("a\r\nb", "fanout").exchange.name == "ab"
    assert router.declare("ab", "fanout", passive=True).created is False
    assert router.bind_queue("a\nb", "q\r1")
    assert router.route("ab", "") == {"q1"}


def test_vhost_appears_in_texts(queues: Queues) -> None:
    router = Router("prod", queue_exists=queues.__contains__)
    refused(lambda: router.route("nope", ""), NotFound, "no exchange 'nope' in vhost 'prod'")


# --- delete ---------------------------------------------------------------------------------


def test_delete(router: Router) -> None:
    router.declare("x", "direct")
    router.bind_queue("x", "q1", "k")
    assert router.delete("x") == Change(True, ("x",))
    assert router.get("x") is None
    assert router.sources_of(Destination(QUEUE, "q1")) == []
    assert router.delete("x") == Change(False)  # missing is not an error


def test_delete_if_unused(router: Router) -> None:
    router.declare("x", "direct")
    router.declare("y", "direct")
    router.bind_queue("x", "q1", "k")
    router.bind_exchange("y", "x", "k")  # x is a destination: still unused
    refused(
        lambda: router.delete("x", if_unused=True),
        PreconditionFailed,
        "exchange 'x' in vhost '/' in use",
    )
    router.unbind_queue("x", "q1", "k")
    assert router.delete("x", if_unused=True).changed
    assert router.bindings("y") == []  # y's binding to x went with x


def test_system_and_default_exchanges_cannot_be_deleted(router: Router) -> None:
    refused(
        lambda: router.delete("amq.direct"),
        AccessRefused,
        "deletion of system exchange 'amq.direct' in vhost '/' not allowed",
    )
    refused(
        lambda: router.delete("amq.nonexistent"),
        AccessRefused,
        "deletion of system exchange 'amq.nonexistent' in vhost '/' not allowed",
    )
    refused(
        lambda: router.delete(""), AccessRefused, "operation not permitted on the default exchange"
    )


# --- bind / unbind --------------------------------------------------------------------------


def test_bind_and_unbind_report_changes(router: Router) -> None:
    router.declare("x", "direct")
    generation = router.generation
    assert router.bind_queue("x", "q1", "k")
    assert router.generation > generation
    generation = router.generation
    assert not router.bind_queue("x", "q1", "k")
    assert router.generation == generation
    assert router.unbind_queue("x", "q1", "k") == Change(True)
    assert router.unbind_queue("x", "q1", "k") == Change(False)
    assert router.unbind_queue("missing", "q1", "k") == Change(False)
    assert router.unbind_queue("x", "missing", "k") == Change(False)


def test_bind_needs_both_ends(router: Router) -> None:
    router.declare("x", "direct")
    refused(
        lambda: router.bind_queue("nope", "nope", "k"), NotFound, "no exchange 'nope' in vhost '/'"
    )
    refused(lambda: router.bind_queue("x", "nope", "k"), NotFound, "no queue 'nope' in vhost '/'")
    refused(
        lambda: router.bind_exchange("x", "nope", "k"), NotFound, "no exchange 'nope' in vhost '/'"
    )


def test_default_exchange_cannot_be_bound(router: Router) -> None:
    router.declare("x", "direct")
    text = "operation not permitted on the default exchange"
    refused(lambda: router.bind_queue("", "q1", "q1"), AccessRefused, text)
    refused(lambda: router.bind_exchange("x", "", "k"), AccessRefused, text)
    refused(lambda: router.unbind_queue("", "q1", "q1"), AccessRefused, text)
    refused(lambda: router.unbind_exchange("x", "", "k"), AccessRefused, text)


def test_headers_binding_is_validated(router: Router) -> None:
    refused(
        lambda: router.bind_queue("amq.headers", "q1", "", {"x-match": "some"}),
        PreconditionFailed,
        'Invalid x-match field value <<"some">>; expected all, any, all-with-x, or any-with-x',
    )
    assert router.bindings("amq.headers") == []
    # other types do not look at x-match
    assert router.bind_queue("amq.direct", "q1", "", {"x-match": "some"})


def test_bindings_listing(router: Router) -> None:
    router.declare("x", "topic")
    router.bind_queue("x", "q1", "a.#", {"k": 1})
    router.bind_exchange("x", "amq.fanout", "b")
    listed = {
        (b.destination, b.routing_key, tuple(b.arguments.items())) for b in router.bindings("x")
    }
    assert listed == {
        (Destination(QUEUE, "q1"), "a.#", (("k", 1),)),
        (Destination(EXCHANGE, "amq.fanout"), "b", ()),
    }
    assert router.sources_of(Destination(EXCHANGE, "amq.fanout")) == ["x"]
    router.bind_queue("amq.direct", "q1", "k")
    assert [(s, b.routing_key) for s, b in router.bindings_to(Destination(QUEUE, "q1"))] == [
        ("amq.direct", "k"),
        ("x", "a.#"),
    ]


# --- auto-delete ----------------------------------------------------------------------------


def test_auto_delete_only_after_the_last_source_binding_goes(router: Router) -> None:
    router.declare("x", "direct", auto_delete=True)
    assert router.get("x") is not None  # never bound: stays
    router.bind_queue("x", "q1", "a")
    router.bind_queue("x", "q2", "b")
    assert router.unbind_queue("x", "q1", "a") == Change(True)
    assert router.get("x") is not None
    assert router.unbind_queue("x", "q2", "b") == Change(True, ("x",))
    assert router.get("x") is None


def test_auto_delete_when_the_bound_queue_is_deleted(router: Router, queues: Queues) -> None:
    router.declare("x", "fanout", auto_delete=True)
    router.declare("keep", "fanout", auto_delete=False)
    router.bind_queue("x", "q1")
    router.bind_queue("keep", "q1")
    queues.discard("q1")
    assert router.queue_deleted("q1") == Change(True, ("x",))
    assert router.get("x") is None
    assert router.get("keep") is not None and router.bindings("keep") == []
    assert router.queue_deleted("q1") == Change(False)


def test_auto_delete_cascades_through_exchange_bindings(router: Router) -> None:
    # a -> b -> c, a and b auto-delete: deleting c empties b, whose deletion empties a.
    for name in ("a", "b"):
        router.declare(name, "fanout", auto_delete=True)
    router.declare("c", "fanout")
    router.bind_exchange("a", "b")
    router.bind_exchange("b", "c")
    assert router.delete("c") == Change(True, ("c", "b", "a"))
    assert {e.name for e in router.exchanges()} == {name for name, _, _ in PREDECLARED}


@pytest.mark.timeout(5)
def test_auto_delete_exchange_bound_to_itself(router: Router) -> None:
    router.declare("loop", "fanout", auto_delete=True)
    router.bind_exchange("loop", "loop")
    assert router.unbind_exchange("loop", "loop") == Change(True, ("loop",))


@pytest.mark.timeout(5)
def test_deleting_a_destination_exchange_in_a_cycle_ends(router: Router) -> None:
    for name in ("a", "b"):
        router.declare(name, "fanout", auto_delete=True)
    router.bind_exchange("a", "b")
    router.bind_exchange("b", "a")
    assert router.delete("a") == Change(True, ("a", "b"))


# --- routing: direct, fanout, default, e2e ---------------------------------------------------


def test_default_exchange_routes_to_the_named_queue_if_it_exists(
    router: Router, queues: Queues
) -> None:
    assert router.route("", "q1") == {"q1"}
    assert router.route("", "nope") == frozenset()
    queues.add("nope")
    assert router.route("", "nope") == {"nope"}  # not cached: follows queue existence
    assert router.route_keys("", ["q1", "q2", "zz"]) == {"q1", "q2"}


def test_publish_errors(router: Router) -> None:
    refused(lambda: router.route("nope", "k"), NotFound, "no exchange 'nope' in vhost '/'")
    router.declare("int", "fanout", internal=True)
    error = refused(
        lambda: router.route("int", "k"),
        AccessRefused,
        "cannot publish to internal exchange 'int' in vhost '/'",
    )
    assert error.reply_code == 403


def test_direct_and_fanout(router: Router) -> None:
    router.bind_queue("amq.direct", "q1", "k")
    router.bind_queue("amq.direct", "q2", "k")
    router.bind_queue("amq.direct", "q3", "other")
    router.bind_queue("amq.fanout", "q4", "ignored")
    assert router.route("amq.direct", "k") == {"q1", "q2"}
    assert router.route("amq.direct", "K") == frozenset()
    assert router.route("amq.fanout", "anything") == {"q4"}


def test_exchange_to_exchange_and_internal_destinations(router: Router) -> None:
    router.declare("front", "topic")
    router.declare("inner", "direct", internal=True)
    router.bind_exchange("front", "inner", "orders.#")
    router.bind_queue("inner", "q1", "orders.eu")
    router.bind_queue("front", "q2", "*.eu")
    assert router.route("front", "orders.eu") == {"q1", "q2"}
    assert router.route("front", "orders.us") == frozenset()


@pytest.mark.timeout(5)
def test_exchange_cycles_end_and_deliver_once(router: Router) -> None:
    for name in ("a", "b", "c"):
        router.declare(name, "fanout")
    router.bind_exchange("a", "b")
    router.bind_exchange("b", "c")
    router.bind_exchange("c", "a")
    router.bind_exchange("a", "a")
    router.bind_queue("c", "q1")
    router.bind_queue("b", "q1")
    for name in ("a", "b", "c"):
        assert router.route(name, "") == {"q1"}


def test_headers_through_e2e(router: Router) -> None:
    router.declare("h", "headers")
    router.bind_exchange("amq.fanout", "h")
    router.bind_queue("h", "q1", "", {"color": "red"})
    assert router.route("amq.fanout", "k", {"color": "red"}) == {"q1"}
    assert router.route("amq.fanout", "k", {"color": "blue"}) == frozenset()
    assert router.route("amq.fanout", "k", None) == frozenset()


def test_route_keys_unions_cc_keys(router: Router) -> None:
    router.bind_queue("amq.direct", "q1", "a")
    router.bind_queue("amq.direct", "q2", "b")
    assert router.route_keys("amq.direct", ["a", "b", "c"]) == {"q1", "q2"}
    assert router.route_keys("amq.direct", ["a"]) == {"q1"}


# --- alternate exchanges --------------------------------------------------------------------


def test_alternate_exchange_takes_unmatched_messages(router: Router) -> None:
    router.declare("ae", "fanout")
    router.declare("main", "direct", arguments={"alternate-exchange": "ae"})
    router.bind_queue("main", "q1", "known")
    router.bind_queue("ae", "q2")
    assert router.route("main", "known") == {"q1"}
    assert router.route("main", "unknown") == {"q2"}


def test_alternate_is_not_used_when_the_exchange_matched_an_exchange(router: Router) -> None:
    # RabbitMQ decides on the exchange's own match, not on whether a queue is reached.
    router.declare("ae", "fanout")
    router.declare("empty", "fanout")
    router.declare("main", "direct", arguments={"alternate-exchange": "ae"})
    router.bind_exchange("main", "empty", "k")
    router.bind_queue("ae", "q2")
    assert router.route("main", "k") == frozenset()
    assert router.route("main", "other") == {"q2"}


def test_alternates_chain_transitively(router: Router) -> None:
    router.declare("ae2", "fanout")
    router.declare("ae1", "direct", arguments={"alternate-exchange": "ae2"})
    router.declare("main", "direct", arguments={"alternate-exchange": "ae1"})
    router.bind_queue("ae1", "q1", "k1")
    router.bind_queue("ae2", "q2")
    assert router.route("main", "k1") == {"q1"}
    assert router.route("main", "k9") == {"q2"}


@pytest.mark.timeout(5)
def test_alternate_cycles_end(router: Router) -> None:
    router.declare("a", "direct", arguments={"alternate-exchange": "b"})
    router.declare("b", "direct", arguments={"alternate-exchange": "a"})
    router.declare("self", "direct", arguments={"alternate-exchange": "self"})
    assert router.route("a", "k") == frozenset()
    assert router.route("self", "k") == frozenset()
    router.bind_queue("b", "q1", "k")
    assert router.route("a", "k") == {"q1"}


def test_missing_or_internal_alternates(router: Router) -> None:
    router.declare("main", "direct", arguments={"alternate-exchange": "later"})
    assert router.route("main", "k") == frozenset()  # missing alternate: skipped
    router.declare("later", "fanout", internal=True)  # internal is fine as a target
    router.bind_queue("later", "q3")
    assert router.route("main", "k") == {"q3"}
    router.declare("to-default", "direct", arguments={"alternate-exchange": ""})
    assert router.route("to-default", "q1") == frozenset()  # "" has no real bindings


def test_alternate_from_an_e2e_destination(router: Router) -> None:
    router.declare("ae", "fanout")
    router.declare("inner", "direct", arguments={"alternate-exchange": "ae"})
    router.bind_exchange("amq.fanout", "inner")
    router.bind_queue("ae", "q4")
    assert router.route("amq.fanout", "x") == {"q4"}


def test_alternate_with_cc_keys_is_used_only_if_no_key_matched(router: Router) -> None:
    router.declare("ae", "fanout")
    router.declare("main", "direct", arguments={"alternate-exchange": "ae"})
    router.bind_queue("main", "q1", "a")
    router.bind_queue("ae", "q2")
    assert router.route_keys("main", ["a", "zz"]) == {"q1"}
    assert router.route_keys("main", ["y", "zz"]) == {"q2"}


# --- the route cache ------------------------------------------------------------------------


def test_cache_is_used_and_invalidated_by_every_change(router: Router, queues: Queues) -> None:
    router.declare("t", "topic")
    router.bind_queue("t", "q1", "a.*")
    first = router.route("t", "a.b")
    assert first == {"q1"}
    assert router.route("t", "a.b") is first  # served from the cache

    router.bind_queue("t", "q2", "#")
    assert router.route("t", "a.b") == {"q1", "q2"}
    router.unbind_queue("t", "q2", "#")
    assert router.route("t", "a.b") == {"q1"}

    router.declare("e", "fanout")
    router.bind_exchange("t", "e", "a.b")
    router.bind_queue("e", "q3")
    assert router.route("t", "a.b") == {"q1", "q3"}
    router.delete("e")
    assert router.route("t", "a.b") == {"q1"}

    queues.discard("q1")
    router.queue_deleted("q1")
    assert router.route("t", "a.b") == frozenset()


def test_cache_sees_a_new_alternate_target(router: Router) -> None:
    router.declare("main", "direct", arguments={"alternate-exchange": "ae"})
    assert router.route("main", "k") == frozenset()
    router.declare("ae", "fanout")
    router.bind_queue("ae", "q1")
    assert router.route("main", "k") == {"q1"}


def test_cache_sees_internal_flag_after_redeclare(router: Router) -> None:
    router.declare("x", "fanout")
    router.bind_queue("x", "q1")
    assert router.route("x", "") == {"q1"}
    router.delete("x")
    with pytest.raises(NotFound):
        router.route("x", "")
    router.declare("x", "fanout", internal=True)
    with pytest.raises(AccessRefused):
        router.route("x", "")


def test_routes_through_headers_exchanges_are_not_cached(router: Router) -> None:
    router.declare("h", "headers")
    router.bind_exchange("amq.topic", "h", "#")
    router.bind_queue("h", "q1", "", {"a": 1})
    assert router.route("amq.topic", "k", {"a": 1}) == {"q1"}
    assert router.route("amq.topic", "k", {"a": 2}) == frozenset()
    assert router.route("amq.headers", "k", {"a": 2}) == frozenset()
    assert router._route_cache == {}


def test_cache_is_bounded(queues: Queues) -> None:
    router = Router(queue_exists=queues.__contains__, route_cache_entries_max=4)
    router.bind_queue("amq.topic", "q1", "#")
    for index in range(10):
        assert router.route("amq.topic", f"k{index}") == {"q1"}
        assert len(router._route_cache) <= 4


def test_reply_texts_reach_the_wire_as_rabbitmq_sends_them(router: Router) -> None:
    """The broker hands a router error to amqp.replies, which adds the name and cuts to 255
    bytes.
    """
    from warrenmq.amqp import replies

    def wire(error: Exception) -> str:
        return replies.protocol_error(error.reply_code, error.reply_text).reply_text

    error = refused(
        lambda: router.declare("", "direct"),
        AccessRefused,
        "operation not permitted on the default exchange",
    )
    assert wire(error) == "ACCESS_REFUSED - operation not permitted on the default exchange"
    long_name = "n" * 250
    with pytest.raises(NotFound) as caught:
        router.route(long_name, "")
    assert len(wire(caught.value).encode()) <= 255
    assert wire(caught.value).startswith("NOT_FOUND - no exchange 'nnn")


def test_benchmark_runs_and_its_routes_hit() -> None:
    from warrenmq.exchanges.bench import bench, build_router

    rates = bench(bindings=40, seconds=0.01)
    assert set(rates) == {
        "direct cached",
        "direct uncached",
        "topic cached",
        "topic uncached",
        "headers",
    }
    assert all(rate > 0 for rate in rates.values())
    router = build_router(8)
    assert router.route("bench.direct", "key3") == {"q3"}
    assert router.route("bench.headers", "", {"kind": "order", "shop": 5}) == {"q5"}

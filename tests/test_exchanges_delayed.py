"""The x-delayed-message exchange type in the router: the plugin's declare checks and texts,
which x-delay values hold a message, and where routing stops for a held message."""

from __future__ import annotations

import decimal

import pytest

from warrenmq.exchanges.delayed import DELAY_MS_MAX, DelayedTarget, delay_ms
from warrenmq.exchanges.errors import CommandInvalid, PreconditionFailed
from warrenmq.exchanges.router import Router


@pytest.fixture
def router() -> Router:
    return Router("/", queue_exists={"q1", "q2", "q3"}.__contains__)


def delayed(router: Router, routing: str = "direct") -> None:
    router.declare("d", "x-delayed-message", arguments={"x-delayed-type": routing})


@pytest.mark.parametrize(
    ("arguments", "error", "text"),
    [
        (
            {},
            PreconditionFailed,
            "Invalid argument, 'x-delayed-type' must be an existing exchange type",
        ),
        (
            {"x-delayed-type": 5},
            PreconditionFailed,
            "Invalid argument, 'x-delayed-type' must be an existing exchange type",
        ),
        (
            {"x-delayed-type": "x-delayed-message"},
            PreconditionFailed,
            "Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'",
        ),
        ({"x-delayed-type": "nope"}, CommandInvalid, "unknown exchange type 'nope'"),
    ],
)
def test_declare_needs_an_existing_delayed_type(router, arguments, error, text) -> None:
    with pytest.raises(error) as caught:
        router.declare("d", "x-delayed-message", arguments=arguments)
    assert caught.value.reply_text == text
    assert router.get("d") is None


def test_the_alternate_exchange_argument_is_checked_before_the_delayed_type(router) -> None:
    with pytest.raises(PreconditionFailed) as caught:
        router.declare("d", "x-delayed-message", arguments={"alternate-exchange": 1})
    assert "alternate-exchange" in caught.value.reply_text


def test_a_redeclare_compares_what_any_exchange_compares(router) -> None:
    delayed(router, routing="topic")
    # As in the plugin, x-delayed-type is not an equivalence argument.
    assert not router.declare(
        "d", "x-delayed-message", arguments={"x-delayed-type": "fanout"}
    ).created
    with pytest.raises(PreconditionFailed):
        router.declare("d", "topic")


@pytest.mark.parametrize(
    ("value", "held_ms"),
    [
        (5000, 5000),
        (1, 1),
        (DELAY_MS_MAX, DELAY_MS_MAX),
        (DELAY_MS_MAX + 1, 0),
        (0, 0),
        (-5000, 0),
        ("5000", 5000),
        (b"+250", 250),
        ("-5", 0),
        ("5 s", 0),
        ("1_000", 0),
        (1500.9, 1500),
        (decimal.Decimal("2.50"), 2),
        (float("nan"), 0),
        (True, 0),
        (bytearray(b"500"), 0),
        ([500], 0),
        (None, 0),
    ],
)
def test_which_x_delay_values_hold_a_message(value, held_ms) -> None:
    assert delay_ms({"x-delay": value}) == held_ms


def test_no_headers_or_no_x_delay_means_no_delay() -> None:
    assert delay_ms(None) == delay_ms({}) == delay_ms({"other": 5}) == 0


@pytest.mark.parametrize(
    ("routing", "binding_key", "routing_key", "reached"),
    [
        ("direct", "k", "k", True),
        ("direct", "k", "other", False),
        ("fanout", "k", "other", True),
        ("topic", "a.*", "a.b", True),
        ("topic", "a.*", "b.b", False),
    ],
)
def test_without_a_delay_it_routes_as_its_delayed_type(
    router, routing, binding_key, routing_key, reached
) -> None:
    delayed(router, routing=routing)
    router.bind_queue("d", "q1", binding_key)
    assert router.route("d", routing_key) == ({"q1"} if reached else set())
    assert router.route("d", routing_key, {"x-delay": 0}) == ({"q1"} if reached else set())


def test_a_headers_delayed_type_matches_on_headers(router) -> None:
    delayed(router, routing="headers")
    router.bind_queue("d", "q1", "", {"x-match": "any", "kind": "order"})
    assert router.route("d", "", {"kind": "order", "x-delay": -1}) == {"q1"}
    assert router.route("d", "", {"kind": "order", "x-delay": 10}) == {DelayedTarget("d", 10)}


def test_a_held_message_stops_at_the_delayed_exchange(router) -> None:
    delayed(router)
    router.bind_queue("d", "q1", "k")
    assert router.route("d", "k", {"x-delay": 100}) == {DelayedTarget("d", 100)}
    # Also when nothing is bound yet: routing happens when it is due.
    assert router.route("d", "nothing-bound", {"x-delay": 100}) == {DelayedTarget("d", 100)}


def test_routes_through_a_delayed_exchange_are_never_cached(router) -> None:
    delayed(router)
    router.bind_queue("d", "q1", "k")
    router.declare("front", "fanout")
    router.bind_exchange("front", "d")
    for exchange in ("d", "front"):
        assert router.route(exchange, "k") == {"q1"}
        assert router.route(exchange, "k", {"x-delay": 7}) == {DelayedTarget("d", 7)}


def test_exchange_to_exchange_and_alternate_routes_reach_a_delayed_exchange(router) -> None:
    delayed(router)
    router.bind_queue("d", "q1", "k")
    router.declare("front", "fanout")
    router.bind_exchange("front", "d")
    router.bind_queue("front", "q2")
    assert router.route("front", "k", {"x-delay": 7}) == {"q2", DelayedTarget("d", 7)}
    router.declare("unroutable", "direct", arguments={"alternate-exchange": "d"})
    assert router.route("unroutable", "k", {"x-delay": 7}) == {DelayedTarget("d", 7)}
    assert router.route("unroutable", "k") == {"q1"}


def test_a_delayed_exchanges_alternate_applies_when_it_routes(router) -> None:
    """The plugin sends a held message to the alternate exchange at once, and routes it again
    when due (rabbitmq-delayed-message-exchange#36); here the alternate applies when it is
    routed, if its bindings match nothing then."""
    router.declare("ae", "fanout")
    router.bind_queue("ae", "q3")
    router.declare(
        "d",
        "x-delayed-message",
        arguments={"x-delayed-type": "direct", "alternate-exchange": "ae"},
    )
    router.bind_queue("d", "q1", "k")
    assert router.route("d", "other", {"x-delay": 5}) == {DelayedTarget("d", 5)}
    assert router.route("d", "other", {"x-delay": -5}) == {"q3"}
    assert router.route("d", "k", {"x-delay": -5}) == {"q1"}

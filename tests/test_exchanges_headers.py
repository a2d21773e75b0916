"""Headers exchange: RabbitMQ 3.10's x-match rules, value equality and bind-time checks."""

from __future__ import annotations

import datetime
import decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warrenmq.exchanges.binding import QUEUE, Destination
from warrenmq.exchanges.errors import PRECONDITION_FAILED, PreconditionFailed
from warrenmq.exchanges.headers import HeadersExchange

Q = Destination(QUEUE, "q")


def matches(arguments: dict, headers: dict | None) -> bool:
    table = HeadersExchange()
    table.validate_binding(arguments)
    table.bind(Q, "ignored", arguments)
    return Q in table.match("any routing key", headers)


@pytest.mark.parametrize(
    ("arguments", "headers", "expected"),
    [
        # x-match defaults to all
        ({"a": 1, "b": 2}, {"a": 1, "b": 2, "c": 3}, True),
        ({"a": 1, "b": 2}, {"a": 1}, False),
        ({"a": 1, "b": 2}, {"a": 1, "b": 3}, False),
        ({"x-match": "all", "a": 1, "b": 2}, {"b": 2, "a": 1}, True),
        ({"x-match": "any", "a": 1, "b": 2}, {"b": 2}, True),
        ({"x-match": "any", "a": 1, "b": 2}, {"a": 2, "b": 3}, False),
        ({"x-match": "any", "a": 1}, {}, False),
        ({"x-match": "any", "a": 1}, None, False),
        ({"x-match": "all", "a": 1}, None, False),
        # nothing left to compare: all matches everything, any matches nothing
        ({}, None, True),
        ({"x-match": "all"}, {"z": 1}, True),
        ({"x-match": "any"}, {"z": 1}, False),
        # "x-" binding keys are ignored by all/any...
        ({"x-match": "all", "x-foo": "bar", "a": 1}, {"a": 1}, True),
        ({"x-match": "any", "x-foo": "bar"}, {"x-foo": "bar"}, False),
        ({"x-foo": "bar"}, {}, True),
        # ...and count for all-with-x/any-with-x, while x-match itself never counts
        ({"x-match": "all-with-x", "x-foo": "bar", "a": 1}, {"a": 1}, False),
        ({"x-match": "all-with-x", "x-foo": "bar", "a": 1}, {"a": 1, "x-foo": "bar"}, True),
        ({"x-match": "any-with-x", "x-foo": "bar"}, {"x-foo": "bar"}, True),
        ({"x-match": "any-with-x", "x-foo": "bar"}, {"x-foo": "baz"}, False),
        ({"x-match": "all-with-x"}, {}, True),
        ({"x-match": "any-with-x"}, {"x-match": "any-with-x"}, False),
        # a void binding value means "present, any value"
        ({"a": None}, {"a": "anything"}, True),
        ({"a": None}, {"a": None}, True),
        ({"a": None}, {"b": 1}, False),
        ({"x-match": "any", "a": None, "b": 1}, {"a": 5}, True),
        # a void header does not equal a non-void binding value
        ({"a": 0}, {"a": None}, False),
        ({"a": ""}, {"a": None}, False),
        # Erlang == on values: numbers by value, bool is not an integer, strings are bytes
        ({"a": 1}, {"a": 1.0}, True),
        ({"a": 1}, {"a": True}, False),
        ({"a": True}, {"a": 1}, False),
        ({"a": True}, {"a": True}, True),
        ({"a": "1"}, {"a": 1}, False),
        ({"a": "v"}, {"a": b"v"}, True),
        ({"a": "v"}, {"a": bytearray(b"v")}, True),
        ({"a": 2**40}, {"a": 2**40}, True),
        ({"a": 1_000}, {"a": datetime.datetime.fromtimestamp(1_000, tz=datetime.UTC)}, True),
        ({"a": decimal.Decimal("1.00")}, {"a": decimal.Decimal("1.00")}, True),
        ({"a": decimal.Decimal("1.00")}, {"a": decimal.Decimal("1.0")}, False),  # {2,100} vs {1,10}
        # tables and arrays compare with their type tags and order
        ({"a": {"k": 1}}, {"a": {"k": 1}}, True),
        ({"a": {"k": 1}}, {"a": {"k": True}}, False),
        ({"a": {"k": 1, "j": 2}}, {"a": {"j": 2, "k": 1}}, False),
        ({"a": [1, "s"]}, {"a": [1, "s"]}, True),
        ({"a": [1]}, {"a": [1.0]}, False),  # {signedint,1} vs {double,1.0}: tags differ
        ({"a": []}, {"a": {}}, True),  # both are Erlang's []
    ],
)
def test_header_matching(arguments: dict, headers: dict | None, expected: bool) -> None:
    assert matches(arguments, headers) is expected


@pytest.mark.parametrize(
    ("x_match", "text"),
    [
        (
            "foo",
            'Invalid x-match field value <<"foo">>; expected all, any, all-with-x, or any-with-x',
        ),
        (
            "ALL",
            'Invalid x-match field value <<"ALL">>; expected all, any, all-with-x, or any-with-x',
        ),
        (1, "Invalid x-match field type signedint (value 1); expected longstr"),
        (True, "Invalid x-match field type bool (value true); expected longstr"),
        (None, "Invalid x-match field type void (value undefined); expected longstr"),
        (2.5, "Invalid x-match field type double (value 2.5); expected longstr"),
    ],
)
def test_bad_x_match_is_refused_with_rabbitmqs_text(x_match: object, text: str) -> None:
    with pytest.raises(PreconditionFailed) as caught:
        HeadersExchange().validate_binding({"x-match": x_match})
    assert caught.value.reply_code == PRECONDITION_FAILED == 406
    assert caught.value.reply_text == text
    assert not caught.value.connection_level


@pytest.mark.parametrize("x_match", ["all", "any", "all-with-x", "any-with-x", b"any"])
def test_good_x_match_is_accepted(x_match: object) -> None:
    HeadersExchange().validate_binding({"x-match": x_match, "a": 1})


def test_bytes_x_match_any_is_honoured() -> None:
    assert matches({"x-match": b"any", "a": 1, "b": 2}, {"b": 2})


def test_unbind_stops_matching_and_other_bindings_remain() -> None:
    table = HeadersExchange()
    other = Destination(QUEUE, "other")
    table.bind(Q, "", {"a": 1})
    table.bind(other, "", {"x-match": "any", "a": 1, "b": 1})
    assert set(table.match("", {"a": 1})) == {Q, other}
    assert table.unbind(Q, "", {"a": 1})
    assert not table.unbind(Q, "", {"a": 1})
    assert set(table.match("", {"a": 1})) == {other}


header_values = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.sampled_from(["x", "y", ""])
)
header_keys = st.sampled_from(["a", "b", "x-c"])


def reference(arguments: dict, headers: dict) -> bool:
    """RabbitMQ 3.10's headers_match/5 merge over key-sorted lists, transcribed step by step."""
    kind = arguments.get("x-match", "all")
    pattern = sorted(arguments.items())
    data = sorted(headers.items())
    all_match, any_match = True, False

    def equal(p: object, d: object) -> bool:
        # Erlang ==: atoms (true/false/undefined) never equal numbers or binaries.
        if isinstance(p, bool) or isinstance(d, bool) or p is None or d is None:
            return type(p) is type(d) and p == d
        if isinstance(p, str) != isinstance(d, str):
            return False
        return p == d

    while True:
        if not all_match and kind in ("all", "all-with-x"):
            return False
        if any_match and kind in ("any", "any-with-x"):
            return True
        if not pattern:
            return all_match if kind in ("all", "all-with-x") else any_match
        pk, pv = pattern[0]
        if pk == "x-match" or (pk.startswith("x-") and kind not in ("all-with-x", "any-with-x")):
            pattern = pattern[1:]
            continue
        if not data:
            all_match = False
            pattern = []
            continue
        dk, dv = data[0]
        if pk > dk:
            data = data[1:]
        elif pk < dk:
            pattern, all_match = pattern[1:], False
        elif pv is None:
            pattern, data, any_match = pattern[1:], data[1:], True
        elif equal(pv, dv):
            pattern, data, any_match = pattern[1:], data[1:], True
        else:
            pattern, data, all_match = pattern[1:], data[1:], False


@given(
    st.sampled_from(["all", "any", "all-with-x", "any-with-x"]),
    st.dictionaries(header_keys, header_values, max_size=3),
    st.dictionaries(header_keys, header_values, max_size=3),
)
def test_matches_the_erlang_merge_algorithm(kind: str, pattern: dict, headers: dict) -> None:
    arguments = {"x-match": kind, **pattern}
    assert matches(arguments, headers) is reference(arguments, headers)


@settings(max_examples=300)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["all", "any", "all-with-x", "any-with-x", None]),
            st.dictionaries(header_keys, header_values, max_size=3),
        ),
        max_size=8,
    ),
    st.lists(st.dictionaries(header_keys, header_values, max_size=3), min_size=1, max_size=4),
    st.sets(st.integers(0, 7)),
)
def test_indexed_table_agrees_with_the_reference_binding_by_binding(
    specs: list[tuple[str | None, dict]], messages: list[dict], removed: set[int]
) -> None:
    """Many bindings in one table (the index picks anchors and buckets), some removed again:
    each message reaches exactly the bindings the Erlang algorithm accepts."""
    table = HeadersExchange()
    live = {}
    for index, (kind, pattern) in enumerate(specs):
        arguments = dict(pattern) if kind is None else {"x-match": kind, **pattern}
        destination = Destination(QUEUE, f"q{index}")
        table.bind(destination, "", arguments)
        live[destination] = arguments
    for index in removed:
        destination = Destination(QUEUE, f"q{index}")
        if destination in live:
            assert table.unbind(destination, "", live.pop(destination))
    for headers in messages:
        expected = {d for d, arguments in live.items() if reference(arguments, headers)}
        assert set(table.match("", headers)) == expected
    for destination, arguments in live.items():
        table.unbind(destination, "", arguments)
    assert (table._any, table._anchored, table._anchors, table._always) == ({}, {}, {}, {})

"""Direct and fanout binding tables, and the Erlang view of field values they rely on."""

from __future__ import annotations

import datetime
import decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warrenmq.exchanges.binding import EXCHANGE, QUEUE, Destination
from warrenmq.exchanges.direct import DirectExchange
from warrenmq.exchanges.fanout import FanoutExchange
from warrenmq.exchanges.field_values import (
    amqp_type_name,
    arguments_key,
    describe_typed,
    erlang_key,
    erlang_repr,
)

Q1 = Destination(QUEUE, "q1")
Q2 = Destination(QUEUE, "q2")
X1 = Destination(EXCHANGE, "x1")


def test_direct_matches_exact_keys_only() -> None:
    table = DirectExchange()
    assert table.bind(Q1, "k")
    assert table.bind(Q2, "k")
    assert table.bind(X1, "other")
    assert set(table.match("k", None)) == {Q1, Q2}
    assert set(table.match("other", None)) == {X1}
    assert set(table.match("K", None)) == set()
    assert set(table.match("", None)) == set()


def test_direct_binding_identity_includes_arguments() -> None:
    table = DirectExchange()
    assert table.bind(Q1, "k", {"a": 1})
    assert not table.bind(Q1, "k", {"a": 1})
    assert table.bind(Q1, "k", {"a": 1.0})  # double is another type than signedint
    assert table.bind(Q1, "k")
    assert len(table) == 3
    assert table.unbind(Q1, "k", {"a": 1})
    assert table.unbind(Q1, "k")
    assert set(table.match("k", None)) == {Q1}  # the {"a": 1.0} binding is still there
    assert table.unbind(Q1, "k", {"a": 1.0})
    assert set(table.match("k", None)) == set()
    assert table._by_key == {}


def test_fanout_ignores_key_and_headers() -> None:
    table = FanoutExchange()
    assert table.bind(Q1, "a")
    assert table.bind(Q1, "b")
    assert table.bind(Q2, "")
    assert set(table.match("zzz", {"h": 1})) == {Q1, Q2}
    assert table.unbind(Q1, "a")
    assert set(table.match("", None)) == {Q1, Q2}
    assert table.unbind_destination(Q1) == 1
    assert set(table.match("", None)) == {Q2}
    assert not table.has_destination(Q1)


@given(
    st.lists(
        st.tuples(st.booleans(), st.sampled_from([Q1, Q2, X1]), st.sampled_from(["a", "b", ""])),
        max_size=40,
    )
)
def test_direct_and_fanout_follow_a_set_of_bindings(operations) -> None:
    direct, fanout = DirectExchange(), FanoutExchange()
    live: set[tuple[Destination, str]] = set()
    for is_bind, destination, key in operations:
        if is_bind:
            expected = (destination, key) not in live
            assert direct.bind(destination, key) is expected
            assert fanout.bind(destination, key) is expected
            live.add((destination, key))
        else:
            expected = (destination, key) in live
            assert direct.unbind(destination, key) is expected
            assert fanout.unbind(destination, key) is expected
            live.discard((destination, key))
    for key in ("a", "b", ""):
        assert set(direct.match(key, None)) == {d for d, k in live if k == key}
    assert set(fanout.match("whatever", None)) == {d for d, _ in live}
    assert {(b.destination, b.routing_key) for b in direct.bindings()} == live


@pytest.mark.parametrize(
    ("value", "type_name", "printed"),
    [
        ("s", "longstr", '<<"s">>'),
        (b"s", "longstr", '<<"s">>'),
        (b"\x00\xff", "longstr", "<<0,255>>"),
        ("é", "longstr", '<<"\u00c3\u00a9">>'),  # latin-1 printable bytes, as Erlang's ~p
        ('q"\n', "longstr", '<<"q\\"\\n">>'),
        (bytearray(b"s"), "binary", '<<"s">>'),
        (True, "bool", "true"),
        (7, "signedint", "7"),
        (2**31, "long", "2147483648"),
        (-(2**31), "signedint", "-2147483648"),
        (1.5, "double", "1.5"),
        (1e20, "double", "1.0e20"),
        (decimal.Decimal("1.25"), "decimal", "{2,125}"),
        (datetime.datetime.fromtimestamp(60, tz=datetime.UTC), "timestamp", "60"),
        (None, "void", "undefined"),
        ({"k": 1}, "table", '[{<<"k">>,signedint,1}]'),
        ([1, "a"], "array", '[{signedint,1},{longstr,<<"a">>}]'),
    ],
)
def test_types_and_erlang_printing(value: object, type_name: str, printed: str) -> None:
    assert amqp_type_name(value) == type_name
    assert erlang_repr(value) == printed


def test_describe_typed_matches_rabbit_misc_val() -> None:
    assert describe_typed("ae") == "the value 'ae' of type 'longstr'"
    assert describe_typed(5) == "the value '5' of type 'signedint'"


def test_erlang_equality_is_not_pythons() -> None:
    assert erlang_key(True) != erlang_key(1)
    assert erlang_key("a") == erlang_key(b"a")
    assert erlang_key(1) == erlang_key(1.0)
    assert erlang_key(datetime.datetime(1970, 1, 1, 0, 1)) == erlang_key(60)  # naive is UTC
    assert erlang_key(decimal.Decimal("1.0")) != erlang_key(decimal.Decimal("1.00"))


def test_arguments_key_is_order_free_and_type_exact() -> None:
    assert arguments_key({"a": 1, "b": 2}) == arguments_key({"b": 2, "a": 1})
    assert arguments_key({"a": 1}) != arguments_key({"a": True})
    assert arguments_key({"a": 1}) != arguments_key({"a": 1.0})
    assert arguments_key({}) == arguments_key(None) == ()


def test_unknown_python_values_are_refused() -> None:
    with pytest.raises(TypeError):
        amqp_type_name(object())
    with pytest.raises(TypeError):
        erlang_key({1, 2})

"""Dead-letter headers and routing (dlq/dead_letter.py) and the property edits under them
(amqp/properties.py): RabbitMQ's rabbit_dead_letter rules, checked on the wire bytes."""

from __future__ import annotations

import datetime

from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands

from warrenmq.amqp import frames
from warrenmq.amqp import properties as p
from warrenmq.dlq import dead_letter as d

NOW_S = 1_700_000_000


def encoded(**fields) -> bytes:
    return frames.encode_properties(commands.Basic.Properties(**fields))


def die(
    properties: bytes, queue="q", reason=d.REJECTED, exchange="ex", key="rk", dlrk=None, now=NOW_S
):
    return d.dead_letter(
        properties,
        queue=queue,
        reason=reason,
        exchange=exchange,
        routing_key=key,
        dead_letter_routing_key=dlrk,
        now_s=now,
    )


def header(properties: bytes, key: str) -> bytes | None:
    return dict(p.headers(properties)).get(key)


def test_the_first_death_writes_x_death_and_x_first_death_with_rabbitmqs_types():
    dead, keys = die(encoded(delivery_mode=2, headers={"CC": ["c1"]}))
    assert keys == ["rk", "c1"]
    death = p.table_value(p.array_items(header(dead, "x-death"))[0])
    # Fields in key order, typed as RabbitMQ writes them: count a signed long, time a
    # timestamp, the rest long strings, routing-keys an array of long strings.
    assert [key for key, _ in death] == [
        "count",
        "exchange",
        "queue",
        "reason",
        "routing-keys",
        "time",
    ]
    fields = dict(death)
    assert fields["count"] == b"l" + (1).to_bytes(8, "big")
    assert fields["time"] == b"T" + NOW_S.to_bytes(8, "big")
    assert fields["reason"] == p.longstr("rejected")
    assert fields["queue"] == p.longstr("q")
    assert fields["exchange"] == p.longstr("ex")
    assert fields["routing-keys"] == p.array([p.longstr("rk"), p.longstr("c1")])
    for suffix, value in (("reason", "rejected"), ("queue", "q"), ("exchange", "ex")):
        assert header(dead, f"x-first-death-{suffix}") == p.longstr(value)
        assert header(dead, f"x-last-death-{suffix}") == p.longstr(value)
    decoded = frames.decode_properties(dead)
    assert decoded.delivery_mode == 2
    assert decoded.headers["CC"] == ["c1"]


def test_the_headers_table_is_left_sorted_and_other_values_keep_their_wire_types():
    # "z" as a signed long and "a" as a short-short: pamqp would re-pick both types.
    table = b"\x01z" + p.long(5) + b"\x01a" + b"b\x07"
    original = p.join({p.HEADERS_FLAG: len(table).to_bytes(4, "big") + table})
    dead, _ = die(original)
    entries = p.headers(dead)
    assert [key for key, _ in entries] == sorted(key for key, _ in entries)
    assert dict(entries)["z"] == p.long(5)
    assert dict(entries)["a"] == b"b\x07"


def test_a_dead_letter_routing_key_replaces_the_keys_and_drops_cc():
    dead, keys = die(encoded(headers={"CC": ["c1"]}), dlrk="to-dlq")
    assert keys == ["to-dlq"]
    assert header(dead, "CC") is None
    death = dict(p.table_value(p.array_items(header(dead, "x-death"))[0]))
    # x-death still records the keys the message was routed with.
    assert death["routing-keys"] == p.array([p.longstr("rk"), p.longstr("c1")])


def test_the_expiration_moves_into_original_expiration():
    dead, _ = die(encoded(expiration="1500"), reason=d.EXPIRED)
    assert frames.decode_properties(dead).expiration is None
    death = dict(p.table_value(p.array_items(header(dead, "x-death"))[0]))
    assert death["original-expiration"] == p.longstr("1500")


def test_a_second_death_in_the_same_queue_for_the_same_reason_counts_and_moves_first():
    once, _ = die(encoded(), queue="a", reason=d.EXPIRED, now=NOW_S)
    twice, _ = die(once, queue="b", reason=d.REJECTED, exchange="dlx", now=NOW_S + 1)
    thrice, _ = die(twice, queue="a", reason=d.EXPIRED, exchange="dlx", now=NOW_S + 2)
    deaths = frames.decode_properties(thrice).headers["x-death"]
    assert [(e["queue"], e["reason"], e["count"]) for e in deaths] == [
        ("a", "expired", 2),
        ("b", "rejected", 1),
    ]
    # The entry keeps its first death's time and exchange, as RabbitMQ 3.10 keeps them.
    assert deaths[0]["time"] == datetime.datetime.fromtimestamp(NOW_S, datetime.UTC)
    assert deaths[0]["exchange"] == "ex"
    headers = frames.decode_properties(thrice).headers
    assert headers["x-first-death-queue"] == "a"
    assert headers["x-first-death-reason"] == "expired"
    assert headers["x-last-death-queue"] == "a"
    assert headers["x-last-death-exchange"] == "dlx"


def test_a_fully_automatic_cycle_is_detected_and_a_rejection_breaks_it():
    expired_in_a, _ = die(encoded(), queue="a", reason=d.EXPIRED)
    assert d.cycling(d.EXPIRED, expired_in_a, "a")
    assert not d.cycling(d.EXPIRED, expired_in_a, "b")
    assert not d.cycling(d.REJECTED, expired_in_a, "a")
    rejected_in_b, _ = die(expired_in_a, queue="b", reason=d.REJECTED)
    expired_in_c, _ = die(rejected_in_b, queue="c", reason=d.EXPIRED)
    # c -> ... -> a passes b's rejection: no cycle; straight back into c is one.
    assert not d.cycling(d.EXPIRED, expired_in_c, "a")
    assert d.cycling(d.EXPIRED, expired_in_c, "c")


_TEXT = st.text(max_size=20)
_PROPERTIES = st.fixed_dictionaries(
    {},
    optional={
        "content_type": _TEXT,
        "headers": st.dictionaries(st.text(min_size=1, max_size=10), _TEXT, max_size=4),
        "delivery_mode": st.integers(1, 2),
        "priority": st.integers(0, 9),
        "correlation_id": _TEXT,
        "expiration": st.integers(0, 10**6).map(str),
        "message_id": _TEXT,
        "timestamp": st.datetimes(
            min_value=datetime.datetime(2000, 1, 1), max_value=datetime.datetime(2100, 1, 1)
        ).map(lambda t: t.replace(microsecond=0, tzinfo=datetime.UTC)),
        "app_id": _TEXT,
    },
)


@given(_PROPERTIES)
def test_split_and_join_keep_property_bytes_exactly(fields):
    original = encoded(**fields)
    assert p.join(p.split(original)) == original
    assert p.with_headers(original, p.headers(original)) == original


@given(_PROPERTIES)
def test_a_dead_letter_keeps_every_other_property(fields):
    dead, _ = die(encoded(**fields))
    before = frames.decode_properties(encoded(**fields))
    after = frames.decode_properties(dead)
    for name in ("content_type", "delivery_mode", "priority", "correlation_id", "message_id"):
        assert getattr(after, name) == getattr(before, name)
    assert after.expiration is None
    for key, value in (before.headers or {}).items():
        if key != "CC":
            assert after.headers[key] == value

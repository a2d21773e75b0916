"""Hand-written hot-path codecs, cross-tested against pamqp in both directions.

Run as a script for the throughput figures (fast path vs pamqp):
    .venv/bin/python tests/test_amqp_fastpath.py
"""

import datetime
import struct
import sys
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import body as pamqp_body
from pamqp import commands
from pamqp import encode as pamqp_encode
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

from warrenmq.amqp import Connection, fastpath, field_table, frames, testing

shortstr = st.text(max_size=40).filter(lambda s: len(s.encode()) <= 255)
# pamqp validates exchange names on marshal (RabbitMQ's name alphabet, 127 bytes at most).
exchange_name = st.from_regex(r"[a-zA-Z0-9_.:-]{0,40}", fullmatch=True)
# pamqp encodes longlong as signed, so delivery tags are compared below 2**63.
delivery_tag = st.integers(0, 2**63 - 1)
header_values = st.recursive(
    st.one_of(
        st.integers(min_value=-(2**63), max_value=2**63 - 1),
        shortstr,
        st.booleans(),
        st.floats(width=32, allow_nan=False),
        st.none(),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.text(min_size=1, max_size=5), inner, max_size=3),
    ),
    max_leaves=8,
)


@st.composite
def properties(draw):
    fields = {
        "content_type": shortstr,
        "content_encoding": shortstr,
        "headers": st.dictionaries(st.text(min_size=1, max_size=10), header_values, max_size=4),
        "delivery_mode": st.sampled_from([1, 2]),
        "priority": st.integers(0, 255),
        "correlation_id": shortstr,
        "reply_to": shortstr,
        "expiration": st.integers(0, 10**9).map(str),
        "message_id": shortstr,
        "timestamp": st.integers(0, 2**32 - 1).map(
            lambda s: datetime.datetime.fromtimestamp(s, tz=datetime.UTC)
        ),
        "message_type": shortstr,
        "user_id": shortstr,
        "app_id": shortstr,
    }
    chosen = draw(st.sets(st.sampled_from(sorted(fields))))
    # pamqp leaves out empty strings when marshalling, so only non-empty ones round-trip.
    values = {name: draw(fields[name]) for name in chosen}
    return commands.Basic.Properties(**{k: v for k, v in values.items() if v != ""})


def method_payload(method):
    """The payload (ids and arguments) of a pamqp method frame."""
    return pamqp_frame.marshal(method, 1)[7:-1]


@settings(max_examples=100)
@given(
    exchange=exchange_name, routing_key=shortstr, mandatory=st.booleans(), immediate=st.booleans()
)
def test_decode_publish_matches_pamqp(exchange, routing_key, mandatory, immediate):
    payload = method_payload(
        commands.Basic.Publish(
            exchange=exchange, routing_key=routing_key, mandatory=mandatory, immediate=immediate
        )
    )
    assert fastpath.decode_publish(payload) == (exchange, routing_key, mandatory, immediate)
    for cut in (len(payload) - 1, 7):
        with pytest.raises(ValueError):
            fastpath.decode_publish(payload[:cut] if cut < len(payload) else payload)
    with pytest.raises(ValueError):
        fastpath.decode_publish(payload + b"\x00")


@settings(max_examples=100)
@given(tag=delivery_tag, multiple=st.booleans(), requeue=st.booleans())
def test_ack_codecs_match_pamqp_both_ways(tag, multiple, requeue):
    ack = commands.Basic.Ack(delivery_tag=tag, multiple=multiple)
    nack = commands.Basic.Nack(delivery_tag=tag, multiple=multiple, requeue=requeue)
    reject = commands.Basic.Reject(delivery_tag=tag, requeue=requeue)
    assert fastpath.decode_ack(method_payload(ack)) == (tag, multiple)
    assert fastpath.decode_nack(method_payload(nack)) == (tag, multiple, requeue)
    assert fastpath.decode_reject(method_payload(reject)) == (tag, requeue)
    assert fastpath.encode_ack(3, tag, multiple) == pamqp_frame.marshal(ack, 3)
    assert fastpath.encode_nack(3, tag, multiple, requeue) == pamqp_frame.marshal(nack, 3)
    with pytest.raises(ValueError):
        fastpath.decode_ack(method_payload(ack)[:-1])


@settings(max_examples=150)
@given(props=properties(), body_size=st.integers(0, 2**40))
def test_content_header_and_property_scan_match_pamqp(props, body_size):
    payload = pamqp_header.ContentHeader(body_size=body_size, properties=props).marshal()
    class_id, weight, size, property_bytes = fastpath.decode_content_header(payload)
    assert (class_id, weight, size) == (60, 0, body_size)
    assert property_bytes == props.marshal()
    assert fastpath.scan_properties(property_bytes) == (
        props.delivery_mode,
        props.priority,
        props.expiration,
        props.user_id,
    )
    assert frames.decode_properties(property_bytes) == props
    for cut in range(len(property_bytes)):
        with pytest.raises(ValueError):
            fastpath.scan_properties(property_bytes[:cut])
    with pytest.raises(ValueError):
        fastpath.scan_properties(property_bytes + b"\x00")


def pamqp_content(channel, props, body, frame_max):
    chunk = frame_max - 8
    frames_out = [pamqp_header.ContentHeader(body_size=len(body), properties=props)]
    frames_out += [pamqp_body.ContentBody(body[i : i + chunk]) for i in range(0, len(body), chunk)]
    return b"".join(pamqp_frame.marshal(f, channel) for f in frames_out)


@settings(max_examples=150)
@given(
    props=properties(),
    body=st.binary(max_size=20000),
    frame_max=st.integers(4096, 12000),
    channel=st.integers(1, 65535),
    consumer_tag=shortstr,
    tag=delivery_tag,
    redelivered=st.booleans(),
    exchange=exchange_name,
    routing_key=shortstr,
)
def test_encode_deliver_is_byte_identical_to_pamqp(
    props, body, frame_max, channel, consumer_tag, tag, redelivered, exchange, routing_key
):
    ours = fastpath.encode_deliver(
        channel,
        consumer_tag,
        tag,
        redelivered,
        exchange,
        routing_key,
        props.marshal(),
        body,
        frame_max,
    )
    theirs = pamqp_frame.marshal(
        commands.Basic.Deliver(
            consumer_tag=consumer_tag,
            delivery_tag=tag,
            redelivered=redelivered,
            exchange=exchange,
            routing_key=routing_key,
        ),
        channel,
    ) + pamqp_content(channel, props, body, frame_max)
    assert ours == theirs


@settings(max_examples=100)
@given(
    props=properties(),
    body=st.binary(max_size=9000),
    tag=delivery_tag,
    count=st.integers(0, 2**32 - 1),
    exchange=exchange_name,
    routing_key=shortstr,
    code=st.sampled_from([312, 313]),
    text=shortstr,
)
def test_get_ok_and_return_are_byte_identical_to_pamqp(
    props, body, tag, count, exchange, routing_key, code, text
):
    get_ok = fastpath.encode_get_ok(
        2, tag, False, exchange, routing_key, count, props.marshal(), body, 4096
    )
    assert get_ok == pamqp_frame.marshal(
        commands.Basic.GetOk(
            delivery_tag=tag,
            redelivered=False,
            exchange=exchange,
            routing_key=routing_key,
            message_count=count,
        ),
        2,
    ) + pamqp_content(2, props, body, 4096)
    returned = fastpath.encode_return(
        2, code, text, exchange, routing_key, props.marshal(), body, 4096
    )
    assert returned == pamqp_frame.marshal(
        commands.Basic.Return(
            reply_code=code, reply_text=text, exchange=exchange, routing_key=routing_key
        ),
        2,
    ) + (pamqp_content(2, props, body, 4096))


# Names RabbitMQ accepts that pamqp's name pattern refuses, and the longest a shortstr holds.
UNUSUAL_NAMES = [
    "café",
    "a%b",
    "star*",
    "paren(1)",
    "tab\there",
    "rabbit-\N{RABBIT}",
    "é" * 127 + "a",
]
any_name = st.one_of(
    st.sampled_from(UNUSUAL_NAMES), st.text(max_size=255).filter(lambda s: len(s.encode()) <= 255)
)


@settings(max_examples=200)
@given(
    name=any_name,
    message_count=st.integers(0, 2**32 - 1),
    consumer_count=st.integers(0, 2**32 - 1),
    channel=st.integers(1, 65535),
)
def test_replies_that_carry_a_name_take_any_name_rabbitmq_accepts(
    name, message_count, consumer_count, channel
):
    replies = (
        (
            fastpath.encode_declare_ok(channel, name, message_count, consumer_count),
            commands.Queue.DeclareOk,
            ("queue", "message_count", "consumer_count"),
            (name, message_count, consumer_count),
        ),
        (
            fastpath.encode_consume_ok(channel, name),
            commands.Basic.ConsumeOk,
            ("consumer_tag",),
            (name,),
        ),
        (
            fastpath.encode_cancel_ok(channel, name),
            commands.Basic.CancelOk,
            ("consumer_tag",),
            (name,),
        ),
    )
    for data, kind, fields, values in replies:
        consumed, got_channel, method = pamqp_frame.unmarshal(data)
        assert (consumed, got_channel, type(method)) == (len(data), channel, kind)
        assert tuple(getattr(method, field) for field in fields) == values


@settings(max_examples=100)
@given(
    name=exchange_name,
    message_count=st.integers(0, 2**32 - 1),
    consumer_count=st.integers(0, 2**32 - 1),
    channel=st.integers(1, 65535),
)
def test_replies_that_carry_a_name_are_byte_identical_to_pamqp(
    name, message_count, consumer_count, channel
):
    assert fastpath.encode_declare_ok(channel, name, message_count, consumer_count) == (
        pamqp_frame.marshal(
            commands.Queue.DeclareOk(
                queue=name, message_count=message_count, consumer_count=consumer_count
            ),
            channel,
        )
    )
    assert fastpath.encode_consume_ok(channel, name) == pamqp_frame.marshal(
        commands.Basic.ConsumeOk(consumer_tag=name), channel
    )
    assert fastpath.encode_cancel_ok(channel, name) == pamqp_frame.marshal(
        commands.Basic.CancelOk(consumer_tag=name), channel
    )


def test_replies_refuse_a_name_longer_than_a_shortstr():
    for encode in (
        lambda name: fastpath.encode_declare_ok(1, name, 0, 0),
        lambda name: fastpath.encode_consume_ok(1, name),
        lambda name: fastpath.encode_cancel_ok(1, name),
    ):
        with pytest.raises(ValueError):
            encode("é" * 128)


class _Stored:
    """A delivery as the broker holds it: exchange and routing key as bytes."""

    def __init__(self, exchange, routing_key, properties, body, redelivered):
        self.exchange = exchange.encode()
        self.routing_key = routing_key.encode()
        self.properties = properties
        self.body = body
        self.redelivered = redelivered


@settings(max_examples=100)
@given(
    deliveries=st.lists(
        st.tuples(
            properties(),
            st.binary(max_size=9000),
            st.booleans(),
            st.sampled_from(["", "amq.direct", "x"]),
            st.sampled_from(["", "k", "orders.created"]),
        ),
        max_size=8,
    ),
    frame_max=st.integers(4096, 12000),
    channel=st.integers(1, 65535),
    consumer_tag=shortstr,
    first_tag=st.integers(1, 2**40),
)
def test_deliver_many_is_byte_identical_to_pamqp_per_message(
    deliveries, frame_max, channel, consumer_tag, first_tag
):
    messages = [
        _Stored(exchange, routing_key, props.marshal(), body, redelivered)
        for props, body, redelivered, exchange, routing_key in deliveries
    ]
    parts = []
    fastpath.deliver_many_parts(parts, channel, consumer_tag, first_tag, messages, frame_max)
    expected = b"".join(
        pamqp_frame.marshal(
            commands.Basic.Deliver(
                consumer_tag=consumer_tag,
                delivery_tag=first_tag + i,
                redelivered=m.redelivered,
                exchange=m.exchange.decode(),
                routing_key=m.routing_key.decode(),
            ),
            channel,
        )
        + pamqp_content(channel, props, m.body, frame_max)
        for i, (m, (props, *_)) in enumerate(zip(messages, deliveries, strict=True))
    )
    assert b"".join(parts) == expected


def test_deliver_many_refuses_an_oversized_routing_key():
    with pytest.raises(ValueError):
        fastpath.deliver_many_parts(
            [], 1, "c", 1, [_Stored("", "k" * 256, b"\x00\x00", b"", False)], 4096
        )


def test_oversized_shortstr_is_refused():
    with pytest.raises(ValueError):
        fastpath.encode_deliver(1, "c" * 256, 1, False, "", "", b"\x00\x00", b"", 4096)


@settings(max_examples=300)
@given(
    props=properties(),
    damage=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=3),
)
def test_property_check_lets_through_only_what_a_client_parses(props, damage):
    property_bytes = props.marshal()
    assert fastpath.scan_properties(property_bytes)
    damaged = bytearray(property_bytes)
    for at, value in damage:
        damaged[at % len(damaged)] = value
    try:
        fastpath.scan_properties(bytes(damaged))
    except ValueError:
        return
    try:
        frames.decode_properties(bytes(damaged))
    except ValueError as error:
        # pamqp turns timestamps into datetimes and fails past year 9999; the wire allows them.
        assert "out of range" in str(error), error


def test_header_tables_nested_too_deep_are_refused():
    deep = {}
    for _ in range(field_table.TABLE_DEPTH_MAX + 1):
        deep = {"n": deep}
    with pytest.raises(ValueError):
        fastpath.scan_properties(commands.Basic.Properties(headers=deep).marshal())
    wide = {f"k{i}": {"n": {}} for i in range(field_table.TABLE_DEPTH_MAX * 2)}
    assert fastpath.scan_properties(commands.Basic.Properties(headers=wide).marshal())


def test_field_table_check_tells_bytes_that_are_no_table_from_refused_tables():
    for table in (
        b"\x01aS" + struct.pack(">I", 50) + b"hi",
        b"\x01aS\x00\x00\x00\x00\x00",
        b"\x01aZ\x00",
        b"\x01a",
        b"\x01al\x00",
    ):
        with pytest.raises(field_table.MalformedFieldTable):
            field_table.check(table, 0, len(table))
    with pytest.raises(UnicodeDecodeError):
        field_table.check(b"\x02\xff\xfeV", 0, 4)
    deep = {}
    for _ in range(field_table.TABLE_DEPTH_MAX + 1):
        deep = {"n": deep}
    table = pamqp_encode.field_table(deep)
    with pytest.raises(ValueError):
        field_table.check(table, 4, len(table))


def test_unknown_property_flags_are_refused():
    with pytest.raises(ValueError):
        fastpath.scan_properties(struct.pack(">H", 0x0002))


# -- measurement -------------------------------------------------------------------------------


def _rate(function, seconds=0.5, calls_per_check=200):
    count = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        for _ in range(calls_per_check):
            function()
        count += calls_per_check
    return count / (time.perf_counter() - start)


def hot_paths():
    """For each hot path the fast path replaces: (ours, pamqp's), as calls with no arguments."""
    props = commands.Basic.Properties(content_type="application/json", delivery_mode=2)
    prop_bytes = props.marshal()
    body = b"x" * 256
    publish = testing.publish(1, "amq.direct", "orders.created", body, props)
    method_end = 7 + struct.unpack_from(">I", publish, 3)[0] + 1
    header_end = method_end + 7 + struct.unpack_from(">I", publish, method_end + 3)[0] + 1
    method_payload_ = publish[7 : method_end - 1]
    header_payload = publish[method_end + 7 : header_end - 1]

    def ours_publish():
        fastpath.decode_publish(method_payload_)
        _, _, _, properties_ = fastpath.decode_content_header(header_payload)
        fastpath.scan_properties(properties_)

    def pamqp_publish():
        offset = 0
        while offset < len(publish):
            consumed, _, _ = pamqp_frame.unmarshal(publish[offset:])
            offset += consumed

    def ours_deliver():
        fastpath.encode_deliver(
            1, "ctag-1", 12345, False, "amq.direct", "orders.created", prop_bytes, body, 131072
        )

    deliver = commands.Basic.Deliver(
        consumer_tag="ctag-1",
        delivery_tag=12345,
        exchange="amq.direct",
        routing_key="orders.created",
    )

    def pamqp_deliver():
        pamqp_frame.marshal(deliver, 1) + pamqp_content(1, props, body, 131072)

    ack_payload = method_payload(commands.Basic.Ack(delivery_tag=99, multiple=True))
    ack_frame = pamqp_frame.marshal(commands.Basic.Ack(delivery_tag=99, multiple=True), 1)
    return {
        "publish parse (method+header+body)": (ours_publish, pamqp_publish),
        "deliver encode (3 frames)": (ours_deliver, pamqp_deliver),
        "ack decode": (
            lambda: fastpath.decode_ack(ack_payload),
            lambda: pamqp_frame.unmarshal(ack_frame),
        ),
    }


def measure(seconds=0.5):
    """Operations per second for each hot path, ours and pamqp's."""
    figures = {}
    for name, (ours, theirs) in hot_paths().items():
        figures[f"{name}, fast path"] = _rate(ours, seconds)
        figures[f"{name}, pamqp"] = _rate(theirs, seconds)
    figures["confirm encode, fast path"] = _rate(lambda: fastpath.encode_ack(1, 99, True), seconds)

    props = commands.Basic.Properties(content_type="application/json", delivery_mode=2)
    batch = testing.publish(1, "amq.direct", "orders.created", b"x" * 256, props) * 1000
    conn = Connection()
    testing.open_connection(conn)
    testing.open_channel(conn, 1)

    def connection_batch():
        conn.receive_data(batch, 1.0)
        while conn.next_event() is not None:
            pass

    figures["publishes through Connection.receive_data+next_event"] = (
        _rate(connection_batch, seconds, calls_per_check=1) * 1000
    )
    return figures


def calls_made(function) -> int:
    """The function calls (Python and C) that function() makes: the same on every machine."""
    calls = 0

    def count(frame, event, arg):
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    previous = sys.getprofile()
    sys.setprofile(count)
    try:
        function()
    finally:
        sys.setprofile(previous)
    return calls


@pytest.mark.parametrize(
    "path", ["publish parse (method+header+body)", "deliver encode (3 frames)"]
)
def test_fast_path_does_less_work_than_pamqp(path):
    """The fast path's claim to speed, checked by counting its calls rather than timing them
    (timings race on a busy machine); the figures come from running this file."""
    ours, theirs = hot_paths()[path]
    assert calls_made(ours) < calls_made(theirs)


def test_the_measurement_runs():
    assert all(rate > 0 for rate in measure(seconds=0.001).values())


if __name__ == "__main__":
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    for name, rate in measure(seconds).items():
        print(f"{name:55s} {rate:12,.0f} /s")

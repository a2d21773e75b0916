"""The compiled codecs (amqp/_speedups.pyx) against their pure-Python reference (fastpath).

Both must give the same answer for any input: the same result (deliveries: the same bytes on
the wire), or the same exception with the same text (a client sees that text in its
connection.close). Inputs: well-formed ones, the same with a byte changed or cut off, and
arbitrary bytes.

The extension is optional at install (no C compiler, no extension); CI has one, so there a
missing extension fails here instead of silently measuring the reference.
"""

import os
import struct
from unittest import mock

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pamqp import commands
from test_amqp_fastpath import properties, shortstr

from warrenmq.amqp import connection, fastpath, frames, testing

if fastpath._speedups is None and os.environ.get("CI") != "true":
    pytest.skip(
        "the compiled decoders were not built (no C compiler?) or WARREN_PURE_PYTHON is set",
        allow_module_level=True,
    )


def outcome(function, data):
    try:
        return ("returned", function(data))
    except Exception as error:  # the type and text are what is compared
        return ("raised", type(error), str(error))


def agree(compiled, reference, data):
    assert outcome(compiled, data) == outcome(reference, data), data


@st.composite
def damaged(draw, valid):
    """`valid` bytes with one byte replaced, or cut short, or with bytes added."""
    data = bytearray(draw(valid))
    how = draw(st.sampled_from(["replace", "cut", "extend"]))
    if how == "replace" and data:
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    elif how == "cut":
        del data[draw(st.integers(0, len(data))) :]
    else:
        data += draw(st.binary(min_size=1, max_size=4))
    return bytes(data)


property_bytes = properties().map(lambda props: props.marshal())


def _shortstr(text):
    encoded = text.encode()
    return bytes((len(encoded),)) + encoded


# Built by hand: pamqp refuses exchange names that RabbitMQ (and so Warren) takes.
publish_payload = st.builds(
    lambda exchange, routing_key, bits: (
        struct.pack(">HHH", 60, 40, 0) + _shortstr(exchange) + _shortstr(routing_key) + bits
    ),
    shortstr,
    shortstr,
    st.sampled_from([b"\x00", b"\x01", b"\x02", b"\x03"]),
)


def test_the_broker_uses_the_compiled_codecs():
    assert fastpath.scan_properties is fastpath._speedups.scan_properties
    assert fastpath.decode_publish is fastpath._speedups.decode_publish
    assert fastpath.deliver_many_parts is fastpath._speedups.deliver_many_parts
    assert connection._publish_frames is fastpath._speedups.publish_frames


@settings(max_examples=400)
@given(data=st.one_of(property_bytes, damaged(property_bytes), st.binary(max_size=64)))
@example(data=b"")
@example(data=b"\x00")
@example(data=b"\x00\x00")
@example(data=b"\x10\x00")  # delivery-mode flagged, its octet missing
@example(data=b"\x01\x00\x04\xc3\xa9\xc3\xa9")  # expiration in non-ASCII UTF-8
@example(data=b"\x01\x00\x03ab\xff")  # only its last byte not ASCII
@example(data=b"\x00\x10\x03ab\xff")  # the same in user-id
@example(data=b"\x01\x00\x02\xff\xfe")  # expiration not UTF-8
@example(data=b"\x00\x40\x00\x00\x00\x00\x00\x00\x00")  # timestamp a byte short
@example(data=b"\x20\x00\x00\x00\x00\x02\x01a")  # headers: an entry cut off
@example(data=b"\x20\x00\xff\xff\xff\xff")  # headers longer than the properties
@example(data=b"\x00\x03")  # unknown flags
def test_scan_properties_agrees_with_the_reference(data):
    agree(fastpath._speedups.scan_properties, fastpath.python_scan_properties, data)


@settings(max_examples=400)
@given(data=st.one_of(publish_payload, damaged(publish_payload), st.binary(max_size=48)))
@example(data=b"\x00\x3c\x00\x28\x00\x00")
@example(data=b"\x00\x3c\x00\x28\x00\x00\x00\x00")  # the bits octet missing
@example(data=b"\x00\x3c\x00\x28\x00\x00\x00\x00\x00\x00")  # a byte trailing
@example(data=b"\x00\x3c\x00\x28\x00\x00\x02\xc3\xa9\x00\x00")  # exchange in UTF-8
@example(data=b"\x00\x3c\x00\x28\x00\x00\x03ab\xff\x00\x00")  # only its last byte not ASCII
@example(data=b"\x00\x3c\x00\x28\x00\x00\x00\x03ab\xff\x00")  # the routing key's
@example(data=b"\x00\x3c\x00\x28\x00\x00\x00\x01\xff\x00")  # routing key not UTF-8
def test_decode_publish_agrees_with_the_reference(data):
    agree(fastpath._speedups.decode_publish, fastpath.python_decode_publish, data)


@given(data=st.one_of(property_bytes, publish_payload))
def test_bytes_that_are_not_bytes_go_to_the_reference(data):
    view = memoryview(data)
    agree(fastpath._speedups.scan_properties, fastpath.python_scan_properties, view)
    agree(fastpath._speedups.decode_publish, fastpath.python_decode_publish, bytearray(data))


deliveries = st.lists(
    st.builds(
        fastpath.Delivery,
        exchange=st.binary(max_size=260),
        routing_key=st.binary(max_size=260),
        properties=property_bytes,
        body=st.one_of(
            st.binary(max_size=64),
            st.integers(1000, 9000).map(lambda size: bytes(range(256)) * (size // 256) + b"x"),
        ),
        redelivered=st.booleans(),
    ),
    max_size=6,
)


def delivered(function, channel, consumer_tag, first_tag, messages, frame_max):
    """The bytes a delivery puts on the wire, and what it returned or raised."""
    parts = []
    result = outcome(
        lambda _: function(parts, channel, consumer_tag, first_tag, messages, frame_max), None
    )
    return b"".join(parts), result


@settings(max_examples=300)
@given(
    channel=st.one_of(st.integers(1, 0xFFFF), st.just(0x10000)),
    consumer_tag=st.one_of(shortstr, st.text(min_size=256, max_size=300)),
    first_tag=st.one_of(st.integers(1, 2**40), st.just(2**63 - 2), st.just(2**64 - 2)),
    messages=deliveries,
    frame_max=st.sampled_from([4095, 4096, 8192, 131072]),
)
@example(
    channel=1,
    consumer_tag="ctag",
    first_tag=1,
    messages=[fastpath.Delivery(b"", b"q", b"\x10\x00\x02", b"x" * 1025, True)],
    frame_max=131072,
)
@example(  # bodies at and past the inline bound and the frame size, names at and past 255
    channel=7,
    consumer_tag="t" * 255,
    first_tag=1,
    messages=[
        fastpath.Delivery(b"e" * 255, b"k" * 255, b"\x00\x00", b"a" * 1024),
        fastpath.Delivery(b"", b"q", b"\x00\x00", b"b" * 1025, True),
        fastpath.Delivery(b"", b"q", b"\x00\x00", b"c" * (4096 - 8)),
        fastpath.Delivery(b"", b"q", b"\x00\x00", b"d" * (4096 - 7)),
        fastpath.Delivery(b"e" * 256, b"q", b"\x00\x00", b"x"),
        fastpath.Delivery(b"", b"k" * 256, b"\x00\x00", b""),
    ],
    frame_max=4096,
)
@example(channel=1, consumer_tag="t" * 256, first_tag=1, messages=[], frame_max=4096)
def test_deliveries_are_the_same_bytes_as_the_reference(
    channel, consumer_tag, first_tag, messages, frame_max
):
    compiled = delivered(
        fastpath._speedups.deliver_many_parts, channel, consumer_tag, first_tag, messages, frame_max
    )
    reference = delivered(
        fastpath.python_deliver_many_parts, channel, consumer_tag, first_tag, messages, frame_max
    )
    assert compiled == reference


# -- whole publishes parsed at once (publish_frames) against the frame-by-frame path ---------

FRAME_MAX = 4096
# Below the frame bound, so that a body in one frame can pass it.
MESSAGE_BYTES_MAX = 3000


def frame(frame_type, channel, payload):
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + b"\xce"


# Names and properties mostly on the common case, so that most publishes take the compiled
# path; the rest (UTF-8 names, headers tables, ...) leave it.
common_name = st.text(alphabet="abcdefghijklmnopqrstuvwxyz.-_", max_size=20)
common_properties = st.sampled_from([b"\x00\x00", b"\x10\x00\x02", b"\x90\x00\x05hello\x01"])


@st.composite
def publish_frames_of(draw, channel):
    """A publish's frames, built by hand (pamqp refuses names RabbitMQ takes): mostly well
    formed, its body in one frame or split, sometimes with a field off the common case."""
    exchange, routing_key = (
        (draw(common_name), draw(common_name))
        if draw(st.integers(0, 4))
        else (draw(shortstr), draw(shortstr))
    )
    # immediate=true (2, 3) closes the connection: rarely, so that publishes after it count.
    bits = draw(st.sampled_from([b"\x00", b"\x01"] * 10 + [b"\x02", b"\x03"]))
    payload = struct.pack(">HHH", 60, 40, 0) + _shortstr(exchange) + _shortstr(routing_key) + bits
    props = draw(common_properties) if draw(st.integers(0, 3)) else draw(property_bytes)
    body = draw(
        st.one_of(
            st.binary(max_size=64),
            st.sampled_from([b"b" * 3000, b"b" * 3001, b"b" * 4088, b"b" * 4089]),
        )
    )
    size = len(body) if draw(st.integers(0, 19)) else draw(st.sampled_from([0, 3001, 2**64 - 1]))
    class_id, weight = (
        (60, 0) if draw(st.integers(0, 19)) else draw(st.sampled_from([(50, 0), (60, 1)]))
    )
    header = struct.pack(">HHQ", class_id, weight, size) + props
    chunk = draw(st.sampled_from([FRAME_MAX - 8, FRAME_MAX - 8, FRAME_MAX - 8, 10, 1]))
    bodies = [body[i : i + chunk] for i in range(0, len(body), chunk)]
    return (
        frame(frames.FRAME_METHOD, channel, payload)
        + frame(frames.FRAME_HEADER, channel, header)
        + b"".join(frame(frames.FRAME_BODY, channel, part) for part in bodies)
    )


benign_frames = st.sampled_from(
    [
        testing.marshal(1, commands.Basic.Ack(delivery_tag=1)),
        testing.marshal(2, commands.Confirm.Select()),
        testing.heartbeat(),
    ]
)
# Each closes the channel or the connection (a stray body, a publish on a channel not open, a
# method frame cut short).
harmful_frames = st.sampled_from(
    [
        frame(frames.FRAME_BODY, 1, b"stray"),
        frame(frames.FRAME_METHOD, 3, struct.pack(">HHH", 60, 40, 0) + b"\x00\x01q\x00"),
        frame(frames.FRAME_METHOD, 1, b"\x00\x3c"),
    ]
)


@st.composite
def client_input(draw):
    """What a client sends after the handshake, maybe damaged, and how it is cut into reads."""
    data = b"".join(
        draw(
            st.lists(
                st.one_of(
                    publish_frames_of(1),
                    publish_frames_of(2),
                    publish_frames_of(1),
                    publish_frames_of(2),
                    benign_frames,
                    harmful_frames,
                ),
                max_size=12,
            )
        )
    )
    if not draw(st.integers(0, 4)):
        data = draw(damaged(st.just(data)))
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=4)))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


def run_connection(reads):
    conn = connection.Connection(
        connection.ConnectionConfig(frame_bytes_max=FRAME_MAX, message_bytes_max=MESSAGE_BYTES_MAX)
    )
    testing.open_connection(conn, frame_max=FRAME_MAX)
    testing.open_channel(conn, 1)
    testing.open_channel(conn, 2)
    conn.receive_data(testing.marshal(1, commands.Confirm.Select()), 0.0)
    testing.drain(conn)
    conn.data_to_send()
    seen = []
    for data in reads:
        conn.receive_data(data, 0.0)
        seen.append((testing.drain(conn), conn.data_to_send()))
    channels = {
        number: (
            channel.state,
            channel.content_state,
            channel.publish_seq,
            channel.last_method_ids,
            channel.confirm_mode,
        )
        for number, channel in conn._channels.items()
    }
    return seen, conn.state, conn.buffered_bytes, channels


@settings(max_examples=300)
@given(reads=client_input())
def test_publishes_parsed_at_once_are_what_the_frame_by_frame_path_makes(reads):
    compiled = run_connection(reads)
    with mock.patch.object(connection, "_publish_frames", None):
        reference = run_connection(reads)
    assert compiled == reference


@pytest.mark.parametrize(
    ("body_bytes", "compiled"),
    [
        (0, True),
        (MESSAGE_BYTES_MAX, True),
        (MESSAGE_BYTES_MAX + 1, False),  # past the message bound: 406 from the reference
        (FRAME_MAX - 8, False),  # within the frame bound, past the message bound
        (FRAME_MAX + 1, False),  # a body frame past the frame bound: 501 from the reference
    ],
)
def test_publishes_at_and_past_the_bounds_parse_as_frame_by_frame(body_bytes, compiled):
    payload = struct.pack(">HHH", 60, 40, 0) + _shortstr("") + _shortstr("q" * 255) + b"\x00"
    body = b"b" * body_bytes
    data = (
        frame(frames.FRAME_METHOD, 1, payload)
        + frame(frames.FRAME_HEADER, 1, struct.pack(">HHQ", 60, 0, body_bytes) + b"\x10\x00\x02")
        + (frame(frames.FRAME_BODY, 1, body) if body else b"")
    )
    parsed = []
    real = connection._publish_frames

    def counting(*args):
        found = real(*args)
        parsed.append(found is not None)
        return found

    with mock.patch.object(connection, "_publish_frames", counting):
        with_compiled = run_connection([data])
    with mock.patch.object(connection, "_publish_frames", None):
        reference = run_connection([data])
    assert with_compiled == reference
    assert parsed[-1] is compiled  # the last method frame tried: the publish
    events = [event for seen, _ in reference[0] for event in seen]
    assert any(type(event).__name__ == "MessagePublished" for event in events) is compiled

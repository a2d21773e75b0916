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

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_amqp_fastpath import properties, shortstr

from warrenmq.amqp import fastpath

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

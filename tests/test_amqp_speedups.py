"""The compiled decoders (amqp/_speedups.pyx) against their pure-Python reference (fastpath).

Both must give the same answer for any bytes: the same result, or the same exception with the
same text (a client sees that text in its connection.close). Inputs: well-formed ones built
by pamqp, the same with a byte changed or cut off, and arbitrary bytes.

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


def test_the_broker_uses_the_compiled_decoders():
    assert fastpath.scan_properties is fastpath._speedups.scan_properties
    assert fastpath.decode_publish is fastpath._speedups.decode_publish


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

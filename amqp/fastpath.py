"""Hand-written codecs for the frames on the message path: publish in, deliver out, acks both ways.

pamqp builds an object per method and walks its attribute list; on the publish/deliver path
that costs more than the rest of the broker's work per message (see the figures in
``tests/test_amqp_fastpath.py``'s ``__main__``). These functions use precompiled
``struct.Struct``s and plain slicing instead, and are tested against pamqp in both directions.

Decoders take a method payload *including* its 4 class/method id bytes and raise ValueError
on anything malformed (RabbitMQ's generated decoders are exact binary patterns, so trailing
bytes are an error too). Encoders return complete frames.

The replies that carry a queue name or a consumer tag (queue.declare-ok, basic.consume-ok,
basic.cancel-ok) are encoded here too, though they are not on the message path: pamqp checks
names against a pattern narrower than what RabbitMQ accepts (any UTF-8 up to 255 bytes), and
would refuse a reply for a queue RabbitMQ declares.

Content properties stay as the bytes the client sent. ``scan_properties`` walks them once to
check their structure and pick out the few fields the broker acts on, without building an
object; ``frames.decode_properties`` does the full (pamqp) decode when a header is needed.
"""

import os
import struct
import sys
from typing import NamedTuple

from . import field_table, frames

QUEUE_CLASS = 50
DECLARE_OK_METHOD = 11
BASIC_CLASS = 60
CONSUME_OK_METHOD = 21
CANCEL_OK_METHOD = 31
PUBLISH_METHOD = 40
RETURN_METHOD = 50
DELIVER_METHOD = 60
GET_OK_METHOD = 71
ACK_METHOD = 80
REJECT_METHOD = 90
NACK_METHOD = 120

SHORTSTR_BYTES_MAX = 255

_FRAME_END = frames.FRAME_END_BYTE
_METHOD_HEAD = struct.Struct(">BHIHH")  # frame header + class id + method id
_CONTENT_HEAD = struct.Struct(">BHIHHQ")  # frame header + class id + weight + body size
_BODY_HEAD = frames.HEADER
_TAG_AND_BITS = struct.Struct(">QB")
_REPLY_CODE = struct.Struct(">H")
_MESSAGE_COUNT = struct.Struct(">I")
_DECLARE_OK_COUNTS = struct.Struct(">II")
_ACK_PAYLOAD = struct.Struct(">HHQB")
_ACK_PAYLOAD_BYTES = _ACK_PAYLOAD.size
_ACK_FRAME = struct.Struct(">BHIHHQBB")
_SHORT = struct.Struct(">H")
_LONG = struct.Struct(">I")

# Basic.Properties in wire order: (flag bit, field width). Widths: "s" shortstr, "t" table,
# 1 octet, 8 timestamp. The last flag bit of each 16-bit flag word means "another word follows".
_PROPERTY_FIELDS = (
    (0x8000, "s"),  # content-type
    (0x4000, "s"),  # content-encoding
    (0x2000, "t"),  # headers
    (0x1000, 1),  # delivery-mode
    (0x0800, 1),  # priority
    (0x0400, "s"),  # correlation-id
    (0x0200, "s"),  # reply-to
    (0x0100, "s"),  # expiration
    (0x0080, "s"),  # message-id
    (0x0040, 8),  # timestamp
    (0x0020, "s"),  # type
    (0x0010, "s"),  # user-id
    (0x0008, "s"),  # app-id
    (0x0004, "s"),  # cluster-id (deprecated, still on the wire)
)
# flags -> the (flag, width) pairs present, so a scan walks only the fields a message has
# (usually one to three of fourteen). Bounded: flags are 14 known bits.
_FIELDS_PRESENT: dict[int, tuple] = {}
_DELIVERY_MODE_FLAG = 0x1000
_PRIORITY_FLAG = 0x0800
_EXPIRATION_FLAG = 0x0100
_USER_ID_FLAG = 0x0010
_PROPERTY_FLAGS_KNOWN = 0xFFFC


def fields_present(flags):
    """The (flag, width) pairs of ``_PROPERTY_FIELDS`` whose bit is set in ``flags``, in wire
    order."""
    fields = _FIELDS_PRESENT.get(flags)
    if fields is None:
        fields = _FIELDS_PRESENT[flags] = tuple(
            (flag, width) for flag, width in _PROPERTY_FIELDS if flags & flag
        )
    return fields


def decode_publish(payload):
    """(exchange, routing_key, mandatory, immediate) from a basic.publish payload."""
    try:
        exchange_end = 7 + payload[6]
        routing_key_end = exchange_end + 1 + payload[exchange_end]
        bits = payload[routing_key_end]
        exchange = payload[7:exchange_end].decode("utf-8")
        routing_key = payload[exchange_end + 1 : routing_key_end].decode("utf-8")
    except (IndexError, UnicodeDecodeError) as error:
        raise ValueError(f"malformed basic.publish: {error}") from error
    if routing_key_end + 1 != len(payload):
        raise ValueError("malformed basic.publish: trailing bytes")
    return exchange, routing_key, bool(bits & 1), bool(bits & 2)


def decode_ack(payload):
    """(delivery_tag, multiple) from a basic.ack payload."""
    if len(payload) != _ACK_PAYLOAD_BYTES:
        raise ValueError("malformed basic.ack")
    _, _, delivery_tag, bits = _ACK_PAYLOAD.unpack(payload)
    return delivery_tag, bool(bits & 1)


def decode_nack(payload):
    """(delivery_tag, multiple, requeue) from a basic.nack payload."""
    if len(payload) != _ACK_PAYLOAD_BYTES:
        raise ValueError("malformed basic.nack")
    _, _, delivery_tag, bits = _ACK_PAYLOAD.unpack(payload)
    return delivery_tag, bool(bits & 1), bool(bits & 2)


def decode_reject(payload):
    """(delivery_tag, requeue) from a basic.reject payload."""
    if len(payload) != _ACK_PAYLOAD_BYTES:
        raise ValueError("malformed basic.reject")
    _, _, delivery_tag, bits = _ACK_PAYLOAD.unpack(payload)
    return delivery_tag, bool(bits & 1)


def decode_content_header(payload):
    """(class_id, weight, body_size, property_bytes) from a content header payload."""
    if len(payload) < frames.CONTENT_HEADER_PREFIX_BYTES:
        raise ValueError("content header is truncated")
    class_id, weight, body_size = frames.CONTENT_HEADER_PREFIX.unpack_from(payload)
    return class_id, weight, body_size, payload[frames.CONTENT_HEADER_PREFIX_BYTES :]


class MalformedProperties(ValueError):
    """Content-header property bytes that do not parse (RabbitMQ cannot decode them either)."""


def scan_properties(property_bytes):
    """Check the structure of content-header property bytes; return what the broker acts on.

    Returns (delivery_mode, priority, expiration, user_id), each None when absent. Raises
    MalformedProperties when a length runs past the end, bytes trail or the headers table is
    malformed, and ValueError for what parses but is refused all the same: an unknown flag,
    text that is not UTF-8, tables nested too deep. Table contents are walked, not decoded.
    """
    end = len(property_bytes)
    if end < 2:
        raise MalformedProperties("content header flags are truncated")
    flags = _SHORT.unpack_from(property_bytes)[0]
    if flags & ~_PROPERTY_FLAGS_KNOWN:
        raise ValueError(f"unknown content header flags {flags:#06x}")
    if not flags:
        if end != 2:
            raise MalformedProperties("trailing bytes after content properties")
        return None, None, None, None
    delivery_mode = priority = expiration = user_id = None
    offset = 2
    try:
        for flag, width in fields_present(flags):
            if width == "s":
                start = offset + 1
                offset = start + property_bytes[offset]
                # RabbitMQ refuses shortstrs that are not UTF-8 (rabbit_binary_parser:assert_utf8).
                text = property_bytes[start:offset].decode("utf-8")
                if flag == _EXPIRATION_FLAG:
                    expiration = text
                elif flag == _USER_ID_FLAG:
                    user_id = text
            elif width == "t":
                start = offset + 4
                offset = start + _LONG.unpack_from(property_bytes, offset)[0]
                if offset > end:
                    raise MalformedProperties("headers table runs past the content header")
                field_table.check(property_bytes, start, offset)
            else:
                if flag == _DELIVERY_MODE_FLAG:
                    delivery_mode = property_bytes[offset]
                elif flag == _PRIORITY_FLAG:
                    priority = property_bytes[offset]
                offset += width
    except UnicodeDecodeError:
        raise ValueError("Malformed UTF-8 in shortstr") from None
    except field_table.MalformedFieldTable as error:
        raise MalformedProperties(f"headers: {error}") from None
    except (IndexError, struct.error) as error:
        raise MalformedProperties(f"content properties are truncated: {error}") from error
    if offset != end:
        raise MalformedProperties("content properties length does not match their flags")
    return delivery_mode, priority, expiration, user_id


def _shortstr(text):
    """A shortstr's bytes: ``text`` encoded, or stored bytes as they are."""
    encoded = text if type(text) is bytes else text.encode("utf-8")
    if len(encoded) > SHORTSTR_BYTES_MAX:
        raise ValueError(f"shortstr longer than {SHORTSTR_BYTES_MAX} bytes: {text[:32]!r}...")
    return encoded


def _content_frames(parts, channel, property_bytes, body, frame_max):
    """Append the content header frame and body frames (split at frame_max) to ``parts``."""
    body_size = len(body)
    parts.append(
        _CONTENT_HEAD.pack(
            frames.FRAME_HEADER, channel, 12 + len(property_bytes), BASIC_CLASS, 0, body_size
        )
    )
    parts.append(property_bytes)
    parts.append(_FRAME_END)
    chunk_bytes_max = frame_max - frames.FRAME_OVERHEAD_BYTES
    if body_size <= chunk_bytes_max:
        if body_size:
            parts.append(_BODY_HEAD.pack(frames.FRAME_BODY, channel, body_size))
            parts.append(body)
            parts.append(_FRAME_END)
        return
    view = memoryview(body)
    for start in range(0, body_size, chunk_bytes_max):
        chunk = view[start : start + chunk_bytes_max]
        parts.append(_BODY_HEAD.pack(frames.FRAME_BODY, channel, len(chunk)))
        parts.append(chunk)
        parts.append(_FRAME_END)


class Delivery(NamedTuple):
    """One message to deliver, as a queue stores it: exchange and routing key as bytes."""

    exchange: bytes
    routing_key: bytes
    properties: bytes
    body: bytes
    redelivered: bool = False


def deliver_many_parts(parts, channel, consumer_tag, first_tag, messages, frame_max):
    """Append basic.deliver + content header + body frames of each of ``messages`` to
    ``parts`` (buffers, not joined), with delivery tags counting up from ``first_tag``. The
    connection appends straight to its output list so a body is copied once, into the
    coalesced write, or not at all when the broker writes the parts as they are (large
    bodies: ``Connection.parts_to_send``). This is the one delivery path: a single delivery
    is a batch of one.

    Each message (a ``Delivery``, or anything with its attributes) has ``exchange`` and
    ``routing_key`` (bytes, as stored: at most 255 bytes, checked here), ``properties``,
    ``body`` and ``redelivered``. The method frame's bytes before and after the delivery tag
    depend only on the consumer tag, exchange and routing key, so they are built once per
    distinct (exchange, routing key) of the batch. Returns the bodies' bytes.
    """
    assert frame_max >= frames.FRAME_MIN_BYTES, frame_max
    tag = _shortstr(consumer_tag)
    tag_part = bytes((len(tag),)) + tag
    chunk_bytes_max = frame_max - frames.FRAME_OVERHEAD_BYTES
    method_head = _METHOD_HEAD.pack
    tag_and_bits = _TAG_AND_BITS.pack
    content_head = _CONTENT_HEAD.pack
    body_head = _BODY_HEAD.pack
    framing = {}
    delivery_tag = first_tag
    body_bytes = 0
    for message in messages:
        exchange = message.exchange
        routing_key = message.routing_key
        around = framing.get((exchange, routing_key))
        if around is None:
            if len(exchange) > SHORTSTR_BYTES_MAX or len(routing_key) > SHORTSTR_BYTES_MAX:
                raise ValueError(f"shortstr longer than {SHORTSTR_BYTES_MAX} bytes")
            size = 16 + len(tag) + len(exchange) + len(routing_key)
            around = framing[(exchange, routing_key)] = (
                method_head(frames.FRAME_METHOD, channel, size, BASIC_CLASS, DELIVER_METHOD)
                + tag_part,
                bytes((len(exchange),))
                + exchange
                + bytes((len(routing_key),))
                + routing_key
                + _FRAME_END,
            )
        property_bytes = message.properties
        body = message.body
        body_size = len(body)
        body_bytes += body_size
        parts += (
            around[0],
            tag_and_bits(delivery_tag, 1 if message.redelivered else 0),
            around[1],
            content_head(
                frames.FRAME_HEADER, channel, 12 + len(property_bytes), BASIC_CLASS, 0, body_size
            ),
            property_bytes,
            _FRAME_END,
        )
        if 0 < body_size <= chunk_bytes_max:
            parts += (body_head(frames.FRAME_BODY, channel, body_size), body, _FRAME_END)
        elif body_size:
            view = memoryview(body)
            for start in range(0, body_size, chunk_bytes_max):
                chunk = view[start : start + chunk_bytes_max]
                parts += (body_head(frames.FRAME_BODY, channel, len(chunk)), chunk, _FRAME_END)
        delivery_tag += 1
    return body_bytes


def encode_deliver(
    channel,
    consumer_tag,
    delivery_tag,
    redelivered,
    exchange,
    routing_key,
    property_bytes,
    body,
    frame_max,
):
    """basic.deliver + content header (stored property bytes) + body frames, as one bytes."""
    parts = []
    deliver_many_parts(
        parts,
        channel,
        consumer_tag,
        delivery_tag,
        [Delivery(_shortstr(exchange), _shortstr(routing_key), property_bytes, body, redelivered)],
        frame_max,
    )
    return b"".join(parts)


def encode_get_ok(
    channel,
    delivery_tag,
    redelivered,
    exchange,
    routing_key,
    message_count,
    property_bytes,
    body,
    frame_max,
):
    """basic.get-ok + content header + body frames, as one bytes."""
    assert frame_max >= frames.FRAME_MIN_BYTES, frame_max
    exchange_bytes = _shortstr(exchange)
    routing_key_bytes = _shortstr(routing_key)
    size = 19 + len(exchange_bytes) + len(routing_key_bytes)
    parts = [
        _METHOD_HEAD.pack(frames.FRAME_METHOD, channel, size, BASIC_CLASS, GET_OK_METHOD),
        _TAG_AND_BITS.pack(delivery_tag, 1 if redelivered else 0),
        bytes((len(exchange_bytes),)),
        exchange_bytes,
        bytes((len(routing_key_bytes),)),
        routing_key_bytes,
        _MESSAGE_COUNT.pack(message_count),
        _FRAME_END,
    ]
    _content_frames(parts, channel, property_bytes, body, frame_max)
    return b"".join(parts)


def encode_return(
    channel, reply_code, reply_text, exchange, routing_key, property_bytes, body, frame_max
):
    """basic.return (an unroutable mandatory message) + content header + body frames."""
    assert frame_max >= frames.FRAME_MIN_BYTES, frame_max
    text_bytes = _shortstr(reply_text)
    exchange_bytes = _shortstr(exchange)
    routing_key_bytes = _shortstr(routing_key)
    size = 9 + len(text_bytes) + len(exchange_bytes) + len(routing_key_bytes)
    parts = [
        _METHOD_HEAD.pack(frames.FRAME_METHOD, channel, size, BASIC_CLASS, RETURN_METHOD),
        _REPLY_CODE.pack(reply_code),
        bytes((len(text_bytes),)),
        text_bytes,
        bytes((len(exchange_bytes),)),
        exchange_bytes,
        bytes((len(routing_key_bytes),)),
        routing_key_bytes,
        _FRAME_END,
    ]
    _content_frames(parts, channel, property_bytes, body, frame_max)
    return b"".join(parts)


def encode_declare_ok(channel, queue, message_count, consumer_count):
    """A queue.declare-ok frame, for any queue name RabbitMQ accepts."""
    name = _shortstr(queue)
    return b"".join(
        (
            _METHOD_HEAD.pack(
                frames.FRAME_METHOD, channel, 13 + len(name), QUEUE_CLASS, DECLARE_OK_METHOD
            ),
            bytes((len(name),)),
            name,
            _DECLARE_OK_COUNTS.pack(message_count, consumer_count),
            _FRAME_END,
        )
    )


def encode_consume_ok(channel, consumer_tag):
    """A basic.consume-ok frame, for any consumer tag."""
    return _consumer_tag_frame(channel, CONSUME_OK_METHOD, consumer_tag)


def encode_cancel_ok(channel, consumer_tag):
    """A basic.cancel-ok frame, for any consumer tag."""
    return _consumer_tag_frame(channel, CANCEL_OK_METHOD, consumer_tag)


def _consumer_tag_frame(channel, method_id, consumer_tag):
    tag = _shortstr(consumer_tag)
    return b"".join(
        (
            _METHOD_HEAD.pack(frames.FRAME_METHOD, channel, 5 + len(tag), BASIC_CLASS, method_id),
            bytes((len(tag),)),
            tag,
            _FRAME_END,
        )
    )


def encode_ack(channel, delivery_tag, multiple):
    """A basic.ack frame (a publisher confirm when sent by the broker)."""
    return _ACK_FRAME.pack(
        frames.FRAME_METHOD,
        channel,
        _ACK_PAYLOAD_BYTES,
        BASIC_CLASS,
        ACK_METHOD,
        delivery_tag,
        1 if multiple else 0,
        frames.FRAME_END,
    )


def encode_nack(channel, delivery_tag, multiple, requeue=False):
    """A basic.nack frame (a negative publisher confirm when sent by the broker)."""
    bits = (1 if multiple else 0) | (2 if requeue else 0)
    return _ACK_FRAME.pack(
        frames.FRAME_METHOD,
        channel,
        _ACK_PAYLOAD_BYTES,
        BASIC_CLASS,
        NACK_METHOD,
        delivery_tag,
        bits,
        frames.FRAME_END,
    )


# The compiled twins of the codecs every message goes through (amqp/_speedups.pyx),
# when the install could build them. The Python functions above stay the reference: the
# twins hand them every input off the well-formed path, and a property test holds the two to
# the same answers. WARREN_PURE_PYTHON=1 keeps the reference (to measure, or to rule it out).
python_scan_properties = scan_properties
python_decode_publish = decode_publish
python_deliver_many_parts = deliver_many_parts
publish_frames = None
"""A whole publish's frames parsed at once (``_speedups.publish_frames``), when compiled; its
reference is the connection's frame-by-frame path."""
if os.environ.get("WARREN_PURE_PYTHON", "") in ("", "0"):
    try:
        from . import _speedups
    except ImportError:
        _speedups = None
    else:
        _speedups.use_reference(sys.modules[__name__])
        scan_properties = _speedups.scan_properties
        decode_publish = _speedups.decode_publish
        deliver_many_parts = _speedups.deliver_many_parts
        publish_frames = _speedups.publish_frames
else:
    _speedups = None

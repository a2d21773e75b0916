"""AMQP 0-9-1 frame layout, the general (pamqp) method codec, and RabbitMQ's error texts for frames.

A frame is ``type:u8 channel:u16 size:u32 payload[size] 0xCE``. The hot methods have their own
codec in ``fastpath``; everything else goes through pamqp here.

Frame error texts reproduce ``rabbit_reader:frame_error/5`` and ``unexpected_frame/4``:
``"type ~tp, ~ts octets = ~tp: ~tp"`` where the octets are the payload (all of it up to 16
bytes, else the first 16) printed as an Erlang binary. ``erlang_binary`` approximates Erlang's
``~tp`` for binaries: printable text as ``<<"abc">>``, anything else as ``<<1,2,3>>``.
"""

import struct

from pamqp import commands, decode
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8
FRAME_END = 0xCE
FRAME_END_BYTE = b"\xce"

FRAME_HEADER_BYTES = 7
# Header plus end octet: what a frame costs beyond its payload (RabbitMQ's ?EMPTY_FRAME_SIZE).
FRAME_OVERHEAD_BYTES = 8
FRAME_MIN_BYTES = 4096

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
PROTOCOL_HEADER_BYTES = 8

HEADER = struct.Struct(">BHI")
METHOD_IDS = struct.Struct(">HH")
CONTENT_HEADER_PREFIX = struct.Struct(">HHQ")
CONTENT_HEADER_PREFIX_BYTES = CONTENT_HEADER_PREFIX.size

HEARTBEAT_FRAME = HEADER.pack(FRAME_HEARTBEAT, 0, 0) + FRAME_END_BYTE

SNIPPET_BYTES_MAX = 16
_ERLANG_PRINTABLE_CONTROLS = "\n\r\t\x0b\x08\x0c\x1b"
_ERLANG_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\x0b": "\\v", "\x08": "\\b",
                   "\x0c": "\\f", "\x1b": "\\e", '"': '\\"', "\\": "\\\\"}


def method_ids(method_class):
    """(class id, method id) of a pamqp method class or instance."""
    return method_class.index >> 16, method_class.index & 0xFFFF


def encode_method(channel, method):
    """One method frame for a pamqp method (the general, slower path)."""
    return pamqp_frame.marshal(method, channel)


def decode_method(class_id, method_id, arguments):
    """A pamqp method from a method payload's argument bytes.

    Raises KeyError for an id pamqp does not know and ValueError for arguments it cannot
    decode. pamqp raises a variety of exceptions on hostile bytes (struct.error, TypeError,
    IndexError, UnicodeDecodeError...), so every failure is folded into ValueError here.
    """
    method = commands.INDEX_MAPPING[(class_id << 16) | method_id]()
    try:
        method.unmarshal(arguments)
    except Exception as error:
        raise ValueError(str(error)) from error
    return method


def decode_properties(property_bytes):
    """pamqp Basic.Properties from content-header property bytes (flags and values)."""
    content_header = pamqp_header.ContentHeader()
    try:
        content_header.unmarshal(CONTENT_HEADER_PREFIX.pack(60, 0, 0) + bytes(property_bytes))
    except Exception as error:
        raise ValueError(str(error)) from error
    return content_header.properties


def encode_properties(properties):
    """Content-header property bytes (flags and values) for pamqp Basic.Properties."""
    return properties.marshal()


def decode_field_table(table_bytes):
    """A field table whose 4-byte length prefix is missing, as in an AMQPLAIN response."""
    try:
        _, table = decode.field_table(struct.pack(">I", len(table_bytes)) + table_bytes)
    except Exception as error:
        raise ValueError(str(error)) from error
    return table


def erlang_binary(data):
    """Erlang's ``~tp`` rendering of a binary, as RabbitMQ prints it in error texts."""
    data = bytes(data)
    if not data:
        return "<<>>"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and all(c.isprintable() or c in _ERLANG_PRINTABLE_CONTROLS for c in text):
        return '<<"' + "".join(_ERLANG_ESCAPES.get(c, c) for c in text) + '">>'
    return "<<" + ",".join(str(b) for b in data) + ">>"


def payload_snippet(payload):
    """RabbitMQ's ``payload_snippet/1``: ("all", payload) or ("first 16", its first 16 bytes)."""
    if len(payload) <= SNIPPET_BYTES_MAX:
        return "all", erlang_binary(payload)
    return "first 16", erlang_binary(payload[:SNIPPET_BYTES_MAX])


def frame_error_text(frame_type, payload, error_term):
    """``rabbit_reader:frame_error/5`` explanation, e.g. for an unknown frame type."""
    which, octets = payload_snippet(payload)
    return f"type {frame_type}, {which} octets = {octets}: {error_term}"


def unexpected_frame_text(frame_type, payload):
    """``rabbit_reader:unexpected_frame/4`` explanation."""
    which, octets = payload_snippet(payload)
    return f"type {frame_type}, {which} octets = {octets}"

"""AMQP 0-9-1 frame layout, the general (pamqp) method codec, and RabbitMQ's error texts for frames.

A frame is ``type:u8 channel:u16 size:u32 payload[size] 0xCE``. The hot methods have their own
codec in ``fastpath``; everything else goes through pamqp here. pamqp's decoder is lenient (it
ignores trailing bytes and reads a table's values past the table's end), so arguments are
first checked against the method's fields as strictly as RabbitMQ's generated decoder, which
matches one exact binary pattern per method.

Frame error texts reproduce ``rabbit_reader:frame_error/5`` and ``unexpected_frame/4``:
``"type ~tp, ~ts octets = ~tp: ~tp"`` where the octets are the payload (all of it up to 16
bytes, else the first 16) printed as an Erlang binary. ``erlang_binary`` approximates Erlang's
``~tp`` for binaries: printable text as ``<<"abc">>``, anything else as ``<<1,2,3>>``.
"""

import struct

from pamqp import commands, decode
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header

from . import field_table

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

_LONG = struct.Struct(">I")
# Wire widths of the fixed-size argument types; bits are packed eight to an octet.
_ARGUMENT_BYTES = {"octet": 1, "short": 2, "long": 4, "longlong": 8}
# Every method's argument types in wire order, by pamqp index.
_ARGUMENT_TYPES = {
    index: tuple(method.amqp_type(name) for name in method.__slots__)
    for index, method in commands.INDEX_MAPPING.items()
}

SNIPPET_BYTES_MAX = 16
_ERLANG_PRINTABLE_CONTROLS = "\n\r\t\x0b\x08\x0c\x1b"
_ERLANG_ESCAPES = {
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\x0b": "\\v",
    "\x08": "\\b",
    "\x0c": "\\f",
    "\x1b": "\\e",
    '"': '\\"',
    "\\": "\\\\",
}


def method_ids(method_class):
    """(class id, method id) of a pamqp method class or instance."""
    return method_class.index >> 16, method_class.index & 0xFFFF


def encode_method(channel, method):
    """One method frame for a pamqp method (the general, slower path)."""
    return pamqp_frame.marshal(method, channel)


def decode_method(class_id, method_id, arguments):
    """A pamqp method from a method payload's argument bytes.

    Raises KeyError for an id pamqp does not know, field_table.MalformedFieldTable for a
    table argument that is not a field table, and ValueError for any other arguments it
    cannot decode. pamqp raises a variety of exceptions on hostile bytes (struct.error,
    TypeError, IndexError, UnicodeDecodeError...), so those are folded into ValueError here.
    """
    index = (class_id << 16) | method_id
    method = commands.INDEX_MAPPING[index]()
    # RabbitMQ's order: the whole pattern (and UTF-8 shortstrs) first, then each table.
    for start, end in _table_spans(_ARGUMENT_TYPES[index], arguments):
        field_table.check(arguments, start, end)
    try:
        method.unmarshal(arguments)
    except Exception as error:
        raise ValueError(str(error)) from error
    return method


def _table_spans(argument_types, arguments):
    """(start, end) of each table in ``arguments``; ValueError unless the bytes are exactly
    the method's arguments, with UTF-8 shortstrs."""
    spans = []
    offset = 0
    bits = 0
    try:
        for kind in argument_types:
            if kind == "bit":
                if bits % 8 == 0:
                    offset += 1
                bits += 1
                continue
            bits = 0
            if kind == "shortstr":
                start = offset + 1
                offset = start + arguments[offset]
                arguments[start:offset].decode("utf-8")
            elif kind == "longstr" or kind == "table":
                start = offset + 4
                offset = start + _LONG.unpack_from(arguments, offset)[0]
                if kind == "table":
                    spans.append((start, offset))
            else:
                offset += _ARGUMENT_BYTES[kind]
    except (IndexError, struct.error):
        raise ValueError("method arguments are truncated") from None
    if offset != len(arguments):
        raise ValueError("method arguments do not end with their last field")
    return spans


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
    """A field table whose 4-byte length prefix is missing, as in an AMQPLAIN response.

    Raises field_table.MalformedFieldTable for bytes that are not a table, ValueError for a
    table refused all the same (see ``field_table.check``) or that pamqp cannot decode.
    """
    field_table.check(table_bytes, 0, len(table_bytes))
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

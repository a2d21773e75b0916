"""Field tables on the wire: the structural check every table from a client goes through.

A table is ``(key:shortstr type:octet value)*`` filling exactly its 32-bit length. RabbitMQ
parses it with ``rabbit_binary_parser:parse_table/1``, one binary pattern per value type and
no catch-all clause, so bytes it has no clause for (a length that runs past the table, a
partial entry at its end, an unknown type) make it crash rather than reply:

* in method arguments the reader process crashes and the client sees the socket close with
  no connection.close (RabbitMQ 3.10.8, checked with hand-built frames);
* in a content header's ``headers`` the channel process crashes when it decodes the
  properties, and the reader closes the connection with a bare 541 INTERNAL_ERROR.

``check`` tells those bytes apart (``MalformedFieldTable``) from the tables this broker
refuses although RabbitMQ takes them (keys that are not UTF-8, nesting beyond
``TABLE_DEPTH_MAX``), so each caller can answer as RabbitMQ does.
"""

import struct

# Field-value types RabbitMQ's rabbit_binary_parser accepts in tables and arrays, with their
# fixed widths; "S", "x", "F" and "A" carry a 32-bit length instead.
FIXED_WIDTHS = {
    ord(t): w
    for t, w in (
        ("t", 1),
        ("b", 1),
        ("B", 1),
        ("s", 2),
        ("u", 2),
        ("I", 4),
        ("i", 4),
        ("f", 4),
        ("D", 5),
        ("l", 8),
        ("L", 8),
        ("d", 8),
        ("T", 8),
        ("V", 0),
    )
}
_LENGTH_PREFIXED = frozenset(map(ord, "Sx"))
_TABLE = ord("F")
_ARRAY = ord("A")
_LONG = struct.Struct(">I")
TABLE_DEPTH_MAX = 32


class MalformedFieldTable(Exception):
    """Bytes that are not a field table at all: RabbitMQ's parser has no clause for them.

    Deliberately not a ValueError: callers answer it differently from every other decode
    error (see the module docstring).
    """


def check(data, start, end):
    """Check that data[start:end] is a well-formed field table, without building it.

    Nested tables and arrays are walked too (at most TABLE_DEPTH_MAX deep), so a message
    whose headers a consumer's client library cannot parse is refused at publish. Raises
    MalformedFieldTable for bytes RabbitMQ cannot parse either, UnicodeDecodeError for a key
    that is not UTF-8, and ValueError for nesting deeper than TABLE_DEPTH_MAX.
    """
    stack = []  # the tables and arrays we are inside of: (is_table, resume at, their end)
    is_table, position, limit = True, start, end
    while True:
        if position >= limit:
            if position > limit:
                raise MalformedFieldTable("field value runs past its table")
            if not stack:
                return
            is_table, position, limit = stack.pop()
            continue
        if is_table:
            key_start = position + 1
            position = key_start + data[position]
            if position >= limit:
                raise MalformedFieldTable("field table entry is truncated")
            # Client libraries decode keys as UTF-8 and fail on anything else.
            data[key_start:position].decode("utf-8")
        kind = data[position]
        position += 1
        width = FIXED_WIDTHS.get(kind)
        if width is not None:
            position += width
            continue
        if kind not in _LENGTH_PREFIXED and kind != _TABLE and kind != _ARRAY:
            raise MalformedFieldTable(f"unknown field value type {kind:#04x}")
        if position + 4 > limit:
            raise MalformedFieldTable("field value length is truncated")
        inner_start = position + 4
        position = inner_start + _LONG.unpack_from(data, position)[0]
        if position > limit:
            raise MalformedFieldTable("field value runs past its table")
        if kind == _TABLE or kind == _ARRAY:
            if len(stack) >= TABLE_DEPTH_MAX:
                raise ValueError("field tables nested too deep")
            stack.append((is_table, position, limit))
            is_table, position, limit = kind == _TABLE, inner_start, position

"""Editing stored content-header properties: the fields the broker itself adds or removes.

The broker stores and re-sends the property bytes a publisher sent (ARCHITECTURE.md, "The
data path"); only what the broker changes (x-death and the other dead-letter headers,
x-delivery-count, a dropped expiration) needs an edit. These functions change exactly those
fields and keep every other byte as it was: re-encoding through pamqp would sort every table
and re-pick the type of every integer the publisher sent.

Values are handled as *typed values*: the type octet followed by the value's wire bytes, as
they sit in a field table (``b"S" + length + text``). The encoders below write the types
RabbitMQ writes for the headers it adds (long strings, signed 64-bit longs, timestamps,
arrays, tables). Property bytes passed in were checked at publish (``fastpath.
scan_properties``), so they are taken to be well formed.
"""

import struct

from .fastpath import _PROPERTY_FIELDS, fields_present
from .field_table import FIXED_WIDTHS

HEADERS_FLAG = 0x2000
# The headers flag's bit in the first byte of the property flags: a test of stored property
# bytes that needs no decoding.
HEADERS_FLAG_BYTE0 = HEADERS_FLAG >> 8
EXPIRATION_FLAG = 0x0100

_SHORT = struct.Struct(">H")
_LONG = struct.Struct(">I")
_SIGNED_LONG_LONG = struct.Struct(">q")
_LONG_LONG = struct.Struct(">Q")
_INTEGER_FORMATS = {
    ord("b"): ">b",
    ord("B"): ">B",
    ord("s"): ">h",
    ord("u"): ">H",
    ord("I"): ">i",
    ord("i"): ">I",
    ord("l"): ">q",
    ord("L"): ">Q",
    ord("T"): ">Q",
}


def split(property_bytes: bytes) -> dict[int, bytes]:
    """The present properties in wire order: flag bit -> the field's bytes (a shortstr with
    its length octet, a table with its 32-bit length)."""
    flags = _SHORT.unpack_from(property_bytes)[0]
    fields: dict[int, bytes] = {}
    offset = 2
    for flag, width in fields_present(flags):
        if width == "s":
            end = offset + 1 + property_bytes[offset]
        elif width == "t":
            end = offset + 4 + _LONG.unpack_from(property_bytes, offset)[0]
        else:
            end = offset + width
        fields[flag] = bytes(property_bytes[offset:end])
        offset = end
    return fields


def join(fields: dict[int, bytes]) -> bytes:
    """Property bytes from `split`'s form (fields in any order)."""
    flags = 0
    parts = [b""]
    for flag, _ in _PROPERTY_FIELDS:
        value = fields.get(flag)
        if value is not None:
            flags |= flag
            parts.append(value)
    parts[0] = _SHORT.pack(flags)
    return b"".join(parts)


def _value_end(data: bytes, position: int) -> int:
    """Where the typed value starting at `position` ends."""
    kind = data[position]
    width = FIXED_WIDTHS.get(kind)
    if width is not None:
        return position + 1 + width
    return position + 5 + _LONG.unpack_from(data, position + 1)[0]


def table_entries(table: bytes) -> list[tuple[str, bytes]]:
    """A table's entries, in order, as (key, typed value); `table` is the table's content
    without its length."""
    entries = []
    position = 0
    while position < len(table):
        key_end = position + 1 + table[position]
        key = table[position + 1 : key_end].decode("utf-8")
        position = _value_end(table, key_end)
        entries.append((key, table[key_end:position]))
    return entries


def array_items(typed: bytes) -> list[bytes]:
    """The typed values of an array's typed value (``b"A" + length + items``)."""
    items = []
    position = 5
    while position < len(typed):
        end = _value_end(typed, position)
        items.append(typed[position:end])
        position = end
    return items


def headers(property_bytes: bytes) -> list[tuple[str, bytes]]:
    """The headers table's entries as (key, typed value); empty when there is none."""
    table = split(property_bytes).get(HEADERS_FLAG)
    return table_entries(table[4:]) if table else []


def with_headers(property_bytes: bytes, entries: list[tuple[str, bytes]]) -> bytes:
    """The properties with the headers table's entries replaced by `entries` (a table is
    added if there was none and `entries` is not empty)."""
    fields = split(property_bytes)
    if entries or HEADERS_FLAG in fields:
        fields[HEADERS_FLAG] = table(entries)[1:]
    return join(fields)


def without(property_bytes: bytes, flag: int) -> bytes:
    fields = split(property_bytes)
    if fields.pop(flag, None) is None:
        return property_bytes
    return join(fields)


def shortstr_field(property_bytes: bytes, flag: int) -> str | None:
    """A shortstr property's text (expiration, message-id, ...), None when absent."""
    value = split(property_bytes).get(flag)
    return None if value is None else value[1:].decode("utf-8")


# -- typed values -----------------------------------------------------------------------------


def longstr(text: str | bytes) -> bytes:
    data = text.encode("utf-8") if isinstance(text, str) else text
    return b"S" + _LONG.pack(len(data)) + data


def long(value: int) -> bytes:
    """A signed 64-bit long ("l"), the type RabbitMQ writes for counts."""
    return b"l" + _SIGNED_LONG_LONG.pack(value)


def timestamp(seconds: int) -> bytes:
    return b"T" + _LONG_LONG.pack(seconds)


def array(items: list[bytes]) -> bytes:
    data = b"".join(items)
    return b"A" + _LONG.pack(len(data)) + data


def table(entries: list[tuple[str, bytes]]) -> bytes:
    data = b"".join(
        bytes((len(encoded),)) + encoded + value
        for encoded, value in ((key.encode("utf-8"), value) for key, value in entries)
    )
    return b"F" + _LONG.pack(len(data)) + data


def text(typed: bytes | None) -> str | None:
    """A long or short string value's text; None for another type or no value."""
    if typed and typed[0] in (ord("S"), ord("x")):
        return typed[5:].decode("utf-8", "replace")
    return None


def integer(typed: bytes | None) -> int | None:
    """An integer or timestamp value; None for another type or no value."""
    if not typed:
        return None
    fmt = _INTEGER_FORMATS.get(typed[0])
    if fmt is None:
        return None
    return struct.unpack_from(fmt, typed, 1)[0]


def table_value(typed: bytes | None) -> list[tuple[str, bytes]] | None:
    """A table value's entries; None for another type or no value."""
    if typed and typed[0] == ord("F"):
        return table_entries(typed[5:])
    return None

"""`x-stream-offset`: where a stream consumer starts, as RabbitMQ 3.10 reads it.

rabbit_stream_queue:parse_offset_arg and rabbit_amqqueue:check_max_age decide: "first",
"last" and "next" (any string type); an AMQP timestamp (seconds); a long string interval
("1h", "30m": a positive count of Y, M, D, h, m or s) meaning that long before now; any
integer, an offset (below what the stream retains: the first retained; beyond its end: that
offset, once written). Without the argument: "next".

RabbitMQ answers two kinds of bad value differently, and so does Warren: an interval with a
count but a bad unit (or a count of 0) is refused with 406 ("invalid arg 'x-stream-offset'
... {invalid_stream_offset_arg,{longstr,<<"99x">>}}"); a string without a leading count, a
boolean, a float and the other types crash RabbitMQ's channel, which closes the connection
with a bare 541 INTERNAL_ERROR (`Unreadable`).
"""

from __future__ import annotations

import datetime
import enum
from typing import Any, NamedTuple

from warrenmq.exchanges.field_values import amqp_type_name


class Start(enum.Enum):
    FIRST = "first"
    LAST = "last"
    """The first offset of the last chunk (a batch written by one tick)."""
    NEXT = "next"
    OFFSET = "offset"
    TIMESTAMP = "timestamp"
    """The first chunk holding a record stamped at or after `value` (epoch ms)."""


class OffsetSpec(NamedTuple):
    start: Start
    value: int = 0


NEXT = OffsetSpec(Start.NEXT)
_NAMED = {"first": Start.FIRST, "last": Start.LAST, "next": Start.NEXT}
# rabbit_amqqueue's unit_value_in_ms/1.
_UNIT_MS = {
    "s": 1000,
    "m": 60_000,
    "h": 3_600_000,
    "D": 86_400_000,
    "M": 30 * 86_400_000,
    "Y": 365 * 86_400_000,
}


class Invalid(ValueError):
    """A value RabbitMQ refuses with 406; the text is the reason term it prints."""


class Unreadable(ValueError):
    """A value that crashes RabbitMQ's channel (541 INTERNAL_ERROR, connection closed)."""


def interval_ms(text: str) -> int | None:
    """rabbit_amqqueue:check_max_age/1: "<count><unit>" in ms; None when invalid; raises
    Unreadable when there is no leading count (RabbitMQ's list_to_integer crashes)."""
    digits = len(text) - len(text.lstrip("0123456789"))
    if digits == 0:
        raise Unreadable(text)
    count = int(text[:digits])
    unit_ms = _UNIT_MS.get(text[digits:])
    if count <= 0 or unit_ms is None:
        return None
    return count * unit_ms


def parse(value: Any, now_ms: int) -> OffsetSpec:
    """The start a consumer asked for; `value` is the decoded argument (None: absent)."""
    if value is None:
        return NEXT
    if isinstance(value, (str, bytes, bytearray)):
        text = value.decode("utf-8", "replace") if not isinstance(value, str) else value
        named = _NAMED.get(text)
        if named is not None:
            return OffsetSpec(named)
        if not isinstance(value, str):
            raise Unreadable(text)
        ms = interval_ms(text)
        if ms is None:
            raise Invalid(f'{{invalid_stream_offset_arg,{{longstr,<<"{text}">>}}}}')
        return OffsetSpec(Start.TIMESTAMP, now_ms - ms)
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.UTC)
        return OffsetSpec(Start.TIMESTAMP, int(value.timestamp()) * 1000)
    if isinstance(value, int) and not isinstance(value, bool):
        return OffsetSpec(Start.OFFSET, value)
    raise Unreadable(amqp_type_name(value))


class Retained(NamedTuple):
    """What a stream holds when a consumer starts: [first, end), the start of its last
    chunk, and the first chunk at or after a time (a function: only a timestamp needs it)."""

    first: int
    end: int
    last_chunk: int


def resolve(spec: OffsetSpec, retained: Retained, chunk_at_or_after: Any) -> int:
    """The offset a consumer with `spec` reads first. `chunk_at_or_after(ms)` is the first
    offset of the first chunk with a record stamped at or after ms, None if none is."""
    start = spec.start
    if start is Start.FIRST:
        return retained.first
    if start is Start.LAST:
        return retained.last_chunk
    if start is Start.NEXT:
        return retained.end
    if start is Start.OFFSET:
        # Below the retained range, the first retained; beyond its end, that offset itself:
        # RabbitMQ skips every record below it, so nothing comes until it is written.
        return max(spec.value, retained.first)
    found = chunk_at_or_after(spec.value)
    return retained.end if found is None else max(found, retained.first)

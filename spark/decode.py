"""Stored batches (`log/batch.py`'s format, as GET /topics/T/batches returns them) into Arrow
record batches of the data source's rows.

The one loop in Python walks the records' 10-byte framing to find where each record starts
(the lengths chain one record to the next, so nothing vectorises it); every column is then cut
out of the fetched bytes by numpy gathers, and the AMQP properties are decoded once per
distinct property bytes (a stream's messages mostly share them), then spread by index.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from crc32c import crc32c

from warrenmq.amqp import properties as amqp_properties
from warrenmq.log.batch import (
    CRC_AT,
    CRC_START,
    HEADER,
    HEADER_BYTES,
    LENGTH_END,
    MAGIC,
    RECORD_HEADER,
    RECORD_HEADER_BYTES,
)
from warrenmq.log.errors import CorruptBatchError

# The AMQP properties offered as columns, by flag: (column, "s" for a short string or "i" for
# an octet). The AMQP timestamp and cluster-id are left out (the broker stamps every record).
PROPERTY_COLUMNS: tuple[tuple[str, int, str], ...] = (
    ("content_type", 0x8000, "s"),
    ("content_encoding", 0x4000, "s"),
    ("delivery_mode", 0x1000, "i"),
    ("priority", 0x0800, "i"),
    ("correlation_id", 0x0400, "s"),
    ("reply_to", 0x0200, "s"),
    ("expiration", 0x0100, "s"),
    ("message_id", 0x0080, "s"),
    ("type", 0x0020, "s"),
    ("user_id", 0x0010, "s"),
    ("app_id", 0x0008, "s"),
)
_SHORT_STRING = "s"


class Located(NamedTuple):
    """Where each record of a fetch is: numpy arrays, one entry per record, in offset order."""

    offsets: np.ndarray
    timestamps_ms: np.ndarray
    starts: np.ndarray
    """Position of the record's framing in the fetched bytes."""
    next_offset: int
    """The offset after the fetch's last batch (where the next fetch starts)."""


def locate(data: bytes) -> Located:
    """Check each batch of `data` (whole batches, CRC-checked) and find its records."""
    unpack_header = HEADER.unpack_from
    unpack_record = RECORD_HEADER.unpack_from
    view = memoryview(data)
    starts = array("q")
    append = starts.append
    bases: list[int] = []
    counts: list[int] = []
    timestamps: list[int] = []
    position = 0
    size = len(data)
    next_offset = -1
    while position < size:
        if size - position < HEADER_BYTES:
            raise CorruptBatchError(f"a batch header is cut at position {position}")
        base, length, magic, crc, _, count, timestamp_ms, _ = unpack_header(data, position)
        end = position + LENGTH_END + length
        if magic != MAGIC or end > size:
            raise CorruptBatchError(f"bad batch header at position {position}")
        if (
            crc32c(view[position + CRC_START : end], crc32c(view[position : position + CRC_AT]))
            != crc
        ):
            raise CorruptBatchError(f"CRC mismatch in batch at offset {base}")
        if next_offset not in (-1, base):
            raise CorruptBatchError(f"offsets jump from {next_offset} to {base}")
        record = position + HEADER_BYTES
        for _ in range(count):
            append(record)
            exchange_len, key_len, properties_len, body_len = unpack_record(data, record)
            record += RECORD_HEADER_BYTES + exchange_len + key_len + properties_len + body_len
        if record != end:
            raise CorruptBatchError(f"record framing of the batch at offset {base} is wrong")
        bases.append(base)
        counts.append(count)
        timestamps.append(timestamp_ms)
        next_offset = base + count
        position = end
    repeats = np.asarray(counts, dtype=np.int64)
    total = int(repeats.sum()) if counts else 0
    firsts = np.cumsum(repeats) - repeats
    offsets = np.arange(total, dtype=np.int64) + np.repeat(
        np.asarray(bases, dtype=np.int64) - firsts, repeats
    )
    return Located(
        offsets,
        np.repeat(np.asarray(timestamps, dtype=np.int64), repeats),
        np.frombuffer(starts, dtype=np.int64),
        next_offset,
    )


def _binary(buffer: np.ndarray, at: np.ndarray, lengths: np.ndarray, kind: pa.DataType):
    """The byte ranges [at, at + lengths) of `buffer` as one Arrow binary or string array."""
    count = len(at)
    offsets = np.zeros(count + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    if total:
        gather = np.arange(total, dtype=np.int64)
        gather += np.repeat(at - offsets[:-1], lengths)
        data = buffer[gather]
    else:
        data = np.zeros(0, dtype=np.uint8)
    return pa.Array.from_buffers(kind, count, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _header_value(typed: bytes) -> bytes:
    """A header's value as a Kafka header's bytes: a string's bytes, an integer's decimal
    text, any other type as its AMQP typed value."""
    text = amqp_properties.text(typed)
    if text is not None:
        return typed[5:]
    number = amqp_properties.integer(typed)
    return typed if number is None else str(number).encode()


def _decoded_properties(property_bytes: bytes, with_headers: bool) -> list[Any]:
    """One row of the property columns (and the headers last, when asked)."""
    fields = amqp_properties.split(property_bytes) if len(property_bytes) > 2 else {}
    row: list[Any] = []
    for _, flag, kind in PROPERTY_COLUMNS:
        value = fields.get(flag)
        if value is None:
            row.append(None)
        elif kind == _SHORT_STRING:
            row.append(value[1:].decode("utf-8", "replace"))
        else:
            row.append(value[0])
    if with_headers:
        table = fields.get(amqp_properties.HEADERS_FLAG)
        entries = amqp_properties.table_entries(table[4:]) if table else []
        row.append([{"key": key, "value": _header_value(value)} for key, value in entries])
    return row


def _property_columns(properties: pa.Array, schema: pa.Schema, with_headers: bool) -> list:
    """The property columns (and headers), decoded once per distinct property bytes."""
    encoded = pc.dictionary_encode(properties)
    distinct = encoded.dictionary.to_pylist()
    rows = [_decoded_properties(value, with_headers) for value in distinct]
    names = [name for name, _, _ in PROPERTY_COLUMNS] + (["headers"] if with_headers else [])
    return [
        pa.array([row[i] for row in rows], type=schema.field(name).type).take(encoded.indices)
        for i, name in enumerate(names)
    ]


def to_record_batch(
    data: bytes,
    located: Located,
    keep: slice,
    stream: str,
    partition: int,
    schema: pa.Schema,
) -> pa.RecordBatch:
    """The records `keep` selects of the located ones as a record batch of `schema`."""
    buffer = np.frombuffer(data, dtype=np.uint8)
    starts = located.starts[keep]
    count = len(starts)
    exchange_len = buffer[starts].astype(np.int64)
    key_len = buffer[starts + 1].astype(np.int64)
    properties_len = _u32(buffer, starts + 2)
    body_len = _u32(buffer, starts + 6)
    exchange_at = starts + RECORD_HEADER_BYTES
    key_at = exchange_at + exchange_len
    properties_at = key_at + key_len
    body_at = properties_at + properties_len
    with_headers = "headers" in schema.names
    columns: dict[str, pa.Array] = {
        "key": _binary(buffer, key_at, key_len, schema.field("key").type),
        "value": _binary(buffer, body_at, body_len, schema.field("value").type),
        "stream": pa.repeat(pa.scalar(stream, schema.field("stream").type), count),
        "partition": pa.repeat(pa.scalar(partition, schema.field("partition").type), count),
        "offset": pa.array(located.offsets[keep], type=schema.field("offset").type),
        "timestamp": pa.array(located.timestamps_ms[keep] * 1000, type=pa.int64()).view(
            schema.field("timestamp").type
        ),
        "exchange": _binary(buffer, exchange_at, exchange_len, schema.field("exchange").type),
    }
    properties = _binary(buffer, properties_at, properties_len, pa.binary())
    names = [name for name, _, _ in PROPERTY_COLUMNS] + (["headers"] if with_headers else [])
    columns.update(zip(names, _property_columns(properties, schema, with_headers), strict=True))
    return pa.RecordBatch.from_arrays([columns[name] for name in schema.names], schema=schema)


def _u32(buffer: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The little-endian u32 at each of `at`."""
    value = buffer[at].astype(np.int64)
    for shift in (1, 2, 3):
        value |= buffer[at + shift].astype(np.int64) << (8 * shift)
    return value


def record_batches(
    fetch: Callable[[int], bytes],
    start: int,
    end: int,
    stream: str,
    partition: int,
    schema: pa.Schema,
) -> Iterator[pa.RecordBatch]:
    """Record batches of every record in [start, end) of one partition, fetched by
    `fetch(offset)` (stored batches from the one holding `offset`; empty at the end)."""
    offset = start
    while offset < end:
        data = fetch(offset)
        if not data:
            return
        located = locate(data)
        if located.next_offset <= offset:
            raise CorruptBatchError(f"a fetch from offset {offset} ended at {located.next_offset}")
        low = int(np.searchsorted(located.offsets, offset))
        high = int(np.searchsorted(located.offsets, end))
        if high > low:
            yield to_record_batch(data, located, slice(low, high), stream, partition, schema)
        offset = max(offset, located.next_offset)

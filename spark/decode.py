"""Stored batches (`log/batch.py`'s format, as GET /topics/T/batches returns them) into Arrow
record batches of the data source's rows.

Python touches each batch (its header and CRC), not each record: the records' starts are found
by numpy rounds over all the fetch's batches at once (`_record_starts`), every field is copied
out of the fetched bytes by Arrow's `take` over one binary array laid on them, and the AMQP
properties are decoded once per distinct property bytes (a stream's messages mostly share them),
then spread by index. `log/batch.py`'s `decode_records` is the tests' oracle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
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
    HEADER_AFTER_LENGTH,
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


# A record's framing (`log/batch.py`): its four lengths.
_FRAMING = np.dtype([("exchange", "u1"), ("key", "u1"), ("properties", "<u4"), ("body", "<u4")])
assert _FRAMING.itemsize == RECORD_HEADER_BYTES
# A round of the vectorised walk that places fewer records than this hands its partitions'
# batches to the Python walk for up to WALK_RECORDS records each: rounds cost ~50 µs, a
# record walked in Python ~0.4 µs, so few long batches of records that keep changing size walk
# about as fast as they would in Python alone.
ROUND_RECORDS_MIN = 128
WALK_RECORDS = 1024
# Each batch's next round guesses at least this many records (when it has them).
GUESS_MIN = 4


class Located(NamedTuple):
    """Where each record of a fetch is: numpy arrays, one entry per record, in offset order."""

    offsets: np.ndarray
    timestamps_ms: np.ndarray
    starts: np.ndarray
    """Position of the record's framing in the fetched bytes."""
    next_offset: int
    """The offset after the fetch's last batch (where the next fetch starts)."""


def _framings(data: bytes) -> np.ndarray:
    """The 10 bytes at every position of `data` (a strided view: no copy); gathered, they view
    as _FRAMING (gathering the plain bytes is several times faster than gathering records)."""
    count = max(len(data) - RECORD_HEADER_BYTES + 1, 0)
    return np.ndarray((count,), f"V{RECORD_HEADER_BYTES}", buffer=data, strides=(1,))


def _sizes(gathered: np.ndarray) -> np.ndarray:
    """Bytes each record takes, framing included, from its gathered framing."""
    framings = gathered.view(_FRAMING)
    sizes = framings["properties"].astype(np.int64)
    sizes += framings["body"]
    sizes += framings["exchange"]
    sizes += framings["key"]
    sizes += RECORD_HEADER_BYTES
    return sizes


def locate(data: bytes) -> Located:
    """Check each batch of `data` (whole batches, CRC-checked) and find its records."""
    unpack_header = HEADER.unpack_from
    view = memoryview(data)
    firsts: list[int] = []
    ends: list[int] = []
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
        if magic != MAGIC or end > size or length < HEADER_AFTER_LENGTH:
            raise CorruptBatchError(f"bad batch header at position {position}")
        if (
            crc32c(view[position + CRC_START : end], crc32c(view[position : position + CRC_AT]))
            != crc
        ):
            raise CorruptBatchError(f"CRC mismatch in batch at offset {base}")
        if next_offset not in (-1, base):
            raise CorruptBatchError(f"offsets jump from {next_offset} to {base}")
        firsts.append(position + HEADER_BYTES)
        ends.append(end)
        bases.append(base)
        counts.append(count)
        timestamps.append(timestamp_ms)
        next_offset = base + count
        position = end
    repeats = np.asarray(counts, dtype=np.int64)
    starts = _record_starts(
        data, np.asarray(firsts, dtype=np.int64), repeats, np.asarray(ends, dtype=np.int64)
    )
    firsts_offsets = np.cumsum(repeats) - repeats
    offsets = np.arange(len(starts), dtype=np.int64) + np.repeat(
        np.asarray(bases, dtype=np.int64) - firsts_offsets, repeats
    )
    return Located(
        offsets,
        np.repeat(np.asarray(timestamps, dtype=np.int64), repeats),
        starts,
        next_offset,
    )


def _record_starts(
    data: bytes, firsts: np.ndarray, counts: np.ndarray, ends: np.ndarray
) -> np.ndarray:
    """Where each record of each batch starts: batch i has counts[i] records from firsts[i]
    to ends[i].

    A record's length says where the next one starts, so a batch is walked in order; but
    the batches are walked side by side, and each step guesses a run of records of the size
    of the one it stands on, then keeps the guesses up to the first record of another size
    (up to there they are exact). Records of one size (a stream of like messages) take a round
    or two for the whole fetch."""
    framings = _framings(data)
    starts = np.empty(int(counts.sum()), dtype=np.int64)
    slots = np.cumsum(counts) - counts
    position = firsts.copy()
    remaining = counts.copy()
    guess = counts.copy()
    batches = np.flatnonzero(remaining)
    while batches.size:
        at = position[batches]
        room = ends[batches] - at
        if (room < RECORD_HEADER_BYTES).any():
            raise CorruptBatchError("a record's framing overruns its batch")
        size = _sizes(framings[at])
        width = np.minimum(np.minimum(guess[batches], remaining[batches]), room // size)
        if not width.all():
            raise CorruptBatchError("a record overruns its batch")
        batch_of = np.repeat(np.arange(batches.size), width)
        segments = np.cumsum(width) - width
        step = np.arange(batch_of.size, dtype=np.int64) - segments[batch_of]
        candidates = at[batch_of] + size[batch_of] * step
        same = _sizes(framings[candidates]) == size[batch_of]
        run = np.minimum.reduceat(np.where(same, width[batch_of], step), segments)
        taken = step < run[batch_of]
        starts[(slots[batches][batch_of] + step)[taken]] = candidates[taken]
        position[batches] += run * size
        remaining[batches] -= run
        slots[batches] += run
        guess[batches] = np.maximum(2 * run, GUESS_MIN)
        batches = batches[remaining[batches] > 0]
        if batches.size and int(run.sum()) < ROUND_RECORDS_MIN:
            _walk(data, batches, starts, slots, position, remaining, ends)
            batches = batches[remaining[batches] > 0]
    if (position != ends).any():
        raise CorruptBatchError("a batch's records do not fill it")
    return starts


def _walk(
    data: bytes,
    batches: np.ndarray,
    starts: np.ndarray,
    slots: np.ndarray,
    position: np.ndarray,
    remaining: np.ndarray,
    ends: np.ndarray,
) -> None:
    """Up to WALK_RECORDS records of each of `batches`, one by one in Python."""
    unpack_record = RECORD_HEADER.unpack_from
    for batch in batches.tolist():
        record = int(position[batch])
        end = int(ends[batch])
        found = []
        append = found.append
        for _ in range(min(int(remaining[batch]), WALK_RECORDS)):
            if record + RECORD_HEADER_BYTES > end:
                raise CorruptBatchError("a record's framing overruns its batch")
            append(record)
            exchange_len, key_len, properties_len, body_len = unpack_record(data, record)
            record += RECORD_HEADER_BYTES + exchange_len + key_len + properties_len + body_len
            if record > end:
                raise CorruptBatchError("a record overruns its batch")
        slot = int(slots[batch])
        starts[slot : slot + len(found)] = found
        position[batch] = record
        remaining[batch] -= len(found)
        slots[batch] += len(found)


def _fields(data: bytes, starts: np.ndarray) -> pa.Array:
    """The records' fields as one binary array over `data` (no copy), five entries a record:
    the bytes before its exchange (framing, and a batch header before a batch's first record),
    then its exchange, routing key, properties and body."""
    framings = _framings(data)[starts].view(_FRAMING)
    bounds = np.empty(5 * len(starts) + 1, dtype=np.int64)
    bounds[0] = 0
    columns = bounds[1:].reshape(len(starts), 5)
    columns[:, 0] = starts + RECORD_HEADER_BYTES
    columns[:, 1] = columns[:, 0] + framings["exchange"]
    columns[:, 2] = columns[:, 1] + framings["key"]
    columns[:, 3] = columns[:, 2] + framings["properties"]
    columns[:, 4] = columns[:, 3] + framings["body"]
    return pa.Array.from_buffers(
        pa.large_binary(), 5 * len(starts), [None, pa.py_buffer(bounds), pa.py_buffer(data)]
    )


def _field(fields: pa.Array, which: int, kind: pa.DataType) -> pa.Array:
    """Field `which` (1 exchange, 2 routing key, 3 properties, 4 body) of every record, copied
    out as a `kind` array (binary, or string: the bytes as they are, unchecked, as AMQP does)."""
    picked = fields.take(pa.array(np.arange(which, len(fields), 5)))
    large = kind in (pa.large_binary(), pa.large_string())
    picked = picked.cast(pa.large_binary() if large else pa.binary())
    return picked if picked.type == kind else picked.view(kind)


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
        _spread([row[i] for row in rows], schema.field(name).type, encoded.indices)
        for i, name in enumerate(names)
    ]


def _spread(distinct: list[Any], kind: pa.DataType, indices: pa.Array) -> pa.Array:
    """The column whose row i is distinct[indices[i]]."""
    if all(value is None for value in distinct):
        # Most properties are absent from every message: no gather for them.
        return pa.nulls(len(indices), kind)
    return pa.array(distinct, type=kind).take(indices)


def to_record_batch(
    data: bytes,
    located: Located,
    keep: slice,
    stream: str,
    partition: int,
    schema: pa.Schema,
) -> pa.RecordBatch:
    """The records `keep` selects of the located ones as a record batch of `schema`."""
    fields = _fields(data, located.starts[keep])
    count = len(fields) // 5
    with_headers = "headers" in schema.names
    columns: dict[str, pa.Array] = {
        "key": _field(fields, 2, schema.field("key").type),
        "value": _field(fields, 4, schema.field("value").type),
        "stream": pa.repeat(pa.scalar(stream, schema.field("stream").type), count),
        "partition": pa.repeat(pa.scalar(partition, schema.field("partition").type), count),
        "offset": pa.array(located.offsets[keep], type=schema.field("offset").type),
        "timestamp": pa.array(located.timestamps_ms[keep] * 1000, type=pa.int64()).view(
            schema.field("timestamp").type
        ),
        "exchange": _field(fields, 1, schema.field("exchange").type),
    }
    properties = _field(fields, 3, pa.binary())
    names = [name for name, _, _ in PROPERTY_COLUMNS] + (["headers"] if with_headers else [])
    columns.update(zip(names, _property_columns(properties, schema, with_headers), strict=True))
    return pa.RecordBatch.from_arrays([columns[name] for name in schema.names], schema=schema)


def record_batches(
    fetch: Callable[[int], bytes],
    start: int,
    end: int,
    stream: str,
    partition: int,
    schema: pa.Schema,
) -> Iterator[pa.RecordBatch]:
    """Record batches of every record in [start, end) of one partition, fetched by
    `fetch(offset)` (stored batches from the one holding `offset`; empty at the end).

    The next fetch runs in a thread while this one is decoded (and while Spark consumes it):
    the request waits on the broker and the socket with the GIL released, so an executor
    keeps its core on decoding instead of alternating between the two."""
    with ThreadPoolExecutor(1, thread_name_prefix="warren-fetch") as fetcher:
        pending = fetcher.submit(fetch, start)
        offset = start
        while offset < end:
            data = pending.result()
            if not data:
                return
            located = locate(data)
            if located.next_offset <= offset:
                raise CorruptBatchError(
                    f"a fetch from offset {offset} ended at {located.next_offset}"
                )
            low = int(np.searchsorted(located.offsets, offset))
            high = int(np.searchsorted(located.offsets, end))
            offset = max(offset, located.next_offset)
            if offset < end:
                pending = fetcher.submit(fetch, offset)
            if high > low:
                yield to_record_batch(data, located, slice(low, high), stream, partition, schema)

"""Record batches: the unit the log writes, checksums and recovers.

A batch on disk (little-endian):

    base_offset       u64   offset of its first record; records are dense from there
    length            u32   bytes that follow this field
    magic             u8    format version, 1
    crc               u32   CRC32C of every other byte of the batch, offset and length included
    term              u64   leader term/epoch that wrote it (replication)
    record_count      u32
    max_timestamp_ms  i64   every record of the batch carries this timestamp (as a RabbitMQ
                            stream chunk does); the log keeps it non-decreasing
    attributes        u16   reserved, 0
    records           record_count x (u8 exchange_len, u8 routing_key_len,
                                      u32 properties_len, u32 body_len, then those bytes)

Record offsets are implicit (base_offset + position in the batch) and exchange names and
routing keys are AMQP short strings (at most 255 bytes), so a record costs 10 bytes of framing.
The properties are the AMQP content-header property bytes exactly as the client sent them.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from typing import NamedTuple

from crc32c import crc32c

from .errors import CorruptBatchError, LogError

MAGIC = 1
HEADER = struct.Struct("<QIBIQIqH")
HEADER_BYTES = HEADER.size
# The length field counts from `magic` on. The CRC covers the bytes before its own field and
# everything after it: unlike Kafka we never rewrite a stored offset, so the offset is covered too.
LENGTH_END = 12
CRC_AT = 13
CRC_START = 17
HEADER_AFTER_LENGTH = HEADER_BYTES - LENGTH_END
RECORD_HEADER = struct.Struct("<BBII")
RECORD_HEADER_BYTES = RECORD_HEADER.size
# What a record takes beyond its properties and body, at most: its framing, and an exchange
# name and routing key of 255 bytes each (AMQP short strings).
RECORD_OVERHEAD_BYTES_MAX = RECORD_HEADER_BYTES + 2 * 255
_HEADER_HEAD = struct.Struct("<QIB")
_HEADER_TAIL = struct.Struct("<QIqH")

RawRecord = tuple[bytes, bytes, bytes, bytes]
"""(exchange, routing_key, properties, body) as appended."""


class Record(NamedTuple):
    offset: int
    timestamp_ms: int
    term: int
    exchange: bytes
    routing_key: bytes
    properties: bytes
    body: bytes


class BatchHeader(NamedTuple):
    base_offset: int
    length: int
    magic: int
    crc: int
    term: int
    record_count: int
    max_timestamp_ms: int
    attributes: int

    @property
    def total_bytes(self) -> int:
        return LENGTH_END + self.length

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.record_count


def record_size(record: Record) -> int:
    """Bytes the record takes inside its batch."""
    return (
        RECORD_HEADER_BYTES
        + len(record.exchange)
        + len(record.routing_key)
        + len(record.properties)
        + len(record.body)
    )


def batch_bounds(
    records: Sequence[RawRecord], records_max: int, bytes_max: int
) -> list[tuple[int, int]]:
    """Split `records` into runs `[start, end)` that each encode to a batch within the bounds.

    A record too large for any batch gets a run of its own (the append then refuses it), so a
    caller can tell exactly which records a failed append took with it.
    """
    bounds: list[tuple[int, int]] = []
    start = 0
    size = HEADER_BYTES
    for index, (exchange, routing_key, properties, body) in enumerate(records):
        record_bytes = (
            RECORD_HEADER_BYTES + len(exchange) + len(routing_key) + len(properties) + len(body)
        )
        if index > start and (size + record_bytes > bytes_max or index - start >= records_max):
            bounds.append((start, index))
            start = index
            size = HEADER_BYTES
        size += record_bytes
    if start < len(records):
        bounds.append((start, len(records)))
    return bounds


def staged_batch_bounds(
    records: Sequence[RawRecord], fields_bytes: int, records_max: int, bytes_max: int
) -> list[tuple[int, int]]:
    """`batch_bounds` for records whose properties and bodies add up to `fields_bytes`
    (a queue's or stream's tick, which keeps that sum as it stages): when everything would
    fit one batch, any run of `records_max` records fits too, so the common tick needs no
    measuring."""
    count = len(records)
    if fields_bytes + count * RECORD_OVERHEAD_BYTES_MAX + HEADER_BYTES <= bytes_max:
        return [(start, min(start + records_max, count)) for start in range(0, count, records_max)]
    return batch_bounds(records, records_max, bytes_max)


def encode_records(records: Sequence[RawRecord], record_bytes_max: int) -> bytes:
    """The records' framing and bytes, one after another. Raises LogError past a bound."""
    parts: list[bytes] = []
    append = parts.append
    pack = RECORD_HEADER.pack
    try:
        for exchange, routing_key, properties, body in records:
            append(pack(len(exchange), len(routing_key), len(properties), len(body)))
            append(exchange)
            append(routing_key)
            append(properties)
            append(body)
    except struct.error as exc:
        raise LogError(f"exchange and routing key must be at most 255 bytes: {exc}") from None
    payload = b"".join(parts)
    # When the whole payload fits the record bound, every record does: check one by one only
    # when it does not, so the common case costs nothing per record.
    if len(payload) > record_bytes_max:
        for exchange, routing_key, properties, body in records:
            size = (
                RECORD_HEADER_BYTES + len(exchange) + len(routing_key) + len(properties) + len(body)
            )
            if size > record_bytes_max:
                raise LogError(
                    f"record of {size} bytes exceeds record_bytes_max {record_bytes_max}"
                )
    return payload


def encode_header(
    base_offset: int, term: int, record_count: int, timestamp_ms: int, payload: bytes
) -> bytes:
    length = HEADER_AFTER_LENGTH + len(payload)
    head = _HEADER_HEAD.pack(base_offset, length, MAGIC)
    tail = _HEADER_TAIL.pack(term, record_count, timestamp_ms, 0)
    crc = crc32c(payload, crc32c(tail, crc32c(head)))
    return HEADER.pack(base_offset, length, MAGIC, crc, term, record_count, timestamp_ms, 0)


def read_header(buf: bytes | memoryview, position: int) -> BatchHeader | None:
    """The batch header at `position`, or None when fewer than a header's bytes remain.

    Raises CorruptBatchError when the header itself cannot be a batch header.
    """
    if len(buf) - position < HEADER_BYTES:
        return None
    header = BatchHeader._make(HEADER.unpack_from(buf, position))
    if header.magic != MAGIC or header.length < HEADER_AFTER_LENGTH:
        raise CorruptBatchError(
            f"bad batch header at position {position}: magic {header.magic}, length {header.length}"
        )
    return header


def verify_crc(buf: bytes | memoryview, position: int, header: BatchHeader) -> None:
    end = position + header.total_bytes
    if (
        crc32c(buf[position + CRC_START : end], crc32c(buf[position : position + CRC_AT]))
        != header.crc
    ):
        raise CorruptBatchError(f"CRC mismatch in batch at offset {header.base_offset}")


def decode_records(
    buf: bytes | memoryview, position: int, header: BatchHeader, first_offset: int
) -> list[Record]:
    """Records of the CRC-verified batch at `position`, from `first_offset` on."""
    if type(buf) is not bytes:
        # One copy of the batch, so that each field below is a single slice of bytes.
        buf = bytes(buf[position : position + header.total_bytes])
        position = 0
    unpack = RECORD_HEADER.unpack_from
    pos = position + HEADER_BYTES
    end = position + header.total_bytes
    offset = header.base_offset
    term = header.term
    timestamp_ms = header.max_timestamp_ms
    records: list[Record] = []
    append = records.append
    new = tuple.__new__
    for _ in range(header.record_count):
        if pos + RECORD_HEADER_BYTES > end:
            raise CorruptBatchError(f"record framing overruns batch at offset {header.base_offset}")
        exchange_len, routing_key_len, properties_len, body_len = unpack(buf, pos)
        pos += RECORD_HEADER_BYTES
        record_end = pos + exchange_len + routing_key_len + properties_len + body_len
        if record_end > end:
            raise CorruptBatchError(f"record framing overruns batch at offset {header.base_offset}")
        if offset >= first_offset:
            routing_key_at = pos + exchange_len
            properties_at = routing_key_at + routing_key_len
            body_at = properties_at + properties_len
            # tuple.__new__: a NamedTuple's own __new__ is a Python function, a call per record.
            append(
                new(
                    Record,
                    (
                        offset,
                        timestamp_ms,
                        term,
                        buf[pos:routing_key_at],
                        buf[routing_key_at:properties_at],
                        buf[properties_at:body_at],
                        buf[body_at:record_end],
                    ),
                )
            )
        pos = record_end
        offset += 1
    if pos != end:
        raise CorruptBatchError(f"batch at offset {header.base_offset} has trailing bytes")
    return records


# The compiled twins of the record codecs (log/_speedups.pyx), when the install could build
# them. The Python functions above stay the reference: the twins hand them every input off
# the common case, and a property test holds the two to the same answers.
# WARREN_PURE_PYTHON=1 keeps the reference.
python_encode_records = encode_records
python_decode_records = decode_records
if os.environ.get("WARREN_PURE_PYTHON", "") in ("", "0"):
    try:
        from . import _speedups
    except ImportError:
        _speedups = None
    else:
        _speedups.use_reference(python_encode_records, python_decode_records)
        encode_records = _speedups.encode_records
        decode_records = _speedups.decode_records
else:
    _speedups = None

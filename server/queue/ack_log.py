"""The ack log: a queue's acknowledgement state as records in a second partition log.

Why a partition log rather than a file of our own: it already gives CRC-checked batches,
crash recovery that keeps a prefix of what was written, group-commit fsync in a worker thread
and whole-segment deletion, all tested; an ack record is just one more record. Each record's
body is (little-endian):

    kind    u8                        DELTA (1), CLIP (2), COUNTS (3), TAKEN (4), RETURNED (5),
                                      BCC (6) or HELD (7)
    floor   u64                       DELTA: every offset below is acked; CLIP: the limit
    mark    u64                       DELTA: offsets below may have been delivered; CLIP: 0
    count   u32                       acked ranges (or count or BCC entries) that follow
    ranges  count x (start u64, end u64)   acked half-open ranges, sorted, disjoint
            COUNTS: count x (offset u64, deliveries u64)
            TAKEN, RETURNED: count x (offset u64, deliveries u32, failures u32)
            HELD: count x (offset u64, deliveries u32, failures u32, due u64 epoch ms)
            BCC: count x (offset u64, keys u32, keys x (length u32, UTF-8 bytes))

Replay applies the records in log order. A DELTA is a union (floor and mark take the maximum,
ranges are added): acknowledgements only ever grow, so replaying a DELTA twice, or an old
one after a newer one, changes nothing. A snapshot is therefore just a DELTA that holds the
whole state: once it is durable, every record before it is redundant and whole segments
below it may go, and a snapshot spread over several records is as good as one. A CLIP
forgets everything at or above its limit; the queue writes one when it opens, so that a
delivered mark written ahead of messages lost in a crash cannot mark the new messages that
take their offsets as delivered.

Each message has two counts (RabbitMQ 4.3's): its deliveries (the times it was acquired by a
consumer, so x-acquired-count is deliveries - 1) and its failed deliveries (x-delivery-count,
what x-delivery-limit is checked against: basic.reject, a lost channel, a visibility timeout;
not basic.nack, basic.recover or a consumer timeout). A TAKEN record holds them for messages
delivered again (in flight as of the record), a RETURNED record for messages given back
(waiting as of the record); replay keeps each offset's last record. The difference matters
after a crash: a message whose last record is not RETURNED was (or may have been) with a
consumer whose connection the crash cut, which counts as a failed delivery, as RabbitMQ counts
a consumer that went down. A count of an acked offset is forgotten.

A HELD record is a RETURNED one for messages given back to wait out a requeue delay
(x-requeue-delay) before they are ready again, with the time they are due: the wait
survives a restart and a crash, and a message waiting when the queue went down was with no
consumer, so no failed delivery is counted for it.

COUNTS is the record of earlier versions, with deliveries only, every return a failure: replay
reads it as a TAKEN record with deliveries - 1 failures, so data written before the split
keeps its delivery limits.

A BCC record holds the BCC keys of messages published with a BCC header. RabbitMQ removes
the header before it stores a message but keeps its keys with it, and routes a dead letter
by them too; they are the queue's durable state about a message that no consumer may see,
like its delivery count, so they live here rather than in the message record: a message
without BCC (nearly all) costs no byte and no step more on its way in and out. An entry is
written once, with the commit that makes its message durable, and forgotten as its message
is acknowledged (and by a CLIP at or below its offset).
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from warrenmq.log import LogConfig, PartitionLog, RawRecord

from .errors import QueueError
from .ranges import coalesce

DELTA = 1
CLIP = 2
COUNTS = 3
TAKEN = 4
RETURNED = 5
BCC = 6
HELD = 7
HEAD = struct.Struct("<BQQI")
RANGE_BYTES = 16
COUNT = struct.Struct("<QII")
assert COUNT.size == RANGE_BYTES
HELD_COUNT = struct.Struct("<QIIQ")
# A u32 holds 4 billion deliveries; a larger count is written as this.
COUNT_MAX = (1 << 32) - 1
_BCC_ENTRY = struct.Struct("<QI")
_BCC_KEY = struct.Struct("<I")
# 16,384 ranges make a 256 KiB record: a snapshot of many holes spans several records.
RANGES_PER_RECORD_MAX = 16_384
# A batch of one record costs this much beyond its ranges (batch, record and DELTA headers).
RECORD_OVERHEAD_BYTES = 80
# Replay reads the ack log in slices of this many bytes.
REPLAY_READ_BYTES = 1 << 20


def _record(body: bytes) -> RawRecord:
    return (b"", b"", b"", body)


def ranges_per_record(config: LogConfig) -> int:
    """Most ranges in one DELTA record that still fits the ack log's record, batch and segment."""
    room = min(config.record_bytes_max, config.batch_bytes_max, config.segment_bytes_max)
    return min(RANGES_PER_RECORD_MAX, (room - RECORD_OVERHEAD_BYTES) // RANGE_BYTES)


def encode_delta(
    floor: int,
    mark: int,
    ranges: Sequence[tuple[int, int]],
    per_record: int = RANGES_PER_RECORD_MAX,
) -> list[RawRecord]:
    """One DELTA record, or several of at most `per_record` ranges each."""
    records: list[RawRecord] = []
    position = 0
    while True:
        chunk = ranges[position : position + per_record]
        flat = [bound for pair in chunk for bound in pair]
        records.append(
            _record(
                HEAD.pack(DELTA, floor, mark, len(chunk)) + struct.pack(f"<{len(flat)}Q", *flat)
            )
        )
        position += len(chunk)
        if position >= len(ranges):
            return records


def encode_clip(limit: int) -> RawRecord:
    return _record(HEAD.pack(CLIP, limit, 0, 0))


def encode_counts(
    kind: int,
    counts: Sequence[tuple[int, ...]],
    per_record: int = RANGES_PER_RECORD_MAX,
) -> list[RawRecord]:
    """TAKEN or RETURNED records of (offset, deliveries, failures), or HELD records of
    (offset, deliveries, failures, due epoch ms), at most `per_record` each."""
    assert kind in (TAKEN, RETURNED, HELD), kind
    if kind == HELD:
        entries = [
            HELD_COUNT.pack(o, min(d, COUNT_MAX), min(f, COUNT_MAX), due) for o, d, f, due in counts
        ]
        # `per_record` is counted in 16-byte entries; a HELD entry is larger.
        per_record = max(1, per_record * COUNT.size // HELD_COUNT.size)
    else:
        entries = [COUNT.pack(o, min(d, COUNT_MAX), min(f, COUNT_MAX)) for o, d, f in counts]
    return [
        _record(HEAD.pack(kind, 0, 0, len(chunk)) + b"".join(chunk))
        for chunk in (entries[i : i + per_record] for i in range(0, len(entries), per_record))
    ]


def _bcc_entry(offset: int, keys: Sequence[str]) -> bytes:
    parts = [_BCC_ENTRY.pack(offset, len(keys))]
    for key in keys:
        encoded = key.encode("utf-8")
        parts += (_BCC_KEY.pack(len(encoded)), encoded)
    return b"".join(parts)


def encode_bcc(entries: Sequence[tuple[int, Sequence[str]]], bytes_max: int) -> list[RawRecord]:
    """BCC records of (offset, BCC keys) entries, each body within `bytes_max` bytes (an
    entry larger than that alone in its record)."""
    records: list[RawRecord] = []
    chunk: list[bytes] = []
    size = HEAD.size
    for offset, keys in entries:
        entry = _bcc_entry(offset, keys)
        if chunk and size + len(entry) > bytes_max:
            records.append(_record(HEAD.pack(BCC, 0, 0, len(chunk)) + b"".join(chunk)))
            chunk, size = [], HEAD.size
        chunk.append(entry)
        size += len(entry)
    if chunk:
        records.append(_record(HEAD.pack(BCC, 0, 0, len(chunk)) + b"".join(chunk)))
    return records


def _decode_bcc(body: bytes, count: int) -> list[tuple[int, tuple[str, ...]]]:
    entries = []
    position = HEAD.size
    try:
        for _ in range(count):
            offset, key_count = _BCC_ENTRY.unpack_from(body, position)
            position += _BCC_ENTRY.size
            keys = []
            for _ in range(key_count):
                (length,) = _BCC_KEY.unpack_from(body, position)
                position += _BCC_KEY.size
                if position + length > len(body):
                    raise QueueError("ack log BCC record overruns its body")
                keys.append(body[position : position + length].decode("utf-8"))
                position += length
            entries.append((offset, tuple(keys)))
    except (struct.error, UnicodeDecodeError) as error:
        raise QueueError(f"ack log BCC record is malformed: {error}") from None
    if position != len(body):
        raise QueueError(f"ack log BCC record of {len(body)} bytes has trailing bytes")
    return entries


@dataclass
class AckState:
    """The durable acknowledgement state, as replay rebuilds it."""

    floor: int = 0
    mark: int = 0
    ranges: list[tuple[int, int]] = field(default_factory=list)
    counts: dict[int, int] = field(default_factory=dict)
    """Deliveries of messages delivered more than once, by offset."""
    bcc: dict[int, tuple[str, ...]] = field(default_factory=dict)
    """The BCC keys of messages published with some, by offset."""
    failures: dict[int, int] = field(default_factory=dict)
    """Failed deliveries of messages that have any, by offset."""
    returned: set[int] = field(default_factory=set)
    """Offsets whose last count record is RETURNED or HELD: given back, not with a consumer."""
    held: dict[int, int] = field(default_factory=dict)
    """When each message whose last count record is HELD is due (epoch ms), by offset."""

    def apply(self, body: bytes) -> None:
        if len(body) < HEAD.size:
            raise QueueError(f"ack log record of {len(body)} bytes is shorter than its header")
        kind, value, mark, count = HEAD.unpack_from(body)
        if kind == BCC:
            self.bcc.update(_decode_bcc(body, count))
            return
        if kind == HELD:
            if len(body) != HEAD.size + count * HELD_COUNT.size:
                raise QueueError(f"ack log record of {len(body)} bytes does not hold {count} holds")
            for offset, deliveries, failures, due_ms in HELD_COUNT.iter_unpack(body[HEAD.size :]):
                self._count(offset, deliveries, failures, True)
                self.held[offset] = due_ms
            return
        if len(body) != HEAD.size + count * RANGE_BYTES:
            raise QueueError(f"ack log record of {len(body)} bytes does not hold {count} ranges")
        if kind == DELTA:
            self.floor = max(self.floor, value)
            self.mark = max(self.mark, mark)
            flat = struct.unpack_from(f"<{2 * count}Q", body, HEAD.size)
            self.ranges += zip(flat[0::2], flat[1::2], strict=True)
        elif kind == TAKEN or kind == RETURNED:
            for offset, deliveries, failures in COUNT.iter_unpack(body[HEAD.size :]):
                self._count(offset, deliveries, failures, kind == RETURNED)
        elif kind == COUNTS:
            flat = struct.unpack_from(f"<{2 * count}Q", body, HEAD.size)
            for offset, deliveries in zip(flat[0::2], flat[1::2], strict=True):
                self._count(offset, deliveries, deliveries - 1, False)
        elif kind == CLIP:
            self.clip(value)
        else:
            raise QueueError(f"ack log record of unknown kind {kind}")

    def _count(self, offset: int, deliveries: int, failures: int, returned: bool) -> None:
        if deliveries > 1:
            self.counts[offset] = deliveries
        else:
            self.counts.pop(offset, None)
        if failures > 0:
            self.failures[offset] = failures
        else:
            self.failures.pop(offset, None)
        if returned:
            self.returned.add(offset)
        else:
            self.returned.discard(offset)
        self.held.pop(offset, None)

    def clip(self, limit: int) -> None:
        """Forget every acknowledgement and delivery at or above `limit`."""
        self.floor = min(self.floor, limit)
        self.mark = min(self.mark, limit)
        self.ranges = [
            (start, min(end, limit)) for start, end in coalesce(self.ranges) if start < limit
        ]
        self.counts = {offset: n for offset, n in self.counts.items() if offset < limit}
        self.bcc = {offset: keys for offset, keys in self.bcc.items() if offset < limit}
        self.failures = {offset: n for offset, n in self.failures.items() if offset < limit}
        self.returned = {offset for offset in self.returned if offset < limit}
        self.held = {offset: due for offset, due in self.held.items() if offset < limit}

    def normalise(self) -> None:
        """Merge the ranges, drop what the floor covers, and lift the floor over touching ranges."""
        ranges = coalesce(self.ranges)
        floor = self.floor
        kept: list[tuple[int, int]] = []
        for start, end in ranges:
            if end <= floor:
                continue
            if start <= floor:
                floor = end
            else:
                kept.append((start, end))
        self.floor = floor
        self.ranges = kept
        if self.counts or self.failures or self.returned or self.bcc or self.held:
            starts = [start for start, _ in kept]

            def acked(offset: int) -> bool:
                at = bisect.bisect_right(starts, offset) - 1
                return offset < floor or (at >= 0 and offset < kept[at][1])

            self.counts = {o: n for o, n in self.counts.items() if not acked(o)}
            self.bcc = {o: keys for o, keys in self.bcc.items() if not acked(o)}
            self.failures = {o: n for o, n in self.failures.items() if not acked(o)}
            self.returned = {o for o in self.returned if not acked(o)}
            self.held = {o: due for o, due in self.held.items() if not acked(o)}


def replay(log: PartitionLog) -> AckState:
    """Apply every record of the ack log, oldest first."""
    state = AckState()
    offset = log.start_offset
    while offset < log.end_offset:
        records = log.read(offset, max_records=100_000, max_bytes=REPLAY_READ_BYTES)
        for record in records:
            state.apply(record.body)
        offset = records[-1].offset + 1
        # Many small deltas accumulate ranges; merging now and then bounds replay memory.
        if len(state.ranges) > 4 * RANGES_PER_RECORD_MAX:
            state.normalise()
    state.normalise()
    return state

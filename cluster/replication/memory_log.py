"""An in-memory `ReplicaLog` for the simulator: real batches (`log/batch.py`'s bytes, so
byte-for-byte comparisons mean what they mean on disk), and a durable offset that a crash
cuts the log back to. Truncations and resets are durable at once (the partition log fsyncs
its directory and recovery point when it drops data)."""

from __future__ import annotations

from bisect import bisect_left, bisect_right

from warrenmq.log import batch as batch_codec
from warrenmq.log.batch import RawRecord
from warrenmq.log.errors import CorruptBatchError, LogError


class MemoryLog:
    __slots__ = (
        "start_offset",
        "end_offset",
        "bases",
        "batches",
        "terms",
        "durable_offset",
        "changes",
        "verified_offset",
    )

    def __init__(self) -> None:
        self.start_offset = 0
        self.bases: list[int] = []
        self.batches: list[bytes] = []
        self.terms: list[int] = []
        self.durable_offset = 0
        # Bumped by every truncation or reset, so an fsync begun before one vouches for
        # nothing after it (as PartitionLog's `_truncations`).
        self.changes = 0
        self.end_offset = 0
        # The simulator's note of how far it has compared this log with the committed
        # batches; anything that drops batches sends it back to the start.
        self.verified_offset = 0

    @property
    def last_term(self) -> int:
        return self.terms[-1] if self.terms else 0

    def append(self, records: list[RawRecord], term: int, timestamp_ms: int) -> int:
        base = self.end_offset
        payload = batch_codec.encode_records(records, 1 << 20)
        header = batch_codec.encode_header(base, term, len(records), timestamp_ms, payload)
        self._push(header + payload, base, term)
        return base

    def _push(self, data: bytes, base: int, term: int) -> None:
        assert term >= self.last_term, (term, self.last_term)
        self.bases.append(base)
        self.batches.append(data)
        self.terms.append(term)
        self.end_offset = batch_codec.read_header(data, 0).next_offset

    def append_stored(self, data: bytes | memoryview) -> int:
        view = memoryview(data)
        position = 0
        expected = self.end_offset
        parsed = []
        while position < len(view):
            header = batch_codec.read_header(view, position)
            if header is None or position + header.total_bytes > len(view):
                raise CorruptBatchError("stored batches end inside a batch")
            if header.base_offset != expected:
                raise LogError(f"stored batch starts at {header.base_offset}, expected {expected}")
            batch_codec.verify_crc(view, position, header)
            parsed.append((bytes(view[position : position + header.total_bytes]), header))
            expected = header.next_offset
            position += header.total_bytes
        for batch, header in parsed:
            self._push(batch, header.base_offset, header.term)
        return self.end_offset

    def truncate(self, offset: int) -> None:
        if offset >= self.end_offset:
            return
        if offset <= self.start_offset:
            self.reset(offset)
            return
        keep = bisect_left(self.bases, offset)
        if keep == len(self.bases) or self.bases[keep] != offset:
            # The partition log would re-append the batch's head under a new CRC: a replica
            # whose batches do not line up with its leader's has diverged already.
            raise LogError(f"truncation at {offset} inside a batch")
        del self.bases[keep:], self.batches[keep:], self.terms[keep:]
        self.end_offset = offset
        self.durable_offset = min(self.durable_offset, offset)
        self.verified_offset = 0
        self.changes += 1

    def reset(self, start_offset: int) -> None:
        self.start_offset = self.durable_offset = self.end_offset = start_offset
        self.bases, self.batches, self.terms = [], [], []
        self.verified_offset = 0
        self.changes += 1

    def crash(self) -> None:
        """Lose everything not fsynced."""
        keep = bisect_right(self.bases, self.durable_offset - 1)
        while keep and self._next(keep - 1) > self.durable_offset:
            keep -= 1
        del self.bases[keep:], self.batches[keep:], self.terms[keep:]
        self.end_offset = self._next(keep - 1) if keep else self.start_offset
        self.verified_offset = 0

    def _next(self, index: int) -> int:
        return batch_codec.read_header(self.batches[index], 0).next_offset

    def epoch_end_offset(self, epoch: int) -> tuple[int, int]:
        found = bisect_right(self.terms, epoch)
        if found == 0:
            return -1, self.start_offset
        term = self.terms[found - 1]
        return term, self.bases[found] if found < len(self.bases) else self.end_offset

    def read_batches(self, offset: int, end_offset: int, max_bytes: int) -> bytes:
        first = bisect_right(self.bases, offset) - 1
        parts: list[bytes] = []
        size = 0
        for index in range(max(first, 0), len(self.batches)):
            if self._next(index) > end_offset or (
                parts and size + len(self.batches[index]) > max_bytes
            ):
                break
            parts.append(self.batches[index])
            size += len(self.batches[index])
        return b"".join(parts)

    def batch_at(self, base: int) -> bytes | None:
        index = bisect_left(self.bases, base)
        if index < len(self.bases) and self.bases[index] == base:
            return self.batches[index]
        return None

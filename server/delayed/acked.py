"""The routed (done) offsets of a delayed-message log: a floor plus one bit per offset above it.

A queue acknowledges mostly in order and keeps its out-of-order acks as ranges
(`queue.ranges.AckedRanges`, a few dict entries per hole). Delayed messages leave in due
order, which for mixed delays is no order at all: every other offset done is the normal
state, and ranges would cost ~150 bytes per hole. A bit per offset between the floor and
the highest done offset costs 125 KB per million, whatever the pattern.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

# The bits below the floor are dropped once this many bytes of them have piled up.
_TRIM_BYTES = 1 << 16


class AckedOffsets:
    """Offsets below `floor` are all done; above it, bit i of `_bits` is offset `_base + i`."""

    __slots__ = ("floor", "_base", "_bits")

    def __init__(self, floor: int = 0) -> None:
        self.floor = floor
        self._base = floor
        self._bits = bytearray()

    @classmethod
    def from_ranges(cls, floor: int, ranges: Iterable[tuple[int, int]]) -> AckedOffsets:
        """Build from the floor and disjoint ranges above it (`ack_log.AckState.normalise`)."""
        acked = cls(floor)
        bits = acked._bits
        for start, end in ranges:
            start = max(start, floor) - floor
            end -= floor
            if start >= end:
                continue
            if (end + 7) >> 3 > len(bits):
                bits.extend(bytes(((end + 7) >> 3) - len(bits)))
            # Whole bytes at once, then the bits at either end.
            first_byte, last_byte = (start + 7) >> 3, end >> 3
            if first_byte < last_byte:
                bits[first_byte:last_byte] = b"\xff" * (last_byte - first_byte)
                edges = (*range(start, 8 * first_byte), *range(8 * last_byte, end))
            else:
                edges = tuple(range(start, end))
            for position in edges:
                bits[position >> 3] |= 1 << (position & 7)
        acked._advance()
        return acked

    def add(self, offset: int) -> None:
        """Mark one offset done (at most once, never below the floor)."""
        assert offset >= self.floor, (offset, self.floor)
        position = offset - self._base
        bits = self._bits
        byte = position >> 3
        if byte >= len(bits):
            bits.extend(bytes(byte + 1 - len(bits)))
        bits[byte] |= 1 << (position & 7)
        if offset == self.floor:
            self._advance()

    def __contains__(self, offset: int) -> bool:
        if offset < self.floor:
            return True
        position = offset - self._base
        byte = position >> 3
        return byte < len(self._bits) and bool(self._bits[byte] >> (position & 7) & 1)

    @property
    def end(self) -> int:
        """One past the highest offset a bit is kept for."""
        return self._base + 8 * len(self._bits)

    def ranges(self) -> Iterator[tuple[int, int]]:
        """The done offsets above the floor as maximal half-open ranges, in order."""
        return ((start, end) for start, end, done in self._spans(self.end) if done)

    def _spans(self, until: int) -> Iterator[tuple[int, int, bool]]:
        """[floor, until) as maximal (start, end, done) spans; offsets past the bits are not
        done."""
        bits = self._bits
        base = self._base
        kept = 8 * len(bits)
        position = self.floor - base
        end = until - base
        span_start = position
        span_done: bool | None = None
        while position < end:
            if position >= kept:
                done, step = False, end - position
            else:
                byte = bits[position >> 3]
                if position & 7 == 0 and position + 8 <= end and byte in (0, 0xFF):
                    done, step = byte == 0xFF, 8
                else:
                    done, step = bool(byte >> (position & 7) & 1), 1
            if done != span_done:
                if span_done is not None:
                    yield base + span_start, base + position, span_done
                span_start, span_done = position, done
            position += step
        if span_done is not None:
            yield base + span_start, base + end, span_done

    def _advance(self) -> None:
        bits = self._bits
        position = self.floor - self._base
        end = 8 * len(bits)
        # Whole bytes of done offsets first, then bit by bit.
        while position < end:
            if position & 7 == 0 and bits[position >> 3] == 0xFF:
                position += 8
            elif bits[position >> 3] >> (position & 7) & 1:
                position += 1
            else:
                break
        self.floor = self._base + position
        dropped = (position >> 3) & ~(_TRIM_BYTES - 1)
        if dropped:
            del bits[:dropped]
            self._base += 8 * dropped

"""The acknowledged offsets of a queue: a floor plus the maximal acked ranges above it.

Everything below `floor` is acknowledged; above it, acknowledged offsets form half-open
ranges [start, end) that never touch each other or the floor (they would have been merged).
Two dictionaries (start -> end and end -> start) find both neighbours of a new offset in O(1),
so an ack costs the same whether the queue holds ten messages or ten million; in-order acks,
the common case, only move the floor and never create a range. Sorted order is needed only
for snapshots and recovery, which sort on demand.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator


def coalesce(ranges: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sort half-open ranges and merge the ones that overlap or touch; empty ranges vanish."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if start >= end:
            continue
        if merged and start <= merged[-1][1]:
            if end > merged[-1][1]:
                merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


class AckedRanges:
    """Acked offsets as a floor and disjoint, non-adjacent ranges above it.

    The caller guarantees that an offset is added at most once and never below the floor (the
    queue only acks offsets it has in flight, or ready offsets it purges).
    """

    __slots__ = ("_end_of", "_start_of", "floor")

    def __init__(self, floor: int = 0) -> None:
        self.floor = floor
        self._end_of: dict[int, int] = {}
        self._start_of: dict[int, int] = {}

    @classmethod
    def from_ranges(cls, floor: int, ranges: Iterable[tuple[int, int]]) -> AckedRanges:
        """Build from any ranges (unsorted, overlapping, partly below the floor)."""
        acked = cls(floor)
        for start, end in coalesce(ranges):
            start = max(start, acked.floor)
            if start >= end:
                continue
            if start == acked.floor:
                acked.floor = end
            else:
                acked._end_of[start] = end
                acked._start_of[end] = start
        return acked

    def add(self, offset: int) -> None:
        """Mark one offset acked, merging it with the floor or its neighbouring ranges."""
        if offset == self.floor:
            floor = offset + 1
            end = self._end_of.pop(floor, None)
            if end is not None:
                del self._start_of[end]
                floor = end
            self.floor = floor
            return
        self.add_range(offset, offset + 1)

    def add_range(self, start: int, end: int) -> None:
        """Mark [start, end) acked; none of it may be acked already."""
        if start >= end:
            return
        # A range ending at `start` or starting at `end` is a neighbour to merge with.
        start = self._start_of.pop(start, start)
        end_of_right = self._end_of.pop(end, None)
        if end_of_right is not None:
            del self._start_of[end_of_right]
            end = end_of_right
        if start == self.floor:
            self.floor = end
            return
        self._end_of[start] = end
        self._start_of[end] = start

    def __len__(self) -> int:
        """How many ranges sit above the floor (the holes the queue pays memory for)."""
        return len(self._end_of)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        """The ranges above the floor, in offset order."""
        return iter(sorted(self._end_of.items()))

    def gaps(self, until: int) -> Iterator[int]:
        """Every offset in [floor, until) that is not acked, in order."""
        position = self.floor
        for start, end in self:
            if start >= until:
                break
            yield from range(position, start)
            position = end
        if position < until:
            yield from range(position, until)

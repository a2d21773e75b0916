"""Which held messages are due when: (due time, offset) pairs in 8 bytes each.

A million messages delayed for an hour must not cost a million Python objects (ARCHITECTURE
"Performance habits"; the issue's budget is < 50 MB), so the pairs live in `array`s.
A binary heap over such arrays would cost a Python-level sift of ~20 steps per pop; instead
the pairs are kept in *runs*, each sorted by due time, appended to at its tail and consumed
from its head, and the runs are merged through a small heap of their heads.

A new pair goes to the run whose tail is the latest one not after it (patience sorting), so
a stream of messages with one delay stays one run, k interleaved delays make about k runs,
and random delays about 2·sqrt(n). Pushing is a bisect over the runs' tails; popping is a
heap operation over the runs' heads. Due times that keep going back would make a run per
message: beyond `RUNS_MAX` runs, such pairs go to a plain binary heap instead (`_Spill`).
Ties are broken by offset, so messages due in the same millisecond leave in the order they
arrived.
"""

from __future__ import annotations

import bisect
import heapq
from array import array

# A run is a list of chunks. A chunk holds (due, offset) pairs as 32-bit differences from
# its first pair, 8 bytes a pair: a run is sorted by due time and, pushed in arrival order,
# by offset too, so the differences are small; a pair that does not fit starts a new chunk.
# A chunk is allocated once at its full size and filled in place: growing arrays by realloc
# on a busy heap left a hole behind at every move (+10 MB of RSS for a million messages).
# Chunks double from MIN pairs up to MAX pairs (512 KiB), so a short run wastes little and a
# long one at most one chunk.
_CHUNK_PAIRS_MIN = 32
_CHUNK_PAIRS_MAX = 1 << 16
_DIFFERENCE_MAX = 2**32 - 1
RUNS_MAX = 4096
"""Beyond this many runs (~700 bytes each), a pair that would start one spills instead."""
_ZERO = array("I", (0,))
assert _ZERO.itemsize == 4, "array('I') is not 32 bits here"


class _Chunk:
    __slots__ = ("due_ms", "offset", "pairs", "fill")

    def __init__(self, due_ms: int, offset: int, pairs_max: int) -> None:
        # Its first pair is (due_ms, offset): differences (0, 0), as allocated.
        self.due_ms = due_ms
        self.offset = offset
        self.pairs = _ZERO * (2 * pairs_max)
        self.fill = 2


class _Run:
    __slots__ = ("chunks", "head", "tail_due")

    def __init__(self, due_ms: int, offset: int) -> None:
        self.chunks = [_Chunk(due_ms, offset, _CHUNK_PAIRS_MIN)]
        self.head = 0
        """Where the head pair is in chunks[0].pairs."""
        self.tail_due = due_ms

    def append(self, due_ms: int, offset: int) -> None:
        tail = self.chunks[-1]
        fill = tail.fill
        due_difference = due_ms - tail.due_ms
        offset_difference = offset - tail.offset
        if (
            fill < len(tail.pairs)
            and due_difference <= _DIFFERENCE_MAX
            and 0 <= offset_difference <= _DIFFERENCE_MAX
        ):
            tail.pairs[fill] = due_difference
            tail.pairs[fill + 1] = offset_difference
            tail.fill = fill + 2
        else:
            # Twice the pairs of the last chunk: len(pairs) is that.
            self.chunks.append(_Chunk(due_ms, offset, min(len(tail.pairs), _CHUNK_PAIRS_MAX)))
        self.tail_due = due_ms

    def advance(self) -> tuple[int, int] | None:
        """Drop the head pair; the new head, or None when the run is empty."""
        head = self.head + 2
        chunks = self.chunks
        if head == chunks[0].fill:
            if len(chunks) == 1:
                return None
            del chunks[0]
            head = 0
        self.head = head
        chunk = chunks[0]
        pairs = chunk.pairs
        return chunk.due_ms + pairs[head], chunk.offset + pairs[head + 1]


class _Spill:
    """A binary heap of (due, offset) pairs in two arrays: where pairs go that would start a
    run beyond RUNS_MAX (due times that keep going back, such as a schedule published
    latest first). A Python-level sift per push and pop, 16 bytes a pair."""

    __slots__ = ("dues", "offsets")

    def __init__(self) -> None:
        self.dues = array("q")
        self.offsets = array("q")

    def __len__(self) -> int:
        return len(self.dues)

    def push(self, due_ms: int, offset: int) -> None:
        dues, offsets = self.dues, self.offsets
        at = len(dues)
        dues.append(due_ms)
        offsets.append(offset)
        while at:
            parent = (at - 1) >> 1
            if dues[parent] < due_ms or (dues[parent] == due_ms and offsets[parent] < offset):
                break
            dues[at], offsets[at] = dues[parent], offsets[parent]
            at = parent
        dues[at], offsets[at] = due_ms, offset

    def pop(self) -> None:
        dues, offsets = self.dues, self.offsets
        due_ms, offset = dues.pop(), offsets.pop()
        count = len(dues)
        if not count:
            return
        at = 0
        while True:
            child = 2 * at + 1
            if child >= count:
                break
            right = child + 1
            if right < count and (
                dues[right] < dues[child]
                or (dues[right] == dues[child] and offsets[right] < offsets[child])
            ):
                child = right
            if due_ms < dues[child] or (due_ms == dues[child] and offset < offsets[child]):
                break
            dues[at], offsets[at] = dues[child], offsets[child]
            at = child
        dues[at], offsets[at] = due_ms, offset


class DueIndex:
    """(due_ms, offset) pairs, popped in (due_ms, offset) order."""

    __slots__ = ("_runs_max", "_runs", "_tails", "_heads", "_spill", "_count")

    def __init__(self, runs_max: int = RUNS_MAX) -> None:
        assert runs_max > 0
        self._runs_max = runs_max
        # The runs in ascending order of their tail's due time, and those tails.
        self._runs: list[_Run] = []
        self._tails: list[int] = []
        # (due_ms, offset, run) of every run's head; offsets are unique, so the run itself
        # is never compared.
        self._heads: list[tuple[int, int, _Run]] = []
        self._spill = _Spill()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    @property
    def run_count(self) -> int:
        return len(self._runs)

    @property
    def spilled(self) -> int:
        return len(self._spill)

    def push(self, due_ms: int, offset: int) -> None:
        at = bisect.bisect_right(self._tails, due_ms) - 1
        if at >= 0:
            self._runs[at].append(due_ms, offset)
            # Still in order: the next run's tail is later than due_ms.
            self._tails[at] = due_ms
        elif len(self._runs) < self._runs_max:
            run = _Run(due_ms, offset)
            self._runs.insert(0, run)
            self._tails.insert(0, due_ms)
            heapq.heappush(self._heads, (due_ms, offset, run))
        else:
            self._spill.push(due_ms, offset)
        self._count += 1

    def next_due_ms(self) -> int | None:
        """When the earliest pair is due; None when there is none."""
        heads, spill = self._heads, self._spill
        if spill and (not heads or spill.dues[0] < heads[0][0]):
            return spill.dues[0]
        return heads[0][0] if heads else None

    def pop_due(self, now_ms: int, count_max: int) -> list[int]:
        """The offsets of up to `count_max` pairs due by `now_ms`, earliest first, removed."""
        heads, spill = self._heads, self._spill
        popped: list[int] = []
        while len(popped) < count_max:
            if spill and (not heads or (spill.dues[0], spill.offsets[0]) < heads[0][:2]):
                if spill.dues[0] > now_ms:
                    break
                popped.append(spill.offsets[0])
                spill.pop()
                continue
            if not heads or heads[0][0] > now_ms:
                break
            _, offset, run = heads[0]
            popped.append(offset)
            head = run.advance()
            if head is not None:
                heapq.heapreplace(heads, (*head, run))
            else:
                heapq.heappop(heads)
                self._remove(run)
        self._count -= len(popped)
        return popped

    def _remove(self, run: _Run) -> None:
        # Tails are sorted: the run is among those whose tail equals its own.
        at = bisect.bisect_left(self._tails, run.tail_due)
        while self._runs[at] is not run:
            at += 1
        del self._runs[at]
        del self._tails[at]

"""Which held messages are due when: (due time, offset) pairs in 16 bytes each.

A million messages delayed for an hour must not cost a million Python objects (ARCHITECTURE
"Performance habits"; the issue's budget is < 50 MB), so the pairs live in `array('q')`s.
A binary heap over such arrays would cost a Python-level sift of ~20 steps per pop; instead
the pairs are kept in *runs*, each sorted by due time, appended to at its tail and consumed
from its head, and the runs are merged through a small heap of their heads.

A new pair goes to the run whose tail is the latest one not after it (patience sorting), so
a stream of messages with one delay stays one run, k interleaved delays make about k runs,
and random delays about 2·sqrt(n). Pushing is a bisect over the runs' tails; popping is a
heap operation over the runs' heads. Ties are broken by offset, so messages due in the same
millisecond leave in the order they arrived.
"""

from __future__ import annotations

import bisect
import heapq
from array import array

# A run drops its consumed head once at least this many pairs (and half of it) are consumed.
_COMPACT_AFTER = 4096


class _Run:
    __slots__ = ("dues", "offsets", "head")

    def __init__(self, due_ms: int, offset: int) -> None:
        self.dues = array("q", (due_ms,))
        self.offsets = array("q", (offset,))
        self.head = 0


class DueIndex:
    """(due_ms, offset) pairs, popped in (due_ms, offset) order."""

    __slots__ = ("_runs", "_tails", "_heads", "_count")

    def __init__(self) -> None:
        # The runs in ascending order of their tail's due time, and those tails.
        self._runs: list[_Run] = []
        self._tails: list[int] = []
        # (due_ms, offset, run) of every run's head; offsets are unique, so the run itself
        # is never compared.
        self._heads: list[tuple[int, int, _Run]] = []
        self._count = 0

    def __len__(self) -> int:
        return self._count

    @property
    def run_count(self) -> int:
        return len(self._runs)

    def push(self, due_ms: int, offset: int) -> None:
        at = bisect.bisect_right(self._tails, due_ms) - 1
        if at >= 0:
            run = self._runs[at]
            run.dues.append(due_ms)
            run.offsets.append(offset)
            # Still in order: the next run's tail is later than due_ms.
            self._tails[at] = due_ms
        else:
            run = _Run(due_ms, offset)
            self._runs.insert(0, run)
            self._tails.insert(0, due_ms)
            heapq.heappush(self._heads, (due_ms, offset, run))
        self._count += 1

    def next_due_ms(self) -> int | None:
        """When the earliest pair is due; None when there is none."""
        return self._heads[0][0] if self._heads else None

    def pop_due(self, now_ms: int, count_max: int) -> list[int]:
        """The offsets of up to `count_max` pairs due by `now_ms`, earliest first, removed."""
        heads = self._heads
        popped: list[int] = []
        while heads and len(popped) < count_max and heads[0][0] <= now_ms:
            _, offset, run = heads[0]
            popped.append(offset)
            run.head += 1
            if run.head < len(run.dues):
                heapq.heapreplace(heads, (run.dues[run.head], run.offsets[run.head], run))
                if run.head >= _COMPACT_AFTER and 2 * run.head >= len(run.dues):
                    del run.dues[: run.head]
                    del run.offsets[: run.head]
                    run.head = 0
            else:
                heapq.heappop(heads)
                self._remove(run)
        self._count -= len(popped)
        return popped

    def _remove(self, run: _Run) -> None:
        # Tails are sorted: the run is among those whose tail equals its own.
        tail = run.dues[-1]
        at = bisect.bisect_left(self._tails, tail)
        while self._runs[at] is not run:
            at += 1
        del self._runs[at]
        del self._tails[at]

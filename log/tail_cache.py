"""One bound on the tail caches of many logs together.

A log's tail cache serves a consumer that keeps up from memory. Bounding each log alone
forces a choice between a bound too small for one busy queue (1,000 in-flight messages of
16 KiB are 16 MiB, and a delivery past the cache is read back from the file on the event
loop) and one that, times thousands of queues, is too large for the node. The logs of a node
share a `TailCacheBudget` instead: any one of them may cache up to its own bound, and past
the node's bound the batch cached longest ago goes first, whichever log holds it.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from .errors import LogError

# Entries of batches their logs dropped on their own (their own bound, a truncation, a
# close) wait in the order until they come up, or until they outnumber the live ones by
# this much, when one sweep drops them all.
_STALE_ENTRIES_SWEPT_PAST = 1024


class CachingLog(Protocol):
    def _cache_drop_batch(self, base: int) -> None: ...

    def _cache_holds(self, base: int) -> bool: ...


class TailCacheBudget:
    """The bytes the tail caches sharing it may hold together (as each log charges them).

    Single-threaded, as the logs are: one per node, used from its event loop.
    """

    __slots__ = ("bytes_max", "cached_bytes", "cached_batches", "_logs", "_bases")

    def __init__(self, bytes_max: int) -> None:
        if bytes_max < 0:
            raise LogError(f"a tail cache budget must not be negative, got {bytes_max}")
        self.bytes_max = bytes_max
        self.cached_bytes = 0
        self.cached_batches = 0
        # The batches in the order they were cached: batch i is the one at offset _bases[i]
        # of the log _logs[i]. Two deques rather than one of (log, base) tuples, so the order
        # holds no object per batch for the garbage collector to walk.
        self._logs: deque[CachingLog] = deque()
        self._bases: deque[int] = deque()

    def cached(self, log: CachingLog, base: int, charged_bytes: int) -> None:
        """`log` cached the batch at `base`: drop the oldest batches of any log while the
        caches hold more than the bound (this one too, should it not fit alone)."""
        self.cached_bytes += charged_bytes
        self.cached_batches += 1
        logs = self._logs
        bases = self._bases
        logs.append(log)
        bases.append(base)
        while self.cached_bytes > self.bytes_max and logs:
            logs.popleft()._cache_drop_batch(bases.popleft())
        if len(logs) > 2 * self.cached_batches + _STALE_ENTRIES_SWEPT_PAST:
            self._sweep()

    def dropped(self, charged_bytes: int, batches: int) -> None:
        """A log dropped `batches` cached batches of `charged_bytes` together."""
        self.cached_bytes -= charged_bytes
        self.cached_batches -= batches

    def _sweep(self) -> None:
        live = [
            (log, base)
            for log, base in zip(self._logs, self._bases, strict=True)
            if log._cache_holds(base)
        ]
        self._logs = deque(log for log, _ in live)
        self._bases = deque(base for _, base in live)

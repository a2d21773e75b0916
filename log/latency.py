"""A latency histogram that costs one bisect and two additions per observation.

Prometheus' histograms are cumulative ("le" buckets); this one counts each bucket on its own
and accumulates only when read (`cumulative`), so the observing side stays cheap. It is not
thread-safe: observe from one thread (the event loop).
"""

from __future__ import annotations

import bisect

# Upper bounds in seconds, from a page-cache write to a disk stalled for seconds.
BOUNDS_S = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


class LatencyHistogram:
    __slots__ = ("bounds_s", "counts", "sum_s")

    def __init__(self, bounds_s: tuple[float, ...] = BOUNDS_S) -> None:
        assert list(bounds_s) == sorted(bounds_s), bounds_s
        self.bounds_s = bounds_s
        self.counts = [0] * (len(bounds_s) + 1)
        """Observations per bucket; the last one is above every bound."""
        self.sum_s = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.bounds_s, seconds)] += 1
        self.sum_s += seconds

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations at or below it) per bucket, the last bound infinite."""
        total = 0
        buckets = []
        for bound, count in zip((*self.bounds_s, float("inf")), self.counts, strict=True):
            total += count
            buckets.append((bound, total))
        return buckets

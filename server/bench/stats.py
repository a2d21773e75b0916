"""Latency statistics for the load generator: a log-linear histogram of fixed, small size.

A benchmark of millions of messages must not keep a latency per message, so latencies go into
buckets the way HdrHistogram does it: values below 128 µs are exact; above that each power of
two is cut into 64 equal buckets, so a bucket is at most 1/64 (1.6 %) of its values wide.
Memory is fixed (``BUCKET_COUNT`` counters) whatever the number of samples or their range up
to ``VALUE_US_MAX``; larger values are clamped to it and counted in ``clamped``.

Percentiles follow the nearest-rank definition (the smallest recorded value such that at least
p % of the samples are ≤ it) and report the highest value of that sample's bucket, so a
reported percentile is never below the exact one and at most 1/64 above it.
"""

from __future__ import annotations

import math

_EXACT_BITS = 7
_EXACT_VALUES = 1 << _EXACT_BITS  # 0..127 µs have a bucket each
_SUB_BUCKETS = _EXACT_VALUES // 2  # 64 buckets per power of two above that
VALUE_US_MAX = (1 << 40) - 1  # about 12.7 days
_SHIFT_MAX = VALUE_US_MAX.bit_length() - _EXACT_BITS
BUCKET_COUNT = _EXACT_VALUES + _SHIFT_MAX * _SUB_BUCKETS


def bucket_index(value_us: int) -> int:
    """The bucket of a non-negative value (clamped to VALUE_US_MAX)."""
    if value_us < _EXACT_VALUES:
        return value_us
    shift = value_us.bit_length() - _EXACT_BITS
    return _EXACT_VALUES + (shift - 1) * _SUB_BUCKETS + (value_us >> shift) - _SUB_BUCKETS


def bucket_highest_us(index: int) -> int:
    """The largest value that falls into bucket ``index``."""
    if index < _EXACT_VALUES:
        return index
    shift = (index - _EXACT_VALUES) // _SUB_BUCKETS + 1
    top = (index - _EXACT_VALUES) % _SUB_BUCKETS + _SUB_BUCKETS
    return ((top + 1) << shift) - 1


class LatencyHistogram:
    """Counts of latencies in microseconds; exact count, min, max and mean, bucketed percentiles."""

    def __init__(self) -> None:
        self.counts = [0] * BUCKET_COUNT
        self.count = 0
        self.clamped = 0
        self.sum_us = 0
        self.min_us: int | None = None
        self.max_us: int | None = None

    def record(self, value_us: int, times: int = 1) -> None:
        """Add ``times`` samples of ``value_us`` (negative values, from clock skew, count as 0)."""
        assert times >= 1, times
        if value_us < 0:
            value_us = 0
        elif value_us > VALUE_US_MAX:
            value_us = VALUE_US_MAX
            self.clamped += times
        self.counts[bucket_index(value_us)] += times
        self.count += times
        self.sum_us += value_us * times
        if self.min_us is None or value_us < self.min_us:
            self.min_us = value_us
        if self.max_us is None or value_us > self.max_us:
            self.max_us = value_us

    def merge(self, other: LatencyHistogram) -> None:
        """Add every sample of ``other`` to this histogram."""
        for index, count in enumerate(other.counts):
            if count:
                self.counts[index] += count
        self.count += other.count
        self.clamped += other.clamped
        self.sum_us += other.sum_us
        for value in (other.min_us, other.max_us):
            if value is None:
                continue
            if self.min_us is None or value < self.min_us:
                self.min_us = value
            if self.max_us is None or value > self.max_us:
                self.max_us = value

    def percentile_us(self, percent: float) -> int | None:
        """The nearest-rank percentile (bucket's highest value, capped at the max); None if
        empty.
        """
        if not 0 < percent <= 100:
            raise ValueError(f"percentile must be in (0, 100], got {percent}")
        if not self.count:
            return None
        rank = max(1, math.ceil(self.count * percent / 100))
        seen = 0
        for index, count in enumerate(self.counts):
            seen += count
            if seen >= rank:
                return min(bucket_highest_us(index), self.max_us)
        raise AssertionError("bucket counts do not add up to the sample count")

    def summary_ms(self) -> dict[str, float | int | None]:
        """The figures a report prints: count, min, mean, p50, p90, p99, p99.9 and max in ms."""

        def ms(value_us: int | None) -> float | None:
            return None if value_us is None else round(value_us / 1000, 3)

        return {
            "count": self.count,
            "latency_ms_min": ms(self.min_us),
            "latency_ms_mean": round(self.sum_us / self.count / 1000, 3) if self.count else None,
            "latency_ms_p50": ms(self.percentile_us(50)),
            "latency_ms_p90": ms(self.percentile_us(90)),
            "latency_ms_p99": ms(self.percentile_us(99)),
            "latency_ms_p999": ms(self.percentile_us(99.9)),
            "latency_ms_max": ms(self.max_us),
        }

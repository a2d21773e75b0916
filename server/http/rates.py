"""Per-second rates of the broker's counters, from what they were at an earlier request.

RabbitMQ samples every object's stats on a timer; here nothing runs between requests. Each
time a request shows an object, its counters are compared with the sample its last shown
rate came from: once that sample is `SAMPLE_INTERVAL_S` old, the rate is the change over
the time between them and the current values become the next sample. So a console polling
every few seconds sees the rate of its last interval, and an object nobody looks at costs
nothing. Samples are kept per object, weakly: a queue or channel gone takes its sample along.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Sequence

SAMPLE_INTERVAL_S = 1.0


class _Sample:
    __slots__ = ("time_s", "values", "rates")

    def __init__(self, time_s: float, values: tuple[float, ...], rates: tuple[float, ...]):
        self.time_s = time_s
        self.values = values
        self.rates = rates


class Rates:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._samples: weakref.WeakKeyDictionary[object, dict[str, _Sample]] = (
            weakref.WeakKeyDictionary()
        )

    def of(self, owner: object, kind: str, values: Sequence[float]) -> tuple[float, ...]:
        """The rates of `values` (one kind of counters of `owner`), per second."""
        now = self._clock()
        current = tuple(values)
        samples = self._samples.get(owner)
        if samples is None:
            samples = self._samples[owner] = {}
        sample = samples.get(kind)
        if sample is None or len(sample.values) != len(current):
            samples[kind] = _Sample(now, current, (0.0,) * len(current))
            return samples[kind].rates
        elapsed_s = now - sample.time_s
        if elapsed_s >= SAMPLE_INTERVAL_S:
            sample.rates = tuple(
                round((new - old) / elapsed_s, 1)
                for new, old in zip(current, sample.values, strict=True)
            )
            sample.time_s = now
            sample.values = current
        return sample.rates

"""The rate generator's schedule: when each message of a paced publisher is due.

Message ``i`` (from 0) of ``total`` is due at ``start_ns + i / rate``. The schedule is pure: the
caller passes the clock reading, so a test can walk it through any timeline without sleeping.

A paced publisher asks ``due(now)`` how many messages it should have sent by now, sends the
difference, and sleeps until ``due_ns(sent)``, the next one's time (no sooner than its timer's
tick). ``lag_ns(sent, now)`` is how late the next message goes out: a generator that cannot
keep its rate (a slow timer, a full confirm window, a socket that does not drain) shows it
there, instead of reporting the lower latency of the messages it did not send on time.
"""

from __future__ import annotations


class RateSchedule:
    """``total`` messages at ``rate_per_s`` from ``start_ns`` (monotonic nanoseconds)."""

    def __init__(self, rate_per_s: float, total: int, start_ns: int) -> None:
        if rate_per_s <= 0:
            raise ValueError(f"rate must be positive, got {rate_per_s}")
        if total < 1:
            raise ValueError(f"total must be positive, got {total}")
        self.rate_per_s = rate_per_s
        self.total = total
        self.start_ns = start_ns
        self._period_ns = 1e9 / rate_per_s

    def due_ns(self, index: int) -> int:
        """When message ``index`` (0-based) is due."""
        assert 0 <= index < self.total, index
        return self.start_ns + round(index * self._period_ns)

    def due(self, now_ns: int) -> int:
        """How many messages are due by ``now_ns``: those whose ``due_ns`` is not after it."""
        if now_ns < self.start_ns:
            return 0
        count = min(int((now_ns - self.start_ns) / self._period_ns) + 1, self.total)
        # The division may land one off the rounded due times: settle on those.
        while count < self.total and self.due_ns(count) <= now_ns:
            count += 1
        while count > 0 and self.due_ns(count - 1) > now_ns:
            count -= 1
        return count

    def lag_ns(self, index: int, now_ns: int) -> int:
        """How late message ``index`` is when sent at ``now_ns`` (0 when on time or early)."""
        return max(0, now_ns - self.due_ns(index))

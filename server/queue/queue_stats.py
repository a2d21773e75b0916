"""A queue's figures at one moment, as the HTTP API shows them: its depths, consumers and
message counters. Taken on the node that leads the queue (`of`) and sent as a list of numbers
to a node that shows it (a STATS request over a forwarding link).
"""

from __future__ import annotations

from typing import Any

from .message_counts import MessageCounts

COUNTERS = (
    "published",
    "delivered",
    "delivered_no_ack",
    "got",
    "got_no_ack",
    "got_empty",
    "consumer_acks",
    "redelivered",
)
"""The `MessageCounts` a queue's figures carry, by the same names."""


class QueueStats:
    __slots__ = (
        "ready",
        "unacked",
        "consumers",
        *COUNTERS,
    )

    def __init__(self, *values: int) -> None:
        for name, value in zip(self.__slots__, values, strict=True):
            setattr(self, name, value)

    @classmethod
    def of(cls, queue: Any) -> QueueStats:
        """A queue hosted here (a `WorkQueue` or a stream)."""
        engine = queue.engine
        counts: MessageCounts = queue.counts
        return cls(
            engine.ready_count,
            engine.unacked_count,
            queue.consumer_count,
            *(getattr(counts, name) for name in COUNTERS),
        )

    def values(self) -> list[int]:
        return [getattr(self, name) for name in self.__slots__]

    @classmethod
    def from_values(cls, values: list[int]) -> QueueStats:
        """What `values` gave; figures a newer node adds at the end are ignored."""
        return cls(*values[: len(cls.__slots__)])

    @property
    def messages(self) -> int:
        return self.ready + self.unacked

"""A queue's figures at one moment, as the HTTP API and the metrics show them: its depths,
consumers and message counters. Taken on the node that leads the queue (`of`) and sent as a
list of numbers to a node that shows it (a STATS request over a forwarding link).
"""

from __future__ import annotations

from typing import Any

from .message_counts import MessageCounts


class QueueStats:
    __slots__ = (
        "ready",
        "unacked",
        "consumers",
        "published",
        "delivered",
        "delivered_no_ack",
        "got",
        "got_no_ack",
        "got_empty",
        "consumer_acks",
        "redelivered",
        "message_log_bytes",
        "message_log_segments",
        "stale_settles",
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
            counts.published,
            counts.delivered,
            counts.delivered_no_ack,
            counts.got,
            counts.got_no_ack,
            counts.got_empty,
            counts.consumer_acks,
            counts.redelivered,
            engine.message_log_bytes,
            engine.message_log_segments,
            queue.stale_settles,
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

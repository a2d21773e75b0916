"""A delayed exchange's store as the broker hosts it, and the hand-off of its due messages.

`DelayedStore` is a `WorkQueue` without consumers whose engine is a `DelayedMessageLog`: a
held message is staged on it by the core's publish and written, committed and confirmed in
the tick exactly as a queue's message is (so a publisher confirm means the held message is
durable). Its timer (`run_timers`, armed by the broker as any queue's) routes what is due.

`DelayedHandoff` is the due messages of one hand-off, staged on their queues: the tick
confirms it as it confirms a publishing channel, and only then are they done in the store.
Each (message, queue) pair has its own tag, so a queue that could not store a message is
retried alone, and the queues that did store it do not get it twice.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from warrenmq.exchanges.router import Exchange

from ..queue.dead_letter_counts import DeadLetterCounts
from ..queue.work_queue import WorkQueue
from .message_log import DelayedMessageLog, Held


class DelayedStore(WorkQueue):
    engine: DelayedMessageLog

    def __init__(
        self,
        vhost: str,
        exchange: Exchange,
        engine: DelayedMessageLog,
        *,
        batch_records_max: int,
        route_due: Callable[[DelayedStore, int], int | None],
    ) -> None:
        # Named as its exchange, durable as it is.
        super().__init__(
            vhost,
            exchange.name,
            engine,
            durable=exchange.durable,
            auto_delete=False,
            exclusive_owner=None,
            arguments={},
            queue_type="classic",
            batch_records_max=batch_records_max,
            # Nothing dies in a store (no dead-letter exchange, no limits): none to count.
            dead_letter_counts=DeadLetterCounts(),
        )
        self._route_due = route_due
        self.hand_offs = 0
        """Hand-offs begun and not yet confirmed."""
        self.retries: list[Staging] = []
        """Messages that some queue could not store, to be staged on those queues again..."""
        self.retry_at_ms = 0
        """...from this time on (epoch ms)."""

    @property
    def held_count(self) -> int:
        """Messages held: waiting for their time, or being routed."""
        return self.engine.ready_count + self.engine.handing_off

    @property
    def has_timers(self) -> bool:
        return True

    def run_timers(self, now_ms: int) -> int | None:
        """Route what is due by `now_ms`; returns when to be called again (epoch ms)."""
        return self._route_due(self, now_ms)


class Staging(NamedTuple):
    """A due message on its way: as it is to be stored, and the queues it goes to."""

    held: Held
    properties: bytes
    """Its properties as routed (x-delay negated)."""
    queues: list[WorkQueue]
    unled: tuple[str, ...] = ()
    """Queues it goes to that have no leader for now (a failover): it waits for them."""


class DelayedHandoff:
    """One hand-off's messages, staged on their queues, waiting for the tick's confirm."""

    def __init__(
        self,
        store: DelayedStore,
        stagings: list[Staging],
        pairs: list[tuple[Staging, WorkQueue]],
        done: Callable[[DelayedHandoff], None],
    ) -> None:
        self.store = store
        self.stagings = stagings
        self.pairs = pairs
        """(message, queue) by tag - 1."""
        self.failed: set[int] = set()
        self._done = done

    def publish_failed(self, tag: int) -> None:
        self.failed.add(tag)

    def confirm(self, _through_tag: int, _refused: object) -> None:
        self._done(self)

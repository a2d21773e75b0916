"""What a queue engine is: the storage side of a work queue, behind `WorkQueue`.

`LogQueue` (one partition log plus an ack log) is the engine of every queue; `PriorityQueue`
is one `LogQueue` per priority level behind the same interface. `WorkQueue` holds a
`QueueEngine` and never asks which one it has.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from typing import NamedTuple, Protocol

from warrenmq.log import RawRecord


class Message(NamedTuple):
    offset: int
    timestamp_ms: int
    exchange: bytes
    routing_key: bytes
    properties: bytes
    """The content-header property bytes exactly as the publisher sent them."""
    body: bytes
    redelivered: bool
    delivery_count: int
    """Deliveries including this one: 1 the first time (x-acquired-count is this - 1). After a
    crash, a message that may have been delivered counts as delivered once before."""
    failed_count: int
    """Failed deliveries before this one (x-delivery-count, checked against x-delivery-limit):
    returns by basic.reject, a lost channel or a visibility timeout, and a crash while the
    message may have been with a consumer."""


class Kept(NamedTuple):
    """What a queue keeps beside a record it appends, for the record at `index` of the
    batch: its BCC keys, which the stored properties no longer carry (`bcc_keys`: a dead
    letter is routed by them too, as RabbitMQ routes it), and the failed deliveries a dead
    letter carries from the queue it died in (RabbitMQ 4's quorum queues pass the count on,
    so a delivery limit ends a retry loop through dead-letter exchanges)."""

    index: int
    bcc: tuple[str, ...] = ()
    failures: int = 0


class QueueEngine(Protocol):
    @property
    def ready_count(self) -> int:
        """Messages waiting to be delivered."""
        ...

    @property
    def unacked_count(self) -> int:
        """Messages handed out and not yet settled."""
        ...

    @property
    def message_log_bytes(self) -> int:
        """What the message log holds on disk (acked messages until their segment goes)."""
        ...

    @property
    def message_log_segments(self) -> int: ...

    @property
    def batch_bytes_max(self) -> int:
        """The largest batch one `append` may write."""
        ...

    @property
    def needs_commit(self) -> bool:
        """Appends, acks or the delivered mark wait for a `commit`."""
        ...

    @property
    def held_until_commit(self) -> bool:
        """Messages are ready, but none is handed out before the next `commit`."""
        ...

    def append(
        self,
        records: Sequence[RawRecord],
        timestamp_ms: int | None = None,
        kept: Sequence[Kept] = (),
    ) -> object:
        """Write one batch of (exchange, routing key, property bytes, body), stamped
        `timestamp_ms` (raises, having written nothing, when it cannot). `kept`: what the
        queue keeps durably beside some of the records (see `Kept`)."""
        ...

    def bcc_keys(self, offset: int) -> tuple[str, ...]:
        """The BCC keys of the unacknowledged message at `offset` (none: empty): a dead
        letter is routed by them too, as RabbitMQ routes it."""
        ...

    def take_many(self, count_max: int) -> list[Message]:
        """Up to `count_max` ready messages in delivery order, marked in flight."""
        ...

    def append_position(self, properties: bytes) -> int:
        """Where a record with these properties appended now would go, or later: a record
        staged after this call is found by `stored_from` (the delayed messages' hand-off
        looks for what it staged before a crash). Positions compare within a sequence (a
        priority level), as do the positions of records with the same properties."""
        ...

    def stored_from(self, positions: Collection[int]) -> Iterator[tuple[int, RawRecord]]:
        """(position, record) of every stored record at or after the earliest of
        `positions` in each of their sequences; acknowledged records too, as long as their
        segment is kept."""
        ...

    def peek(self) -> Message | None:
        """The message `take_many(1)` would hand out next, left in place."""
        ...

    def drop_head(self, count_max: int) -> int:
        """Acknowledge up to `count_max` messages from the head; returns how many."""
        ...

    def ack_many(self, offsets: Iterable[int]) -> int:
        """Acknowledge in-flight messages; returns how many were in flight."""
        ...

    def requeue(self, offsets: Iterable[int], failed: bool = False) -> int:
        """Return in-flight messages to be delivered again (redelivered); `failed` counts a
        failed delivery for each."""
        ...

    def hold(self, offsets: Iterable[int], due_ms: int, failed: bool = False) -> int:
        """Take in-flight messages back to wait, durably, until `due_ms` (epoch ms): neither
        ready nor with a consumer until `release`; `failed` counts a failed delivery for
        each. Returns how many were in flight."""
        ...

    def release(self, offsets: Iterable[int]) -> int:
        """Make held messages ready (redelivered); returns how many were held."""
        ...

    def held(self) -> list[tuple[int, int]]:
        """(offset, due epoch ms) of every held message, those a restart found too."""
        ...

    def settle_redeliveries(self, offsets: Iterable[int]) -> int:
        """Acknowledge messages waiting to be delivered again, without delivering them;
        returns how many were waiting."""
        ...

    def browse(self, start: int, count_max: int) -> list[tuple[Message, bool]]:
        """Up to `count_max` unacknowledged messages from offset `start` on, each with whether
        it is in flight, without delivering them."""
        ...

    def deliveries(self, offset: int) -> int:
        """How many times the in-flight message at `offset` has been delivered."""
        ...

    def failures(self, offset: int) -> int:
        """How many of those deliveries failed (before the current one)."""
        ...

    def in_flight(self, offsets: Iterable[int]) -> list[Message]:
        """The in-flight messages at `offsets`, read back (they stay in flight)."""
        ...

    def purge(self) -> int:
        """Acknowledge every ready message; returns how many."""
        ...

    async def commit(self) -> None:
        """Make appends, acks and the delivered mark durable."""
        ...

    async def shutdown(self) -> None:
        """Commit everything and close, recording exactly what was delivered."""
        ...

    def close(self) -> None:
        """Release files without writing."""
        ...

    def delete(self) -> None:
        """Close and remove the queue's data."""
        ...

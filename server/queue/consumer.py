"""The consumer interface: what a queue hands messages to.

A queue knows its consumers only through this interface. The AMQP channel implements
`ConsumerChannel` today; a stream cursor, an HTTP long-poll and a consumer forwarded from
another node implement the same one. The queue never imports the session.

Credit is two questions, because RabbitMQ's no-ack consumers ignore prefetch but still stop
when their channel cannot take more output (channel.flow, a full socket): `can_deliver()`
and `credit()`. A consumer found without credit is *blocked* (`ConsumerState`): one blocked
by its own prefetch waits for its own acks; one blocked by its channel waits in the channel
(`block`), which hands it back to the queue (`WorkQueue.unblock`) once it has credit again.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .engine import Message


class ConsumerChannel(Protocol):
    """Whoever receives a consumer's deliveries (an AMQP channel, a cursor, a long-poll)."""

    def can_deliver(self) -> bool:
        """Whether any delivery may go out now (flow on, output not backed up)."""
        ...

    def credit(self) -> int:
        """How many deliveries that need an ack the channel takes now (its shared limits)."""
        ...

    def block(self, consumer: Consumer) -> None:
        """Keep a consumer its queue found without the channel's credit until credit returns."""
        ...

    def forget_blocked(self, consumer: Consumer) -> None:
        """The consumer is gone: stop keeping it."""
        ...

    def deliver(self, consumer: Consumer, messages: Sequence[Message]) -> None:
        """Hand messages over, in order; the queue has marked them in flight (or acked them,
        for a no-ack consumer: see `Consumer.no_ack`)."""
        ...

    def cancel(self, consumer: Consumer, reason: str) -> None:
        """The queue dropped the consumer (deleted, or the consumer timed out)."""
        ...


class ConsumedQueue(Protocol):
    """What a consumer's channel may do to the queue it consumes from."""

    consumer_timeout_ms: int | None
    """x-consumer-timeout: how long its deliveries may stay unacked (None: the broker's)."""
    visibility_timeout_ms: int | None
    """x-visibility-timeout: how long a delivery's message stays with its consumer before it
    goes back to the queue alone (None: until it is settled)."""

    def stale_settled(self) -> None:
        """A delivery was settled after its visibility timeout had given its message back."""
        ...

    def ack(self, offsets: list[int]) -> None:
        """The deliveries at `offsets` are done with (acked, or rejected without requeue)."""
        ...

    def reject(self, offsets: list[int]) -> None:
        """The deliveries at `offsets` were rejected without requeue (dead-lettered)."""
        ...

    def requeue(self, offsets: list[int], failed: bool) -> None:
        """The deliveries at `offsets` go back to be delivered again; `failed` says whether
        they count as failed deliveries (see `ack_log.py` for which returns do)."""
        ...

    def prefetch_freed(self, consumer: Consumer) -> None:
        """Settling made room under the consumer's own prefetch."""
        ...

    def unblock(self, consumer: Consumer) -> None:
        """The channel that kept the consumer blocked has credit again."""
        ...


class ConsumerState(enum.Enum):
    ROTATING = "in its priority level's round-robin"
    BLOCKED_BY_PREFETCH = "out of its own prefetch; its acks unblock it"
    BLOCKED_BY_CHANNEL = "its channel has no credit or may not deliver; the channel unblocks it"
    CANCELLED = "gone from its queue"


ROTATING = ConsumerState.ROTATING
BLOCKED_BY_PREFETCH = ConsumerState.BLOCKED_BY_PREFETCH
BLOCKED_BY_CHANNEL = ConsumerState.BLOCKED_BY_CHANNEL
CANCELLED = ConsumerState.CANCELLED


@dataclass(eq=False, slots=True)
class Consumer:
    """One consumer of one queue, as the queue sees it."""

    tag: str
    channel: ConsumerChannel
    queue: ConsumedQueue
    no_ack: bool
    """Deliveries count as acked once handed over; only `can_deliver()` limits them."""
    exclusive: bool
    priority: int
    prefetch_count: int
    """Its own prefetch (basic.qos global=false at consume time); 0 is unlimited."""
    unacked_count: int = 0
    state: ConsumerState = ROTATING

    def credit(self, count_max: int) -> int:
        """How many deliveries, at most `count_max`, may go to this consumer now."""
        channel = self.channel
        if not channel.can_deliver():
            return 0
        if self.no_ack:
            return count_max
        if self.prefetch_count:
            count_max = min(count_max, self.prefetch_count - self.unacked_count)
        return max(0, min(count_max, channel.credit()))

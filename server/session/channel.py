"""The broker's side of one channel: consumers, delivery tags, unacked messages, qos, tx.

``amqp.channel.Channel`` owns the wire state (content assembly, confirm and tx flags);
this class owns what the broker does with it. Delivery tags count up from 1 per channel;
the unacked map is ordered by tag, so ``multiple`` acks pop from its front.

Prefetch follows RabbitMQ with per_consumer_qos: basic.qos global=false sets the limit of
consumers created afterwards, global=true a limit shared by the channel's consumers.
basic.get deliveries need acks but do not count against either limit (RabbitMQ's limiter
counts consumer deliveries only).

A queue blocks a consumer whose channel has no credit (or may not deliver) and leaves it with
the channel (``block``); the channel unblocks them all once it has credit again, after acks,
basic.qos, channel.flow or a drained socket (``unblock_consumers``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from warrenmq.amqp import replies
from warrenmq.server.errors import precondition_failed

if TYPE_CHECKING:
    from warrenmq.server.queue.work_queue import Consumer, WorkQueue

    from .connection import BrokerConnection


class Unacked:
    """One delivery awaiting basic.ack: where it came from and who got it."""

    __slots__ = ("tag", "queue", "offset", "consumer")

    def __init__(self, tag: int, queue: WorkQueue, offset: int, consumer: Consumer | None) -> None:
        self.tag = tag
        self.queue = queue
        self.offset = offset
        self.consumer = consumer


class BrokerChannel:
    def __init__(self, connection: BrokerConnection, number: int, unacked_max: int) -> None:
        assert unacked_max > 0
        self.connection = connection
        self.number = number
        self.consumers: dict[str, Consumer] = {}
        self.unacked: dict[int, Unacked] = {}
        self.delivery_tag = 0
        self.consumer_prefetch = 0
        self.global_prefetch = 0
        self.consumer_unacked = 0
        self.unacked_max = unacked_max
        self.flow_active = True
        self.last_queue = ""
        self.reply_consumer: str | None = None
        self.reply_to_name = ""
        # The highest publisher-confirm tag already answered on this channel.
        self.confirmed_through = 0
        # Confirm tags whose message could not be stored: nacked when their tick is released.
        self.failed_confirms: set[int] = set()
        # A message of the transaction being committed could not be stored.
        self.tx_failed = False
        self.tx = False
        self.tx_publishes: list[Any] = []
        self.tx_settles: list[tuple[list[Unacked], bool | None]] = []
        # Exchanges this channel may write to (checked once, as permissions change rarely).
        self.writable_exchanges: set[str] = set()
        # Consumers their queues blocked for want of this channel's credit: no-ack ones wait
        # only for the channel to deliver again (flow, socket), the others for credit too.
        self.blocked_no_ack: dict[Consumer, None] = {}
        self.blocked: dict[Consumer, None] = {}

    # -- credit ---------------------------------------------------------------------------

    def can_deliver(self) -> bool:
        return self.flow_active and self.connection.writable

    def has_credit(self) -> bool:
        if self.global_prefetch and self.consumer_unacked >= self.global_prefetch:
            return False
        return len(self.unacked) < self.unacked_max

    def credit(self) -> int:
        """Consumer deliveries this channel may take now (`has_credit()` while positive)."""
        room = self.unacked_max - len(self.unacked)
        if self.global_prefetch:
            room = min(room, self.global_prefetch - self.consumer_unacked)
        return room

    def block(self, consumer: Consumer) -> None:
        (self.blocked_no_ack if consumer.no_ack else self.blocked)[consumer] = None

    def forget_blocked(self, consumer: Consumer) -> None:
        self.blocked_no_ack.pop(consumer, None)
        self.blocked.pop(consumer, None)

    def unblock_consumers(self) -> set[WorkQueue]:
        """Blocked consumers whose channel has credit again rejoin their queues' rotation;
        returns those queues (to dispatch)."""
        if not (self.blocked_no_ack or self.blocked) or not self.can_deliver():
            return set()
        unblocked = list(self.blocked_no_ack)
        self.blocked_no_ack = {}
        if self.has_credit():
            unblocked += self.blocked
            self.blocked = {}
        for consumer in unblocked:
            consumer.queue.unblock(consumer)
        return {consumer.queue for consumer in unblocked}

    # -- delivering -----------------------------------------------------------------------

    def deliver(self, consumer: Consumer, message: Any) -> None:
        self.delivery_tag += 1
        tag = self.delivery_tag
        queue = consumer.queue
        if consumer.no_ack:
            queue.ack([message.offset])
        else:
            self.unacked[tag] = Unacked(tag, queue, message.offset, consumer)
            consumer.unacked_count += 1
            self.consumer_unacked += 1
        self.connection.send_deliver(self.number, consumer.tag, tag, message)

    def deliver_many(self, consumer: Consumer, messages: list[Any]) -> None:
        """`deliver` each message in turn, with the per-message work hoisted out of the loop."""
        queue = consumer.queue
        first = self.delivery_tag + 1
        self.delivery_tag += len(messages)
        if consumer.no_ack:
            queue.ack([message.offset for message in messages])
        else:
            unacked = self.unacked
            for tag, message in enumerate(messages, first):
                unacked[tag] = Unacked(tag, queue, message.offset, consumer)
            consumer.unacked_count += len(messages)
            self.consumer_unacked += len(messages)
        self.connection.send_deliveries(self.number, consumer.tag, first, messages)

    def record_get(self, queue: WorkQueue, offset: int, no_ack: bool) -> int:
        """A basic.get delivery: its tag (and an unacked entry unless no_ack)."""
        self.delivery_tag += 1
        if no_ack:
            queue.ack([offset])
        else:
            self.unacked[self.delivery_tag] = Unacked(self.delivery_tag, queue, offset, None)
        return self.delivery_tag

    # -- settling -------------------------------------------------------------------------

    def take(self, delivery_tag: int, multiple: bool) -> list[Unacked]:
        """Remove and return the deliveries an ack/nack/reject names (rabbit_channel's
        collect_acks: the tag itself must be unacked, except for multiple with tag 0)."""
        unacked = self.unacked
        if multiple and delivery_tag == 0:
            taken = list(unacked.values())
            unacked.clear()
        elif delivery_tag not in unacked:
            raise precondition_failed(f"unknown delivery tag {delivery_tag}")
        elif multiple:
            tags = []
            for tag in unacked:
                if tag > delivery_tag:
                    break
                tags.append(tag)
            taken = [unacked.pop(tag) for tag in tags]
        else:
            taken = [unacked.pop(delivery_tag)]
        for entry in taken:
            consumer = entry.consumer
            if consumer is not None:
                consumer.unacked_count -= 1
                self.consumer_unacked -= 1
        return taken

    def restore(self, taken: list[Unacked]) -> None:
        """tx.rollback: deliveries taken by acks in the transaction are unacked again."""
        for entry in taken:
            if entry.consumer is not None:
                entry.consumer.unacked_count += 1
                self.consumer_unacked += 1
        merged = {**self.unacked, **{entry.tag: entry for entry in taken}}
        self.unacked = {tag: merged[tag] for tag in sorted(merged)}

    def apply(self, taken: list[Unacked], requeue: bool | None) -> set[WorkQueue]:
        """ack (requeue None or False drops) or requeue: returns queues that may dispatch
        (those settled, and those of consumers the freed credit unblocked)."""
        by_queue: dict[WorkQueue, list[int]] = {}
        for entry in taken:
            by_queue.setdefault(entry.queue, []).append(entry.offset)
            consumer = entry.consumer
            if consumer is not None:
                consumer.queue.prefetch_freed(consumer)
        for queue, offsets in by_queue.items():
            if requeue:
                queue.requeue(offsets)
            else:
                # Without requeue a nacked message is dropped (dead-lettering is its own issue).
                queue.ack(offsets)
        touched = set(by_queue)
        touched.update(self.unblock_consumers())
        return touched

    def settle(self, delivery_tag: int, multiple: bool, requeue: bool | None) -> set[WorkQueue]:
        return self.apply(self.take(delivery_tag, multiple), requeue)

    def requeue_all(self) -> set[WorkQueue]:
        """basic.recover and channel close: every unacked message goes back, redelivered."""
        if not self.unacked:
            return set()
        return self.settle(0, True, True)

    # -- publishing -----------------------------------------------------------------------

    def publisher(self, confirm_tag: int) -> tuple[BrokerChannel, int] | None:
        """Who waits for a message published on this channel to be stored: its confirm
        (tag > 0) or the transaction being committed (tag 0); None when nobody does."""
        if confirm_tag or self.tx:
            return (self, confirm_tag)
        return None

    def publish_failed(self, confirm_tag: int) -> None:
        if confirm_tag:
            self.failed_confirms.add(confirm_tag)
        else:
            self.tx_failed = True

    def take_failed_confirms(self, through_tag: int) -> list[int]:
        """The failed confirm tags up to `through_tag`, forgotten as they are answered."""
        failed = self.failed_confirms
        if not failed:
            return []
        taken = [tag for tag in failed if tag <= through_tag]
        failed.difference_update(taken)
        return taken

    def tx_check(self) -> None:
        if not self.tx:
            raise replies.ChannelError(replies.PRECONDITION_FAILED, "channel is not transactional")

"""The broker's side of one channel: consumers, delivery tags, unacked messages, qos, tx.

``amqp.channel.Channel`` owns the wire state (content assembly, the confirm and tx modes);
this class owns what the broker does with it, and is the consumer interface
(``server.queue.consumer.ConsumerChannel``) its queues deliver through. Delivery tags count
up from 1 per channel; the unacked map is ordered by tag, so ``multiple`` acks pop from its
front.

Prefetch follows RabbitMQ with per_consumer_qos: basic.qos global=false sets the limit of
consumers created afterwards, global=true a limit shared by the channel's consumers.
basic.get deliveries need acks but do not count against either limit (RabbitMQ's limiter
counts consumer deliveries only). An ack inside a transaction gives its credit back at
tx.commit, as RabbitMQ's limiter learns of it only then: the acks a transaction holds are
bounded by the deliveries the channel may have unacked.

A queue blocks a consumer whose channel has no credit (or may not deliver) and leaves it with
the channel (``block``); the channel unblocks them all once it has credit again, after acks,
basic.qos, channel.flow or a drained socket (``unblock_consumers``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from pamqp import commands

from warrenmq.amqp.connection import Connection
from warrenmq.amqp.fastpath import Delivery
from warrenmq.server.errors import precondition_failed
from warrenmq.server.queue.consumer import ConsumedQueue, Consumer
from warrenmq.server.queue.engine import Message
from warrenmq.server.queue.message_counts import MessageCounts


class ChannelConnection(Protocol):
    """What a channel needs of its connection (``connection.BrokerConnection``)."""

    amqp: Connection
    channels: Mapping[int, BrokerChannel]
    writable: bool
    """False while the socket's write buffer is full."""

    def send_deliveries(
        self, channel: int, consumer_tag: str, first_tag: int, messages: Sequence[Any]
    ) -> None: ...

    def output_ready(self) -> None:
        """Have the tick write this connection's output."""
        ...


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class Unacked:
    """One delivery awaiting basic.ack: where it came from, who got it, when (monotonic ms,
    for the consumer timeout), until when its message stays invisible to other consumers
    (x-visibility-timeout; 0: for as long as it is unacked), and whether that time passed
    (`stale`: its message went back to the queue, and a settle of it changes nothing there)."""

    __slots__ = ("tag", "queue", "offset", "consumer", "delivered_ms", "hidden_until_ms", "stale")

    def __init__(
        self,
        tag: int,
        queue: ConsumedQueue,
        offset: int,
        consumer: Consumer | None,
        delivered_ms: int,
        hidden_until_ms: int = 0,
    ) -> None:
        self.tag = tag
        self.queue = queue
        self.offset = offset
        self.consumer = consumer
        self.delivered_ms = delivered_ms
        self.hidden_until_ms = hidden_until_ms
        self.stale = False


class BrokerChannel:
    def __init__(
        self,
        connection: ChannelConnection,
        number: int,
        unacked_max: int,
        tx_messages_max: int,
        consumer_timeout_ms: int = 0,
    ) -> None:
        assert unacked_max > 0 and tx_messages_max > 0 and consumer_timeout_ms >= 0
        self.connection = connection
        self.number = number
        self.wire = connection.amqp.channel(number)
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
        self.tx_messages_max = tx_messages_max
        self.tx_publishes: list[Any] = []
        # (deliveries, requeue, failed) of each settle, as `apply` takes them.
        self.tx_settles: list[tuple[list[Unacked], bool | None, bool]] = []
        # Deliveries settled in the open transaction: still counted against the unacked limit.
        self.tx_settled_count = 0
        # Exchanges this channel may write to (checked once, as permissions change rarely).
        self.writable_exchanges: set[str] = set()
        # Consumers their queues blocked for want of this channel's credit: no-ack ones wait
        # only for the channel to deliver again (flow, socket), the others for credit too.
        self.blocked_no_ack: dict[Consumer, None] = {}
        self.blocked: dict[Consumer, None] = {}
        # The consumer timeout: the broker's default, the shortest timeout of the queues this
        # channel has had deliveries from (0: none has one), and the tags of deliveries taken
        # back from a timed-out consumer, whose late acks are ignored (RabbitMQ 4.3).
        self.consumer_timeout_ms = consumer_timeout_ms
        self.shortest_timeout_ms = 0
        self.reclaimed: set[int] = set()
        self.counts = MessageCounts()

    @property
    def tx(self) -> bool:
        return self.wire.tx_mode

    @property
    def is_open(self) -> bool:
        return self.connection.channels.get(self.number) is self

    # -- credit (the consumer interface) ----------------------------------------------------

    def can_deliver(self) -> bool:
        return self.flow_active and self.connection.writable

    def credit(self) -> int:
        """Consumer deliveries this channel may take now."""
        room = self.unacked_max - len(self.unacked) - self.tx_settled_count
        if self.global_prefetch:
            room = min(room, self.global_prefetch - self.consumer_unacked)
        return room

    def block(self, consumer: Consumer) -> None:
        (self.blocked_no_ack if consumer.no_ack else self.blocked)[consumer] = None

    def forget_blocked(self, consumer: Consumer) -> None:
        self.blocked_no_ack.pop(consumer, None)
        self.blocked.pop(consumer, None)

    def unblock_consumers(self) -> set[ConsumedQueue]:
        """Blocked consumers whose channel has credit again rejoin their queues' rotation;
        returns those queues (to dispatch)."""
        if not (self.blocked_no_ack or self.blocked) or not self.can_deliver():
            return set()
        unblocked = list(self.blocked_no_ack)
        self.blocked_no_ack = {}
        if self.credit() > 0:
            unblocked += self.blocked
            self.blocked = {}
        for consumer in unblocked:
            consumer.queue.unblock(consumer)
        return {consumer.queue for consumer in unblocked}

    # -- delivering (the consumer interface) ------------------------------------------------

    def deliver(self, consumer: Consumer, messages: Sequence[Message]) -> None:
        """basic.deliver each message, with delivery tags counting up."""
        queue = consumer.queue
        first = self.delivery_tag + 1
        self.delivery_tag += len(messages)
        if consumer.no_ack:
            queue.ack([message.offset for message in messages])
        else:
            unacked = self.unacked
            now = monotonic_ms()
            hidden_until = self._time_out(queue, now)
            for tag, message in enumerate(messages, first):
                unacked[tag] = Unacked(tag, queue, message.offset, consumer, now, hidden_until)
            consumer.unacked_count += len(messages)
            self.consumer_unacked += len(messages)
        self.counts.handed_out(messages, consumer.no_ack)
        self.connection.send_deliveries(self.number, consumer.tag, first, messages)

    def cancel(self, consumer: Consumer, reason: str) -> None:
        """The queue dropped the consumer: basic.cancel to a client that asked for it."""
        if self.consumers.get(consumer.tag) is not consumer:
            return
        del self.consumers[consumer.tag]
        connection = self.connection
        if connection.amqp.capabilities.get("consumer_cancel_notify") is True:
            connection.amqp.send_method(
                self.number, commands.Basic.Cancel(consumer_tag=consumer.tag, nowait=True)
            )
            connection.output_ready()

    def got(self, queue: ConsumedQueue, message: Message, no_ack: bool) -> int:
        """A basic.get delivery: its tag (and an unacked entry unless no_ack)."""
        self.delivery_tag += 1
        if not no_ack:
            now = monotonic_ms()
            hidden_until = self._time_out(queue, now)
            self.unacked[self.delivery_tag] = Unacked(
                self.delivery_tag, queue, message.offset, None, now, hidden_until
            )
        return self.delivery_tag

    # -- the consumer timeout -----------------------------------------------------------

    def timeout_of(self, queue: ConsumedQueue) -> int:
        timeout = queue.consumer_timeout_ms
        return self.consumer_timeout_ms if timeout is None else timeout

    def _time_out(self, queue: ConsumedQueue, now_ms: int) -> int:
        """Note the timeouts of a queue this channel gets deliveries from; returns until when
        a delivery made now stays invisible (0: no visibility timeout)."""
        visibility = queue.visibility_timeout_ms
        for timeout in (self.timeout_of(queue), visibility):
            if timeout and (not self.shortest_timeout_ms or timeout < self.shortest_timeout_ms):
                self.shortest_timeout_ms = timeout
        return now_ms + visibility if visibility else 0

    def timed_out(self, now_ms: int) -> tuple[list[Unacked], list[Unacked]]:
        """(deliveries unacked past their queue's consumer timeout, deliveries past their
        visibility timeout). Oldest first, and only as far as the shortest timeout reaches: a
        check costs nothing while nothing is near a timeout. A stale delivery is in neither:
        its message is back in the queue already."""
        shortest = self.shortest_timeout_ms
        if not shortest:
            return [], []
        expired: list[Unacked] = []
        visible: list[Unacked] = []
        for entry in self.unacked.values():
            age = now_ms - entry.delivered_ms
            if age < shortest:
                break
            if entry.stale:
                continue
            if entry.hidden_until_ms and now_ms >= entry.hidden_until_ms:
                visible.append(entry)
                continue
            timeout = self.timeout_of(entry.queue)
            if timeout and age >= timeout:
                expired.append(entry)
        return expired, visible

    def reveal(self, visible: list[Unacked]) -> set[ConsumedQueue]:
        """Past its visibility timeout a delivery's message goes back to its queue (to be
        redelivered, counted as a failed delivery: the consumer neither finished nor gave it
        back in time) while the delivery stays with its consumer, stale."""
        by_queue: dict[ConsumedQueue, list[int]] = {}
        for entry in visible:
            entry.stale = True
            by_queue.setdefault(entry.queue, []).append(entry.offset)
        for queue, offsets in by_queue.items():
            queue.requeue(offsets, failed=True)
        return set(by_queue)

    def extend(self, tags: Sequence[int], extension_ms: int | None, now_ms: int) -> bool:
        """Keep these deliveries invisible for `extension_ms` more from now (None: their
        queue's visibility timeout); False, changing nothing, unless every tag is an unacked,
        not stale delivery from a queue with a visibility timeout."""
        entries = [self.unacked.get(tag) for tag in tags]
        if not entries or any(e is None or e.stale or not e.hidden_until_ms for e in entries):
            return False
        for entry in entries:
            assert entry is not None
            visibility = entry.queue.visibility_timeout_ms
            extension = visibility if extension_ms is None else extension_ms
            entry.hidden_until_ms = now_ms + (extension or 0)
        return True

    def reclaim(self, consumer: Consumer) -> list[Unacked]:
        """Take back every unacked delivery of a timed-out consumer (to requeue); a later ack
        of one of them is ignored, not an unknown delivery tag."""
        taken = [entry for entry in self.unacked.values() if entry.consumer is consumer]
        for entry in taken:
            del self.unacked[entry.tag]
            self.reclaimed.add(entry.tag)
        return taken

    def deliver_reply(
        self, exchange: bytes, routing_key: bytes, properties: bytes, body: bytes
    ) -> bool:
        """A direct reply-to message for this channel's reply consumer; False if it has none."""
        consumer_tag = self.reply_consumer
        if consumer_tag is None or not self.is_open:
            return False
        self.delivery_tag += 1
        self.connection.send_deliveries(
            self.number,
            consumer_tag,
            self.delivery_tag,
            [Delivery(exchange, routing_key, properties, body)],
        )
        return True

    # -- settling -------------------------------------------------------------------------

    def take(self, delivery_tag: int, multiple: bool) -> list[Unacked]:
        """Remove and return the deliveries an ack/nack/reject names (rabbit_channel's
        collect_acks: the tag itself must be unacked, except for multiple with tag 0).

        A tag a consumer timeout took back (`reclaim`) is settled too late: ignored, as
        RabbitMQ 4.3 ignores it, while the unacked deliveries below it still settle."""
        unacked = self.unacked
        if multiple and delivery_tag == 0:
            taken = list(unacked.values())
            unacked.clear()
            return taken
        reclaimed = delivery_tag in self.reclaimed
        if reclaimed:
            self.reclaimed.discard(delivery_tag)
        elif delivery_tag not in unacked:
            raise precondition_failed(f"unknown delivery tag {delivery_tag}")
        if multiple:
            tags = []
            for tag in unacked:
                if tag > delivery_tag:
                    break
                tags.append(tag)
            return [unacked.pop(tag) for tag in tags]
        return [] if reclaimed else [unacked.pop(delivery_tag)]

    def hold(self, taken: list[Unacked], requeue: bool | None, *, failed: bool) -> None:
        """Keep a settle of the open transaction until tx.commit."""
        self.tx_settles.append((taken, requeue, failed))
        self.tx_settled_count += len(taken)

    def rollback(self) -> None:
        """tx.rollback: the transaction's publishes are dropped and the deliveries its acks
        took are unacked again."""
        self.tx_publishes = []
        settles, self.tx_settles = self.tx_settles, []
        self.tx_settled_count = 0
        merged = dict(self.unacked)
        for taken, _, _ in settles:
            merged.update((entry.tag, entry) for entry in taken)
        self.unacked = {tag: merged[tag] for tag in sorted(merged)}

    def apply(
        self, taken: list[Unacked], requeue: bool | None, *, failed: bool
    ) -> set[ConsumedQueue]:
        """ack (requeue None), reject without requeue (False) or requeue (True), `failed`
        saying whether a requeue counts as a failed delivery: returns the queues that may
        dispatch (those settled, and those of consumers the freed credit unblocked)."""
        by_queue: dict[ConsumedQueue, list[int]] = {}
        touched: set[ConsumedQueue] = set()
        # Each consumer's freed prefetch, told to its queue once the whole settle is counted.
        freed: dict[Consumer, None] = {}
        for entry in taken:
            if entry.stale:
                # Its message went back to the queue at its visibility timeout: counted, and
                # nothing else (the message may be with another consumer by now).
                entry.queue.stale_settled()
                touched.add(entry.queue)
            else:
                by_queue.setdefault(entry.queue, []).append(entry.offset)
            consumer = entry.consumer
            if consumer is not None:
                consumer.unacked_count -= 1
                self.consumer_unacked -= 1
                freed[consumer] = None
        for consumer in freed:
            consumer.queue.prefetch_freed(consumer)
        if requeue is None:
            self.counts.acked += len(taken)
        for queue, offsets in by_queue.items():
            if requeue:
                queue.requeue(offsets, failed)
            elif requeue is False:
                queue.reject(offsets)
            else:
                queue.ack(offsets)
        touched.update(by_queue)
        touched.update(self.unblock_consumers())
        return touched

    def commit_settles(self) -> set[ConsumedQueue]:
        """tx.commit: apply the transaction's acks, nacks and rejects in order."""
        settles, self.tx_settles = self.tx_settles, []
        self.tx_settled_count = 0
        touched: set[ConsumedQueue] = set()
        for taken, requeue, failed in settles:
            touched |= self.apply(taken, requeue, failed=failed)
        return touched

    def requeue_all(self, *, failed: bool) -> set[ConsumedQueue]:
        """basic.recover (no failure) and channel close (`failed`: RabbitMQ 4.3 counts the
        deliveries of a consumer whose channel went down as failed): every unacked message
        goes back, redelivered."""
        if not self.unacked:
            return set()
        return self.apply(self.take(0, True), True, failed=failed)

    # -- publishing -----------------------------------------------------------------------

    def hold_publish(self, publish: Any) -> None:
        """Keep a publish of the open transaction until tx.commit, up to the channel's limit."""
        if len(self.tx_publishes) >= self.tx_messages_max:
            raise precondition_failed(
                f"reached maximum ({self.tx_messages_max}) of messages in a transaction"
            )
        self.tx_publishes.append(publish)

    def publish_failed(self, confirm_tag: int) -> None:
        if confirm_tag:
            self.failed_confirms.add(confirm_tag)
        else:
            self.tx_failed = True

    def confirm(self, through_tag: int, refused: Sequence[int]) -> None:
        """Answer publisher confirms up to `through_tag`: runs of acks with multiple=true, and
        a single nack for each refused message (x-overflow reject-publish) or failed write."""
        if not self.is_open:
            return
        amqp = self.connection.amqp
        number = self.number
        done = self.confirmed_through
        failed = self._take_failed_confirms(through_tag)
        nacks = sorted({*refused, *failed}) if failed else refused
        for nack in nacks:
            if nack - 1 > done:
                amqp.confirm(number, nack - 1, multiple=True, nack=False)
            amqp.confirm(number, nack, multiple=False, nack=True)
            done = nack
        if through_tag > done:
            amqp.confirm(number, through_tag, multiple=True, nack=False)
        self.counts.confirmed += through_tag - self.confirmed_through - len(nacks)
        self.confirmed_through = through_tag
        self.connection.output_ready()

    def _take_failed_confirms(self, through_tag: int) -> list[int]:
        """The failed confirm tags up to `through_tag`, forgotten as they are answered."""
        failed = self.failed_confirms
        if not failed:
            return []
        taken = [tag for tag in failed if tag <= through_tag]
        failed.difference_update(taken)
        return taken

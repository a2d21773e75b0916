"""One stream consumer's position: the `ConsumedQueue` its channel settles with.

A cursor reads the stream from its next offset and hands records to its consumer while the
consumer has credit: its prefetch, less what it holds unacked (RabbitMQ's stream consumers
work so over AMQP 0-9-1: acks are credit, nothing is removed). Only fsynced records are read,
so a consumer never sees a message a crash could take back. Deliveries carry
`x-stream-offset` (a long, the last header, as RabbitMQ adds it).

A tracked consumer (`tracked_offsets`) keeps the offsets it holds unacked: its tracked
offset is the lowest of them, or, when it holds none, the next it will read.

basic.nack and basic.reject are refused as RabbitMQ refuses them (540); requeues (a closed
channel, basic.recover, a consumer timeout) put nothing back: a stream keeps every message.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import NoReturn, Protocol

from warrenmq.amqp import properties as props
from warrenmq.log import PartitionLog
from warrenmq.server.errors import not_implemented
from warrenmq.server.queue.consumer import (
    BLOCKED_BY_CHANNEL,
    BLOCKED_BY_PREFETCH,
    ROTATING,
    Consumer,
)
from warrenmq.server.queue.engine import Message
from warrenmq.server.queue.message_counts import MessageCounts

from .filter import StreamFilter
from .tracked_offsets import TrackedOffsets

OFFSET_HEADER = "x-stream-offset"
# One read takes at most this much from the log; a dispatch pass at most this many messages.
READ_BYTES_MAX = 1 << 20
DISPATCH_DELIVERIES_MAX = 1024


_OFFSET_KEY = bytes([len(OFFSET_HEADER)]) + OFFSET_HEADER.encode()
_OFFSET_ENTRY = struct.Struct(f">{len(_OFFSET_KEY)}scq")
_FLAGS = struct.Struct(">H")
_TABLE_LENGTH = struct.Struct(">I")
_CONTENT_TYPE_FLAG = 0x8000
_CONTENT_ENCODING_FLAG = 0x4000


PARTITION_HEADER = "x-stream-partition"
_PARTITION_KEY = bytes([len(PARTITION_HEADER)]) + PARTITION_HEADER.encode()


def partition_entry(partition: str) -> bytes:
    """The encoded header entry naming a group member's partition."""
    return _PARTITION_KEY + props.longstr(partition)


def with_offset(properties: bytes, offset: int, partition: bytes = b"") -> bytes:
    """The stored properties with x-stream-offset set, last in the headers table (then
    x-stream-partition, given as `partition_entry`'s bytes, for a group member).

    Every delivery of a replay needs this, so the common case edits the bytes in place of
    decoding them: a headers table without the keys gets the entries appended (one is added
    after content-type and content-encoding when there is none). Anything else (a key
    already there, more property flags) takes the general path."""
    entry = _OFFSET_ENTRY.pack(_OFFSET_KEY, b"l", offset) + partition
    flags = _FLAGS.unpack_from(properties)[0]
    if not flags & 1:
        position = 2
        if flags & _CONTENT_TYPE_FLAG:
            position += 1 + properties[position]
        if flags & _CONTENT_ENCODING_FLAG:
            position += 1 + properties[position]
        if not flags & props.HEADERS_FLAG:
            return b"".join(
                (
                    _FLAGS.pack(flags | props.HEADERS_FLAG),
                    properties[2:position],
                    _TABLE_LENGTH.pack(len(entry)),
                    entry,
                    properties[position:],
                )
            )
        length = _TABLE_LENGTH.unpack_from(properties, position)[0]
        end = position + 4 + length
        table = properties[position + 4 : end]
        if _OFFSET_KEY not in table and not (partition and _PARTITION_KEY in table):
            return b"".join(
                (
                    properties[:position],
                    _TABLE_LENGTH.pack(length + len(entry)),
                    table,
                    entry,
                    properties[end:],
                )
            )
    added = [(OFFSET_HEADER, props.long(offset))]
    if partition:
        added.append((PARTITION_HEADER, partition[len(_PARTITION_KEY) :]))
    keys = {key for key, _ in added}
    entries = [entry for entry in props.headers(properties) if entry[0] not in keys]
    return props.with_headers(properties, entries + added)


class ReadStream(Protocol):
    """What a cursor reads and counts (``stream.Stream``)."""

    name: str
    vhost: str
    deleted: bool
    log: PartitionLog
    counts: MessageCounts
    tracked: TrackedOffsets

    def remove_consumer(self, consumer: Consumer) -> bool: ...


class StreamDeliveries:
    """What a channel settles a stream consumer's deliveries with: its `Cursor`, or, for a
    stream another node leads, the forwarded consumer's (``forward.entry.RemoteCursor``).
    Acks are credit; basic.nack and basic.reject are refused; nothing is ever requeued."""

    # A stream consumer gets the broker's consumer timeout; nothing here hides a message.
    consumer_timeout_ms: int | None = None
    visibility_timeout_ms: int | None = None
    has_timers = False
    name: str
    vhost: str

    def reject(self, offsets: list[int]) -> None:
        self.refuse_nack()

    def refuse_nack(self) -> NoReturn:
        """basic.nack and basic.reject, with requeue or without: 540, as RabbitMQ."""
        name = f"queue '{self.name}' in vhost '{self.vhost}'"
        raise not_implemented(f"basic.nack and basic.reject not supported by stream queues {name}")

    def requeue(self, offsets: list[int], failed: bool) -> None:
        """A closed channel, basic.recover or a consumer timeout: nothing goes back."""

    def stale_settled(self) -> None:
        """Never stale: a stream hides nothing."""


class Cursor(StreamDeliveries):
    """A consumer's place in its stream, and the queue its channel sees."""

    def __init__(
        self,
        stream: ReadStream,
        next_offset: int,
        tracked_tag: str | None,
        stream_filter: StreamFilter | None = None,
    ) -> None:
        self.stream = stream
        self.filter = stream_filter
        """Which messages this consumer takes (None: all); the others are passed over."""
        self.next_offset = next_offset
        self.consumer: Consumer | None = None
        self.dead_letters: list = []
        """Never any: the tick asks every queue it dispatches."""
        self.tracked_tag = tracked_tag
        """The tag whose offset this cursor tracks (None: not tracked)."""
        self._unacked: set[int] = set()
        """A tracked cursor's offsets delivered and not yet acked."""
        self.on_drained: Callable[[], None] | None = None
        """Called once, when a tracked cursor holds no unacked delivery any more (a group
        partition moving to another member waits for it)."""
        self.partition_entry: bytes = b""
        """A header entry every delivery carries beside x-stream-offset (a group member's
        partition name), already encoded."""
        self.committing = False

    @property
    def tracked_offset(self) -> int:
        """The end of the contiguous acked prefix of what this cursor handed out."""
        return min(self._unacked) if self._unacked else self.next_offset

    @property
    def needs_commit(self) -> bool:
        # A deleted stream's offsets went with its directory.
        return (
            self.tracked_tag is not None and not self.stream.deleted and self.stream.tracked.changed
        )

    async def commit(self) -> None:
        """Make the stream's tracked offsets durable (the tick calls it after acks)."""
        self.committing = True
        try:
            await self.stream.tracked.commit()
        finally:
            self.committing = False

    @property
    def name(self) -> str:
        return self.stream.name

    @property
    def vhost(self) -> str:
        return self.stream.vhost

    @property
    def deleted(self) -> bool:
        return self.stream.deleted or self.consumer is None

    def dispatch(self, now_ms: int, budget: int = DISPATCH_DELIVERIES_MAX) -> bool:
        """Deliver what the consumer has credit for; True if stopped by `budget`."""
        consumer = self.consumer
        if consumer is None or consumer.state is not ROTATING or self.stream.deleted:
            return False
        log = self.stream.log
        while True:
            end = log.committed_offset
            if self.next_offset >= end:
                return False
            if budget <= 0:
                return True
            credit = consumer.credit(budget)
            if not credit:
                self._block(consumer)
                return False
            # Retention may have removed what the cursor had not read yet.
            offset = max(self.next_offset, log.start_offset)
            records = log.read(offset, min(credit, end - offset), READ_BYTES_MAX)
            if not records:
                return False
            self.next_offset = records[-1].offset + 1
            # What is read costs the pass's budget; only what is delivered costs credit.
            budget -= len(records)
            if self.filter is not None:
                matches = self.filter.matches
                records = [record for record in records if matches(record.properties)]
                if not records:
                    continue
            messages = [
                Message(
                    record.offset,
                    record.timestamp_ms,
                    record.exchange,
                    record.routing_key,
                    with_offset(record.properties, record.offset, self.partition_entry),
                    record.body,
                    False,
                    1,
                    0,
                )
                for record in records
            ]
            if self.tracked_tag is not None:
                self._unacked.update(message.offset for message in messages)
            consumer.channel.deliver(consumer, messages)
            self.stream.counts.handed_out(messages, False)

    def _block(self, consumer: Consumer) -> None:
        channel = consumer.channel
        if channel.can_deliver() and channel.credit() > 0:
            consumer.state = BLOCKED_BY_PREFETCH
        else:
            consumer.state = BLOCKED_BY_CHANNEL
            channel.block(consumer)

    # -- what the consumer's channel does (ConsumedQueue) -------------------------------------

    def ack(self, offsets: list[int]) -> None:
        self.stream.counts.settled += len(offsets)
        if self.tracked_tag is not None:
            self._unacked.difference_update(offsets)
            self.stream.tracked.set(self.tracked_tag, self.tracked_offset)
            if self.on_drained is not None and not self._unacked:
                drained, self.on_drained = self.on_drained, None
                drained()

    @property
    def holds_unacked(self) -> bool:
        return bool(self._unacked)

    def prefetch_freed(self, consumer: Consumer) -> None:
        if (
            consumer.state is BLOCKED_BY_PREFETCH
            and consumer.unacked_count < consumer.prefetch_count
        ):
            consumer.state = ROTATING

    def unblock(self, consumer: Consumer) -> None:
        assert consumer.state is BLOCKED_BY_CHANNEL
        consumer.state = ROTATING

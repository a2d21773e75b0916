"""The entry node's side: `RemoteQueue`, which stands in the vhost for a queue another node
leads, and `EntryLink`, the stream to that node it sends the queue's work over.

A `RemoteQueue` answers the calls the tick, the vhost and the channels make of a local
`WorkQueue` (stage, flush, take_written, commit, dispatch, ack, requeue...) by sending them
over the link, so the session and the tick do not know where a queue lives. The few calls
that must wait for the owner's answer (consume, get, purge, delete, the counts of a declare)
are awaitables the vhost returns.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable, Mapping
from typing import Any

from warrenmq.amqp.replies import ProtocolError, protocol_error
from warrenmq.cluster import auth
from warrenmq.exchanges.errors import NotFound
from warrenmq.log import Record
from warrenmq.server.queue import arguments as queue_arguments
from warrenmq.server.queue.consumer import Consumer
from warrenmq.server.queue.engine import Message
from warrenmq.server.queue.message_counts import MessageCounts
from warrenmq.server.queue.queue_stats import QueueStats
from warrenmq.server.queue.work_queue import timeouts
from warrenmq.server.stream.cursor import StreamDeliveries
from warrenmq.server.stream.groups import group_tag

from . import wire
from .link import FramedLink, LinkError, log

CREDIT_WINDOW = 256
"""Deliveries an owner may send ahead to one consumer that has no prefetch of its own (one
with a prefetch gets at most what it has room for)."""


_ANSWERS = (
    wire.Kind.REPLY,
    wire.Kind.GOT,
    wire.Kind.ERROR,
    wire.Kind.STATS_REPLY,
    wire.Kind.PEEKED,
    wire.Kind.REDRIVEN,
    wire.Kind.RECORDS,
    wire.Kind.VIEWED,
    wire.Kind.GROUP_DESCRIBED,
)


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def node_name(node: int) -> str:
    return f"warren@{node}"


class EntryLink(FramedLink):
    """The link this node dialled to the node leading some queues: publishes and their
    confirms, consumers and their deliveries, settles, and requests with their replies.

    Publishes are numbered (`seq`) in the order they are sent; the owner confirms through a
    seq once every publish up to it is stored (and fsynced, for a persistent message on a
    durable queue) and nacks the ones it could not store, before that confirm."""

    def __init__(
        self,
        node: int,
        own_node: int,
        secret: str,
        frame_bytes_max: int,
        wake: Callable[[Any], None],
        metadata_index: Callable[[], int],
        replicas: Any = None,
    ) -> None:
        super().__init__(frame_bytes_max)
        self.node = node
        # This node's replication (`server/replication.py`): its fetches go over this link.
        self._replicas = replicas
        self._wake = wake
        self._metadata_index = metadata_index
        self._barrier_sent = 0
        self._ids = 0
        self._seq = 0
        # Publishes someone waits for, by seq: (channel, confirm tag) as the vhost staged them.
        self._publishers: dict[int, Any] = {}
        # (last seq, future resolved once the owner confirmed through it), oldest first.
        self._batches: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()
        self._requests: dict[int, asyncio.Future[list[Any]]] = {}
        self.consumers: dict[int, Consumer] = {}
        self.group_members: dict[int, Any] = {}
        """Members of groups the owner coordinates, by member id (`coordination.py`)."""
        self._own_node = own_node
        self._secret = secret
        self._nonce = auth.nonce()
        # Nothing goes out before the owner proved the secret over our nonce (its WELCOME).
        self.held = True

    @property
    def name(self) -> str:
        return node_name(self.node)

    def send(self, kind: wire.Kind, *fields: Any) -> None:
        """Queue a message, after a BARRIER if this node applied metadata since the last
        one: the owner then acts on it only once it knows what this node's client saw
        (a queue declared or bound here a moment ago)."""
        index = self._metadata_index()
        if index > self._barrier_sent:
            self._barrier_sent = index
            super().send(wire.Kind.BARRIER, index)
        super().send(kind, *fields)

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        transport.write(wire.MAGIC)
        self.flush()

    def next_id(self) -> int:
        self._ids += 1
        return self._ids

    # -- publishing -----------------------------------------------------------------------

    def publish(
        self,
        vhost: str,
        queue: str,
        record: Any,
        persistent: bool,
        expiring: bool,
        bcc: tuple[str, ...],
        publisher: Any,
        failures: int = 0,
    ) -> int:
        """`failures`: the failed deliveries a dead letter carries (PUBLISH_KEPT)."""
        self._seq += 1
        exchange, routing_key, properties, body = record
        fields = [
            self._seq,
            vhost,
            [queue],
            exchange.decode(),
            routing_key.decode(),
            properties,
            body,
            persistent,
            expiring,
            list(bcc),
        ]
        if failures:
            self.send(wire.Kind.PUBLISH_KEPT, *fields, failures)
        else:
            self.send(wire.Kind.PUBLISH, *fields)
        if publisher is not None:
            self._publishers[self._seq] = publisher
        return self._seq

    def stored(self) -> asyncio.Future[None]:
        """Resolved once everything published so far is confirmed (nacked ones were handed
        back to their publishers first); fails with LinkError if the link goes first."""
        future = asyncio.get_running_loop().create_future()
        if self.closed:
            future.set_exception(LinkError(f"{self.name} is down or inaccessible"))
        else:
            self._batches.append((self._seq, future))
        return future

    # -- requests -------------------------------------------------------------------------

    async def request(self, kind: wire.Kind, request_id: int, *fields: Any) -> list[Any]:
        """Send a request and wait for its answer: REPLY or GOT fields; an ERROR raises the
        channel or connection exception the owner raised; a lost link raises 404 as
        RabbitMQ answers for a queue whose node is down."""
        if self.closed:
            raise LinkError(f"{self.name} is down or inaccessible")
        future: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
        self._requests[request_id] = future
        self.send(kind, request_id, *fields)
        try:
            return await future
        finally:
            # Given up on (a bounded wait for an owner that does not answer): forgotten.
            self._requests.pop(request_id, None)

    # -- what the owner sends ---------------------------------------------------------------

    def received(self, kind: wire.Kind, fields: list[Any]) -> None:
        if kind is wire.Kind.DELIVER:
            consumer = self.consumers.get(fields[0])
            message = Message(*fields[1:])
            if consumer is None:
                return
            queue: RemoteQueue = consumer.queue  # type: ignore[assignment]
            queue.delivered(consumer, message)
        elif kind is wire.Kind.CONFIRM:
            self._confirmed(fields[0])
        elif kind is wire.Kind.FETCHED:
            if self._replicas is not None:
                self._replicas.fetched(self.node, fields[0])
        elif kind is wire.Kind.NACK:
            publisher = self._publishers.pop(fields[0], None)
            if publisher is not None:
                channel, tag = publisher
                channel.publish_failed(tag)
        elif kind is wire.Kind.CANCELLED:
            consumer = self.consumers.pop(fields[0], None)
            if consumer is not None:
                consumer.queue.cancelled(consumer, fields[1])  # type: ignore[attr-defined]
        elif kind in _ANSWERS:
            future = self._requests.pop(fields[0], None)
            if future is None or future.done():
                return
            if kind is wire.Kind.ERROR:
                future.set_exception(protocol_error(fields[1], fields[2]))
            else:
                future.set_result(fields[1:])
        elif kind is wire.Kind.CHALLENGE:
            mac = auth.proof(self._secret, wire.Role.ENTRY, fields[0], self._own_node)
            self.send_now(wire.Kind.HELLO, self._own_node, self._nonce, mac)
        elif kind is wire.Kind.WELCOME:
            self._welcomed(fields[0], fields[1])
        elif kind is wire.Kind.ASSIGN:
            member = self.group_members.get(fields[0])
            if member is not None:
                member.assign(fields[1])
        elif kind is wire.Kind.REVOKE:
            member = self.group_members.get(fields[0])
            if member is not None:
                member.revoke(fields[1])
        elif kind is wire.Kind.GROUP_CANCELLED:
            member = self.group_members.get(fields[0])
            if member is not None:
                member.cancelled(fields[1])
        else:
            raise ValueError(f"unexpected {kind.name} from an owner")

    def _welcomed(self, node: int, mac: bytes) -> None:
        if node != self.node or not auth.proof_valid(
            self._secret, wire.Role.OWNER, self._nonce, node, mac
        ):
            log.error(
                "link to %s refused: its welcome does not prove the cluster secret", self.name
            )
            self.abort()
            return
        log.info("link to %s up", self.name)
        self.held = False
        self.flush()

    def _confirmed(self, through: int) -> None:
        publishers = self._publishers
        while publishers:
            seq = next(iter(publishers))
            if seq > through:
                break
            del publishers[seq]
        batches = self._batches
        while batches and batches[0][0] <= through:
            _, future = batches.popleft()
            if not future.done():
                future.set_result(None)

    def lost(self, reason: str) -> None:
        log.warning("%s", reason)
        error = LinkError(f"{self.name} is down or inaccessible")
        self._publishers.clear()
        while self._batches:
            _, future = self._batches.popleft()
            if not future.done():
                future.set_exception(error)
        requests, self._requests = self._requests, {}
        for future in requests.values():
            if not future.done():
                future.set_exception(error)
        consumers, self.consumers = self.consumers, {}
        for consumer in consumers.values():
            # As RabbitMQ cancels the consumers of a queue whose node went down.
            consumer.queue.cancelled(consumer, "node down")  # type: ignore[attr-defined]
        # Their group's coordinator is gone: it dropped them.
        for member in list(self.group_members.values()):
            member.cancelled("node down")
        if self._replicas is not None:
            self._replicas.link_lost(self.node)

    def writable_again(self) -> None:
        pass


def append_position(queue: Any, properties: bytes) -> int:
    """Where a queue's log stands before a staging, for a hand-off's journal (delayed
    messages, redrives); 0 for a queue another node leads, whose log is not read from here:
    after a crash its messages are staged there again (at least once)."""
    if isinstance(queue, RemoteQueue):
        return 0
    return queue.engine.append_position(properties)


class RemoteQueue:
    """A queue another node leads, as this node's vhost, tick and channels use it.

    `link()` is the current link to the owner (a new one after the last was lost). Messages
    delivered here carry the owner's offsets; the channel's acks, rejects and requeues of
    them go back by offset, and the owner ignores offsets it did not hand to this link."""

    remote = True

    def __init__(
        self,
        vhost: str,
        name: str,
        node: int,
        arguments: Mapping[str, Any],
        link: Callable[[], EntryLink],
        wake: Callable[[Any], None],
    ) -> None:
        self.vhost = vhost
        self.name = name
        self.node = node
        self.arguments = dict(arguments)
        self.queue_type = queue_arguments.queue_type(arguments)
        self._link = link
        self._wake = wake
        self.deleted = False
        self.deposed = False
        """Its leader moved: it forwards no more (`VirtualHost.stop_forwarding`)."""
        self.committing = False
        self.needs_commit = False
        self.has_timers = False
        self.dead_letters: list[Any] = []
        self.counts = MessageCounts()
        self.effective_arguments: Mapping[str, Any] = self.arguments
        self.consumer_timeout_ms: int | None = None
        self.visibility_timeout_ms: int | None = None
        self.ready_count = 0
        """As the owner last said (a declare, a get)."""
        self.consumer_count = 0
        self.stats: QueueStats | None = None
        """The owner's figures, as it last said (`refresh_counts`)."""
        self._staged: list[tuple[Any, bool, bool, Any, tuple[str, ...], int]] = []
        self._written: list[Any] = []
        self._stored: collections.deque[asyncio.Future[None]] = collections.deque()
        self._store_wanted = False
        # Consumers here, with their id on the link and the deliveries the owner may still
        # send them ahead of this node asking (granted credit not yet used).
        self.consumers: dict[Consumer, int] = {}
        self._granted: dict[Consumer, int] = {}

    def apply_arguments(self, effective: Mapping[str, Any]) -> None:
        """Its arguments with the policies applied (metadata every node has): this node's
        channels hold its deliveries, so they enforce its timeouts."""
        self.effective_arguments = effective
        self.consumer_timeout_ms, self.visibility_timeout_ms = timeouts(effective)

    @property
    def dead_letter_exchange(self) -> str | None:
        """As the owner's queue has it (`VirtualHost.dead_letter_queues` lists its targets)."""
        return _text(self.effective_arguments.get("x-dead-letter-exchange"))

    @property
    def dead_letter_routing_key(self) -> str | None:
        return _text(self.effective_arguments.get("x-dead-letter-routing-key"))

    def _unavailable(self) -> NotFound:
        rs = queue_arguments.resource("queue", self.name, self.vhost)
        node = node_name(self.node)
        return NotFound(f"home node '{node}' of durable {rs} is down or inaccessible")

    # -- publishing (the tick's calls) ----------------------------------------------------

    def stage(
        self, record: Any, persistent: bool, expiring: bool = False, publisher: Any = None
    ) -> bool:
        return self.stage_kept(record, persistent, expiring, publisher)

    def stage_kept(
        self,
        record: Any,
        persistent: bool,
        expiring: bool = False,
        publisher: Any = None,
        *,
        bcc: tuple[str, ...] = (),
        failures: int = 0,
    ) -> bool:
        self._staged.append((record, persistent, expiring, publisher, bcc, failures))
        return True

    def flush(self, now_ms: int) -> None:
        """Send what was staged. A publish someone waits for (a confirm, a transaction)
        waits for the owner's confirm, transient or not: the owner must have it."""
        staged = self._staged
        if not staged:
            return
        self._staged = []
        link = self._link()
        for record, persistent, expiring, publisher, bcc, failures in staged:
            link.publish(
                self.vhost, self.name, record, persistent, expiring, bcc, publisher, failures
            )
            if publisher is not None:
                self._written.append(publisher)
                self._store_wanted = True
        self.counts.published += len(staged)

    def drop_staged(self) -> list[Any]:
        """Forget what is staged and not yet sent; returns its publishers (None included),
        which must be refused: the queue is no longer forwarded to this owner."""
        staged, self._staged = self._staged, []
        return [publisher for _, _, _, publisher, _, _ in staged]

    def take_written(self) -> tuple[list[Any], list[Any], bool]:
        written, self._written = self._written, []
        wanted, self._store_wanted = self._store_wanted, False
        if wanted:
            # The tick calls commit() for exactly these, in the order it took them.
            self._stored.append(self._link().stored())
        return written, [], wanted

    async def commit(self) -> None:
        if self._stored:
            await self._stored.popleft()

    def enforce_length(self) -> int:
        return 0

    # -- consumers --------------------------------------------------------------------------

    async def consume(self, consumer: Consumer, arguments: Mapping[str, Any]) -> Consumer:
        """Register the consumer on the owner; raises what the owner's basic.consume raised.
        Its first credit goes with the next dispatch, which the caller asks for once the
        client has its consume-ok (deliveries must not overtake it)."""
        link = self._link()
        consumer_id = link.next_id()
        link.consumers[consumer_id] = consumer
        try:
            await link.request(
                wire.Kind.CONSUME,
                consumer_id,
                self.vhost,
                self.name,
                consumer.tag,
                consumer.exclusive,
                dict(arguments),
            )
        except LinkError:
            link.consumers.pop(consumer_id, None)
            raise self._unavailable() from None
        except asyncio.CancelledError:
            # The client went while the owner registered it: no consumer may stay there.
            link.consumers.pop(consumer_id, None)
            link.send(wire.Kind.CANCEL, consumer_id)
            raise
        except BaseException:
            link.consumers.pop(consumer_id, None)
            raise
        self.consumers[consumer] = consumer_id
        self._granted[consumer] = 0
        return consumer

    def remove_consumer(self, consumer: Consumer) -> asyncio.Future[Any]:
        """Cancel it on the owner; the future resolves (never fails) once the owner removed
        it, and deleted the queue if it was auto-delete and this was its last consumer."""
        consumer_id = self.consumers.pop(consumer, None)
        self._granted.pop(consumer, None)
        link = self._link()
        if consumer_id is None or link.closed:
            link.consumers.pop(consumer_id, None)  # type: ignore[arg-type]
            future = asyncio.get_running_loop().create_future()
            future.set_result(None)
            return future
        return asyncio.ensure_future(self._cancel(link, consumer_id))

    @staticmethod
    async def _cancel(link: EntryLink, consumer_id: int) -> None:
        # The link keeps knowing the consumer until the owner answers: what it delivered
        # before it read the CANCEL still arrives, and goes back (`delivered`), where
        # dropping it left it unacked on the owner for as long as the link lives.
        try:
            await link.request(wire.Kind.CANCEL, consumer_id)
        except (LinkError, ProtocolError):
            pass
        finally:
            link.consumers.pop(consumer_id, None)

    def cancelled(self, consumer: Consumer, reason: str) -> None:
        """The owner dropped the consumer (queue deleted, its node down)."""
        if self.consumers.pop(consumer, None) is None:
            return
        self._granted.pop(consumer, None)
        consumer.channel.cancel(consumer, reason)

    def delivered(self, consumer: Consumer, message: Message) -> None:
        if consumer not in self.consumers:
            # Cancelled here before the owner knew: back to the queue, not a failure.
            self.requeue([message.offset], False)
            return
        self._granted[consumer] -= 1
        consumer.channel.deliver(consumer, [message])
        self.counts.handed_out([message], consumer.no_ack)
        self._wake(self)

    def dispatch(self, now_ms: int) -> bool:
        """Grant each consumer the deliveries it has room for, less what it was granted."""
        link = None
        for consumer, consumer_id in self.consumers.items():
            room = consumer.credit(CREDIT_WINDOW)
            if room <= 0:
                consumer.channel.block(consumer)
                continue
            more = room - self._granted[consumer]
            if more > 0:
                if link is None:
                    link = self._link()
                link.send(wire.Kind.CREDIT, consumer_id, more)
                self._granted[consumer] = room
        return False

    def unblock(self, consumer: Consumer) -> None:
        self._wake(self)

    def prefetch_freed(self, consumer: Consumer) -> None:
        self._wake(self)

    def exclusive_consumer(self) -> Consumer | None:
        return None

    # -- settling -------------------------------------------------------------------------

    def _settle(self, how: wire.Settle, offsets: list[int]) -> None:
        link = self._link()
        link.send(wire.Kind.SETTLE, self.vhost, self.name, how, offsets)

    def ack(self, offsets: list[int]) -> None:
        self._settle(wire.Settle.ACK, offsets)

    def reject(self, offsets: list[int]) -> None:
        self._settle(wire.Settle.REJECT, offsets)

    def requeue(self, offsets: list[int], failed: bool) -> None:
        self._settle(wire.Settle.REQUEUE_FAILED if failed else wire.Settle.REQUEUE, offsets)

    def stale_settled(self) -> None:
        pass

    # -- requests ---------------------------------------------------------------------------

    async def _request(self, kind: wire.Kind, *fields: Any) -> list[Any]:
        link = self._link()
        try:
            return await link.request(kind, link.next_id(), self.vhost, self.name, *fields)
        except LinkError:
            raise self._unavailable() from None

    @property
    def held_until_commit(self) -> bool:
        """basic.get always asks the owner (`take_after_commit`)."""
        return not self.deleted

    def take(self, now_ms: int) -> Message | None:
        return None

    async def take_after_commit(self, now_ms: int) -> Message | None:
        """basic.get on the owner (always acknowledged there by this node's ack: a no-ack
        get's ack follows at once)."""
        reply = await self._request(wire.Kind.GET)
        self.ready_count = reply[0]
        return Message(*reply[1:]) if len(reply) > 2 else None

    async def purge(self) -> int:
        return (await self._request(wire.Kind.PURGE))[0]

    async def delete(self, *, if_unused: bool, if_empty: bool) -> int:
        return (await self._request(wire.Kind.DELETE, if_unused, if_empty))[0]

    async def append(
        self, exchange: str, routing_key: str, properties: bytes, body: bytes
    ) -> int | None:
        """Append one record to the stream on the owner (the topic API's POST): its offset
        once fsynced there, None for an idempotent producer's duplicate."""
        offset, duplicate = await self._request(
            wire.Kind.APPEND, exchange, routing_key, properties, body
        )
        return None if duplicate else offset

    async def read(
        self, offset: int | None, limit: int, bytes_max: int, timeout_ms: int
    ) -> tuple[list[Record], int]:
        """The topic API's GET of the stream on the owner (`Stream.read_waiting`): records
        from `offset` (None: the first retained) and the offset to read next."""
        fields = await self._request(
            wire.Kind.READ, offset or 0, offset is None, limit, bytes_max, timeout_ms
        )
        next_offset, offsets, timestamps, *columns = fields
        records = [
            Record(offset, timestamp, 0, *values)
            for offset, timestamp, *values in zip(offsets, timestamps, *columns, strict=True)
        ]
        return records, next_offset

    async def tracked(self, tag: str) -> tuple[int, int | None]:
        """The stream's end offset on the owner, and the offset tracked there under `tag`."""
        end, tracked = await self._request(wire.Kind.TRACKED, tag)
        return end, tracked - 1 if tracked else None

    async def commit_offset(self, tag: str, offset: int) -> None:
        """Track `offset` under `tag` on the owner, durably (the topic API's commit)."""
        await self._request(wire.Kind.COMMIT_OFFSET, tag, offset)

    async def refresh_counts(self) -> None:
        """passive declare, the HTTP API, the metrics: the owner's figures."""
        (values,) = await self._request(wire.Kind.STATS)
        stats = self.stats = QueueStats.from_values(values)
        self.ready_count, self.consumer_count = stats.ready, stats.consumers

    async def browse(self, start: int, count_max: int) -> list[tuple[Message, bool]]:
        """The DLQ tools' browse (`QueueEngine.browse`) on the owner, asked a slice at a time
        until `count_max` messages came or the queue has no more."""
        browsed: list[tuple[Message, bool]] = []
        while len(browsed) < count_max:
            columns = await self._request(wire.Kind.PEEK, start, count_max - len(browsed))
            if not columns[0]:
                break
            for *fields, redelivered, deliveries, failures, in_flight in zip(*columns, strict=True):
                message = Message(*fields, bool(redelivered), deliveries, failures)
                browsed.append((message, bool(in_flight)))
            start = browsed[-1][0].offset + 1
        return browsed

    # -- lifecycle --------------------------------------------------------------------------

    def touch(self, now_ms: int) -> None:
        """x-expires is the owner's: its own uses renew it."""

    def retire(self) -> None:
        """Its record is gone: the owner cancels the consumers it had here."""
        self.deleted = True


class RemoteCursor(StreamDeliveries):
    """A consumer of a stream another node leads, as its channel sees it (a local stream
    consumer's `Cursor`).

    The owner runs the real stream consumer (its start offset, filter and tracked offset),
    whose channel is the link; deliveries, credit and cancels go by the `RemoteQueue` as any
    forwarded consumer's. Acks go to that consumer by its id (STREAM_ACK): several consumers
    of one stream hold the same offsets. Nack and reject are refused here, as a local
    stream refuses them, and nothing is requeued."""

    needs_commit = False
    committing = False

    def __init__(self, remote: RemoteQueue) -> None:
        self.remote = remote
        self.dead_letters: list[Any] = []
        self._link: EntryLink | None = None
        """The link the consumer was registered over: an ack after that link was lost names
        nothing there (ids start again on a new link), so it goes nowhere."""
        self._consumer_id = 0
        self._unacked: set[int] = set()
        """A group partition's deliveries not yet acked (its move to another member waits
        for them)."""
        self.on_drained: Callable[[], None] | None = None
        self._registering: asyncio.Future[Any] | None = None
        self._group = ""
        self.letting_go: asyncio.Future[None] | None = None
        """A group partition's removal under way: done once its node removed the consumer
        and has every ack sent before (`_let_go`)."""

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.remote.name

    @property
    def vhost(self) -> str:  # type: ignore[override]
        return self.remote.vhost

    @property
    def deleted(self) -> bool:
        return self.remote.deleted

    async def consume(self, consumer: Consumer, arguments: Mapping[str, Any]) -> Consumer:
        """Register it on the owner with the client's arguments (x-stream-offset,
        x-stream-filter...), which this node checked as a local basic.consume does."""
        # The link `RemoteQueue.consume` sends the request over (no await in between).
        link = self.remote._link()
        await self.remote.consume(consumer, arguments)
        self._link = link
        self._consumer_id = self.remote.consumers[consumer]
        return consumer

    def consume_partition(
        self, consumer: Consumer, group: str, arguments: Mapping[str, Any]
    ) -> None:
        """Register a consumer group member on this partition, on the node leading it (from
        the group's committed offset there, `groups.attach_partition`); under way until that
        node answered, when the member's channel gets its first deliveries."""
        self._registering = asyncio.ensure_future(
            self._consume_partition(consumer, group, dict(arguments))
        )

    async def _consume_partition(
        self, consumer: Consumer, group: str, arguments: dict[str, Any]
    ) -> None:
        self._group = group
        remote = self.remote
        link = self._link = remote._link()
        consumer_id = link.next_id()
        link.consumers[consumer_id] = consumer
        fields = (remote.vhost, remote.name, consumer.tag, group, arguments)
        try:
            await link.request(wire.Kind.CONSUME_PARTITION, consumer_id, *fields)
        except asyncio.CancelledError:
            link.consumers.pop(consumer_id, None)
            link.send(wire.Kind.CANCEL, consumer_id)
            raise
        except (LinkError, ProtocolError, NotFound) as error:
            link.consumers.pop(consumer_id, None)
            log.warning("group %s: partition %s not consumed: %s", group, remote.name, error)
            return
        self._consumer_id = consumer_id
        remote.consumers[consumer] = consumer_id
        remote._granted[consumer] = 0
        remote.dispatch(0)

    @property
    def holds_unacked(self) -> bool:
        """Deliveries not acked yet, or its removal under way: the partition's next member
        may be on another node, whose CONSUME_PARTITION must find the committed offset where
        this member's acks got to."""
        return bool(self._unacked) or self.letting_go is not None

    def ack(self, offsets: list[int]) -> None:
        link = self._link
        if link is not None and not link.closed:
            link.send(wire.Kind.STREAM_ACK, self._consumer_id, offsets)
        if self._unacked:
            self._unacked.difference_update(offsets)
            self._drained()

    def _drained(self) -> None:
        if self.on_drained is not None and not self.holds_unacked:
            drained, self.on_drained = self.on_drained, None
            drained()

    def returned(self) -> None:
        """Its member left: what it holds is returned, not waited for."""
        self._unacked.clear()

    async def _let_go(self, removal: asyncio.Future[Any]) -> None:
        """Wait for the removal, then for a request sent after every ack (the link keeps
        order): the node leading the partition committed what the member acked."""
        await removal
        try:
            await self.remote.tracked(group_tag(self._group))
        except (LinkError, ProtocolError, NotFound):
            # That node is gone: its link's loss committed what reached it.
            pass
        self.letting_go = None
        self._drained()

    def dispatch(self, now_ms: int) -> bool:
        return self.remote.dispatch(now_ms)

    def delivered(self, consumer: Consumer, message: Message) -> None:
        if self._registering is not None and consumer in self.remote.consumers:
            self._unacked.add(message.offset)
        self.remote.delivered(consumer, message)

    def cancelled(self, consumer: Consumer, reason: str) -> None:
        self.remote.cancelled(consumer, reason)

    def remove_consumer(self, consumer: Consumer) -> asyncio.Future[Any]:
        registering = self._registering
        if registering is not None and not registering.done():
            registering.cancel()
        removal = self.remote.remove_consumer(consumer)
        if self._consumer_id and self._group:
            self.letting_go = asyncio.ensure_future(self._let_go(removal))
        return removal

    def prefetch_freed(self, consumer: Consumer) -> None:
        self.remote.prefetch_freed(consumer)

    def unblock(self, consumer: Consumer) -> None:
        self.remote.unblock(consumer)

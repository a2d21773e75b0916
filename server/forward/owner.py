"""The owner's side: `OwnerLink` serves one entry node's link by calling this node's core,
as a channel would, and answering over the link.

To the core the link is a publisher (its `confirm`/`publish_failed` are a channel's, with the
link's seqs for confirm tags) and one consumer channel per forwarded consumer (`LinkChannel`:
credit is what the entry node granted, deliveries go out as DELIVER). Everything this link
was handed and not settled goes back to its queue when the link goes, as a closed channel's
deliveries do; its consumers are cancelled.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from warrenmq.amqp.replies import RESOURCE_ERROR, ProtocolError
from warrenmq.cluster import auth
from warrenmq.exchanges.errors import NotFound, RoutingError
from warrenmq.server.errors import internal_error
from warrenmq.server.queue import arguments as queue_arguments
from warrenmq.server.queue.consumer import Consumer
from warrenmq.server.queue.engine import Message
from warrenmq.server.queue.queue_stats import QueueStats
from warrenmq.server.queue.work_queue import WorkQueue
from warrenmq.server.stream.cursor import Cursor
from warrenmq.server.stream.groups import MemberStandIn, commit_released
from warrenmq.server.stream.stream import Stream

from . import wire
from .entry import node_name
from .link import FramedLink, log

if TYPE_CHECKING:
    from warrenmq.server.vhost import VirtualHost

PEEK_MESSAGES_MAX = 1000
PEEK_REPLY_BYTES = 1 << 20
PEEKED_COLUMNS = len(Message._fields) + 1


class OwnerHost(Protocol):
    """What the owner's side needs of the broker process."""

    vhosts: dict[str, VirtualHost]

    def stage_confirm(self, channel: Any, tag: int, refused: bool = False) -> None: ...

    def want_dispatch(self, queue: Any) -> None: ...

    def metadata_index(self) -> int: ...

    def metadata_applied(self, index: int) -> asyncio.Future[Any]: ...

    def after_commit(self) -> asyncio.Future[None]: ...

    boot: int
    redrives: Any
    replicas: Any

    async def local_view(self, name: str, argument: Any) -> Any:
        """This node's part of a cluster-wide HTTP API figure (`server/http/node_views.py`)."""
        ...


class LinkChannel:
    """The consumer channel of one consumer forwarded over a link (`ConsumerChannel`)."""

    __slots__ = ("link", "consumer_id", "credit_left", "blocked")

    def __init__(self, link: OwnerLink, consumer_id: int) -> None:
        self.link = link
        self.consumer_id = consumer_id
        self.credit_left = 0
        self.blocked: Consumer | None = None

    def can_deliver(self) -> bool:
        return self.link.writable and not self.link.closed

    def credit(self) -> int:
        return self.credit_left

    def block(self, consumer: Consumer) -> None:
        self.blocked = consumer

    def forget_blocked(self, consumer: Consumer) -> None:
        self.blocked = None

    def unblock(self) -> None:
        consumer, self.blocked = self.blocked, None
        if consumer is not None:
            consumer.queue.unblock(consumer)
            self.link.host.want_dispatch(consumer.queue)

    def deliver(self, consumer: Consumer, messages: Sequence[Message]) -> None:
        self.credit_left -= len(messages)
        link = self.link
        link.unacked.setdefault(consumer.queue, set()).update(m.offset for m in messages)  # type: ignore[arg-type]
        for message in messages:
            link.send(wire.Kind.DELIVER, self.consumer_id, *message)

    def cancel(self, consumer: Consumer, reason: str) -> None:
        if self.link.consumers.pop(self.consumer_id, None) is not None:
            self.link.send(wire.Kind.CANCELLED, self.consumer_id, reason)


class _Appended:
    """The publisher of an APPEND's record: told when its write failed."""

    failed = False

    def publish_failed(self, tag: int) -> None:
        self.failed = True


class OwnerLink(FramedLink):
    """A link an entry node dialled to this node, once the AMQP listener handed it over."""

    def __init__(self, host: OwnerHost, node: int, secret: str, frame_bytes_max: int) -> None:
        super().__init__(frame_bytes_max)
        self.host = host
        self.node = node
        self._secret = secret
        self.peer_node = 0
        """The entry node, once its hello proved the cluster secret (0 until then)."""
        self._magic_seen = b""
        self.failed_seqs: set[int] = set()
        self.consumers: dict[int, tuple[VirtualHost, Consumer]] = {}
        self.unacked: dict[WorkQueue, set[int]] = {}
        self.cursors: dict[int, Cursor] = {}
        """The cursors of forwarded stream consumers by id, kept past a cancel while they
        hold deliveries (acks after a cancel still move a tracked offset, as locally)."""
        self.group_members: dict[int, tuple[VirtualHost, MemberStandIn]] = {}
        """Members connected to the entry node of groups this node coordinates, by the
        member ids the entry node gave them (`coordination.py`)."""
        self._tasks: set[asyncio.Future[Any]] = set()
        self._nonce = auth.nonce()
        self._held: list[tuple[wire.Kind, list[Any]]] | None = None
        """Messages after a BARRIER this node's metadata has not reached yet, in order."""

    @property
    def name(self) -> str:
        return node_name(self.peer_node) if self.peer_node else "an unknown node"

    def data_received(self, data: bytes) -> None:
        if len(self._magic_seen) < len(wire.MAGIC):
            missing = len(wire.MAGIC) - len(self._magic_seen)
            self._magic_seen += data[:missing]
            data = data[missing:]
            if not wire.MAGIC.startswith(self._magic_seen):
                self.abort()
                return
        if data:
            super().data_received(data)

    # -- the core's publisher (confirms) ----------------------------------------------------

    def publish_failed(self, seq: int) -> None:
        self.failed_seqs.add(seq)

    def confirm(self, through: int, refused: Sequence[int]) -> None:
        failed = {seq for seq in self.failed_seqs if seq <= through}
        self.failed_seqs -= failed
        for seq in sorted({*refused, *failed}):
            self.send(wire.Kind.NACK, seq)
        self.send(wire.Kind.CONFIRM, through)

    # -- messages -------------------------------------------------------------------------

    def received(self, kind: wire.Kind, fields: list[Any]) -> None:
        if not self.peer_node:
            self._hello(kind, fields)
            return
        if self._held is not None:
            self._held.append((kind, fields))
        elif kind is wire.Kind.BARRIER:
            self._barrier(fields[0])
        elif kind is wire.Kind.PUBLISH:
            self._publish(*fields)
        elif kind is wire.Kind.PUBLISH_KEPT:
            self._publish(*fields[:-1], failures=fields[-1])
        elif kind is wire.Kind.CREDIT:
            consumer_id, more = fields
            entry = self.consumers.get(consumer_id)
            if entry is not None:
                channel: LinkChannel = entry[1].channel  # type: ignore[assignment]
                channel.credit_left += more
                channel.unblock()
        elif kind is wire.Kind.SETTLE:
            self._settle(*fields)
        elif kind is wire.Kind.CONSUME:
            self._answer(fields[0], self._consume, *fields)
        elif kind is wire.Kind.CANCEL:
            self._answer(fields[0], self._cancel, fields[0])
        elif kind is wire.Kind.GET:
            self._answer(fields[0], self._get, *fields)
        elif kind is wire.Kind.PURGE:
            self._answer(fields[0], self._purge, *fields)
        elif kind is wire.Kind.DELETE:
            self._answer(fields[0], self._delete, *fields)
        elif kind is wire.Kind.STATS:
            self._answer(fields[0], self._stats, *fields)
        elif kind is wire.Kind.STREAM_ACK:
            self._stream_ack(*fields)
        elif kind is wire.Kind.APPEND:
            self._answer(fields[0], self._append, *fields)
        elif kind is wire.Kind.PEEK:
            self._answer(fields[0], self._peek, *fields)
        elif kind is wire.Kind.FETCH:
            replicas = self.host.replicas
            if replicas is None:
                raise ValueError("a FETCH to a node that does not replicate")
            replicas.fetch_received(self, fields[0])
        elif kind is wire.Kind.BOOT:
            self.send(wire.Kind.REPLY, fields[0], self.host.boot, 0)
        elif kind is wire.Kind.REDRIVE:
            self._answer(fields[0], self._redrive, *fields)
        elif kind is wire.Kind.READ:
            self._answer(fields[0], self._read, *fields)
        elif kind is wire.Kind.TRACKED:
            self._answer(fields[0], self._tracked, *fields)
        elif kind is wire.Kind.COMMIT_OFFSET:
            self._answer(fields[0], self._commit_offset, *fields)
        elif kind is wire.Kind.CONSUME_PARTITION:
            self._answer(fields[0], self._consume_partition, *fields)
        elif kind is wire.Kind.VIEW:
            self._answer(fields[0], self._view, *fields)
        elif kind is wire.Kind.GROUP_JOIN:
            self._answer(fields[0], self._group_join, *fields)
        elif kind is wire.Kind.GROUP_LEAVE:
            self._group_leave(fields[0])
        elif kind is wire.Kind.DRAINED:
            entry = self.group_members.get(fields[0])
            if entry is not None:
                entry[1].group.drained(entry[1], fields[1])
        elif kind is wire.Kind.GROUP_DESCRIBE:
            self._answer(fields[0], self._group_describe, *fields)
        else:
            raise ValueError(f"unexpected {kind.name} from an entry node")

    def _barrier(self, index: int) -> None:
        if self.host.metadata_index() >= index:
            return
        self._held = []
        if self.transport is not None:
            self.transport.pause_reading()
        self.host.metadata_applied(index).add_done_callback(self._release_held)

    def _release_held(self, caught_up: asyncio.Future[Any]) -> None:
        if self.closed:
            return
        if caught_up.cancelled() or caught_up.exception() is not None:
            log.error("link %s: metadata never caught up; closing it", self.name)
            self.abort()
            return
        held, self._held = self._held or [], None
        if self.transport is not None:
            self.transport.resume_reading()
        for position, (kind, fields) in enumerate(held):
            if self._held is not None:
                # Another barrier among them: the rest waits for it.
                self._held.extend(held[position:])
                return
            self.received(kind, fields)
            if self.closed:
                return

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self.send_now(wire.Kind.CHALLENGE, self._nonce)

    def _hello(self, kind: wire.Kind, fields: list[Any]) -> None:
        valid = kind is wire.Kind.HELLO and auth.proof_valid(
            self._secret, wire.Role.ENTRY, self._nonce, fields[0], fields[2]
        )
        if not valid:
            log.error("link from %s refused: no valid hello (cluster secret)", self._peer())
            self.abort()
            return
        self.peer_node = fields[0]
        log.info("link from %s (%s) up", self.name, self._peer())
        mac = auth.proof(self._secret, wire.Role.OWNER, fields[1], self.node)
        self.send(wire.Kind.WELCOME, self.node, mac)

    def _peer(self) -> str:
        peer = self.transport.get_extra_info("peername") if self.transport else None
        return f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else "?"

    def _vhost(self, name: str) -> VirtualHost:
        vhost = self.host.vhosts.get(name)
        if vhost is None:
            raise NotFound(f"no vhost '{name}'")
        return vhost

    @staticmethod
    def _owner(vhost: VirtualHost, queue: str) -> str:
        """Exclusivity was checked on the entry node (metadata every node has): the owner
        acts for the queue's own connection.

        Every request on a queue asks this first, so it also refuses a queue another node
        leads by now: deleted and declared again there since the entry node sent the
        request. The entry node meant the queue that was deleted: 404, as for any queue
        deleted under a client (acting on the new one here would forward it again)."""
        if queue in vhost.remote:
            raise NotFound(f"no queue '{queue}' in vhost '{vhost.name}'")
        record = vhost.store.state.queue(vhost.name, queue)
        return (record.exclusive_owner or "") if record is not None else ""

    def _publish(
        self,
        seq: int,
        vhost_name: str,
        queues: list[str],
        exchange: str,
        routing_key: str,
        properties: bytes,
        body: bytes,
        persistent: bool,
        expiring: bool,
        bcc: list[str],
        failures: int = 0,
    ) -> None:
        vhost = self.host.vhosts.get(vhost_name)
        record = (exchange.encode(), routing_key.encode(), properties, body)
        refused = vhost is None
        for name in queues:
            queue = vhost.queues.get(name) if vhost is not None else None
            if queue is None or not vhost.restage(  # type: ignore[union-attr]
                queue, record, persistent, expiring, (self, seq), tuple(bcc), failures
            ):
                refused = True
        self.host.stage_confirm(self, seq, refused)

    def _settle(self, vhost_name: str, name: str, how: int, offsets: list[int]) -> None:
        vhost = self.host.vhosts.get(vhost_name)
        queue = vhost.queues.get(name) if vhost is not None else None
        held = self.unacked.get(queue) if queue is not None else None  # type: ignore[arg-type]
        if held is None:
            return
        # Only what this link was handed: a settle after a lost link is of nothing here.
        mine = [offset for offset in offsets if offset in held]
        if not mine:
            return
        held.difference_update(mine)
        if how == wire.Settle.ACK:
            queue.ack(mine)
        elif how == wire.Settle.REJECT:
            queue.reject(mine)
        else:
            queue.requeue(mine, how == wire.Settle.REQUEUE_FAILED)
        self.host.want_dispatch(queue)

    def _answer(self, request_id: int, handler: Any, *fields: Any) -> None:
        """Run a request (at once, or as a task when it must wait) and send its answer:
        REPLY/GOT, or ERROR with the reply code and text the core raised."""
        try:
            outcome = handler(*fields)
        except Exception as error:
            self._error(request_id, error)
            return
        if asyncio.iscoroutine(outcome):
            task = asyncio.ensure_future(outcome)
            self._tasks.add(task)
            task.add_done_callback(lambda done: self._answered(request_id, done))

    def _answered(self, request_id: int, task: asyncio.Future[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._error(request_id, task.exception())  # type: ignore[arg-type]

    def _error(self, request_id: int, error: BaseException) -> None:
        if isinstance(error, RoutingError):
            self.send(wire.Kind.ERROR, request_id, error.reply_code, error.reply_text)
        elif isinstance(error, ProtocolError):
            self.send(wire.Kind.ERROR, request_id, error.code, error.text)
        else:
            log.error("link from %s: request failed: %r", self.name, error)
            self.send(wire.Kind.ERROR, request_id, 541, f"internal error: {type(error).__name__}")

    def _consume(
        self,
        consumer_id: int,
        vhost_name: str,
        name: str,
        tag: str,
        exclusive: bool,
        arguments: dict[str, Any],
    ) -> None:
        vhost = self._vhost(vhost_name)
        stream = vhost.get_queue(name, self._owner(vhost, name))
        if isinstance(stream, Stream):
            self._consume_stream(vhost, stream, consumer_id, tag, exclusive, arguments)
            return
        # The entry node keeps the client's prefetch and no-ack: here the link's credit.
        consumer = vhost.consume(
            name,
            self._owner(vhost, name),
            LinkChannel(self, consumer_id),
            tag,
            no_ack=False,
            exclusive=exclusive,
            arguments=arguments,
            prefetch_count=0,
        )
        self.consumers[consumer_id] = (vhost, consumer)
        self.send(wire.Kind.REPLY, consumer_id, 0, 0)

    def _consume_stream(
        self,
        vhost: VirtualHost,
        stream: Stream,
        consumer_id: int,
        tag: str,
        exclusive: bool,
        arguments: dict[str, Any],
    ) -> None:
        """A real stream consumer (from the client's x-stream-offset, with its filter and
        tracked offset) whose channel is the link; its acks come as STREAM_ACK."""
        consumer = vhost.consume_forwarded_stream(
            stream, LinkChannel(self, consumer_id), tag, exclusive=exclusive, arguments=arguments
        )
        self.consumers[consumer_id] = (vhost, consumer)
        self.cursors[consumer_id] = consumer.queue  # type: ignore[assignment]
        self.send(wire.Kind.REPLY, consumer_id, 0, 0)

    def _stream_ack(self, consumer_id: int, offsets: list[int]) -> None:
        cursor = self.cursors.get(consumer_id)
        held = self.unacked.get(cursor) if cursor is not None else None  # type: ignore[call-overload]
        if held is None:
            return
        mine = [offset for offset in offsets if offset in held]
        held.difference_update(mine)
        if mine:
            cursor.ack(mine)  # type: ignore[union-attr]
            # The tick commits the tracked offset the ack moved.
            self.host.want_dispatch(cursor)
        self._forget_cursor(consumer_id)

    def _forget_cursor(self, consumer_id: int) -> None:
        """Drop a cancelled stream consumer's cursor once it holds no delivery."""
        cursor = self.cursors.get(consumer_id)
        if cursor is not None and cursor.consumer is None and not self.unacked.get(cursor):  # type: ignore[call-overload]
            del self.cursors[consumer_id]
            self.unacked.pop(cursor, None)  # type: ignore[call-overload]

    def _cancel(self, consumer_id: int) -> Any:
        entry = self.consumers.pop(consumer_id, None)
        if entry is None:
            self.send(wire.Kind.REPLY, consumer_id, 0, 0)
            return None
        vhost, consumer = entry
        consumer.channel.forget_blocked(consumer)
        deleting = vhost.cancel(consumer)
        _released(consumer)
        self._forget_cursor(consumer_id)
        if deleting is None:
            self.send(wire.Kind.REPLY, consumer_id, 0, 0)
            return None
        return self._cancelled_after(consumer_id, deleting)

    async def _cancelled_after(self, consumer_id: int, deleting: asyncio.Future[Any]) -> None:
        await asyncio.wait([deleting])
        self.send(wire.Kind.REPLY, consumer_id, 0, 0)

    async def _get(self, request_id: int, vhost_name: str, name: str) -> None:
        vhost = self._vhost(vhost_name)
        queue, message = vhost.get(name, self._owner(vhost, name), no_ack=False)
        if message is None and queue.held_until_commit:
            message = await vhost.get_after_commit(queue, no_ack=False)
        if message is None:
            self.send(wire.Kind.REPLY, request_id, queue.ready_count, 0)
            return
        self.unacked.setdefault(queue, set()).add(message.offset)
        self.send(wire.Kind.GOT, request_id, queue.ready_count, *message)

    def _purge(self, request_id: int, vhost_name: str, name: str) -> None:
        vhost = self._vhost(vhost_name)
        count = vhost.purge(name, self._owner(vhost, name))
        self.send(wire.Kind.REPLY, request_id, count, 0)

    async def _delete(
        self, request_id: int, vhost_name: str, name: str, if_unused: bool, if_empty: bool
    ) -> None:
        vhost = self._vhost(vhost_name)
        queue = vhost.get_queue(name, self._owner(vhost, name))
        count = await vhost.delete_queue(queue, if_unused=if_unused, if_empty=if_empty)
        self.send(wire.Kind.REPLY, request_id, count, 0)

    async def _append(
        self,
        request_id: int,
        vhost_name: str,
        name: str,
        exchange: str,
        routing_key: str,
        properties: bytes,
        body: bytes,
    ) -> None:
        """One record of the entry node's topic API, answered with its offset once fsynced
        (as that API answers a local POST)."""
        vhost = self._vhost(vhost_name)
        stream = vhost.get_queue(name, "")
        if not isinstance(stream, Stream):
            raise NotFound(f"no stream {queue_arguments.resource('queue', name, vhost_name)}")
        offset = stream.staged_end
        stored = _Appended()
        vhost.stage(
            ((name,), properties, ()), exchange, routing_key, body, True, False, (stored, 0)
        )
        # An idempotent producer's duplicate is not staged.
        staged = stream.staged_end > offset
        await self.host.after_commit()
        if stored.failed or (staged and (stream.deleted or stream.log.committed_offset <= offset)):
            raise internal_error("storing the record failed")
        self.send(wire.Kind.REPLY, request_id, offset if staged else 0, 0 if staged else 1)

    def _stream(self, vhost_name: str, name: str) -> Stream:
        vhost = self._vhost(vhost_name)
        stream = vhost.queues.get(name)
        if not isinstance(stream, Stream):
            raise NotFound(f"no stream {queue_arguments.resource('queue', name, vhost_name)}")
        return stream

    async def _read(
        self,
        request_id: int,
        vhost_name: str,
        name: str,
        offset: int,
        from_start: bool,
        limit: int,
        bytes_max: int,
        timeout_ms: int,
    ) -> None:
        """The entry node's topic API GET, read here as a local GET reads."""
        stream = self._stream(vhost_name, name)
        read = await stream.read_waiting(
            None if from_start else offset, limit, bytes_max, timeout_ms
        )
        if read is None:
            raise ProtocolError(RESOURCE_ERROR, "too many readers wait on this partition")
        records, next_offset = read
        self.send(
            wire.Kind.RECORDS,
            request_id,
            next_offset,
            [r.offset for r in records],
            [r.timestamp_ms for r in records],
            [r.exchange for r in records],
            [r.routing_key for r in records],
            [r.properties for r in records],
            [r.body for r in records],
        )

    def _tracked(self, request_id: int, vhost_name: str, name: str, tag: str) -> None:
        stream = self._stream(vhost_name, name)
        tracked = stream.tracked.get(tag)
        self.send(
            wire.Kind.REPLY,
            request_id,
            stream.log.end_offset,
            0 if tracked is None else tracked + 1,
        )

    async def _commit_offset(
        self, request_id: int, vhost_name: str, name: str, tag: str, offset: int
    ) -> None:
        stream = self._stream(vhost_name, name)
        stream.tracked.set(tag, offset)
        await stream.tracked.commit()
        self.send(wire.Kind.REPLY, request_id, 0, 0)

    def _consume_partition(
        self,
        consumer_id: int,
        vhost_name: str,
        name: str,
        tag: str,
        group: str,
        arguments: dict[str, Any],
    ) -> None:
        """A consumer group member on another node reading this partition: attached as a
        local member's partition is (`groups.attach_partition`), whose channel is the link;
        the entry node checked the member's arguments."""
        stream = self._stream(vhost_name, name)
        vhost = self._vhost(vhost_name)
        consumer = vhost.consume_group_partition(
            stream, LinkChannel(self, consumer_id), tag, group, arguments
        )
        self.consumers[consumer_id] = (vhost, consumer)
        self.cursors[consumer_id] = consumer.queue  # type: ignore[assignment]
        self.send(wire.Kind.REPLY, consumer_id, 0, 0)

    def _group_join(
        self, member_id: int, vhost_name: str, super_stream: str, group_name: str, tag: str
    ) -> None:
        """A member connected to the entry node joins a group this node coordinates: a
        stand-in here, its partitions sent as ASSIGN and taken back by REVOKE."""
        vhost = self._vhost(vhost_name)
        group = vhost.coordinated_group(super_stream, group_name)
        # Its consume-ok goes ahead of the partitions it gets.
        self.send(wire.Kind.REPLY, member_id, 0, 0)

        def cancel(reason: str) -> None:
            if self.group_members.pop(member_id, None) is not None:
                self.send(wire.Kind.GROUP_CANCELLED, member_id, reason)

        member = group.join_elsewhere(
            tag,
            lambda index: self.send(wire.Kind.ASSIGN, member_id, index),
            lambda index: self.send(wire.Kind.REVOKE, member_id, index),
            cancel,
        )
        self.group_members[member_id] = (vhost, member)

    def _group_leave(self, member_id: int) -> None:
        entry = self.group_members.pop(member_id, None)
        if entry is not None:
            vhost, member = entry
            vhost.leave_group(member)

    def _group_describe(
        self, request_id: int, vhost_name: str, super_stream: str, group_name: str
    ) -> None:
        group = self._vhost(vhost_name).groups.get((super_stream, group_name))
        described = group.describe() if group is not None and group.members else None
        self.send(wire.Kind.GROUP_DESCRIBED, request_id, json.dumps(described))

    def _stats(self, request_id: int, vhost_name: str, name: str) -> None:
        vhost = self._vhost(vhost_name)
        queue = vhost.check_queue(name, self._owner(vhost, name))
        self.send(wire.Kind.STATS_REPLY, request_id, QueueStats.of(queue).values())

    def _peek(
        self, request_id: int, vhost_name: str, name: str, start: int, count_max: int
    ) -> None:
        """Browse for the DLQ tools: at most PEEK_MESSAGES_MAX messages and, past the first,
        PEEK_REPLY_BYTES of them (the entry node asks again from where this stopped)."""
        vhost = self._vhost(vhost_name)
        wanted = min(count_max, PEEK_MESSAGES_MAX)
        browsed = vhost.peek(name, self._owner(vhost, name), wanted, start)
        rows: list[tuple[Any, ...]] = []
        size = 0
        for message, in_flight in browsed:
            size += len(message.properties) + len(message.body)
            if rows and size > PEEK_REPLY_BYTES:
                break
            rows.append((*message, in_flight))
        columns = [list(column) for column in zip(*rows, strict=True)]
        self.send(wire.Kind.PEEKED, request_id, *(columns or [[]] * PEEKED_COLUMNS))

    async def _redrive(
        self, request_id: int, operation: str, vhost: str, queue: str, argument: str
    ) -> None:
        answer = await self.host.redrives.operate(operation, vhost, queue, argument)
        self.send(wire.Kind.REDRIVEN, request_id, json.dumps(answer))

    async def _view(self, request_id: int, name: str, argument: str) -> None:
        answer = await self.host.local_view(name, json.loads(argument))
        self.send(wire.Kind.VIEWED, request_id, json.dumps(answer, separators=(",", ":")))

    # -- the link going -----------------------------------------------------------------------

    def writable_again(self) -> None:
        for _, consumer in list(self.consumers.values()):
            consumer.channel.unblock()  # type: ignore[attr-defined]

    def lost(self, reason: str) -> None:
        """As a closed channel: consumers cancelled, what they held goes back (a failed
        delivery, as RabbitMQ 4.3 counts a lost channel's)."""
        if self.peer_node:
            log.warning("%s", reason)
        for task in list(self._tasks):
            task.cancel()
        consumers, self.consumers = self.consumers, {}
        for vhost, consumer in consumers.values():
            consumer.channel.forget_blocked(consumer)
            vhost.cancel(consumer)
            _released(consumer)
        self.cursors = {}
        # The entry node's members of groups coordinated here are gone with it.
        members, self.group_members = self.group_members, {}
        for vhost, member in members.values():
            vhost.leave_group(member)
        unacked, self.unacked = self.unacked, {}
        for queue, offsets in unacked.items():
            if offsets and not queue.deleted:
                queue.requeue(sorted(offsets), True)
                self.host.want_dispatch(queue)


def _released(consumer: Consumer) -> None:
    """A group member's partition leaves the member: the group's committed offset is where
    the member's acks got to, as a local group's release commits it (also when it never
    acked anything: the next member starts where this one did)."""
    cursor = consumer.queue
    if isinstance(cursor, Cursor) and cursor.partition_entry and cursor.tracked_tag:
        commit_released(cursor)

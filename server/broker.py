"""The broker process: listening socket, vhosts, and the per-tick publish/commit/confirm cycle.

The tick (ARCHITECTURE.md, "The data path"): connections stage published records on their
queues while they parse a read; once per event-loop pass the broker writes each touched
queue's records with one append, hands ready messages to consumers, starts one group commit
for the queues holding persistent messages that someone waits for (publisher confirms,
tx.commit), and writes each connection's output once.

Confirms are released strictly in tick order, each channel's as one ``basic.ack
multiple=true`` for the highest tag of the tick: a later tick that needs no fsync must not
confirm (by ``multiple``) tags of an earlier tick whose fsync is still running.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import gc
import logging
import secrets
import shutil
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from warrenmq.amqp.auth import EXTERNAL
from warrenmq.amqp.connection import ConnectionConfig
from warrenmq.log import DescriptorPool, LogConfig, TailCacheBudget
from warrenmq.log.batch import HEADER_BYTES, RECORD_OVERHEAD_BYTES_MAX
from warrenmq.log.descriptors import default_capacity
from warrenmq.log.latency import LatencyHistogram
from warrenmq.server.metadata import (
    QueueRecord,
    ReplicatedMetadata,
    StoreFailed,
    loopback_refused,
)
from warrenmq.server.queue import LogQueue, QueueConfig, QueueEngine

from .alarms import (
    ResourceMonitor,
    blocked_reason,
    disk_free_bytes,
    disk_free_limit_bytes,
    memory_limit_bytes,
    release_free_memory,
    resident_memory_bytes,
    total_memory_bytes,
)
from .cluster_node import ClusterNode
from .config import BrokerConfig
from .delayed import DelayedLogConfig, DelayedMessageLog
from .delayed.store import DelayedHandoff
from .descriptor_alarm import DescriptorAlarm
from .forward.entry import RemoteQueue
from .forward.forwarding import Forwarding
from .forward.owner import OwnerLink
from .http import HttpListeners
from .partition_controller import PartitionController
from .queue.arguments import max_priority, queue_type
from .queue.dead_letter_counts import DeadLetterCounts
from .queue.log_queue import MESSAGES_DIR
from .queue.priority import PriorityQueue
from .queue.work_queue import WorkQueue
from .redrive import Redrives
from .replication import Replicas
from .session import admission
from .session.channel import BrokerChannel, monotonic_ms
from .session.connection import BrokerConnection
from .stream.arguments import log_config as stream_log_config
from .stream.stream import Stream, StreamLog
from .stream.tracked_offsets import LOG_CONFIG as OFFSETS_LOG_CONFIG
from .stream.tracked_offsets import OFFSETS_DIR
from .tls import server_context
from .vhost import REPLY_TO_PREFIX, DeadLetterHandoff, VirtualHost, generated_name

log = logging.getLogger("warrenmq.server")
# How often channels look for deliveries past their consumer timeout: a timeout fires at most
# this late.
CONSUMER_TIMEOUT_CHECK_S = 0.25
# How often the broker looks for metadata changes other processes made (`warren policies set`
# against its data dir): one cheap query (SQLite's data_version) when nothing changed.
METADATA_SYNC_INTERVAL_S = 1.0
REDRIVES_DIRECTORY = "redrives"


def now_ms() -> int:
    """The broker's clock, passed to the core and its queues: epoch milliseconds."""
    return time.time_ns() // 1_000_000


def message_log_config(config: BrokerConfig) -> LogConfig:
    """A queue's message log: it must hold any message the broker accepts, so its record
    bound follows the broker's maximum message size (body, plus a content header of up to a
    frame, plus exchange and routing key). Every log opened with it (and with the configs
    derived from it: streams', delayed messages', replicas') shares one tail cache budget."""
    record_bytes_max = config.message_bytes_max + config.frame_bytes_max + RECORD_OVERHEAD_BYTES_MAX
    # At most a quarter of the memory high watermark: a cache full of the newest messages
    # must not raise the memory alarm on its own.
    cache_bytes = min(
        config.tail_cache_bytes_max, memory_limit_bytes(config, total_memory_bytes()) // 4
    )
    return LogConfig(
        segment_bytes_max=config.segment_bytes_max,
        tail_cache_bytes_max=cache_bytes,
        tail_cache_budget=TailCacheBudget(cache_bytes),
        record_bytes_max=record_bytes_max,
        batch_bytes_max=max(64 << 20, record_bytes_max + HEADER_BYTES),
    )


Confirmed = BrokerChannel | DeadLetterHandoff | DelayedHandoff | OwnerLink
"""What the tick confirms once its writes are durable: a publishing channel, the dead
letters a queue published, the due messages a delayed exchange routed, or another node's
link forwarding publishes here."""


class _Tick:
    """The confirms and tx waiters of one tick, released once its commit is done.

    Another node's forwarded publishes are staged into this node's queues only, so their
    confirms (`forwarded`) go out once this node's fsyncs are done (`stored_here`), without
    waiting for the tick's publishes to queues other nodes lead: those nodes' confirms may
    wait in turn for this node's, when two nodes (or a ring) forward to each other."""

    __slots__ = ("confirms", "forwarded", "nacks", "waiters", "stored_here", "ready", "wanted_s")

    def __init__(
        self,
        confirms: dict[Confirmed, int],
        nacks: dict[Confirmed, list[int]],
        waiters: list[asyncio.Future[None]],
        wanted_s: float,
    ) -> None:
        self.forwarded = {
            link: tag for link, tag in confirms.items() if isinstance(link, OwnerLink)
        }
        self.confirms = {
            channel: tag for channel, tag in confirms.items() if channel not in self.forwarded
        }
        self.nacks = nacks
        self.waiters = waiters
        self.stored_here = False
        self.ready = False
        self.wanted_s: float | None = wanted_s
        """When the tick was asked for (monotonic): no publish it confirms came earlier
        (None once its confirm latency is observed)."""


class Broker:
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.amqp_config = ConnectionConfig(
            frame_bytes_max=config.frame_bytes_max,
            channel_max=config.channel_max,
            heartbeat_s=config.heartbeat_s,
            message_bytes_max=config.message_bytes_max,
            channel_refusal=self.channel_refusal,
        )
        # A TLS connection is offered EXTERNAL too, as rabbitmq_auth_mechanism_ssl offers it
        # on every TLS socket (since 3.x: a client without a certificate then gets a refusal
        # that says so rather than no common mechanism).
        self.amqp_tls_config = dataclasses.replace(
            self.amqp_config, mechanisms=(*self.amqp_config.mechanisms, EXTERNAL)
        )
        self.message_log_config = message_log_config(config)
        self._delayed_log_config = DelayedLogConfig.holding(self.message_log_config)
        # One config per queue type, shared by every queue: 100,000 queues need not hold
        # 100,000 copies.
        self._queue_configs = {
            quorum: QueueConfig(message_log=self.message_log_config, deliver_uncommitted=not quorum)
            for quorum in (False, True)
        }
        # Every queue's logs open their files through this pool, so the number of queues is
        # bounded by disk and memory, not by RLIMIT_NOFILE.
        self.descriptors = DescriptorPool(config.log_open_files_max or default_capacity())
        self.descriptor_alarm = DescriptorAlarm(self.descriptors.capacity)
        self.data_dir = Path(config.data_dir)
        self.store: ReplicatedMetadata | None = None
        self.vhosts: dict[str, VirtualHost] = {}
        self.connections: set[BrokerConnection] = set()
        self.reply_channels: dict[str, BrokerChannel] = {}
        self.server: asyncio.AbstractServer | None = None
        self.port = 0
        self.tls_server: asyncio.AbstractServer | None = None
        self.tls_port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tick_scheduled = False
        self._tick_wanted_s = 0.0
        self.confirm_latency = LatencyHistogram()
        self.dead_letter_counts = DeadLetterCounts()
        """Seconds from a tick's first event to its confirms going out, once per tick."""
        self._staged: dict[WorkQueue, None] = {}
        self._dispatch: dict[WorkQueue, None] = {}
        self._output: dict[BrokerConnection, None] = {}
        self._confirms: dict[Confirmed, int] = {}
        self._nacks: dict[Confirmed, list[int]] = {}
        # Queues with dead letters to publish, at the start of the next tick.
        self._dead_letters: dict[WorkQueue, None] = {}
        self._waiters: list[asyncio.Future[None]] = []
        # Every tick whose commit is under way, oldest first: a tx waiter waits for them all.
        self._ticks: collections.deque[_Tick] = collections.deque()
        # Per publisher, the ticks holding a confirm for it, oldest first: a confirm covers
        # every tag below it (`multiple`), so a publisher's confirms go out in tick order,
        # but one publisher's never wait for another's (a queue that waits for its quorum
        # holds the confirms of its own publishers only). Forwarded ones (another node's
        # link) wait for this node's fsyncs alone (`_Tick`).
        self._confirming: dict[Confirmed, collections.deque[_Tick]] = {}
        self._forwarding: dict[Confirmed, collections.deque[_Tick]] = {}
        # The queues' timers: when each is due (epoch ms) and the loop's handle.
        self._timers: dict[WorkQueue, tuple[int, asyncio.TimerHandle]] = {}
        self._background: set[asyncio.Future[Any]] = set()
        self._stopping = False
        self._timeout_check: asyncio.TimerHandle | None = None
        memory_bytes = total_memory_bytes()
        self.resources = ResourceMonitor(
            memory_limit_bytes(config, memory_bytes),
            disk_free_limit_bytes(config, memory_bytes),
            resident_memory_bytes,
            lambda: disk_free_bytes(self.data_dir),
            self._alarms_changed,
        )
        self.blocked_reason = ""
        self._resource_check: asyncio.TimerHandle | None = None
        self.read_bytes_unsampled = 0
        """Bytes read from clients since the resources were last sampled (see
        alarms.RESOURCE_CHECK_READ_BYTES); connections count them."""
        self._metadata_follower: asyncio.Task[None] | None = None
        self._partition_controller: asyncio.Task[None] | None = None
        self.node = ClusterNode(self)
        self.boot = secrets.randbits(62)
        """This start of the broker (`NodeStarted`)."""
        # The management API and the metrics: adapters of their own on this event loop.
        self.http = HttpListeners(self)
        self.redrives = Redrives(
            self.data_dir / REDRIVES_DIRECTORY, self.vhosts, self.after_commit, now_ms
        )
        self.node_id = config.node_id
        # Links to the nodes leading queues this node's clients use, and from other nodes.
        self.forwarding = Forwarding(self)
        # Durable queues' logs copied to their followers (`replication.py`), when asked for.
        self.replicas = Replicas(self) if config.replicate else None

    # -- start and stop -------------------------------------------------------------------

    async def start(self) -> None:
        """Open the metadata, recover every queue, listen. On failure, what was opened is
        closed again (the metadata store's thread would otherwise keep the process alive)."""
        self._loop = asyncio.get_running_loop()
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            log.info(
                "memory high watermark %d MiB; disk free limit %d MB on %s",
                self.resources.memory_limit_bytes >> 20,
                self.resources.disk_free_limit_bytes // 1_000_000,
                self.data_dir,
            )
            self.resources.check()
            self.store = await ReplicatedMetadata.open(
                self.data_dir,
                node_id=self.config.node_id,
                peers=self.config.cluster_peers,
                joining=self.config.join,
                snapshot_entries=self.config.metadata_snapshot_entries,
                secret=self.config.cluster_secret,
            )
            # Recovery creates only objects that live on, millions of them for 100,000
            # queues; the collector's full passes over them were 40% of the time it took.
            collecting = gc.isenabled()
            gc.disable()
            try:
                self._recover()
            finally:
                if collecting:
                    gc.enable()
            # From here on (no await since the metadata opened), every entry applied here,
            # wherever it was proposed, reaches the running side.
            self.store.machine.listener = self.node.applied
            self.store.machine.restored = self.node.resync
            if self.replicas is not None and self.store.clustered:
                self.replicas.start()
                self.replicas.sync_all(recovering=True)
            await self.node.started()
            self.server = await self._loop.create_server(
                lambda: BrokerConnection(self),
                self.config.bind,
                self.config.port,
                reuse_address=True,
                backlog=1024,
            )
            self.port = self.server.sockets[0].getsockname()[1]
            if self.config.tls_enabled:
                context = server_context(self.config)
                self.tls_server = await self._loop.create_server(
                    lambda: BrokerConnection(self),
                    self.config.bind,
                    self.config.tls_port,
                    ssl=context,
                    reuse_address=True,
                    backlog=1024,
                )
                self.tls_port = self.tls_server.sockets[0].getsockname()[1]
                log.info("AMQP over TLS listening on %s:%d", self.config.bind, self.tls_port)
            await self.http.start()
            self.node.check_removed()
            if not self.node.removed:
                await self.node.register()
        except BaseException:
            await self._abandon_start()
            raise
        self._timeout_check = self._loop.call_later(
            CONSUMER_TIMEOUT_CHECK_S, self._check_consumer_timeouts
        )
        self._resource_check = self._loop.call_later(
            self.config.resource_check_interval_ms / 1000, self._check_resources
        )
        self._metadata_follower = asyncio.ensure_future(self._follow_metadata())
        if self.store.clustered:
            controller = PartitionController(self.store, self.config.node_gone_ms / 1000)
            self._partition_controller = asyncio.ensure_future(controller.run())
        self.redrives.recover()

    async def _abandon_start(self) -> None:
        """Close what a failed start opened, writing nothing: the next start recovers."""
        await self.http.stop()
        for server in (self.server, self.tls_server):
            if server is not None:
                server.close()
        for vhost in self.vhosts.values():
            for queue in vhost.queues.values():
                queue.engine.close()
            vhost.delayed.close()
        if self.store is not None:
            await self.store.close()

    def _new_vhost(self, name: str) -> VirtualHost:
        vhost = VirtualHost(
            name,
            self.data_dir,
            self.store,
            open_engine=self._open_engine,
            batch_records_max=self.config.queue_batch_records_max,
            staged=self.staged,
            wake=self.want_dispatch,
            deliver_reply=self.deliver_reply,
            background=self.background,
            clock=now_ms,
            confirm=self.stage_confirm,
            open_delayed=self._open_delayed,
            dead_letter_counts=self.dead_letter_counts,
            node_id=self.config.node_id,
            leader_locator=self.config.queue_leader_locator,
            replicate=self.replicas is not None,
        )
        self.vhosts[name] = vhost
        return vhost

    def _open_engine(self, directory: Path, name: str, arguments: Any) -> QueueEngine:
        replicas = self.replicas
        clustered = self.store is not None and self.store.clustered
        open_log = replicas.open_log if replicas is not None and clustered else None
        if queue_type(arguments) == Stream.queue_type:
            return StreamLog.open(  # type: ignore[return-value]
                directory,
                self.message_log_config,
                arguments,
                open_log=open_log,
                descriptors=self.descriptors,
            )
        # A quorum queue hands out only fsynced messages, as RabbitMQ's does (a consumer then
        # never sees a message a crash could take back); a classic one delivers at once.
        quorum = arguments.get("x-queue-type") in ("quorum", b"quorum")
        config = self._queue_configs[quorum]
        descriptors = self.descriptors
        levels = max_priority(arguments)
        if levels is not None:
            return PriorityQueue(
                directory,
                levels,
                config.message_log.batch_bytes_max,
                lambda level_directory: LogQueue.open(
                    level_directory, config, descriptors=descriptors, open_log=open_log
                ),
                every_level=open_log is not None,
            )
        return LogQueue.open(directory, config, descriptors=descriptors, open_log=open_log)

    def replica_log_config(self, record: QueueRecord, part: str) -> LogConfig:
        """The config of a follower's copy of a queue's log (`part`: messages, acks, or a
        stream's), as the leader's queue opens it."""
        if part == OFFSETS_DIR:
            return OFFSETS_LOG_CONFIG
        if queue_type(record.arguments) == Stream.queue_type:
            return stream_log_config(self.message_log_config, record.arguments)
        config = self._queue_configs[True]
        return config.message_log if Path(part).name == MESSAGES_DIR else config.ack_log

    def _open_delayed(self, directory: Path) -> DelayedMessageLog:
        return DelayedMessageLog.open(
            directory, self._delayed_log_config, descriptors=self.descriptors
        )

    def _recover(self) -> None:
        """Host every queue the metadata kept; drop directories of transient leftovers.

        A queue whose files cannot be opened is logged and left unavailable (the vhost's
        `failed`), as RabbitMQ keeps a crashed queue's record: one damaged queue does not
        keep the broker, and every other queue, from starting.
        """
        assert self.store is not None
        started = time.monotonic()
        log.info(
            "file descriptors: %d (RLIMIT_NOFILE); queue logs keep at most %d open, "
            "connections at most %d",
            self.descriptor_alarm.limit,
            self.descriptors.capacity,
            self.descriptor_alarm.connections_max,
        )
        for name in self.store.state.vhosts:
            vhost = self._new_vhost(name)
            # Before the vhost's recovery: a delayed hand-off it resumes may target them.
            for record in self.store.state.queues(name).values():
                if record.node != self.node_id:
                    self.forwarding.place(vhost, record.name)
            kept = set(vhost.recover())
            if vhost.directory.exists():
                for leftover in vhost.directory.iterdir():
                    if leftover.name not in kept:
                        shutil.rmtree(leftover, ignore_errors=True)
            log.info(
                "vhost '%s': %d exchanges, %d queues recovered, %d unavailable (%.1f s)",
                name,
                len(vhost.router.exchanges()),
                len(vhost.queues),
                len(vhost.failed),
                time.monotonic() - started,
            )

    def sync_vhosts(self) -> None:
        """Host vhosts created (and drop those deleted) in the store by another process."""
        assert self.store is not None
        names = set(self.store.state.vhosts)
        for name in names - set(self.vhosts):
            self._new_vhost(name)
        for name in set(self.vhosts) - names:
            vhost = self.vhosts.pop(name)
            for connection in list(self.connections):
                if connection.vhost is vhost:
                    connection.close(320, f"vhost '{name}' is deleted")
            for _, queue in vhost.all_queues():
                vhost.retire_queue(queue)
            vhost.delayed.retire()

    def apply_policies(self) -> None:
        """Have every queue take the policies as the metadata now holds them (an in-process
        caller, such as the HTTP API, calls it after a SetPolicy or ClearPolicy)."""
        assert self.store is not None
        known = self.store.state.vhosts
        for name, vhost in self.vhosts.items():
            # A vhost deleted from the metadata is retired by the next `sync_vhosts`.
            if name in known:
                vhost.apply_policies()

    async def _follow_metadata(self) -> None:
        """Apply what other processes change in the metadata, once a second: a policy set or
        cleared by `warren policies` reaches the queues without any client connecting (users
        and vhosts are also synced before each login)."""
        assert self.store is not None
        while True:
            await asyncio.sleep(METADATA_SYNC_INTERVAL_S)
            try:
                await self.store.sync_external_changes()
            except StoreFailed as error:
                log.error("metadata store failed; no longer following its changes: %r", error)
                return
            except Exception as error:
                log.error("reading metadata changes made by other processes failed: %r", error)
            self.sync_vhosts()
            self.apply_policies()
            self.node.check_removed()

    async def stop(self) -> None:
        """SIGTERM: stop accepting, close clients with 320, flush and fsync, close queues."""
        if self._stopping:
            return
        self._stopping = True
        if self._timeout_check is not None:
            self._timeout_check.cancel()
        if self._resource_check is not None:
            self._resource_check.cancel()
        for task in (self._metadata_follower, self._partition_controller):
            if task is not None:
                task.cancel()
        await self.http.stop()
        for server in (self.server, self.tls_server):
            if server is not None:
                server.close()
        await self.redrives.shutdown()
        for connection in list(self.connections):
            connection.close()
        self.forwarding.close()
        if self.replicas is not None:
            self.replicas.close()
        self._tick()
        deadline = time.monotonic() + self.config.shutdown_timeout_s
        while self.connections and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.abort()
        # Let the last ticks run: confirms, commits, and the deletes of exclusive queues.
        await asyncio.sleep(0)
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)
        try:
            for vhost in self.vhosts.values():
                await vhost.shutdown()
        finally:
            # Even when a queue's last write fails: the store's thread holds the process.
            if self.store is not None:
                await self.store.close()
        for server in (self.server, self.tls_server):
            if server is not None:
                await server.wait_closed()

    # -- connections ----------------------------------------------------------------------

    def accept(self, connection: BrokerConnection) -> bool:
        if self._stopping or len(self.connections) >= self.config.connections_max:
            log.error(
                "refusing connection from %s: %s",
                connection.name,
                "shutting down" if self._stopping else "connections_max reached",
            )
            return False
        if not self.descriptor_alarm.admit(len(self.connections)):
            return False
        self.connections.add(connection)
        return True

    def forget(self, connection: BrokerConnection) -> None:
        self.connections.discard(connection)
        self._output.pop(connection, None)
        self.descriptor_alarm.released(len(self.connections))

    async def authenticate(self, username: str, password: str, address: str, mechanism: str) -> Any:
        """The user, or None (logged) when the login is refused. With EXTERNAL, `username` is
        the one a verified client certificate names and no password is checked, as
        rabbitmq_auth_mechanism_ssl: the user only has to exist."""
        store = self.store
        assert store is not None
        try:
            await store.sync_external_changes()
        except Exception as error:
            log.error("reading metadata changes made by other processes failed: %r", error)
        self.sync_vhosts()
        self.apply_policies()
        if mechanism == EXTERNAL:
            user = store.state.users.get(username)
        else:
            user = await store.authenticate(username, password, address)
        if user is None:
            log.error("%s login refused: user '%s' - invalid credentials", mechanism, username)
            return None
        if loopback_refused(user.name, address, self.config.loopback_users):
            log.error(
                "%s login refused: user '%s' can only connect via localhost", mechanism, username
            )
            return None
        return user

    def may_use_vhost(self, username: str, vhost: str) -> bool:
        assert self.store is not None
        state = self.store.state
        return vhost in state.vhosts and state.permission(username, vhost) is not None

    def queue_leader(self, vhost: str, name: str) -> int:
        """The id of the node that leads the queue (NotFound if there is none)."""
        return self.node.queue_leader(vhost, name)

    def node_address(self, node_id: int) -> tuple[str, int]:
        """(host, AMQP port) of a node of the cluster (NotFound if unknown)."""
        return self.node.node_address(node_id)

    def connection_refusal(self, username: str, vhost: str) -> str | None:
        assert self.store is not None
        removed = self.node.refusal()
        if removed is not None:
            return removed
        state = self.store.state
        return admission.connection_refusal(
            state.vhost_limits.get(vhost),
            state.user_limits.get(username),
            self.connections,
            username,
            vhost,
        )

    def channel_refusal(self, username: str) -> str | None:
        """Why the user's channel limit refuses one more channel (the AMQP machines ask
        before channel.open-ok), or None."""
        assert self.store is not None
        limits = self.store.state.user_limits.get(username)
        return admission.channel_refusal(limits, self.connections, username)

    def check_access(self, username: str, vhost: str, access: str, kind: str, name: str) -> None:
        assert self.store is not None
        self.store.state.check_resource_access(username, vhost, access, kind, name)

    # -- direct reply-to ------------------------------------------------------------------

    def register_reply_channel(self, channel: BrokerChannel) -> str:
        name = generated_name(REPLY_TO_PREFIX)
        self.reply_channels[name] = channel
        return name

    def unregister_reply_channel(self, name: str) -> None:
        self.reply_channels.pop(name, None)

    def deliver_reply(
        self, routing_key: str, exchange: str, properties: bytes, body: bytes
    ) -> bool:
        """Publish to "amq.rabbitmq.reply-to.X": straight to X's channel, never stored."""
        channel = self.reply_channels.get(routing_key)
        return channel is not None and channel.deliver_reply(
            exchange.encode(), routing_key.encode(), properties, body
        )

    # -- the tick -------------------------------------------------------------------------

    def _schedule(self) -> None:
        if not self._tick_scheduled:
            self._tick_scheduled = True
            self._tick_wanted_s = time.monotonic()
            assert self._loop is not None
            self._loop.call_soon(self._tick)

    def staged(self, queue: WorkQueue) -> None:
        staged = self._staged
        if queue not in staged:
            staged[queue] = None
            self._schedule()

    def stage_confirm(self, channel: Confirmed, tag: int, refused: bool = False) -> None:
        self._confirms[channel] = tag
        if refused:
            self._nacks.setdefault(channel, []).append(tag)
        self._schedule()

    def metadata_index(self) -> int:
        """How far this node has applied the metadata log."""
        assert self.store is not None
        return self.store.group.applied_index

    def metadata_applied(self, index: int) -> asyncio.Future[Any]:
        """Resolves once this node has applied the metadata log up to `index`."""
        assert self.store is not None
        return self.store.group.applied(index)

    async def local_view(self, name: str, argument: Any) -> Any:
        """This node's part of a cluster-wide management API figure, for another node."""
        return await self.http.local_view(name, argument)

    def want_dispatch(self, queue: WorkQueue) -> None:
        self._dispatch[queue] = None
        self._schedule()

    def want_flush(self, connection: BrokerConnection) -> None:
        self._output[connection] = None
        self._schedule()

    def after_commit(self) -> asyncio.Future[None]:
        """A future resolved once everything staged so far is appended and fsynced."""
        assert self._loop is not None
        future = self._loop.create_future()
        self._waiters.append(future)
        self._schedule()
        return future

    def background(self, work: Awaitable[Any]) -> asyncio.Future[Any]:
        """Run persistence nobody has to wait for (auto-delete, exclusive cleanup); log
        failures. Returns its task, for a caller that would rather wait."""
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background_done)
        return task

    def _background_done(self, task: asyncio.Future[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background metadata write failed: %r", task.exception())

    def _check_consumer_timeouts(self) -> None:
        now = monotonic_ms()
        for connection in list(self.connections):
            connection.check_consumer_timeouts(now)
        assert self._loop is not None
        self._timeout_check = self._loop.call_later(
            CONSUMER_TIMEOUT_CHECK_S, self._check_consumer_timeouts
        )

    def _check_resources(self) -> None:
        if self.resources.alarms:
            # Blocked connections are not read, so a client that left one goes unseen and
            # what it held (half-sent bodies, a transaction) would keep the alarm up.
            for connection in list(self.connections):
                connection.drop_if_peer_gone()
            release_free_memory()
        self.sample_resources()
        assert self._loop is not None
        self._resource_check = self._loop.call_later(
            self.config.resource_check_interval_ms / 1000, self._check_resources
        )

    def sample_resources(self) -> None:
        """Sample memory and disk now: on the timer, and after alarms.RESOURCE_CHECK_READ_BYTES
        of input."""
        self.read_bytes_unsampled = 0
        self.resources.check()

    def _alarms_changed(self, alarms: frozenset[str]) -> None:
        """Publishers are blocked as they next publish while any alarm is in effect, and all
        unblocked once none is."""
        self.blocked_reason = blocked_reason(alarms) if alarms else ""
        for connection in list(self.connections):
            connection.alarms_changed(self.blocked_reason)

    def _arm(self, queue: WorkQueue, due_ms: int | None) -> None:
        """Have the queue's timers run at `due_ms` (epoch ms; None: never)."""
        timers = self._timers
        armed = timers.get(queue)
        if armed is not None:
            if due_ms is not None and armed[0] <= due_ms:
                # It fires no later than wanted; the tick of that run arms the next one.
                return
            armed[1].cancel()
            del timers[queue]
        if due_ms is not None:
            assert self._loop is not None
            delay_s = max(0.0, (due_ms - now_ms()) / 1000)
            timers[queue] = (due_ms, self._loop.call_later(delay_s, self._timer_due, queue))

    def _timer_due(self, queue: WorkQueue) -> None:
        del self._timers[queue]
        if queue.unused_expired(now_ms()):
            log.info(
                "queue '%s' in vhost '%s' expired (x-expires %d ms)",
                queue.name,
                queue.vhost,
                queue.expires_ms,
            )
            vhost = self.vhosts.get(queue.vhost)
            if vhost is not None:
                vhost.drop_queue(queue)
            return
        # The tick runs the queue's timers (and commits the messages they drop).
        self.want_dispatch(queue)

    def _tick(self) -> None:
        self._tick_scheduled = False
        wanted_s = self._tick_wanted_s
        now = now_ms()
        # Dead letters first: staged on their targets, they are written and confirmed (and
        # so leave their queue) in this tick.
        dead, self._dead_letters = self._dead_letters, {}
        for queue in dead:
            vhost = self.vhosts.get(queue.vhost)
            if vhost is not None and not queue.deleted:
                vhost.dead_letter(queue)
        to_commit: list[tuple[WorkQueue, list[Any]]] = []
        staged, self._staged = self._staged, {}
        for queue in staged:
            if queue.deleted:
                continue
            queue.flush(now)
            if queue.dead_letters:
                self._dead_letters[queue] = None
            written, failed, commit_wanted = queue.take_written()
            for publisher in failed:
                _publish_failed(publisher)
            if commit_wanted:
                to_commit.append((queue, written))
            self._dispatch[queue] = None
        dispatch, self._dispatch = self._dispatch, {}
        for queue in dispatch:
            if queue.deleted:
                self._arm(queue, None)
                continue
            try:
                if queue.dispatch(now):
                    self._dispatch[queue] = None
                if queue.has_timers:
                    self._arm(queue, queue.run_timers(now))
                if queue.dead_letters:
                    self._dead_letters[queue] = None
            except Exception as error:
                # A queue whose log cannot be read stops delivering; the others carry on.
                log.error(
                    "queue '%s' in vhost '%s': delivery failed: %r", queue.name, queue.vhost, error
                )
        if self._dispatch or self._dead_letters:
            self._schedule()
        confirms, self._confirms = self._confirms, {}
        nacks, self._nacks = self._nacks, {}
        waiters, self._waiters = self._waiters, []
        if confirms or waiters:
            tick = _Tick(confirms, nacks, waiters, wanted_s)
            self._ticks.append(tick)
            for channels, pending in (
                (tick.confirms, self._confirming),
                (tick.forwarded, self._forwarding),
            ):
                for channel in channels:
                    held = pending.get(channel)
                    if held is None:
                        held = pending[channel] = collections.deque()
                    held.append(tick)
            if to_commit:
                self._track(self._commit(tick, to_commit))
            else:
                # Nothing to fsync in this tick; the in-order release still holds its
                # confirms behind their publishers' earlier ticks whose commit is running.
                tick.stored_here = tick.ready = True
                self._release(tick)
        else:
            to_commit.clear()
        # Acks, the delivered mark and unconfirmed appends: the engine asks for a commit, and
        # may hold back deliveries until it has one.
        committing = {queue for queue, _ in to_commit}
        for queue in dispatch:
            if queue.needs_commit and not queue.committing and queue not in committing:
                self._track(self._commit_queue(queue))
        output, self._output = self._output, {}
        for connection in output:
            connection.flush()

    def _track(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _commit_queue(self, queue: WorkQueue) -> None:
        try:
            await queue.commit()
        except Exception as error:
            log.error("queue '%s' in vhost '%s': commit failed: %r", queue.name, queue.vhost, error)
            return
        self.want_dispatch(queue)

    async def _commit(self, tick: _Tick, to_commit: list[tuple[WorkQueue, list[Any]]]) -> None:
        """fsync the tick's queues, and wait for the owners of its queues led elsewhere to
        confirm; a queue whose fsync fails fails exactly the publishes written to it in this
        tick, and the others' are confirmed."""
        here = [
            (queue, written) for queue, written in to_commit if not isinstance(queue, RemoteQueue)
        ]
        elsewhere = [
            (queue, written) for queue, written in to_commit if isinstance(queue, RemoteQueue)
        ]
        stored_elsewhere = asyncio.gather(
            *(queue.commit() for queue, _ in elsewhere), return_exceptions=True
        )
        _refuse_failed(
            here,
            await asyncio.gather(*(queue.commit() for queue, _ in here), return_exceptions=True),
        )
        tick.stored_here = True
        self._release_confirms(tick.forwarded, self._forwarding)
        _refuse_failed(elsewhere, await stored_elsewhere)
        tick.ready = True
        self._release(tick)
        for queue, _ in to_commit:
            self.want_dispatch(queue)

    def _release(self, tick: _Tick) -> None:
        """`tick` is ready: its confirms go, each once its publisher's earlier ticks are
        ready too, and the tx waiters once every earlier tick is."""
        self._release_confirms(tick.forwarded, self._forwarding)
        self._release_confirms(tick.confirms, self._confirming)
        ticks = self._ticks
        while ticks and ticks[0].ready:
            for waiter in ticks.popleft().waiters:
                if not waiter.done():
                    waiter.set_result(None)

    def _release_confirms(
        self, confirms: dict[Confirmed, int], pending: dict[Confirmed, collections.deque[_Tick]]
    ) -> None:
        """For each publisher of `confirms` (a tick that is now stored), send the confirms
        of its oldest ticks that are stored too."""
        forwarded = pending is self._forwarding
        for channel in confirms:
            held = pending.get(channel)
            while held:
                head = held[0]
                if not (head.stored_here if forwarded else head.ready):
                    break
                held.popleft()
                if head.wanted_s is not None:
                    # A tick's confirm latency: until the first of its confirms goes.
                    self.confirm_latency.observe(time.monotonic() - head.wanted_s)
                    head.wanted_s = None
                channel.confirm(
                    (head.forwarded if forwarded else head.confirms)[channel],
                    head.nacks.get(channel, ()),
                )
            if held is not None and not held:
                del pending[channel]


def _refuse_failed(
    to_commit: list[tuple[WorkQueue | RemoteQueue, list[Any]]], outcomes: list[Any]
) -> None:
    """Fail the publishes written to each queue whose commit failed."""
    for (queue, written), outcome in zip(to_commit, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            log.error(
                "queue '%s' in vhost '%s': fsync failed, refusing the publishes written to it: %r",
                queue.name,
                queue.vhost,
                outcome,
            )
            for publisher in written:
                _publish_failed(publisher)


def _publish_failed(publisher: tuple[Confirmed, int] | None) -> None:
    if publisher is not None:
        channel, tag = publisher
        channel.publish_failed(tag)

"""Queue replication's data path (issue 12): the host that drives `cluster/replication`'s
`ReplicationNode` with this broker's logs, links and metadata.

What it replicates
    A durable, non-exclusive queue with more than one replica (`replicated`) is two
    partitions to the core, its messages log and its ack log; a stream too, its log and
    its tracked offsets' log (`partitions`). The leader's `LogQueue` or `StreamLog` opens
    them as `ReplicatedLog`s (`open_log`); a follower holds them as plain `PartitionLog`s in
    the same directories the leader's are in, storing the leader's batches verbatim.
    A priority queue is two partitions per level, every level. A stream's producer
    sequences are rebuilt from its records, which carry them.

The commit rule
    A `ReplicatedLog` the host adopted (`replicated`) stamps each batch with its leader epoch,
    and its `commit()` returns only once the core's high watermark covers what was appended
    before the call: fsynced on every ISR member, the ISR at least a majority. So publisher
    confirms (the broker's tick awaits the queue's commit) mean "on a quorum", and the queue
    delivers only below `committed_offset`. A leader that stops leading (deposed, deleted,
    closed) fails its waiting commits, and their publishes are nacked.

Fetching
    Followers pull: one FETCH per (follower node, leader node) at a time (`poll_fetches`),
    sent over this node's link to the leader (`Forwarding.link`), answered by FETCHED over
    the same connection, whenever the leader has news or the long poll ends. The records
    are read in a worker thread (`PartitionLog.read_batches`). A follower fsyncs what it
    stored, then tells the core, whose next fetch carries the new durable offset: that is
    the leader's acknowledgement.

The ISR
    The core proposes ISR changes per partition; a queue has one ISR for its two logs, so
    the host proposes, as one `AlterIsr` to the metadata, the replicas both logs want in
    sync. It is applied (or refused as stale) through the metadata Raft, and every node
    hears of it as of any change to the queue's record (`sync`).

Leaders and epochs
    `sync(record)` tells the core what the metadata says of a queue: lead it (once the
    vhost hosts it here), follow it (its files opened here), or forget it (its follower
    files deleted). A node restarted never leads an epoch it led before; the metadata gives
    the queues it leads a new epoch when it starts (`NodeStarted`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from warrenmq.cluster.replication import codec
from warrenmq.cluster.replication.config import ReplicationConfig
from warrenmq.cluster.replication.messages import (
    NO_LEADER as NO_REPLICATION_LEADER,
)
from warrenmq.cluster.replication.messages import (
    FetchRequest,
    FetchResponse,
    PartitionKey,
    PartitionState,
)
from warrenmq.cluster.replication.node import PendingFetch, ReplicationNode
from warrenmq.log import LogConfig, LogError, OffsetOutOfRangeError, PartitionLog

from .forward import wire
from .metadata import commands as c
from .metadata.records import NO_LEADER, QueueRecord
from .queue.arguments import max_priority, queue_type
from .queue.log_queue import ACKS_DIR, MESSAGES_DIR, remove_directory
from .queue.priority import level_directory
from .stream.tracked_offsets import OFFSETS_DIR

log = logging.getLogger(__name__)

TICK_S = 0.05
"""How often the core's timers run (ISR checks, held fetches' deadlines, retries)."""
REPLICA_LAG_S = 3.0
"""A follower not caught up for this long leaves the ISR. Every confirm of its queues waits
for it until then (the quorum is the whole ISR), so it is short: the controller judges a
node gone as soon (`partition_controller.NODE_GONE_S`)."""
LINK_RETRY_S = 0.5
"""After a link to a leader node was lost, fetches wait this long before dialling again."""


class ReplicationStopped(Exception):
    """This node no longer leads the partition: what was waiting for the quorum is not
    confirmed (its publishes are nacked)."""


class NotEnoughReplicas(Exception):
    """Fewer replicas in sync than a majority (Kafka's NOT_ENOUGH_REPLICAS): nothing can be
    confirmed, so a commit fails at once (its publishes are nacked) rather than hold back
    every other queue's confirms behind it."""


def replicated(record: QueueRecord) -> bool:
    """Whether the queue's logs are replicated (`replicates`)."""
    return replicates(
        record.replicas, record.durable, record.exclusive_owner is not None, record.arguments
    )


def replicates(
    replicas: tuple[int, ...], durable: bool, exclusive: bool, arguments: Mapping[str, Any]
) -> bool:
    """Durable, not exclusive, and more than one replica."""
    return len(replicas) > 1 and durable and not exclusive


STREAM_LOG = ""
"""A stream's log is in its directory itself (`StreamLog`), its tracked offsets' log in
`OFFSETS_DIR` under it."""


def partition_key(vhost: str, name: str, part: str) -> PartitionKey:
    """The core's key of one log of a queue (NUL cannot be in a name)."""
    return f"{vhost}\0{name}\0{part}"


def partitions(record: QueueRecord) -> tuple[tuple[PartitionKey, str], ...]:
    """(key, directory under the queue's) of each log of a replicated queue: a queue's
    messages log and ack log, those of each level of a priority queue (all of its levels,
    which its leader opens at once), a stream's log and its tracked offsets' log."""
    if queue_type(record.arguments) == "stream":
        parts: tuple[str, ...] = (STREAM_LOG, OFFSETS_DIR)
    else:
        levels = max_priority(record.arguments)
        if levels is None:
            parts = (MESSAGES_DIR, ACKS_DIR)
        else:
            parts = tuple(
                f"{level_directory(level)}/{part}"
                for level in range(levels + 1)
                for part in (MESSAGES_DIR, ACKS_DIR)
            )
    return tuple((partition_key(record.vhost, record.name, part), part) for part in parts)


class ReplicatedLog(PartitionLog):
    """A leader's log: a plain `PartitionLog` until the host adopts it (`replicated`)."""

    __slots__ = (
        "key",
        "host",
        "replicated",
        "leader_epoch",
        "high_watermark",
        "stopped",
        "enough_replicas",
        "_moved",
    )

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.key: PartitionKey = ""
        self.host: Replicas | None = None
        self.replicated = False
        self.leader_epoch = 0
        self.high_watermark = 0
        self.stopped = False
        self.enough_replicas = True
        self._moved: asyncio.Future[None] | None = None

    @property
    def committed_offset(self) -> int:
        if not self.replicated:
            return self._durable_offset
        return min(self._durable_offset, self.high_watermark)

    def append(self, records: Any, timestamp_ms: int | None = None, term: int = 0) -> int:
        base = super().append(records, timestamp_ms, self.leader_epoch)
        if self.replicated and self.host is not None:
            self.host.appended(self.key)
        return base

    async def commit(self) -> int:
        target = self.end_offset
        durable = await super().commit()
        if not self.replicated:
            return durable
        if self.host is not None:
            self.host.durable(self.key)
        while self.high_watermark < min(target, self.end_offset):
            if self.stopped:
                raise ReplicationStopped(f"{self.directory} is no longer led here")
            if not self.enough_replicas:
                raise NotEnoughReplicas(
                    f"{self.directory} has fewer replicas in sync than a majority"
                )
            if self._moved is None:
                self._moved = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._moved)
        return self.committed_offset

    def moved(self, high_watermark: int) -> None:
        """The quorum's high watermark moved (or leadership ended): wake the commits."""
        self.high_watermark = max(self.high_watermark, high_watermark)
        waiting, self._moved = self._moved, None
        if waiting is not None and not waiting.done():
            waiting.set_result(None)

    def stop(self) -> None:
        self.stopped = True
        self.moved(self.high_watermark)

    def close(self) -> None:
        self.stop()
        if self.host is not None:
            self.host.closed(self)
        super().close()


class Replicas:
    """This node's side of every replicated queue. `broker` is the Broker (not imported: it
    imports this module)."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self.node_id: int = broker.config.node_id
        self.node = ReplicationNode(self.node_id, ReplicationConfig(replica_lag_s=REPLICA_LAG_S))
        # Leader-side logs by directory, as LogQueue opened them (adopted or not).
        self._opened: dict[Path, ReplicatedLog] = {}
        self._leading: dict[PartitionKey, ReplicatedLog] = {}
        self._following: dict[PartitionKey, PartitionLog] = {}
        self._queues: dict[PartitionKey, tuple[str, str]] = {}
        self._fetch_links: dict[int, Any] = {}
        # The HW a follower knew when it was promoted: its first as leader.
        self._known_high_watermarks: dict[PartitionKey, int] = {}
        # The directory of every replicated queue's logs here, and the queue's name.
        self._directories: dict[Path, tuple[str, str]] = {}
        # Leader nodes whose link was lost, and when fetches may dial them again.
        self._down_until: dict[int, float] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._work: set[asyncio.Future[Any]] = set()
        self._next_tick = 0.0

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
        # Nothing more reaches the quorum: what waits for it fails (and is nacked), and the
        # queues' last writes as they close (their exact delivered mark) are this node's
        # alone, an uncommitted tail that a follower leading next never had.
        for led in list(self._leading.values()):
            led.stop()
            led.replicated = False
        for work in list(self._work):
            work.cancel()
        for key in list(self._following):
            self._unfollow(key)

    def _spawn(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._work.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Future[Any]) -> None:
        self._work.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("replication work failed: %r", task.exception())

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    # -- the leader's logs (LogQueue opens them) -------------------------------------------

    def open_log(self, directory: Path, config: LogConfig) -> PartitionLog:
        opened = ReplicatedLog.open(directory, config, descriptors=self.broker.descriptors)
        assert isinstance(opened, ReplicatedLog)
        opened.host = self
        self._opened[directory] = opened
        log.debug("opened %s at end %d", directory, opened.end_offset)
        known = self._directories.get(directory)
        record = self.broker.store.state.queue(*known) if known is not None else None
        if record is not None and record.node == self.node_id:
            # What the queue writes as it opens (a CLIP of what a crash took back) carries
            # the epoch it now leads in: stamped with an older one, a follower holding that
            # older epoch's lost tail could not tell the two apart.
            opened.leader_epoch = record.leader_epoch
        if known is not None:
            # A known queue opened again (its storage failed before): adopted at once after.
            asyncio.get_running_loop().call_soon(self._adopt, directory)
        return opened

    def _adopt(self, directory: Path) -> None:
        vhost, name = self._directories[directory]
        record = self.broker.store.state.queue(vhost, name)
        if record is not None and directory in self._opened:
            self.sync(record)

    def closed(self, closing: ReplicatedLog) -> None:
        log.debug(
            "closed %s at end %d durable %d hw %d",
            closing.directory,
            closing.end_offset,
            closing.durable_offset,
            closing.high_watermark,
        )
        if self._opened.get(closing.directory) is closing:
            del self._opened[closing.directory]
        if self._leading.get(closing.key) is closing:
            del self._leading[closing.key]
            self.node.remove(closing.key)

    def appended(self, key: PartitionKey) -> None:
        self.node.appended(key, self._now())
        self._wake.set()

    def durable(self, key: PartitionKey) -> None:
        self.node.durable(key, self._now())
        self._publish_high_watermarks()
        self._wake.set()

    # -- metadata ----------------------------------------------------------------------------

    def release(self, record: QueueRecord) -> None:
        """Before this node starts hosting a queue it now leads: its follower files close,
        for the queue to open them."""
        if record.node == self.node_id:
            for key, _ in partitions(record):
                if key in self._following:
                    self._known_high_watermarks[key] = self.node.high_watermark(key)
                self._unfollow(key)

    def sync_all(self, recovering: bool = False) -> None:
        """`sync` every queue; `recovering` at start, when this node may lead none of the
        epochs it led before (see `ReplicationNode.recover`)."""
        state = self.broker.store.state
        for vhost in self.broker.vhosts.values():
            for record in state.queues(vhost.name).values():
                self.sync(record, recovering)

    def forget(self, vhost: str, name: str) -> None:
        """The queue is gone (deleted): stop replicating it, delete a follower's files."""
        following = False
        keys = [key for key, queue in self._queues.items() if queue == (vhost, name)]
        for key in keys:
            following = key in self._following or following
            self._unfollow(key)
            del self._queues[key]
            self._known_high_watermarks.pop(key, None)
        for directory in [d for d, queue in self._directories.items() if queue == (vhost, name)]:
            del self._directories[directory]
        host = self.broker.vhosts.get(vhost)
        if following and host is not None and name not in host.queues:
            remove_directory(host.queue_directory(name))

    def sync(self, record: QueueRecord, recovering: bool = False) -> None:
        """Tell the core what the metadata now says of the queue."""
        vhost = self.broker.vhosts.get(record.vhost)
        if vhost is None or not replicated(record):
            return
        if self.node_id not in record.replicas:
            self.forget(record.vhost, record.name)
            return
        leader = record.node if record.node != NO_LEADER else NO_REPLICATION_LEADER
        state = PartitionState(
            record.replicas, leader, record.leader_epoch, record.isr, record.partition_epoch
        )
        directory = vhost.queue_directory(record.name)
        log.debug("queue '%s' in vhost '%s': %s", record.name, record.vhost, state)
        now = self._now()
        for key, part in partitions(record):
            self._queues[key] = (record.vhost, record.name)
            self._directories[directory / part] = (record.vhost, record.name)
            if record.node == self.node_id:
                self._unfollow(key)
                led = self._opened.get(directory / part)
                if led is None:
                    # Not hosted yet: the vhost opens it, then syncs again.
                    continue
                led.key = key
                led.stopped = False
                led.enough_replicas = not record.under_min_isr
                led.replicated = True
                led.leader_epoch = record.leader_epoch
                self._leading[key] = led
                if recovering:
                    self.node.recover(key, state, led, now)
                else:
                    known = self._known_high_watermarks.pop(key, 0)
                    self.node.apply(key, state, led, now, known)
                # A new leader starts from the HW it knew, which need not move to be news.
                led.moved(self.node.high_watermark(key))
                continue
            deposed = self._leading.pop(key, None)
            if deposed is not None:
                deposed.stop()
            if directory / part in self._opened:
                # Still hosted here: the vhost steps it down, then syncs again.
                continue
            follower = self._following.get(key)
            if follower is None:
                follower = PartitionLog.open(
                    directory / part,
                    self.broker.replica_log_config(record, part),
                    descriptors=self.broker.descriptors,
                )
                self._following[key] = follower
            self.node.apply(key, state, follower, now)
        self._publish_high_watermarks()
        self._wake.set()

    def _unfollow(self, key: PartitionKey) -> None:
        follower = self._following.pop(key, None)
        if follower is not None:
            self.node.remove(key)
            follower.close()

    # -- fetches served (this node leads) ----------------------------------------------------

    def fetch_received(self, link: Any, data: bytes) -> None:
        request = codec.decode(data)
        if not isinstance(request, FetchRequest):
            raise ValueError("a FETCH carries a fetch request")
        self._fetch_links[request.replica] = link
        pending = self.node.handle_fetch(request, self._now())
        if pending is not None:
            self._spawn(self._answer(pending))
        self._publish_high_watermarks()

    async def _answer(self, pending: PendingFetch) -> None:
        for read in pending.reads:
            if pending.budget_bytes <= 0:
                break
            leading = self._leading.get(read.key)
            if leading is None:
                continue
            try:
                data = await leading.read_batches(
                    read.offset, read.end_offset, pending.budget_bytes
                )
            except (LogError, OffsetOutOfRangeError):
                continue
            pending.fill(read.key, data)
        link = self._fetch_links.get(pending.replica)
        if link is not None and not link.closed:
            link.send(wire.Kind.FETCHED, codec.encode(pending.response()))

    # -- fetches sent (this node follows) ----------------------------------------------------

    def _send_fetches(self, now: float) -> None:
        forwarding = self.broker.forwarding
        for leader, until in list(self._down_until.items()):
            if now >= until:
                del self._down_until[leader]
                # The requests held back meanwhile were never sent.
                self.node.link_lost(leader)
        for leader, request in self.node.poll_fetches(now):
            if leader in self._down_until:
                continue
            try:
                self.broker.node_address(leader)
            except Exception:
                self.node.link_lost(leader)
                continue
            forwarding.link(leader).send(wire.Kind.FETCH, codec.encode(request))

    def fetched(self, leader: int, data: bytes) -> None:
        response = codec.decode(data)
        if not isinstance(response, FetchResponse):
            raise ValueError("a FETCHED carries a fetch response")
        now = self._now()
        ends = (
            {key: f.end_offset for key, f in self._following.items()}
            if log.isEnabledFor(logging.DEBUG)
            else {}
        )
        try:
            grown = self.node.handle_response(leader, response, now)
        except LogError as error:
            # A follower's log refused the leader's batches: logged, and fetched again
            # later, without taking down the link, which carries the node's other work.
            log.error("replicating from node %d failed: %r", leader, error)
            self._down_until[leader] = now + LINK_RETRY_S
            return
        for key, end in ends.items():
            follower = self._following.get(key)
            if follower is not None and follower.end_offset < end:
                log.debug(
                    "replica %r truncated from %d to %d: %s",
                    key,
                    end,
                    follower.end_offset,
                    response.answers,
                )
        for partition in response.partitions:
            follower = self._following.get(partition.key)
            # What the leader deleted (acknowledged messages) goes here too, once committed.
            if follower is not None and partition.log_start > follower.start_offset:
                follower.delete_before(
                    min(partition.log_start, self.node.high_watermark(partition.key))
                )
        if grown:
            self._spawn(self._store(grown))
        self._wake.set()

    async def _store(self, keys: list[PartitionKey]) -> None:
        logs = [(key, log_) for key in keys if (log_ := self._following.get(key)) is not None]
        outcomes = await asyncio.gather(
            *(follower.commit() for _, follower in logs), return_exceptions=True
        )
        now = self._now()
        for (key, _), outcome in zip(logs, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                log.error("replica %r: fsync failed: %r", key, outcome)
                continue
            self.node.durable(key, now)
        self._wake.set()

    def link_lost(self, leader: int) -> None:
        self._down_until[leader] = self._now() + LINK_RETRY_S
        self.node.link_lost(leader)
        self._wake.set()

    # -- the loop ----------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), TICK_S)
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                self._turn(self._now())
            except Exception:
                log.exception("replication failed a turn")

    def _turn(self, now: float) -> None:
        if now >= self._next_tick:
            self._next_tick = now + TICK_S
            self.node.tick(now)
            self._propose(now)
        for pending in self.node.ready_fetches(now):
            self._spawn(self._answer(pending))
        self._send_fetches(now)
        self._publish_high_watermarks()

    def _publish_high_watermarks(self) -> None:
        for key, high_watermark in self.node.take_high_watermarks().items():
            leading = self._leading.get(key)
            if leading is not None:
                leading.moved(high_watermark)
                self._wake_queue(key)

    def _wake_queue(self, key: PartitionKey) -> None:
        """The HW of one of a queue's logs moved: what it may deliver grew. A commit of its
        own wakes it once it returns, but the HW also moves without one (a restarted leader's
        followers reporting what they hold, a follower back in the ISR)."""
        names = self._queues.get(key)
        vhost = self.broker.vhosts.get(names[0]) if names is not None else None
        queue = vhost.queues.get(names[1]) if vhost is not None else None
        if queue is not None:
            self.broker.want_dispatch(queue)

    def _propose(self, now: float) -> None:
        """One AlterIsr per queue whose logs want a new ISR: the replicas they all want."""
        queues = {self._queues[p.key] for p in self.node.take_alter_isr() if p.key in self._queues}
        state = self.broker.store.state
        for vhost, name in queues:
            record = state.queue(vhost, name)
            if record is None or record.node != self.node_id:
                continue
            leaders = [self.node.leaders.get(key) for key, _ in partitions(record)]
            if None in leaders:
                continue
            wanted = [
                set(leader.proposed_isr if leader.proposed_isr is not None else leader.state.isr)
                for leader in leaders
                if leader is not None
            ]
            isr = tuple(node for node in record.replicas if all(node in w for w in wanted))
            if set(isr) == set(record.isr) or self.node_id not in isr:
                for leader in leaders:
                    if leader is not None:
                        leader.alter_isr_rejected()
                continue
            for leader in leaders:
                if leader is not None:
                    leader.proposed_isr = isr
                    leader.proposed_at = now
            command = c.AlterIsr(
                vhost, name, self.node_id, record.leader_epoch, record.partition_epoch, isr
            )
            log.debug("queue '%s' in vhost '%s': proposing ISR %s", name, vhost, isr)
            self._spawn(self._alter_isr(command, leaders))

    async def _alter_isr(self, command: c.AlterIsr, leaders: list[Any]) -> None:
        try:
            outcome = await self.broker.store.apply_idempotent(command)
        except Exception as error:
            # The outcome is unknown: the entry may still commit. The proposal stands, and
            # with it the HW's wait for a replica it adds (KIP-497's maximal ISR); the core
            # sends it again. Dropping it let the HW pass a replica that then joined the ISR
            # without the data, and could be elected.
            log.warning("AlterIsr of queue '%s' has no answer yet: %r", command.name, error)
            return
        if outcome.refused:
            for leader in leaders:
                if leader is not None and leader.proposed_isr == command.isr:
                    leader.alter_isr_rejected()

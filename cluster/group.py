"""An in-process Raft group: the core (`raft/core.py`) hosted with durable storage, a ticker
and the peer transport, replicating opaque commands for a state machine it knows nothing of.

Design
======

`RaftGroup(config, machine)` owns a `RaftNode`, its `RaftStorage` (`storage.py`) and, when
the group has other members, a `PeerTransport` (`transport.py`). Its users are the demo
key-value node (`node.RaftServer`, a subclass adding a client protocol and ReadIndex reads)
and the broker's metadata (`warrenmq.server.metadata.replicated`, which holds one by
composition). Both see the same interface:

* `propose(data) -> Future[Applied]`, on ANY member: appends `data` as a log entry and
  resolves once that entry is committed *and applied here*, with `Applied(index, result)`
  where `result` is what this member's `machine.apply` returned. So a caller that awaits its
  proposal reads its own write from the local state machine. On the leader it raises
  `ProposalRefused` at once (nothing was appended); the future fails with `ProposalLost`
  when the entry's fate is unknown (leadership lost, the entry overwritten or replaced by a
  snapshot, the leader lost before it answered a forwarded proposal), with `NotLeader` only
  when no leader became known within `leader_wait_s`. A group of one (no transport) raises
  NotLeader at once when it does not lead, as it never forwards.
* `add_member(node_id, host, port)` / `remove_member(node_id)` from any member, futures of
  the same kind (see "Membership" below); `removed` tells a member it was removed.
* The state machine (`StateMachine`): `apply(index, data)` for every committed NORMAL entry,
  in log order, exactly once per incarnation; `skip(index)` for the others (leader no-ops,
  membership changes); `snapshot()` returns its state as bytes as of the last applied entry;
  `restore(index, data)` replaces its state by a snapshot's.
* Snapshots and compaction: once `snapshot_entries` applied entries sit in the log after the
  last snapshot, the group asks the machine for a snapshot, stores it and drops the log
  segments it covers. A follower that fell behind the leader's log is sent the snapshot and
  the machine `restore`s it.
* Restart: storage yields the snapshot (restored into the machine before anything else), the
  hard state and the log after the snapshot; the core re-delivers the committed entries in
  its first Readys, which re-applies them. The machine's state is therefore a pure function
  of the log, not a second durable copy that could disagree with it.

Forwarding: a member that does not lead queues its requests (proposals, membership
changes) and, in its next pass of the host loop, sends all of them to the leader in one
PROPOSE frame (`group_codec`; the transport carries these frames beside the Raft messages).
The leader proposes each and answers in one PROPOSE_REPLY frame where it appended it (index,
term), or NOT_LEADER (the requester then asks the next leader it learns of), or why it
refused. Its answer leaves before any append carrying the entry, so the requester knows the
index before it can apply it; it then waits for that index like a local proposal does, and
its own `apply` result resolves the future (ProposalLost if the entry at that index has
another term). A forwarded request whose connection to the leader drops before the answer,
or that is not answered within `forward_reply_timeout_s`, fails with ProposalLost.

Membership: the core changes voters one at a time by CONFIG entries. Adding a member first
appends a HOST entry with its transport address: the group interprets HOST entries itself
(the machine only sees `skip`), so every member's transport learns the address in log order
and dials the new member, and a restart recovers it. The group's own state (the addresses
learned from the log, the ids removed) travels in snapshots in an envelope around the
machine's bytes (`group_codec.wrap_snapshot`; snapshots from before it are the machine's
bytes alone). A joining node is started with the voters it joins (GroupConfig.voters without
itself) and catches up by log or snapshot once a member adds it. A removed node may not even
receive the entry that removes it (the leader stops replicating to it at once): the members
that applied its removal answer its next message (a vote request, once it times out) with a
REMOVED frame; it then sets `removed`, stops campaigning and leaves a marker file so that a
restart keeps it removed.

The host loop (`_drive`): everything that arrives in one event-loop iteration (peer frames,
proposals, a tick) is stepped into the core first; the resulting Ready is then handled once.
Its entries are appended in the loop's thread (a write to the page cache) and fsynced in a
worker thread (`RaftStorage.flush`, with the hard state file when term or vote changed),
so the event loop serves every connection while the disk works. One Ready is outstanding at
a time: what is proposed while its fsync runs is stepped into the core meanwhile and
handed out as the next Ready the moment it finishes, so a burst of proposals costs one
append and one fsync (group commit), however they were spread over loop iterations.
Messages of a Ready leave only after its entries and hard state are durable, except a
steady leader's appends (see `_may_send_before_persisting`). Applying follows the fsync, so
a group of ONE member commits an entry after its own fsync and nothing else: a one-node
broker runs this same code path, with no transport and no waiting on anyone. A proposer
therefore sees its entry applied a loop iteration and an fsync after `propose`, never
within it: whatever must see the change waits for the future.

Failure: a full disk (ENOSPC, EDQUOT) while persisting a Ready is not fatal: the Ready is kept
and tried again every `disk_full_retry_s`, the storage having taken back the partial write;
proposals wait meanwhile and complete once space returns. Any other storage error or a core
exception halts the group (fail-stop): our promises to peers (votes, acks) may no longer be
true of the disk, so the node must not say another word; pending proposals fail, and a restart
recovers from what storage really holds.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import heapq
import itertools
import logging
import random
import struct
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple, Protocol

from warrenmq.cluster import group_codec as wire
from warrenmq.cluster.group_codec import GroupState, Reply, ReplyStatus, Request, RequestKind
from warrenmq.cluster.raft.core import (
    LEADER,
    NotLeader,
    ProposalRefused,
    RaftConfig,
    RaftError,
    RaftNode,
    Ready,
)
from warrenmq.cluster.raft.messages import (
    CODEC_VERSION,
    DecodeError,
    Entry,
    EntryKind,
    Message,
    MessageKind,
    Snapshot,
    decode_message,
    decode_voters,
    encode_message,
)
from warrenmq.cluster.storage import RaftStorage
from warrenmq.cluster.transport import PeerTransport

_log = logging.getLogger(__name__)
_READY_ROUNDS_MAX = 64
# A lone voter still counts its randomized election timeout in ticks; this bounds the ticks
# `start` steps through at once to make it leader without waiting in real time.
_SOLO_ELECTION_TICKS_MAX = 10_000
_DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
REMOVED_MARKER_FILE = "removed"
# The group's own ReadIndex contexts: one byte longer than the demo server's (node.py), so the
# two never take each other's read states.
_READ_POINT_CONTEXT = struct.Struct("<cQ")


class StateMachine(Protocol):
    """What a group replicates for: see the module docstring."""

    def apply(self, index: int, data: bytes) -> Any: ...

    def skip(self, index: int) -> None: ...

    def snapshot(self) -> bytes: ...

    def restore(self, index: int, data: bytes) -> None: ...


class ProposalLost(RaftError):
    """The proposed entry may or may not commit: its outcome is unknown to us."""


class GroupStopped(RaftError):
    """The group halted or was stopped before the proposal was applied."""


class Applied(NamedTuple):
    index: int
    result: Any
    """What the state machine's `apply` returned (None for a non-command entry)."""


@dataclass(frozen=True)
class GroupConfig:
    node_id: int
    data_dir: Path
    peers: dict[int, tuple[str, int]] | None = None
    """Raft transport address of every voter, this node included; None for a group of one,
    which needs no transport."""
    voters: tuple[int, ...] | None = None
    """The bootstrap voter set (default: every peer, or this node alone). A node that is to
    join later is started with the voters it will join (without itself) and added by
    ADD_VOTER; the configuration then lives in the log and snapshots, which win over this on
    restart."""
    tick_s: float = 0.01
    raft: RaftConfig | None = None
    snapshot_entries: int = 50_000
    """Compact the log once this many applied entries are held after the last snapshot."""
    seed: int = 0
    gc_freeze_entries: int = 0
    """Move every live object to the permanent GC generation after this many applied entries
    (0: never). Only for a process that is nothing but a Raft node: see `_after_apply`."""
    overlap_leader_fsync: bool = True
    """Let a steady leader's appends leave before its own fsync (see
    _may_send_before_persisting)."""
    disk_full_retry_s: float = 0.5
    leader_wait_s: float | None = None
    """How long a request made while no leader is known waits for one before failing
    NotLeader (default: four election timeouts, time for an election or two)."""
    forward_reply_timeout_s: float = 5.0
    """A forwarded request the leader has not answered in this time fails ProposalLost."""
    secret: str = ""
    """The cluster secret both ends of every transport connection prove (`transport`)."""


def coalesce_appends(messages: Sequence[Message]) -> list[Message]:
    """Merge runs of APPENDs to one peer whose entries follow each other into one APPEND.

    The core sends one APPEND per proposal while its pipeline has room, so a burst of
    pipelined writes would otherwise cost a message (encode, decode, step, ack) per entry.
    The merged APPEND carries the first one's consistency check (index, log_term) and the
    last one's commit; the follower's single ack frees every merged in-flight slot, as the
    leader releases all in-flight appends at or below an acked index.
    """
    out: list[Message] = []
    open_run: dict[int, int] = {}  # peer -> position in `out` of its APPEND still open to merging
    merged: dict[int, tuple[list[Entry], int]] = {}  # position -> (all entries, last commit)
    for m in messages:
        if m.kind is MessageKind.APPEND and m.entries:
            position = open_run.get(m.dst)
            if position is not None:
                head = out[position]
                run = merged.get(position)
                last_index = run[0][-1].index if run is not None else head.entries[-1].index
                if head.term == m.term and last_index == m.index:
                    if run is None:
                        run = merged[position] = (list(head.entries), head.commit)
                    run[0].extend(m.entries)
                    merged[position] = (run[0], m.commit)
                    continue
            open_run[m.dst] = len(out)
        else:
            # Anything else to this peer must stay after the appends sent before it.
            open_run.pop(m.dst, None)
        out.append(m)
    for position, (entries, commit) in merged.items():
        out[position] = replace(out[position], entries=tuple(entries), commit=commit)
    return out


def _disk_full(error: BaseException) -> bool:
    return isinstance(error, OSError) and error.errno in _DISK_FULL_ERRNOS


@dataclass(slots=True)
class _ReadRound:
    """Callers of `read_point` whose ReadIndex request the core sent at `asked_s`."""

    waiting: list[tuple[asyncio.Future[int], float]]  # (future, deadline_s)
    asked_s: float


@dataclass(slots=True)
class _Forwarded:
    """A request of this member's for the leader: waiting for one to be known, or sent to
    `leader` over transport connection `link` and waiting for its reply."""

    kind: RequestKind
    data: bytes
    future: asyncio.Future[Applied]
    deadline_s: float
    leader: int = 0
    link: int | None = None
    refused_by: tuple[int, int | None, float] = field(default=(0, None, 0.0))
    """(term, leader, until) of the last NOT_LEADER answer: that leader is not asked again
    in that term before `until` (an election timeout later)."""


class RaftGroup:
    """One member of one Raft group: core, storage, transport and the host loop."""

    def __init__(self, config: GroupConfig, machine: StateMachine) -> None:
        self.config = config
        node_id = config.node_id
        self.raft_config = config.raft or RaftConfig(node_id=node_id)
        assert self.raft_config.node_id == node_id
        self.machine = machine
        self.storage = RaftStorage.open(config.data_dir)
        hard_state = self.storage.hard_state
        if hard_state is not None and hard_state.commit > self.storage.last_index:
            raise RuntimeError(
                f"stored commit {hard_state.commit} is beyond the log end {self.storage.last_index}"
            )
        peers = config.peers or {}
        voters = config.voters if config.voters is not None else tuple(peers) or (node_id,)
        self.raft = RaftNode(
            self.raft_config,
            tuple(sorted(voters)),
            random.Random(config.seed * 1_000_003 + node_id),
            hard_state=hard_state,
            snapshot=self.storage.snapshot,
            entries=self.storage.entries(),
        )
        # What the group itself keeps of the log (HOST and CONFIG entries), as of the applied
        # index: the addresses of the members added through it, who was removed.
        self.group_state = GroupState()
        self._applied_voters = tuple(sorted(voters))
        snapshot = self.storage.snapshot
        self.applied_index = 0
        if snapshot is not None:
            self._restore_snapshot(snapshot)
        self.removed = (config.data_dir / REMOVED_MARKER_FILE).exists()
        """This node was removed from the group: it must not serve (see `_set_removed`)."""
        # Addresses this node proposed as leader, dialled before their entries apply.
        self._proposed_addresses: dict[int, tuple[str, int]] = {}
        # Removed members that still talk to us, to be told once (then no longer dialled).
        self._removed_to_notify: set[int] = set()
        self._addresses_changed = False
        self.transport: PeerTransport | None = None
        if peers:
            self.transport = PeerTransport(
                node_id, self._peer_addresses(), self._on_peer_frame, secret=config.secret
            )
        self._leader_wait_s = (
            config.leader_wait_s
            if config.leader_wait_s is not None
            else 4 * self.raft_config.election_ticks * config.tick_s
        )
        self._request_ids = itertools.count(1)
        self._unsent: list[_Forwarded] = []
        self._sent: dict[int, _Forwarded] = {}
        self._replies: dict[int, list[Reply]] = {}
        # (index, tie-break, future): resolved once applied up to index, whatever its term
        self._applied_waiters: list[tuple[int, int, asyncio.Future[Applied]]] = []
        # read_point callers: not yet asked of the core (no leader known, or asked this
        # iteration), and asked, by the round's context
        self._reads_unasked: list[tuple[asyncio.Future[int], float]] = []
        self._read_rounds: dict[bytes, _ReadRound] = {}
        self._read_round_ids = itertools.count(1)
        # index -> (term it was proposed in, its future)
        self._proposals: dict[int, tuple[int, asyncio.Future[Applied]]] = {}
        self._kick_scheduled = False
        # The Ready whose fsync runs in a worker thread; no other is taken from the core
        # meanwhile, so the proposals made while it runs share the next one.
        self._persisting: asyncio.Task[None] | None = None
        self._closing = False
        self._stalled_ready: Ready | None = None
        self._was_leader = False
        self._leadership: tuple[int, int | None] = (0, None)
        self._ticker: asyncio.TimerHandle | None = None
        self._next_tick_s = 0.0
        self._stopped = asyncio.Event()
        self.fatal_error: BaseException | None = None
        self.ready_count = 0
        self.entries_persisted = 0
        self.persist_s_total = 0.0
        self.persist_s_max = 0.0
        self.disk_full_retries = 0
        self._frozen_at_index = 0
        self.heard_s: dict[int, float] = {}
        """The loop time of the last Raft message from each peer: a leader hears from each
        live follower every heartbeat, so this is how long ago a node was last alive."""

    # -- lifecycle ---------------------------------------------------------------------

    @property
    def stopped(self) -> bool:
        return self._stopped.is_set()

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self.transport is not None:
            await self.transport.start()
        if self.raft.voters == (self.config.node_id,):
            # Alone, no one can be heard from: campaign now rather than after a real election
            # timeout (the vote persists in the first Ready like any other).
            for _ in range(_SOLO_ELECTION_TICKS_MAX):
                if self.raft.role == LEADER:
                    break
                self.raft.tick()
        self._next_tick_s = loop.time() + self.config.tick_s
        self._ticker = loop.call_at(self._next_tick_s, self._on_tick)
        self._kick()

    async def wait_leading(self) -> None:
        """Until this node leads and has applied an entry of its term (so every entry
        committed before it took over is applied here too); for a group of one, right after
        `start`'s first fsync. Raises GroupStopped if the group halts first."""
        while not self.leading:
            if self._stopped.is_set():
                raise GroupStopped("the group stopped") from self.fatal_error
            await asyncio.sleep(self.config.tick_s)

    @property
    def leading(self) -> bool:
        raft = self.raft
        return (
            raft.role == LEADER
            and self.applied_index >= raft.commit_index
            and raft.term_at(raft.commit_index) == raft.term
        )

    async def stop(self, transfer_timeout_s: float = 1.0) -> None:
        """Shut down; a leader first hands its leadership to a peer (Raft §3.10), so a
        planned restart costs the cluster a round trip instead of an election timeout."""
        if self.fatal_error is not None or self._stopped.is_set():
            return
        if self.raft.role == LEADER and transfer_timeout_s > 0:
            await self._transfer_leadership_away(transfer_timeout_s)
        # No Ready is taken from the core from now on.
        self._closing = True
        if self._ticker is not None:
            self._ticker.cancel()
        self._close_inputs()
        if self.transport is not None:
            await self.transport.close()
        if self._persisting is not None:
            # Its worker still fsyncs the log: close the storage after it. What it applies
            # meanwhile answers its proposers.
            await asyncio.shield(self._persisting)
        self._fail_proposals(GroupStopped("the group stopped; outcome unknown"))
        self._fail_requests(GroupStopped("the group stopped; outcome unknown"))
        try:
            self.storage.close()
        finally:
            self._stopped.set()

    def _close_inputs(self) -> None:
        """Subclasses close what feeds them requests (listeners, client sockets)."""

    async def _transfer_leadership_away(self, timeout_s: float) -> None:
        transport = self.transport
        if transport is None:
            return
        peers = [v for v in self.raft.voters if v != self.config.node_id and transport.connected(v)]
        if not peers:
            return
        try:
            self.raft.transfer_leadership(peers[0])
        except RaftError:
            return
        self._kick()
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + timeout_s
        while self.raft.role == LEADER and loop.time() < deadline_s:
            await asyncio.sleep(self.config.tick_s)

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    # -- proposals ---------------------------------------------------------------------

    def propose(self, data: bytes) -> asyncio.Future[Applied]:
        """Append `data`; the future resolves once it is applied here (module docstring).
        A member that does not lead forwards it to the leader."""
        try:
            return self._track(self.raft.propose(data))
        except NotLeader:
            if self.transport is None:
                raise
        return self._forward(RequestKind.PROPOSE, data)

    def add_member(self, node_id: int, host: str, port: int) -> asyncio.Future[Applied]:
        """Make `node_id`, whose Raft transport listens on host:port, a voter; from any
        member. Its address goes into the log first, so every member (and every restart)
        knows it. Adding a voter again is a no-op success (with a new address: a move),
        so retrying after ProposalLost is safe."""
        return self._request(RequestKind.ADD_MEMBER, wire.encode_member(node_id, host, port))

    def remove_member(self, node_id: int) -> asyncio.Future[Applied]:
        """Remove the voter `node_id`, from any member; removing a non-voter is a no-op
        success. The removed node learns it (`removed`) once it hears from a member."""
        return self._request(RequestKind.REMOVE_MEMBER, wire.encode_node(node_id))

    def propose_membership(
        self, add: int | None = None, remove: int | None = None
    ) -> asyncio.Future[Applied]:
        """Leader only, addresses not logged (the KV demo's bootstrap map has them all)."""
        return self._track(self.raft.propose_membership(add=add, remove=remove))

    def _request(self, kind: RequestKind, data: bytes) -> asyncio.Future[Applied]:
        if self.transport is None:
            raise ProposalRefused("a group started without peer addresses has no other members")
        if self.raft.role != LEADER:
            return self._forward(kind, data)
        self._check_running()
        index, term = self._propose_request(kind, data)
        future: asyncio.Future[Applied] = asyncio.get_running_loop().create_future()
        self._await_applied(index, term, future)
        self._kick()
        return future

    def _propose_request(self, kind: RequestKind, data: bytes) -> tuple[int, int | None]:
        """Propose a request as leader: (index, term) of its entry, or (index, None) when
        nothing had to be appended and it is done once applied up to index. Raises
        NotLeader, ProposalRefused, or DecodeError on malformed data."""
        raft = self.raft
        if raft.role != LEADER:
            raise NotLeader(raft.leader_id)
        if kind is RequestKind.PROPOSE:
            return raft.propose(data), raft.term
        if kind is RequestKind.REMOVE_MEMBER:
            node = wire.decode_node(data)
            if node not in raft.voters:
                return raft.last_index, None
            return raft.propose_membership(remove=node), raft.term
        node, host, port = wire.decode_member(data)
        address = (host, port)
        if node in raft.voters:
            if self.member_addresses().get(node) == address:
                return raft.last_index, None
            index = raft.propose_host(data)  # a voter moved: only its address changes
        else:
            raft.membership_change(add=node)
            raft.propose_host(data)
            index = raft.propose_membership(add=node)
        self._proposed_addresses[node] = address
        self._addresses_changed = True
        return index, raft.term

    def _forward(self, kind: RequestKind, data: bytes) -> asyncio.Future[Applied]:
        """Queue a request for the leader; it leaves with the others of this loop
        iteration in one frame (`_dispatch_requests`)."""
        self._check_running()
        if self.removed:
            raise ProposalRefused("this node was removed from the group")
        loop = asyncio.get_running_loop()
        request = _Forwarded(kind, data, loop.create_future(), loop.time() + self._leader_wait_s)
        self._unsent.append(request)
        self._kick()
        return request.future

    def _check_running(self) -> None:
        if self.fatal_error is not None or self._stopped.is_set():
            raise GroupStopped("the group stopped")

    @property
    def proposals_pending(self) -> int:
        return len(self._proposals)

    def _track(self, index: int) -> asyncio.Future[Applied]:
        if self.fatal_error is not None or self._stopped.is_set():
            raise GroupStopped("the group stopped")
        future: asyncio.Future[Applied] = asyncio.get_running_loop().create_future()
        superseded = self._proposals.get(index)
        if superseded is not None:
            # Our earlier entry at this index was truncated away: it will never apply.
            _lose(superseded[1], "entry was overwritten")
        self._proposals[index] = (self.raft.term, future)
        self._kick()
        return future

    def _fail_proposals(self, error: Exception, above: int = 0) -> None:
        """Fail the proposals at indexes past `above`."""
        failed = [index for index in self._proposals if index > above]
        for index in failed:
            _, future = self._proposals.pop(index)
            if not future.done():
                future.set_exception(error)

    def _fail_requests(self, error: Exception) -> None:
        """Fail what waits for a leader or for the index it was told (a group that stops)."""
        futures = [r.future for r in self._unsent] + [r.future for r in self._sent.values()]
        futures += [future for _, _, future in self._applied_waiters]
        futures += [future for future, _ in self._reads_unasked]
        futures += [future for r in self._read_rounds.values() for future, _ in r.waiting]
        self._unsent, self._sent, self._applied_waiters = [], {}, []
        self._reads_unasked, self._read_rounds = [], {}
        for future in futures:
            if not future.done():
                future.set_exception(error)

    def applied(self, index: int) -> asyncio.Future[Applied]:
        """Resolves once this member has applied the log up to `index` (an index another
        member applied: what this one must know before acting for it)."""
        future: asyncio.Future[Applied] = asyncio.get_running_loop().create_future()
        self._await_applied(index, None, future)
        return future

    def read_point(self) -> asyncio.Future[int]:
        """Resolves with a linearizable read point (ReadIndex, Raft §6.4): once this member
        has applied up to it (`applied`), its state holds every write acknowledged by any
        member before this call. The leader takes its commit index and confirms it still
        leads with a heartbeat round; a follower asks the leader for that index (the core's
        READ_INDEX). Concurrent callers share one round. A group of one answers at once: all
        its acknowledged writes were applied here. Fails NotLeader when no leader confirmed
        a round within `leader_wait_s`."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[int] = loop.create_future()
        if self.transport is None:
            future.set_result(self.applied_index)
            return future
        self._check_running()
        self._reads_unasked.append((future, loop.time() + self._leader_wait_s))
        self._kick()
        return future

    def _ask_read_points(self) -> None:
        raft = self.raft
        if raft.role != LEADER and raft.leader_id is None:
            return  # asked once a leader is known (_drive_once kicks then)
        context = _READ_POINT_CONTEXT.pack(b"g", next(self._read_round_ids))
        waiting, self._reads_unasked = self._reads_unasked, []
        self._read_rounds[context] = _ReadRound(waiting, asyncio.get_running_loop().time())
        raft.read_index(context)

    def _resolve_read_points(self, ready: Ready) -> None:
        for read_state in ready.read_states:
            read_round = self._read_rounds.pop(read_state.context, None)
            if read_round is None:
                continue
            for future, _ in read_round.waiting:
                if not future.done():
                    future.set_result(read_state.index)

    def _ask_read_points_again(self) -> None:
        """The rounds asked are put back to be asked anew: asked of a leader that is no
        longer ours, or lost with a connection, they may never be answered."""
        rounds, self._read_rounds = self._read_rounds, {}
        for read_round in rounds.values():
            self._reads_unasked += read_round.waiting
        if self._reads_unasked:
            self._kick()

    def _expire_read_points(self, now_s: float) -> None:
        """Fail the callers past their deadline; re-ask the rounds unanswered for an
        election timeout (a request dropped by a leader busy with too many reads, or lost)."""
        retry_s = self.raft_config.election_ticks * self.config.tick_s
        if any(now_s - r.asked_s > retry_s for r in self._read_rounds.values()):
            self._ask_read_points_again()
        if not any(deadline_s <= now_s for _, deadline_s in self._reads_unasked):
            return
        keep = []
        for future, deadline_s in self._reads_unasked:
            if deadline_s > now_s:
                keep.append((future, deadline_s))
            elif not future.done():
                future.set_exception(NotLeader(self.raft.leader_id))
        self._reads_unasked = keep

    def _await_applied(self, index: int, term: int | None, future: asyncio.Future[Applied]) -> None:
        """Resolve `future` once `index` is applied here: with the machine's result if its
        entry has `term`, ProposalLost if another entry took the index. With term None,
        once applied up to index (nothing of the caller's own to apply)."""
        if term is None:
            if self.applied_index >= index:
                future.set_result(Applied(index, None))
            else:
                heapq.heappush(self._applied_waiters, (index, next(self._request_ids), future))
            return
        if index <= self.applied_index:
            # Only a snapshot installed before the leader's reply arrived gets here: the
            # reply leaves the leader before any append carrying the entry.
            _lose(future, "applied before the leader's answer arrived; outcome unknown")
            return
        superseded = self._proposals.get(index)
        if superseded is not None:
            older, newer = (superseded, (term, future))
            if superseded[0] > term:
                older, newer = newer, older
            _lose(older[1], "entry was overwritten")
            self._proposals[index] = newer
            return
        self._proposals[index] = (term, future)

    def _release_applied_waiters(self) -> None:
        waiters = self._applied_waiters
        while waiters and waiters[0][0] <= self.applied_index:
            index, _, future = heapq.heappop(waiters)
            if not future.done():
                future.set_result(Applied(index, None))

    # -- forwarding ----------------------------------------------------------------------

    def _dispatch_requests(self) -> None:
        """Send the requests waiting for a leader to the one now known, one frame for all;
        or propose them here if this node leads."""
        raft = self.raft
        leader = raft.leader_id
        if leader is None:
            return
        if leader == raft.node_id:
            unsent, self._unsent = self._unsent, []
            for request in unsent:
                self._propose_forwarded_here(request)
            return
        transport = self.transport
        assert transport is not None
        link = transport.link(leader)
        if link is None:
            return  # a frame would be dropped; wait for the connection (bounded)
        now_s = asyncio.get_running_loop().time()
        sending = []
        waiting = []
        for request in self._unsent:
            term, refuser, until_s = request.refused_by
            if (term, refuser) == (raft.term, leader) and now_s < until_s:
                waiting.append(request)
                continue
            request.leader = leader
            request.link = link
            request.deadline_s = now_s + self.config.forward_reply_timeout_s
            request_id = next(self._request_ids)
            self._sent[request_id] = request
            sending.append(Request(request_id, request.kind, request.data))
        self._unsent = waiting
        if not sending:
            return
        if not transport.send(leader, wire.encode_propose(raft.node_id, sending)):
            # Dropped unsent (the connection is backed up): surely not proposed.
            for item in sending:
                self._unsent.append(self._sent.pop(item.id))

    def _propose_forwarded_here(self, request: _Forwarded) -> None:
        if request.future.done():
            return
        try:
            index, term = self._propose_request(request.kind, request.data)
        except (RaftError, DecodeError) as exc:
            request.future.set_exception(exc)
            return
        self._await_applied(index, term, request.future)

    def _answer_requests(self, src: int, requests: list[Request]) -> None:
        """As leader (or not): answer a member's forwarded requests, in one frame."""
        replies = self._replies.setdefault(src, [])
        raft = self.raft
        for request in requests:
            if raft.role == LEADER and raft.lead_transferee is not None:
                # Soon not the leader: the requester waits for the next one, as a refusal
                # here would make it fail what the next leader will take.
                replies.append(Reply(request.id, ReplyStatus.NOT_LEADER, leader=raft.node_id))
                continue
            try:
                index, term = self._propose_request(request.kind, request.data)
            except NotLeader as exc:
                replies.append(Reply(request.id, ReplyStatus.NOT_LEADER, leader=exc.leader_id or 0))
                continue
            except (ProposalRefused, DecodeError) as exc:
                replies.append(Reply(request.id, ReplyStatus.REFUSED, reason=str(exc)))
                continue
            if term is None:
                replies.append(Reply(request.id, ReplyStatus.IN_EFFECT, index=index))
            else:
                replies.append(Reply(request.id, ReplyStatus.APPENDED, index=index, term=term))

    def _send_replies(self) -> None:
        # Called before the Ready's messages are sent: a reply leaves before any append
        # carrying its entry, so the requester knows the index before it can apply it.
        replies, self._replies = self._replies, {}
        assert self.transport is not None
        for dst, items in replies.items():
            self.transport.send(dst, wire.encode_replies(self.raft.node_id, items))

    def _on_replies(self, replies: list[Reply]) -> None:
        for reply in replies:
            request = self._sent.pop(reply.id, None)
            if request is None or request.future.done():
                continue  # timed out or its link was lost meanwhile
            status = reply.status
            if status is ReplyStatus.APPENDED:
                self._await_applied(reply.index, reply.term, request.future)
            elif status is ReplyStatus.IN_EFFECT:
                self._await_applied(reply.index, None, request.future)
            elif status is ReplyStatus.REFUSED:
                request.future.set_exception(ProposalRefused(reply.reason))
            else:
                # Surely not proposed: ask the leader we learn of next (bounded wait).
                now_s = asyncio.get_running_loop().time()
                election_timeout_s = self.raft_config.election_ticks * self.config.tick_s
                request.refused_by = (self.raft.term, request.leader, now_s + election_timeout_s)
                request.deadline_s = now_s + self._leader_wait_s
                self._unsent.append(request)

    def _expire_requests(self, now_s: float) -> None:
        transport = self.transport
        assert transport is not None
        if self._unsent:
            waiting = []
            for request in self._unsent:
                if request.future.done():
                    continue
                if request.deadline_s <= now_s:
                    request.future.set_exception(NotLeader(self.raft.leader_id))
                else:
                    waiting.append(request)
            self._unsent = waiting
        for request_id in [
            i
            for i, r in self._sent.items()
            if r.deadline_s <= now_s or transport.link(r.leader) != r.link or r.future.done()
        ]:
            # The frame may or may not have reached the leader, which may have appended it.
            _lose(self._sent.pop(request_id).future, "lost the leader before its answer")

    # -- membership and addresses --------------------------------------------------------

    def member_addresses(self) -> dict[int, tuple[str, int]]:
        """The transport address of every node known: the bootstrap map, overridden by what
        the log says (and, on a leader, by the additions it just proposed)."""
        return {
            **(self.config.peers or {}),
            **self.group_state.addresses,
            **self._proposed_addresses,
        }

    def _peer_addresses(self) -> dict[int, tuple[str, int]]:
        """Whom the transport dials: every known node but the removed ones (unless one
        still has to be told), and this node's own listening address."""
        removed = self.group_state.removed
        addresses = {
            n: a
            for n, a in self.member_addresses().items()
            if n not in removed or n in self._removed_to_notify
        }
        assert self.config.peers is not None
        addresses[self.raft.node_id] = self.config.peers[self.raft.node_id]
        return addresses

    def _apply_own(self, entry: Entry) -> None:
        """A CONFIG or HOST entry is applied: keep the group's state of them."""
        state = self.group_state
        if entry.kind == EntryKind.HOST:
            node, host, port = wire.decode_member(entry.data)
            state.addresses[node] = (host, port)
            if self._proposed_addresses.get(node) == (host, port):
                del self._proposed_addresses[node]
        else:
            voters = decode_voters(entry.data)
            state.removed |= set(self._applied_voters) - set(voters)
            state.removed -= set(voters)
            self._applied_voters = voters
            if self.raft.node_id in state.removed:
                self._set_removed(True)
            elif self.removed and self.raft.node_id in voters:
                self._set_removed(False)
        self._addresses_changed = True

    def _set_removed(self, removed: bool) -> None:
        """Its removal is committed (or it was added back). The marker file keeps a
        restarted node from serving before it hears of it again."""
        if removed == self.removed:
            return
        self.removed = removed
        marker = self.config.data_dir / REMOVED_MARKER_FILE
        if removed:
            _log.warning("raft node %d was removed from the group", self.raft.node_id)
            marker.touch()
        else:
            marker.unlink(missing_ok=True)

    def _notify_removed(self) -> None:
        """Tell the removed members that still talk to us, once each, when dialled."""
        transport = self.transport
        assert transport is not None
        for node in [n for n in self._removed_to_notify if transport.connected(n)]:
            transport.send(node, wire.encode_removed(self.raft.node_id))
            self._removed_to_notify.discard(node)
            self._addresses_changed = True

    # -- inputs ------------------------------------------------------------------------

    def _on_tick(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            if not self.removed:  # a removed node must not campaign
                self.raft.tick()
        except Exception as exc:
            self._fail(exc)
            return
        now_s = loop.time()
        if self._unsent or self._sent:
            self._expire_requests(now_s)
        if self._reads_unasked or self._read_rounds:
            self._expire_read_points(now_s)
        # Keep the tick rate steady: a late tick does not push every later one back.
        self._next_tick_s = max(self._next_tick_s + self.config.tick_s, now_s)
        self._ticker = loop.call_at(self._next_tick_s, self._on_tick)
        self._after_tick(now_s)
        self._kick()

    def _after_tick(self, now_s: float) -> None:
        """Subclasses expire their own timers here."""

    def _on_peer_frame(self, frame: bytes) -> None:
        if self.fatal_error is not None or self._stopped.is_set():
            return
        try:
            if frame and frame[0] == CODEC_VERSION:
                message = decode_message(frame)
            else:
                self._on_group_frame(frame)
                return
        except DecodeError as exc:
            raise ValueError(str(exc)) from exc  # the transport drops the connection
        if message.dst != self.config.node_id:
            raise ValueError(f"message for node {message.dst} reached node {self.config.node_id}")
        self.heard_s[message.src] = asyncio.get_running_loop().time()
        if message.src in self.group_state.removed and message.src not in self.raft.voters:
            self._heard_from_removed(message.src)
            return
        try:
            self.raft.step(message)
        except Exception as exc:
            self._fail(exc)
            return
        self._kick()

    def _on_group_frame(self, frame: bytes) -> None:
        kind = wire.frame_kind(frame)
        if kind == wire.PROPOSE:
            src, requests = wire.decode_propose(frame)
            if src in self.group_state.removed and src not in self.raft.voters:
                self._heard_from_removed(src)
                return
            try:
                self._answer_requests(src, requests)
            except Exception as exc:
                self._fail(exc)
                return
        elif kind == wire.PROPOSE_REPLY:
            _, replies = wire.decode_replies(frame)
            self._on_replies(replies)
        elif kind == wire.REMOVED:
            src = wire.decode_removed(frame)
            if src in self.raft.voters:
                self._set_removed(True)
        else:
            raise DecodeError(f"unknown frame kind {kind:#x}")
        self._kick()

    def _heard_from_removed(self, node: int) -> None:
        if node not in self._removed_to_notify:
            self._removed_to_notify.add(node)
            self._addresses_changed = True
            self._kick()

    # -- the host loop -----------------------------------------------------------------

    def _kick(self) -> None:
        if not self._kick_scheduled:
            self._kick_scheduled = True
            asyncio.get_running_loop().call_soon(self._drive)

    def _drive(self) -> None:
        self._kick_scheduled = False
        if self.fatal_error is not None or self._stopped.is_set():
            return
        try:
            self._drive_once()
        except Exception as exc:
            self._fail(exc)

    def _before_ready(self) -> None:
        """Subclasses step what they batched during the loop iteration into the core."""

    def _drive_once(self) -> None:
        """Step what is batched into the core, then handle its Ready until it has none."""
        raft = self.raft
        if self._unsent:
            self._dispatch_requests()
        if self._replies:
            self._send_replies()
        self._before_ready()
        if self._reads_unasked:
            self._ask_read_points()
        for _ in range(_READY_ROUNDS_MAX):
            if (
                self._stalled_ready is not None
                or self._persisting is not None
                or self._closing
                or not raft.has_ready()
            ):
                break
            ready = raft.ready()
            if not self._handle_ready(ready):
                break
            raft.advance(ready)
        else:
            self._kick()  # still more: yield to the loop rather than spin here
        is_leader = raft.role == LEADER
        if self._was_leader and not is_leader:
            # Our uncommitted entries may yet commit under the next leader, or be
            # overwritten; we cannot know which now, and waiting could take until the log
            # grows past them. Tell the proposers at once so they can check, or retry.
            # Those already committed keep waiting: a Ready whose fsync is under way applies
            # them (a leader that removed itself steps down as its removal commits).
            self._fail_proposals(
                ProposalLost("leadership lost; outcome unknown"), above=raft.commit_index
            )
            if self._proposed_addresses:
                # Dialled from the entries' apply if they commit after all.
                self._proposed_addresses.clear()
                self._addresses_changed = True
        self._was_leader = is_leader
        leadership = (raft.term, raft.leader_id)
        if leadership != self._leadership:
            self._leadership = leadership
            _log.info(
                "raft node %d: term %d, leader %s, role %s",
                raft.node_id,
                raft.term,
                raft.leader_id,
                raft.role,
            )
            self._on_leadership_change()
            if self._read_rounds:
                self._ask_read_points_again()
            if self._unsent or self._reads_unasked:
                self._kick()  # a leader is known now: the requests waiting for one go
        # Everything this iteration had to say is queued: write it now rather than one
        # loop iteration later.
        transport = self.transport
        if transport is not None:
            if self._removed_to_notify:
                self._notify_removed()
            if self._addresses_changed:
                self._addresses_changed = False
                transport.set_addresses(self._peer_addresses())
            transport.flush()

    def _on_leadership_change(self) -> None:
        """Subclasses drop what only the old leader could have answered."""

    def _fail(self, exc: BaseException) -> None:
        """Fail-stop (see the module docstring)."""
        if self.fatal_error is not None:
            return
        self.fatal_error = exc
        traceback.print_exception(exc, file=sys.stderr)
        if self._ticker is not None:
            self._ticker.cancel()
        self._close_inputs()
        if self.transport is not None:
            self.transport.drop_connections()
            asyncio.ensure_future(self.transport.close())
        stopped = GroupStopped(f"the raft group halted: {exc!r}")
        stopped.__cause__ = exc
        self._fail_proposals(stopped)
        self._fail_requests(stopped)
        self._stopped.set()

    def _handle_ready(self, ready: Ready) -> bool:
        """Persist and act on one Ready. True if done at once (nothing to fsync); False if
        its fsync runs in a worker thread (`_persist`, which finishes it and drives on) or
        the disk is full (it is retried later)."""
        messages = coalesce_appends(ready.messages)
        if messages and self._may_send_before_persisting(ready):
            self._send(messages)
            messages = []
            # The writes are flushed now, so followers fsync while we do (the flush would
            # otherwise wait for the next loop iteration, after our fsync).
            assert self.transport is not None
            self.transport.flush()
        persist_started_s = time.perf_counter()
        try:
            must_flush = self.storage.write(ready.hard_state, ready.entries, ready.snapshot)
        except OSError as exc:
            if not _disk_full(exc):
                raise
            self._stall(ready, exc)
            return False
        if must_flush:
            self._persisting = asyncio.ensure_future(
                self._persist(ready, messages, persist_started_s)
            )
            return False
        self._persisted(ready, messages, persist_started_s)
        return True

    async def _persist(
        self, ready: Ready, messages: Sequence[Message], persist_started_s: float
    ) -> None:
        """Wait for the storage's fsyncs, then act on the Ready and take the next one."""
        try:
            await self.storage.flush()
        except Exception as exc:
            self._persisting = None
            if _disk_full(exc):
                self._stall(ready, exc)
            else:
                self._fail(exc)
            return
        self._persisting = None
        if self.fatal_error is not None:
            return
        try:
            self._persisted(ready, messages, persist_started_s)
            self.raft.advance(ready)
        except Exception as exc:
            self._fail(exc)
            return
        # At once, not a loop iteration later: what was proposed while the fsync ran is
        # waiting for the next one.
        self._drive()

    def _persisted(
        self, ready: Ready, messages: Sequence[Message], persist_started_s: float
    ) -> None:
        """The Ready is durable: send what waited for that, then apply what it commits."""
        persist_s = time.perf_counter() - persist_started_s
        self.ready_count += 1
        self.persist_s_total += persist_s
        self.persist_s_max = max(self.persist_s_max, persist_s)
        self.entries_persisted += len(ready.entries)
        if ready.snapshot is not None:
            self._install_snapshot_state(ready.snapshot)
        self._send(messages)
        if ready.committed:
            self._apply(ready.committed)
        if ready.read_states and self._read_rounds:
            self._resolve_read_points(ready)
        self._after_ready(ready)

    def _send(self, messages: Sequence[Message]) -> None:
        transport = self.transport
        if transport is None:
            assert not messages, "a group of one has no one to send to"
            return
        for message in messages:
            transport.send(message.dst, encode_message(message))

    def _stall(self, ready: Ready, error: BaseException) -> None:
        if self._stalled_ready is None:
            _log.error(
                "raft log write failed, the disk is full; trying again every %.1f s: %r",
                self.config.disk_full_retry_s,
                error,
            )
        self._stalled_ready = ready
        self.disk_full_retries += 1
        asyncio.get_running_loop().call_later(self.config.disk_full_retry_s, self._retry_stalled)

    def _retry_stalled(self) -> None:
        ready = self._stalled_ready
        if ready is None or self.fatal_error is not None or self._stopped.is_set():
            return
        self._stalled_ready = None
        try:
            if self._handle_ready(ready):
                self.raft.advance(ready)
            elif self._stalled_ready is not None:
                return  # still full
            # else its fsync runs: the write that the full disk refused went through.
            _log.warning("raft log written again: disk space is back")
        except Exception as exc:
            self._fail(exc)
            return
        self._kick()

    def _after_ready(self, ready: Ready) -> None:
        """Subclasses serve what waited for this Ready (reads)."""

    def _may_send_before_persisting(self, ready: Ready) -> bool:
        """Whether this Ready's messages may leave before its entries are fsynced.

        A leader may replicate entries it has not yet made durable itself (Raft
        dissertation §10.2.1): its appends promise nothing about its own disk. The danger
        would be counting its own unsynced copy towards a commit; but the followers' acks
        can only be stepped after this callback returns, and `save` below fsyncs before it
        does, so every commit the core computes from them already includes our durable
        copy. This halves commit latency (our fsync overlaps the followers'). It holds
        only while this node was leader for the whole Ready: its term and vote did not
        change in it (a new term or vote must be durable before anyone hears of it).
        """
        if (
            not self.config.overlap_leader_fsync
            or self.transport is None
            or self.raft.role != LEADER
            or ready.snapshot is not None
        ):
            return False
        hard_state = ready.hard_state
        return hard_state is None or self.storage.term_and_vote_durable(
            hard_state.term, hard_state.vote
        )

    def _restore_snapshot(self, snapshot: Snapshot) -> None:
        """The machine's state and the group's own become the snapshot's."""
        state, machine_data = wire.unwrap_snapshot(snapshot.data)
        self.machine.restore(snapshot.index, machine_data)
        self.applied_index = snapshot.index
        if state is not None:
            self.group_state = state
        self._applied_voters = snapshot.voters
        self._addresses_changed = True

    def _install_snapshot_state(self, snapshot: Snapshot) -> None:
        self._restore_snapshot(snapshot)
        if self.raft.node_id in self.group_state.removed:
            self._set_removed(True)
        elif self.raft.node_id in snapshot.voters:
            self._set_removed(False)
        index = snapshot.index
        for proposal_index in [i for i in self._proposals if i <= index]:
            _, future = self._proposals.pop(proposal_index)
            _lose(future, "replaced by a snapshot; outcome unknown")
        self._release_applied_waiters()

    def _apply(self, entries: Sequence[Entry]) -> None:
        machine = self.machine
        proposals = self._proposals
        normal = EntryKind.NORMAL
        for entry in entries:
            index = entry.index
            if index <= self.applied_index:
                continue  # covered by the snapshot the state machine was restored from
            if entry.kind == normal:
                result = machine.apply(index, entry.data)
            else:
                machine.skip(index)
                if entry.kind != EntryKind.NOOP:
                    self._apply_own(entry)
                result = None
            self.applied_index = index
            proposal = proposals.pop(index, None)
            if proposal is not None:
                term, future = proposal
                if future.done():
                    continue
                if term == entry.term:
                    future.set_result(Applied(index, result))
                else:
                    _lose(future, "a new leader replaced the entry")
        if self._applied_waiters:
            self._release_applied_waiters()
        self._after_apply()

    def _after_apply(self) -> None:
        self._maybe_compact()
        freeze_entries = self.config.gc_freeze_entries
        if freeze_entries and self.applied_index - self._frozen_at_index >= freeze_entries:
            # The log entries the core holds (until the next compaction) are long-lived and
            # numerous; a full collection that rescans them all paused a node for up to
            # ~100 ms under load. Frozen objects are still freed by reference counting;
            # only reference cycles among them would outlive us, and the entries, messages
            # and store values have none.
            gc.freeze()
            self._frozen_at_index = self.applied_index

    def _maybe_compact(self) -> None:
        raft = self.raft
        applied = self.applied_index
        if applied - raft.first_index + 1 < self.config.snapshot_entries:
            return
        self.compact()

    def compact(self) -> None:
        """Snapshot the state machine at the applied index and drop the log it covers."""
        applied = self.applied_index
        if applied <= (self.storage.snapshot.index if self.storage.snapshot else 0):
            return
        data = wire.wrap_snapshot(self.group_state, self.machine.snapshot())
        snapshot = self.raft.compact(applied, data)
        self.storage.compact(snapshot)

    def status(self) -> dict[str, object]:
        raft = self.raft
        transport = self.transport
        addresses = self.member_addresses()
        return {
            "id": raft.node_id,
            "role": raft.role,
            "term": raft.term,
            "leader": raft.leader_id,
            "commit": raft.commit_index,
            "applied": self.applied_index,
            "last_index": raft.last_index,
            "first_index": raft.first_index,
            "voters": list(raft.voters),
            "members": [
                {
                    "id": node,
                    "address": f"{addresses[node][0]}:{addresses[node][1]}"
                    if node in addresses
                    else None,
                    "connected": node == raft.node_id
                    or (transport is not None and transport.connected(node)),
                }
                for node in raft.voters
            ],
            "peers_connected": sorted(
                n for n in (transport.addresses if transport else ()) if transport.connected(n)
            ),
            "removed": self.removed,
            "ready_count": self.ready_count,
            "entries_persisted": self.entries_persisted,
            "persist_ms_total": round(self.persist_s_total * 1000, 3),
            "persist_ms_max": round(self.persist_s_max * 1000, 3),
            "frames_dropped": self.transport.stats.frames_dropped if self.transport else 0,
            "disk_full_retries": self.disk_full_retries,
        }


def _lose(future: asyncio.Future[Applied], reason: str) -> None:
    if not future.done():
        future.set_exception(ProposalLost(reason))

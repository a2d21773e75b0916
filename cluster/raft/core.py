"""A sans-I/O Raft core, shaped like etcd-io/raft's RawNode.

No sockets, no clock, no disk and no global randomness inside: the host feeds it `tick()`,
`step(message)`, `propose(...)` and reads back `Ready` batches. One core serves the
production node (asyncio transport + fsynced storage) and the deterministic simulator
(`sim.py`), which is how it is shown to be correct.

Contract
========

Host loop::

    node.tick() / node.step(m) / node.propose(data) / node.read_index(ctx) ...
    if node.has_ready():
        rd = node.ready()
        storage: if rd.snapshot: discard the whole stored log, store rd.snapshot
                 if rd.entries: truncate stored entries with index >= rd.entries[0].index,
                                then append rd.entries
                 if rd.hard_state: store it
                 fsync
        send rd.messages (only now: votes and acks promise durable state)
        apply rd.snapshot.data (if any), then rd.committed in order, then serve
              rd.read_states whose index <= applied index
        node.advance(rd)

`ready()` hands over everything it returns at once; until `advance(rd)` is called,
`has_ready()` is False, but `tick()`, `step()` and the proposal methods may still be called
(a host whose fsync runs in a thread keeps receiving). Ready batches must be persisted and
acted on in the order they were returned.

Restart: construct `RaftNode(config, voters, rng, hard_state=..., snapshot=..., entries=...)`
from what storage holds (entries after the snapshot). The configuration is rebuilt from the
last CONFIG entry in `entries`, else `snapshot.voters`, else the `voters` argument (the
bootstrap set; a node that is joining an existing cluster passes the voters it was told
about, without itself, or `()`). The applied index restarts at the snapshot index: the host
restores its state machine from the snapshot and the first Ready re-delivers the committed
entries after it. A node id names one disk: never start an empty node under an id that was
ever a member (a leader, even a stale one, remembers what the old disk acknowledged and
would send it a commit index beyond its log); give a replacement machine a new id, add it,
and remove the old id.

`compact(index, data)` returns the `Snapshot` it made; the host stores it and drops stored
entries <= index itself (it is not repeated in a Ready, whose `snapshot` field is only for
snapshots received from a leader, which the host must install).

Public API (beyond the issue's contract, all optional to use):

* `RaftNode` read-only: node_id, term, vote, leader_id, role ('follower' | 'pre_candidate' |
  'candidate' | 'leader', also the constants FOLLOWER, PRE_CANDIDATE, CANDIDATE, LEADER),
  commit_index, applied_index (last committed index handed out in a Ready), first_index,
  last_index, snapshot, voters, lead_transferee; term_at(index) and
  entries_between(lo, hi) for inspection.
* Methods: tick, step, propose, propose_host, propose_membership(add= | remove=),
  membership_change (its checks alone), transfer_leadership,
  read_index, compact (returns the Snapshot), has_ready, ready, advance.
* `RaftConfig` bounds: max_entries_per_append, max_append_bytes, max_inflight_appends,
  max_pending_reads, max_uncommitted_entries (propose raises ProposalRefused beyond it),
  max_committed_per_ready, append_stall_heartbeats_max.
* Leader-side overlap: a host may send a leader's Ready messages before its own fsync if
  the Ready carries no snapshot and no unsynced term/vote change (node.py does; sim.py
  simulates it), because commits computed from the acks that answer them are only handed
  out in a later Ready, after this one is durable.

Messages (`messages.py`): PRE_VOTE(_RESP), VOTE(_RESP), APPEND(_RESP), HEARTBEAT(_RESP),
SNAPSHOT (answered by APPEND_RESP), TIMEOUT_NOW, READ_INDEX(_RESP).

Errors: `propose*` raise `NotLeader(leader_id)` on a non-leader and `ProposalRefused` when a
leader cannot take the proposal now (leadership transfer in progress, another membership
change not yet committed, no entry of its term committed yet, bad arguments).

Design choices
==============

* Elections: randomized timeout in [election_ticks, 2*election_ticks); pre-vote (§9.6) so a
  partitioned node that rejoins cannot disrupt a working leader by bumping the term; a voter
  that heard from a leader within the last election timeout ignores (pre-)votes for a higher
  term ("lease" check, as in etcd) unless the vote comes from a leadership transfer.
* Check-quorum: every election_ticks a leader checks that a quorum (itself included) sent
  it any response since the last check, and steps down otherwise.
* Replication: per-follower progress in probe / replicate / snapshot state (etcd's model).
  In replicate state appends are pipelined up to max_inflight_appends messages of at most
  max_entries_per_append entries / max_append_bytes bytes each. Rejections carry a hint
  (follower's largest index <= the rejected one whose term is <= the leader's term there),
  so a follower's divergent tail is skipped one term per round trip, not one entry. A
  follower whose match has not moved across append_stall_heartbeats_max heartbeat responses
  goes back to probe, which re-sends lost appends (the simulator loses messages; TCP would
  not help after a reconnect either).
* Commit: the leader advances commit to the quorum-replicated index only if that entry is of
  its current term (Figure 8); every new leader appends a NOOP to get there.
* Membership: single-server changes (Ongaro's dissertation §4.1). The CONFIG entry takes
  effect on every node when appended and is undone if that entry is truncated; a leader
  refuses a change while an earlier one is uncommitted and until it has committed an entry
  of its own term (the fix for the single-server-change bug reported on raft-dev in 2015).
  A leader that removes itself keeps leading until the change commits, not counting itself,
  then steps down. Nodes outside the voter set never campaign.
* Leadership transfer (§3.10): the leader stops taking proposals, brings the target up to
  date and sends TIMEOUT_NOW; the transfer is abandoned after one election timeout.
* Linearizable reads: ReadIndex (§6.4), not leases. A lease is only safe if clocks drift
  within a bound, and the simulator deliberately drifts tick rates without bound; ReadIndex
  costs one heartbeat round but depends on nothing but messages. The leader records its
  commit index, confirms it is still leader with a heartbeat round carrying a round id, and
  releases the read once a quorum answered that round (or any later one). A new leader
  defers reads until it has committed an entry of its term, since before that its commit
  index may lag the true one. Followers forward reads to the leader (READ_INDEX).
"""

from __future__ import annotations

import random
import struct
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from warrenmq.cluster.raft.messages import (
    Entry,
    EntryKind,
    Message,
    MessageKind,
    Snapshot,
    decode_voters,
    encode_voters,
)

__all__ = [
    "CANDIDATE",
    "FOLLOWER",
    "LEADER",
    "PRE_CANDIDATE",
    "Entry",
    "EntryKind",
    "HardState",
    "Message",
    "MessageKind",
    "NotLeader",
    "ProposalRefused",
    "RaftConfig",
    "RaftError",
    "RaftNode",
    "ReadState",
    "Ready",
    "Snapshot",
]

FOLLOWER = "follower"
PRE_CANDIDATE = "pre_candidate"
CANDIDATE = "candidate"
LEADER = "leader"

_TRANSFER_CONTEXT = b"transfer"
_ROUND_ID = struct.Struct("<Q")

_PROBE = 0
_REPLICATE = 1
_SNAPSHOT = 2


class RaftError(Exception):
    """Base of the errors the core raises to its caller."""


class NotLeader(RaftError):
    def __init__(self, leader_id: int | None) -> None:
        super().__init__(f"not the leader; leader is {leader_id}")
        self.leader_id = leader_id


class ProposalRefused(RaftError):
    """The leader cannot accept this proposal now; retrying later may succeed."""


@dataclass(frozen=True, slots=True)
class HardState:
    term: int
    vote: int | None
    commit: int


@dataclass(frozen=True, slots=True)
class ReadState:
    """A linearizable read is safe to serve once the applied index is >= `index`."""

    index: int
    context: bytes


@dataclass
class Ready:
    hard_state: HardState | None
    entries: list[Entry]
    snapshot: Snapshot | None
    messages: list[Message]
    committed: list[Entry]
    read_states: list[ReadState]


@dataclass(frozen=True)
class RaftConfig:
    node_id: int
    election_ticks: int = 10
    heartbeat_ticks: int = 1
    pre_vote: bool = True
    check_quorum: bool = True
    max_entries_per_append: int = 64
    max_append_bytes: int = 1 << 20
    max_inflight_appends: int = 256
    max_pending_reads: int = 4096
    max_uncommitted_entries: int = 1 << 16
    max_committed_per_ready: int = 4096
    # A follower whose match index stays put across this many heartbeat responses while it
    # lags is assumed to have lost appends (or a snapshot) and is probed again.
    append_stall_heartbeats_max: int = 2

    def __post_init__(self) -> None:
        if self.node_id <= 0:
            raise ValueError("node_id must be positive (0 means 'none' on the wire)")
        if self.heartbeat_ticks < 1 or self.election_ticks <= self.heartbeat_ticks:
            raise ValueError("need 1 <= heartbeat_ticks < election_ticks")
        if (
            min(
                self.max_entries_per_append,
                self.max_inflight_appends,
                self.max_committed_per_ready,
                self.max_pending_reads,
            )
            < 1
        ):
            raise ValueError("batch, pipeline and queue bounds must be >= 1")


@dataclass(slots=True)
class _Progress:
    """What the leader knows about one follower's log."""

    match: int = 0
    next: int = 1
    state: int = _PROBE
    probe_sent: bool = False  # probe state: one append is out, wait for its answer
    # The last index of each pipelined append not yet acknowledged.
    inflight: deque[int] = field(default_factory=deque)
    pending_snapshot: int = 0
    recent_active: bool = False
    match_at_heartbeat: int = -1
    stalled_heartbeats: int = 0

    def become_probe(self) -> None:
        self.state = _PROBE
        self.next = self.match + 1
        self.probe_sent = False
        self.inflight.clear()
        self.stalled_heartbeats = 0

    def become_replicate(self) -> None:
        self.state = _REPLICATE
        self.next = self.match + 1
        self.probe_sent = False
        self.inflight.clear()
        self.stalled_heartbeats = 0


@dataclass(slots=True)
class _PendingRead:
    round_id: int
    index: int
    context: bytes
    requester: int  # node id to answer, or our own id for a local ReadState
    acks: set[int]


class RaftNode:
    def __init__(
        self,
        config: RaftConfig,
        voters: tuple[int, ...],
        rng: random.Random,
        *,
        hard_state: HardState | None = None,
        snapshot: Snapshot | None = None,
        entries: Sequence[Entry] = (),
    ) -> None:
        self._config = config
        self._id = config.node_id
        self._rng = rng
        self._snapshot = snapshot
        snap_index = snapshot.index if snapshot is not None else 0
        self._snap_index = snap_index
        self._snap_term = snapshot.term if snapshot is not None else 0
        self._entries: list[Entry] = list(entries)
        for offset, entry in enumerate(self._entries):
            if entry.index != snap_index + 1 + offset:
                raise ValueError(f"entry {entry.index} out of place after snapshot {snap_index}")
        self._base_voters: tuple[int, ...] = (
            tuple(sorted(snapshot.voters)) if snapshot is not None else tuple(sorted(set(voters)))
        )
        self._config_entries: list[tuple[int, tuple[int, ...]]] = [
            (e.index, decode_voters(e.data)) for e in self._entries if e.kind == EntryKind.CONFIG
        ]
        self._voters = self._current_voters()

        hs = hard_state if hard_state is not None else HardState(0, None, 0)
        self._term = hs.term
        self._vote = hs.vote
        self._commit = max(hs.commit, snap_index)
        if self._commit > self.last_index:
            raise ValueError(f"commit {self._commit} beyond last index {self.last_index}")
        self._applied = snap_index
        self._role = FOLLOWER
        self._leader_id: int | None = None

        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._randomized_timeout = self._config.election_ticks
        self._votes: dict[int, bool] = {}
        self._progress: dict[int, _Progress] = {}
        self._transferee: int | None = None
        self._read_round = 0
        self._pending_reads: deque[_PendingRead] = deque()
        self._deferred_reads: list[tuple[bytes, int]] = []

        # Ready bookkeeping: everything from _unstable_from on has not been handed out yet.
        self._unstable_from = self.last_index + 1
        self._outbox: list[Message] = []
        self._read_states: list[ReadState] = []
        self._pending_snapshot: Snapshot | None = None
        self._handed_hard_state = HardState(self._term, self._vote, self._commit)
        self._ready_outstanding: Ready | None = None
        self._appends_pending = False  # proposals not yet offered to the followers
        self._reset_randomized_timeout()

    # ---------------------------------------------------------------- read-only properties

    @property
    def node_id(self) -> int:
        return self._id

    @property
    def term(self) -> int:
        return self._term

    @property
    def vote(self) -> int | None:
        return self._vote

    @property
    def leader_id(self) -> int | None:
        return self._leader_id

    @property
    def role(self) -> str:
        return self._role

    @property
    def commit_index(self) -> int:
        return self._commit

    @property
    def applied_index(self) -> int:
        """Index of the last committed entry handed out in a Ready (or the snapshot index)."""
        return self._applied

    @property
    def last_index(self) -> int:
        return self._snap_index + len(self._entries)

    @property
    def first_index(self) -> int:
        """Index of the first entry still held in the log (snapshot index + 1)."""
        return self._snap_index + 1

    @property
    def snapshot(self) -> Snapshot | None:
        return self._snapshot

    @property
    def voters(self) -> tuple[int, ...]:
        return self._voters

    @property
    def lead_transferee(self) -> int | None:
        return self._transferee

    def term_at(self, index: int) -> int | None:
        """Term of the entry at `index`, the snapshot's term at its index, 0 at index 0, or
        None if the entry was compacted away or does not exist."""
        if index == self._snap_index:
            return self._snap_term
        offset = index - self._snap_index - 1
        if 0 <= offset < len(self._entries):
            return self._entries[offset].term
        return None

    def entries_between(self, lo: int, hi: int) -> list[Entry]:
        """Entries with lo <= index < hi that are still held (not compacted)."""
        start = max(lo, self.first_index) - self.first_index
        stop = min(hi, self.last_index + 1) - self.first_index
        return self._entries[start:stop] if stop > start else []

    # ---------------------------------------------------------------- inputs

    def tick(self) -> None:
        if self._role == LEADER:
            self._tick_leader()
            return
        self._election_elapsed += 1
        if self._election_elapsed >= self._randomized_timeout and self._promotable():
            self._election_elapsed = 0
            self._campaign(transfer=False)

    def step(self, message: Message) -> None:
        m = message
        if m.dst != self._id:
            raise ValueError(f"message for {m.dst} stepped into node {self._id}")
        elapsed_before = self._election_elapsed
        if m.term > self._term:
            if m.kind in (MessageKind.PRE_VOTE, MessageKind.VOTE):
                forced = m.context == _TRANSFER_CONTEXT
                in_lease = (
                    self._config.check_quorum
                    and self._leader_id is not None
                    and self._election_elapsed < self._config.election_ticks
                )
                if in_lease and not forced:
                    # We heard from a live leader within the election timeout: this candidate
                    # is a disruptive (re)joiner; ignore it rather than bump our term.
                    return
            if m.kind == MessageKind.PRE_VOTE:
                pass  # a pre-vote never changes our term
            elif m.kind == MessageKind.PRE_VOTE_RESP and not m.reject:
                pass  # granted pre-votes carry the term we would campaign for
            elif m.kind in (
                MessageKind.APPEND,
                MessageKind.HEARTBEAT,
                MessageKind.SNAPSHOT,
            ):
                self._become_follower(m.term, m.src)
            else:
                self._become_follower(m.term, None)
        elif m.term < self._term:
            if m.kind in (MessageKind.APPEND, MessageKind.HEARTBEAT) and (
                self._config.check_quorum or self._config.pre_vote
            ):
                # A stale leader (cut off while we moved on) would otherwise never learn of
                # our term, and with pre-vote we would never raise it further: answer so that
                # it steps down and a real election can happen.
                self._send(Message(MessageKind.APPEND_RESP, self._id, m.src, self._term))
            elif m.kind in (MessageKind.PRE_VOTE, MessageKind.VOTE):
                # Tell a candidate from an older term ours (Figure 2: the reply carries
                # currentTerm); otherwise a candidate whose only possible voter keeps
                # raising its own term may never catch up with it.
                resp_kind = (
                    MessageKind.PRE_VOTE_RESP
                    if m.kind == MessageKind.PRE_VOTE
                    else MessageKind.VOTE_RESP
                )
                self._send(Message(resp_kind, self._id, m.src, self._term, reject=True))
            return

        kind = m.kind
        if kind in (MessageKind.PRE_VOTE, MessageKind.VOTE):
            granted = self._handle_vote_request(m)
            if kind == MessageKind.VOTE and not granted and self._role == FOLLOWER:
                # Only a granted vote or a leader restarts the election timer (Figure 2).
                # A candidate we refused, which keeps coming back with higher terms, would
                # otherwise keep us, the better candidate, from ever timing out.
                self._election_elapsed = elapsed_before
        elif self._role == LEADER:
            self._step_leader(m)
        elif self._role in (CANDIDATE, PRE_CANDIDATE):
            self._step_candidate(m)
        else:
            self._step_follower(m)

    def propose(self, data: bytes) -> int:
        return self._propose(EntryKind.NORMAL, data)

    def propose_host(self, data: bytes) -> int:
        """Append a HOST entry: data for the host itself, not its state machine."""
        return self._propose(EntryKind.HOST, data)

    def propose_membership(self, add: int | None = None, remove: int | None = None) -> int:
        voters = self.membership_change(add=add, remove=remove)
        return self._propose(EntryKind.CONFIG, encode_voters(voters))

    def membership_change(
        self, add: int | None = None, remove: int | None = None
    ) -> tuple[int, ...]:
        """The voter set that `propose_membership` would propose; raises NotLeader or
        ProposalRefused, as it would, if the change cannot be proposed now."""
        if (add is None) == (remove is None):
            raise ProposalRefused("give exactly one of add= or remove=")
        self._check_leader()
        if self._config_entries and self._config_entries[-1][0] > self._commit:
            raise ProposalRefused("an earlier membership change is not committed yet")
        if self.term_at(self._commit) != self._term:
            raise ProposalRefused("the leader has not committed an entry of its term yet")
        voters = set(self._voters)
        if add is not None:
            if add <= 0 or add in voters:
                raise ProposalRefused(f"cannot add {add} to {sorted(voters)}")
            voters.add(add)
        else:
            if remove not in voters or len(voters) == 1:
                raise ProposalRefused(f"cannot remove {remove} from {sorted(voters)}")
            voters.discard(remove)
        return tuple(sorted(voters))

    def transfer_leadership(self, to: int) -> None:
        self._check_leader()
        if to == self._id:
            return
        if to not in self._voters:
            raise ProposalRefused(f"{to} is not a voter")
        self._transferee = to
        # The transfer gets one election timeout to finish; _tick_leader abandons it after.
        self._election_elapsed = 0
        pr = self._progress[to]
        if pr.match == self.last_index:
            self._send(Message(MessageKind.TIMEOUT_NOW, self._id, to, self._term))
        else:
            self._send_append(to)

    def read_index(self, context: bytes) -> None:
        if self._role == LEADER:
            self._leader_read(context, self._id)
        elif self._leader_id is not None:
            self._send(
                Message(
                    MessageKind.READ_INDEX,
                    self._id,
                    self._leader_id,
                    self._term,
                    context=context,
                )
            )
        # With no known leader the read is dropped; the caller times out and retries, as it
        # must anyway for a read lost in the network.

    def compact(self, index: int, snapshot_data: bytes) -> Snapshot:
        if index <= self._snap_index:
            raise ValueError(f"compact({index}) at or below snapshot {self._snap_index}")
        if index > self._applied:
            raise ValueError(f"compact({index}) beyond applied index {self._applied}")
        term = self.term_at(index)
        assert term is not None
        snapshot = Snapshot(index, term, self._voters_at(index), snapshot_data)
        del self._entries[: index - self._snap_index]
        self._snapshot = snapshot
        self._snap_index = index
        self._snap_term = term
        self._base_voters = snapshot.voters
        self._config_entries = [(i, v) for i, v in self._config_entries if i > index]
        return snapshot

    # ---------------------------------------------------------------- outputs

    def has_ready(self) -> bool:
        if self._ready_outstanding is not None:
            return False
        return bool(
            self._outbox
            or self._read_states
            or self._pending_snapshot is not None
            or self._unstable_from <= self.last_index
            or self._applied < self._commit
            or self._term != self._handed_hard_state.term
            or self._vote != self._handed_hard_state.vote
            or self._commit != self._handed_hard_state.commit
        )

    def ready(self) -> Ready:
        if self._ready_outstanding is not None:
            raise RuntimeError("ready() called again before advance()")
        if self._appends_pending:
            self._appends_pending = False
            if self._role == LEADER:
                for peer in self._progress:
                    self._send_appends(peer)
        hs = self._hard_state()
        entries = self.entries_between(self._unstable_from, self.last_index + 1)
        # Bounded so that a restart with a long committed tail does not build one huge
        # batch; has_ready() stays true until the rest has been handed out.
        apply_to = min(self._commit, self._applied + self._config.max_committed_per_ready)
        committed = self.entries_between(self._applied + 1, apply_to + 1)
        rd = Ready(
            hard_state=hs if hs != self._handed_hard_state else None,
            entries=entries,
            snapshot=self._pending_snapshot,
            messages=self._outbox,
            committed=committed,
            read_states=self._read_states,
        )
        self._handed_hard_state = hs
        self._unstable_from = self.last_index + 1
        if committed:
            self._applied = committed[-1].index
        self._outbox = []
        self._read_states = []
        self._pending_snapshot = None
        self._ready_outstanding = rd
        return rd

    def advance(self, ready: Ready) -> None:
        if ready is not self._ready_outstanding:
            raise RuntimeError("advance() with a Ready that is not the outstanding one")
        self._ready_outstanding = None

    # ---------------------------------------------------------------- internals: log

    def _hard_state(self) -> HardState:
        return HardState(self._term, self._vote, self._commit)

    def _last_term(self) -> int:
        return self._entries[-1].term if self._entries else self._snap_term

    def _append(self, entries: Sequence[Entry]) -> None:
        """Append entries that directly follow our last index."""
        for e in entries:
            assert e.index == self.last_index + 1, (e.index, self.last_index)
            self._entries.append(e)
            if e.kind == EntryKind.CONFIG:
                self._config_entries.append((e.index, decode_voters(e.data)))
                self._on_config_change()

    def _truncate_from(self, index: int) -> None:
        """Drop entries with index >= `index` (a conflicting, uncommitted suffix)."""
        assert index > self._commit, f"truncating committed entry {index} <= {self._commit}"
        del self._entries[index - self._snap_index - 1 :]
        self._unstable_from = min(self._unstable_from, index)
        if self._config_entries and self._config_entries[-1][0] >= index:
            self._config_entries = [(i, v) for i, v in self._config_entries if i < index]
            self._on_config_change()

    def _find_conflict_by_term(self, index: int, term: int) -> int:
        """Largest i <= index whose term is <= `term` (or the snapshot index)."""
        index = min(index, self.last_index)
        while index > self._snap_index:
            t = self.term_at(index)
            if t is not None and t <= term:
                break
            index -= 1
        return index

    def _commit_to(self, index: int) -> None:
        if index > self._commit:
            assert index <= self.last_index, (index, self.last_index)
            self._commit = index

    # ---------------------------------------------------------------- internals: config

    def _current_voters(self) -> tuple[int, ...]:
        return self._config_entries[-1][1] if self._config_entries else self._base_voters

    def _voters_at(self, index: int) -> tuple[int, ...]:
        voters = self._base_voters
        for i, v in self._config_entries:
            if i > index:
                break
            voters = v
        return voters

    def _on_config_change(self) -> None:
        self._voters = self._current_voters()
        if self._role != LEADER:
            return
        for peer in self._voters:
            if peer != self._id and peer not in self._progress:
                pr = _Progress(next=self.last_index + 1)
                pr.recent_active = True  # do not count a brand new member against the quorum
                self._progress[peer] = pr
        for peer in list(self._progress):
            if peer not in self._voters:
                del self._progress[peer]
        if self._transferee is not None and self._transferee not in self._voters:
            self._transferee = None

    def _promotable(self) -> bool:
        return self._id in self._voters

    def _quorum(self) -> int:
        return len(self._voters) // 2 + 1

    # ---------------------------------------------------------------- internals: roles

    def _reset_randomized_timeout(self) -> None:
        n = self._config.election_ticks
        self._randomized_timeout = n + self._rng.randrange(n)

    def _reset(self, term: int) -> None:
        if term != self._term:
            self._term = term
            self._vote = None
        self._leader_id = None
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._reset_randomized_timeout()
        self._votes = {}
        self._progress = {}
        self._transferee = None
        self._pending_reads.clear()
        self._deferred_reads.clear()

    def _become_follower(self, term: int, leader_id: int | None) -> None:
        self._reset(term)
        self._role = FOLLOWER
        self._leader_id = leader_id

    def _campaign(self, transfer: bool) -> None:
        if not self._config.pre_vote or transfer:
            self._start_election(transfer)
            return
        self._reset(self._term)
        self._role = PRE_CANDIDATE
        self._votes[self._id] = True
        if not self._tally_votes():
            self._request_votes(MessageKind.PRE_VOTE, self._term + 1, b"")

    def _start_election(self, transfer: bool) -> None:
        self._reset(self._term + 1)
        self._role = CANDIDATE
        self._vote = self._id
        self._votes[self._id] = True
        if not self._tally_votes():
            context = _TRANSFER_CONTEXT if transfer else b""
            self._request_votes(MessageKind.VOTE, self._term, context)

    def _request_votes(self, kind: MessageKind, term: int, context: bytes) -> None:
        last_index, last_term = self.last_index, self._last_term()
        for peer in self._voters:
            if peer != self._id:
                self._send(
                    Message(
                        kind,
                        self._id,
                        peer,
                        term,
                        log_term=last_term,
                        index=last_index,
                        context=context,
                    )
                )

    def _tally_votes(self) -> bool:
        """Act on the votes so far; True if the election is decided."""
        granted = sum(1 for v in self._votes.values() if v)
        rejected = len(self._votes) - granted
        quorum = self._quorum()
        if granted >= quorum:
            if self._role == PRE_CANDIDATE:
                self._start_election(transfer=False)
            else:
                self._become_leader()
            return True
        if rejected > len(self._voters) - quorum:
            self._become_follower(self._term, None)
            return True
        return False

    def _become_leader(self) -> None:
        assert self._role == CANDIDATE
        self._reset(self._term)
        self._role = LEADER
        self._leader_id = self._id
        last = self.last_index
        for peer in self._voters:
            if peer != self._id:
                pr = _Progress(next=last + 1)
                pr.recent_active = True
                self._progress[peer] = pr
        self._append([Entry(self._term, last + 1, EntryKind.NOOP, b"")])
        self._maybe_commit()
        self._broadcast_append()

    # ---------------------------------------------------------------- internals: voting

    def _handle_vote_request(self, m: Message) -> bool:
        pre = m.kind == MessageKind.PRE_VOTE
        can_vote = (
            self._vote == m.src
            or (self._vote is None and self._leader_id is None)
            or (pre and m.term > self._term)
        )
        up_to_date = self._log_up_to_date(m.log_term, m.index)
        resp_kind = MessageKind.PRE_VOTE_RESP if pre else MessageKind.VOTE_RESP
        if can_vote and up_to_date:
            self._send(Message(resp_kind, self._id, m.src, m.term))
            if not pre:
                self._vote = m.src
                self._election_elapsed = 0
            return True
        self._send(Message(resp_kind, self._id, m.src, self._term, reject=True))
        return False

    def _log_up_to_date(self, last_term: int, last_index: int) -> bool:
        """Is a log ending at (last_term, last_index) at least as up to date as ours (§5.4.1)?"""
        return (last_term, last_index) >= (self._last_term(), self.last_index)

    def _step_candidate(self, m: Message) -> None:
        kind = m.kind
        if kind in (MessageKind.APPEND, MessageKind.HEARTBEAT, MessageKind.SNAPSHOT):
            # A leader exists for our term (a candidate) or a term we could not have won (a
            # pre-candidate, whose term is not raised): follow it.
            self._become_follower(m.term, m.src)
            self._step_follower(m)
        elif (kind == MessageKind.PRE_VOTE_RESP and self._role == PRE_CANDIDATE) or (
            kind == MessageKind.VOTE_RESP and self._role == CANDIDATE
        ):
            if m.src in self._voters:
                self._votes.setdefault(m.src, not m.reject)
                self._tally_votes()

    # ---------------------------------------------------------------- internals: follower

    def _step_follower(self, m: Message) -> None:
        kind = m.kind
        if kind == MessageKind.APPEND:
            self._election_elapsed = 0
            self._leader_id = m.src
            self._handle_append(m)
        elif kind == MessageKind.HEARTBEAT:
            self._election_elapsed = 0
            self._leader_id = m.src
            self._commit_to(m.commit)
            self._send(
                Message(
                    MessageKind.HEARTBEAT_RESP,
                    self._id,
                    m.src,
                    self._term,
                    context=m.context,
                )
            )
        elif kind == MessageKind.SNAPSHOT:
            self._election_elapsed = 0
            self._leader_id = m.src
            self._handle_snapshot(m)
        elif kind == MessageKind.TIMEOUT_NOW:
            if self._promotable():
                self._campaign(transfer=True)
        elif kind == MessageKind.READ_INDEX_RESP:
            if not m.reject:
                self._read_states.append(ReadState(m.index, m.context))

    def _handle_append(self, m: Message) -> None:
        if m.index < self._commit:
            # Everything up to our commit index matches the leader already; this is a stale
            # or duplicated append.
            self._send(
                Message(
                    MessageKind.APPEND_RESP,
                    self._id,
                    m.src,
                    self._term,
                    index=self._commit,
                )
            )
            return
        if self.term_at(m.index) == m.log_term:
            new = m.entries
            for pos, e in enumerate(new):
                if self.term_at(e.index) != e.term:
                    if e.index <= self.last_index:
                        self._truncate_from(e.index)
                    self._append(new[pos:])
                    break
            last_new = m.index + len(new)
            self._commit_to(min(m.commit, last_new))
            self._send(
                Message(MessageKind.APPEND_RESP, self._id, m.src, self._term, index=last_new)
            )
            return
        hint = self._find_conflict_by_term(min(m.index, self.last_index), m.log_term)
        self._send(
            Message(
                MessageKind.APPEND_RESP,
                self._id,
                m.src,
                self._term,
                index=m.index,
                reject=True,
                reject_hint=hint,
                log_term=self.term_at(hint) or 0,
            )
        )

    def _handle_snapshot(self, m: Message) -> None:
        snap = m.snapshot
        assert snap is not None
        if snap.index <= self._commit:
            reply_index = self._commit
        elif self.term_at(snap.index) == snap.term:
            # We already hold the snapshot's last entry: our log matches up to there, so just
            # learn that it is committed and keep the entries after it.
            self._commit_to(snap.index)
            reply_index = snap.index
        else:
            self._restore(snap)
            reply_index = snap.index
        self._send(Message(MessageKind.APPEND_RESP, self._id, m.src, self._term, index=reply_index))

    def _restore(self, snap: Snapshot) -> None:
        self._entries = []
        self._snapshot = snap
        self._snap_index = snap.index
        self._snap_term = snap.term
        self._base_voters = tuple(sorted(snap.voters))
        self._config_entries = []
        self._voters = self._base_voters
        self._commit = snap.index
        self._applied = snap.index
        self._unstable_from = snap.index + 1
        self._pending_snapshot = snap

    # ---------------------------------------------------------------- internals: leader

    def _check_leader(self) -> None:
        if self._role != LEADER:
            raise NotLeader(self._leader_id)
        if self._transferee is not None:
            raise ProposalRefused(f"leadership is being transferred to {self._transferee}")

    def _propose(self, kind: EntryKind, data: bytes) -> int:
        self._check_leader()
        if self.last_index - self._commit >= self._config.max_uncommitted_entries:
            raise ProposalRefused("too many uncommitted entries")
        index = self.last_index + 1
        self._append([Entry(self._term, index, kind, data)])
        self._maybe_commit()
        # Sent at the next ready(): a burst of proposals then leaves as a few full
        # appends rather than one message per entry.
        self._appends_pending = True
        return index

    def _tick_leader(self) -> None:
        self._heartbeat_elapsed += 1
        self._election_elapsed += 1
        if self._election_elapsed >= self._config.election_ticks:
            self._election_elapsed = 0
            if self._config.check_quorum:
                active = sum(
                    1
                    for peer in self._voters
                    if peer == self._id or self._progress[peer].recent_active
                )
                if active < self._quorum():
                    self._become_follower(self._term, None)
                    return
                for pr in self._progress.values():
                    pr.recent_active = False
            self._transferee = None
        if self._heartbeat_elapsed >= self._config.heartbeat_ticks:
            self._heartbeat_elapsed = 0
            # Carry the newest read round so that reads whose own round was lost still
            # complete: a quorum acking any later round releases every earlier read.
            context = b""
            if self._pending_reads:
                context = _ROUND_ID.pack(self._pending_reads[-1].round_id)
            self._broadcast_heartbeat(context)

    def _commit_allowed(self, index: int) -> bool:
        """Raft's commit rule (§5.4.2): count replicas only for entries of the current term."""
        return self.term_at(index) == self._term

    def _maybe_commit(self) -> bool:
        matches = [
            self.last_index if peer == self._id else self._progress[peer].match
            for peer in self._voters
        ]
        matches.sort(reverse=True)
        candidate = matches[self._quorum() - 1]
        if candidate <= self._commit or not self._commit_allowed(candidate):
            return False
        self._commit = candidate
        if self._deferred_reads and self.term_at(self._commit) == self._term:
            deferred, self._deferred_reads = self._deferred_reads, []
            for context, requester in deferred:
                self._leader_read(context, requester)
        if (
            self._id not in self._voters
            and self._config_entries
            and self._config_entries[-1][0] <= self._commit
        ):
            # We removed ourselves and the change is committed: hand over by stepping down;
            # a remaining voter times out and is elected.
            self._become_follower(self._term, None)
        return True

    def _send(self, m: Message) -> None:
        self._outbox.append(m)

    def _send_append(self, peer: int, send_empty: bool = True) -> bool:
        """Send the next append (or snapshot) to `peer` if its progress allows; True if sent."""
        pr = self._progress[peer]
        if pr.state == _SNAPSHOT:
            return False
        if pr.state == _PROBE and pr.probe_sent:
            return False
        if pr.state == _REPLICATE and len(pr.inflight) >= self._config.max_inflight_appends:
            return False
        prev = pr.next - 1
        prev_term = self.term_at(prev)
        if prev_term is None:
            return self._send_snapshot(peer, pr)
        entries = self._batch_from(pr.next)
        if not entries and not send_empty:
            return False
        self._send(
            Message(
                MessageKind.APPEND,
                self._id,
                peer,
                self._term,
                log_term=prev_term,
                index=prev,
                commit=self._commit,
                entries=entries,
            )
        )
        if pr.state == _REPLICATE:
            if entries:
                pr.next = entries[-1].index + 1
                pr.inflight.append(entries[-1].index)
        else:
            pr.probe_sent = True
        return True

    def _send_appends(self, peer: int) -> None:
        """Send `peer` every unsent entry that its progress state and pipeline allow."""
        pr = self._progress[peer]
        while self._send_append(peer, send_empty=False):
            if pr.state != _REPLICATE:
                break

    def _batch_from(self, index: int) -> tuple[Entry, ...]:
        start = index - self._snap_index - 1
        if start >= len(self._entries):
            return ()
        batch = []
        size = 0
        for e in self._entries[start : start + self._config.max_entries_per_append]:
            size += len(e.data)
            if batch and size > self._config.max_append_bytes:
                break
            batch.append(e)
        return tuple(batch)

    def _send_snapshot(self, peer: int, pr: _Progress) -> bool:
        snap = self._snapshot
        assert snap is not None, "entries compacted without a snapshot"
        self._send(Message(MessageKind.SNAPSHOT, self._id, peer, self._term, snapshot=snap))
        pr.state = _SNAPSHOT
        pr.pending_snapshot = snap.index
        pr.inflight.clear()
        pr.stalled_heartbeats = 0
        return True

    def _broadcast_append(self, send_empty: bool = True) -> None:
        for peer in self._progress:
            self._send_append(peer, send_empty)

    def _broadcast_heartbeat(self, context: bytes) -> None:
        for peer, pr in self._progress.items():
            self._send(
                Message(
                    MessageKind.HEARTBEAT,
                    self._id,
                    peer,
                    self._term,
                    commit=min(pr.match, self._commit),
                    context=context,
                )
            )

    def _step_leader(self, m: Message) -> None:
        kind = m.kind
        if kind == MessageKind.READ_INDEX:
            self._leader_read(m.context, m.src)
            return
        pr = self._progress.get(m.src)
        if pr is None:
            return  # not (or no longer) a member
        if kind == MessageKind.APPEND_RESP:
            pr.recent_active = True
            if m.reject:
                self._handle_append_reject(m.src, pr, m)
            else:
                self._handle_append_ack(m.src, pr, m.index)
        elif kind == MessageKind.HEARTBEAT_RESP:
            pr.recent_active = True
            self._handle_heartbeat_resp(m.src, pr, m)

    def _handle_append_ack(self, peer: int, pr: _Progress, index: int) -> None:
        if index > pr.match:
            pr.match = index
            pr.next = max(pr.next, index + 1)
            pr.stalled_heartbeats = 0
            if pr.state == _PROBE or (pr.state == _SNAPSHOT and index >= pr.pending_snapshot):
                pr.become_replicate()
            elif pr.state == _REPLICATE:
                while pr.inflight and pr.inflight[0] <= index:
                    pr.inflight.popleft()
            if self._maybe_commit():
                if self._role != LEADER:
                    return
                self._broadcast_append(send_empty=True)
        elif pr.state == _PROBE:
            pr.probe_sent = False
        self._send_appends(peer)
        if peer == self._transferee and pr.match == self.last_index:
            self._send(Message(MessageKind.TIMEOUT_NOW, self._id, peer, self._term))

    def _handle_append_reject(self, peer: int, pr: _Progress, m: Message) -> None:
        if pr.state == _SNAPSHOT:
            return
        if pr.state == _REPLICATE and m.index <= pr.match:
            return  # stale: that prefix is known to match already
        if pr.state == _PROBE and m.index != pr.next - 1:
            return  # stale: not the probe we are waiting for
        next_probe = m.reject_hint
        if m.log_term > 0:
            next_probe = self._find_conflict_by_term(m.reject_hint, m.log_term)
        pr.become_probe()
        pr.next = max(min(m.index, next_probe + 1), pr.match + 1)
        self._send_append(peer)

    def _handle_heartbeat_resp(self, peer: int, pr: _Progress, m: Message) -> None:
        if pr.match < self.last_index:
            if pr.match == pr.match_at_heartbeat:
                pr.stalled_heartbeats += 1
            else:
                pr.stalled_heartbeats = 0
            pr.match_at_heartbeat = pr.match
            if (
                pr.stalled_heartbeats >= self._config.append_stall_heartbeats_max
                and pr.state != _PROBE
            ):
                pr.become_probe()
            if pr.state == _PROBE:
                pr.probe_sent = False
            # In replicate state an empty append would name a previous entry that may still
            # be in flight, draw a rejection and needlessly drop the pipeline back to probe.
            self._send_append(peer, send_empty=pr.state == _PROBE)
        elif peer == self._transferee:
            # The TIMEOUT_NOW may have been lost; the target is up to date, so repeat it.
            self._send(Message(MessageKind.TIMEOUT_NOW, self._id, peer, self._term))
        if m.context:
            self._ack_read_round(peer, m.context)

    # ---------------------------------------------------------------- internals: ReadIndex

    def _leader_read(self, context: bytes, requester: int) -> None:
        if self.term_at(self._commit) != self._term:
            if len(self._deferred_reads) >= self._config.max_pending_reads:
                self._refuse_read(context, requester)
                return
            self._deferred_reads.append((context, requester))
            return
        if len(self._voters) == 1 and self._id in self._voters:
            self._release_read(self._commit, context, requester)
            return
        if len(self._pending_reads) >= self._config.max_pending_reads:
            self._refuse_read(context, requester)
            return
        self._read_round += 1
        self._pending_reads.append(
            _PendingRead(self._read_round, self._commit, context, requester, {self._id})
        )
        self._broadcast_heartbeat(_ROUND_ID.pack(self._read_round))

    def _ack_read_round(self, peer: int, context: bytes) -> None:
        if len(context) != _ROUND_ID.size:
            return
        (round_id,) = _ROUND_ID.unpack(context)
        target = None
        for read in self._pending_reads:
            if read.round_id == round_id:
                target = read
                break
        if target is None:
            return
        target.acks.add(peer)
        if sum(1 for v in target.acks if v in self._voters) < self._quorum():
            return
        # A quorum confirmed our leadership after this round started, hence after every
        # earlier read was registered too: release them all, oldest first.
        while self._pending_reads:
            read = self._pending_reads.popleft()
            self._release_read(read.index, read.context, read.requester)
            if read is target:
                break

    def _release_read(self, index: int, context: bytes, requester: int) -> None:
        if requester == self._id:
            self._read_states.append(ReadState(index, context))
        else:
            self._send(
                Message(
                    MessageKind.READ_INDEX_RESP,
                    self._id,
                    requester,
                    self._term,
                    index=index,
                    context=context,
                )
            )

    def _refuse_read(self, context: bytes, requester: int) -> None:
        if requester != self._id:
            self._send(
                Message(
                    MessageKind.READ_INDEX_RESP,
                    self._id,
                    requester,
                    self._term,
                    context=context,
                    reject=True,
                )
            )

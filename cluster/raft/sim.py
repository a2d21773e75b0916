"""Deterministic simulation of a Raft cluster under faults, with safety and liveness checks.

One seeded `random.Random` drives one event scheduler (a heap ordered by virtual time, then
by insertion). Nodes are `RaftNode` cores wrapped in a host loop that behaves like a real
one: a Ready's writes go to the node's storage as unsynced; the fsync completes after a disk
delay; only then are the Ready's messages sent and its committed entries applied (to a
key-value store, `sim_kv.py`). A crash throws the unsynced writes away (or, at random, keeps
them, as a page cache may), the core, the state machine and all in-memory host state, and a
restart rebuilds everything from the durable part.

Faults during the fault phase: message loss, duplication, delay and reordering (per-link
random delays with a slow tail); symmetric partitions, one-way link cuts and isolated
nodes; crashes and restarts; process pauses (everything that arrives meanwhile is handled
on resume, as after a GC pause or SIGSTOP); slow disks; clock drift (each node's tick period changes
independently, up to 4x apart); membership changes (a voter removed, and added back) and
leadership transfers, a removed voter sometimes being replaced by a new, empty machine
with a new id; per seed, the leader may send its appends before its own fsync, as
`node.py` does. Clients issue puts and reads (ReadIndex, to leaders and followers)
with retries and timeouts; their history is checked for linearizability at the end.

Checked at every step: election safety (one leader per term), log matching (an (index,
term) pair names one entry content and one predecessor term, on every node, at every
append), leader completeness (a new leader holds every entry committed in an earlier term),
state-machine safety (no two nodes apply different entries at one index, and the commit
point never moves to a different entry), and, stronger than leader completeness, that no
node lacking the highest committed entry could collect the votes to be elected with any
log its voters may hold in memory or on disk (this catches a lost commit as soon as it
becomes possible, not only once a schedule happens to exploit it). Committed-and-answered
client writes surviving every crash follows from these and the history check. After the fault phase
every fault is healed, and
within `liveness_ticks` ticks a leader must be elected, the full membership restored, every
client must complete an operation and every node must converge on the same applied state.

    python -m warrenmq.cluster.raft.sim --seeds 1000 [--start S] [--nodes K]
    python -m warrenmq.cluster.raft.sim --seeds 1 --start S --trace   # replay one seed
    python -m warrenmq.cluster.raft.sim --soak 600                    # run for 10 minutes
"""

from __future__ import annotations

import argparse
import heapq
import random
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from warrenmq.cluster.raft.core import (
    LEADER,
    EntryKind,
    Message,
    NotLeader,
    ProposalRefused,
    RaftConfig,
    RaftError,
    RaftNode,
    Ready,
)
from warrenmq.cluster.raft.linearizability import KvModel, Operation, check
from warrenmq.cluster.raft.messages import decode_voters
from warrenmq.cluster.raft.sim_kv import KvStore, encode_put

TICK_UNITS = 100  # virtual time units per nominal tick
ELECTION_TICKS = 10
HEARTBEAT_TICKS = 1
KEYS = ("a", "b")
CLIENTS = 5
ATTEMPT_TIMEOUT_TICKS = 8  # a client re-sends an unanswered request after this long
OP_TIMEOUT_TICKS = 40  # and gives up on the operation (outcome unknown) after this long
LINEARIZABILITY_STEPS_MAX = 5_000_000

_EV_TICK = 0
_EV_DELIVER = 1
_EV_FSYNC = 2
_EV_CLIENT_REQUEST = 3
_EV_CLIENT_RESPONSE = 4
_EV_CLIENT_WAKE = 5
_EV_CHAOS = 6
_EV_RESTART = 7
_EV_HEAL_LINK = 8
_EV_HEAL_ALL = 9
_EV_JANITOR = 10
_EV_STRIKE_LEADER = 11
_HOST_EVENTS = frozenset((_EV_TICK, _EV_DELIVER, _EV_FSYNC, _EV_CLIENT_REQUEST))

_READ_CONTEXT = struct.Struct("<QQQ")  # client, op id, attempt


class Violation(Exception):
    """A safety or liveness property failed."""


@dataclass(slots=True)
class _Durable:
    hard_state: object = None
    snapshot: object = None
    entries: list = field(default_factory=list)

    def write(self, rd: Ready) -> None:
        if rd.snapshot is not None:
            self.snapshot = rd.snapshot
            self.entries = []
        if rd.entries:
            first = rd.entries[0].index
            base = self.snapshot.index if self.snapshot is not None else 0
            del self.entries[max(0, first - base - 1) :]
            self.entries.extend(rd.entries)
        if rd.hard_state is not None:
            self.hard_state = rd.hard_state

    def term_at(self, index: int) -> int | None:
        base = self.snapshot.index if self.snapshot is not None else 0
        if index == base:
            return self.snapshot.term if self.snapshot is not None else 0
        offset = index - base - 1
        if 0 <= offset < len(self.entries):
            return self.entries[offset].term
        return None

    def compact(self, snapshot) -> None:
        base = self.snapshot.index if self.snapshot is not None else 0
        del self.entries[: snapshot.index - base]
        self.snapshot = snapshot


@dataclass(slots=True)
class _Host:
    node_id: int
    core: RaftNode | None = None
    up: bool = False
    incarnation: int = 0
    durable: _Durable = field(default_factory=_Durable)
    unsynced: Ready | None = None
    sent_early: bool = False  # the unsynced Ready's messages already left (leader overlap)
    kv: KvStore = field(default_factory=KvStore)
    applied: int = 0
    tick_units: int = TICK_UNITS
    disk_slow_until: int = 0
    paused_until: int = 0
    pending_writes: dict = field(default_factory=dict)  # log index -> request
    pending_reads: dict = field(default_factory=dict)  # read context -> request
    read_states: list = field(default_factory=list)
    leader_term_seen: int = 0  # last term this host was observed leading
    commit_recorded: int = 0  # commit index up to which its leadership was recorded
    compact_every: int = 20
    bootstrap_voters: tuple[int, ...] = ()  # what the node is started with on an empty disk
    retired: bool = False  # replaced by a new machine with a new id; never starts again


@dataclass(slots=True)
class _Client:
    client_id: int
    next_op_id: int = 1
    op: tuple | None = None  # (op_id, kind, key, value, call_time, started_at)
    attempt: int = 0
    leader_hint: int | None = None
    completed_after_heal: bool = False


class Simulation:
    def __init__(
        self,
        seed: int,
        nodes: int = 3,
        *,
        fault_ticks: int = 600,
        liveness_ticks: int = 120,
        trace: Callable[[str], None] | None = None,
        node_factory: Callable[..., RaftNode] = RaftNode,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.node_ids = tuple(range(1, nodes + 1))
        self.fault_units = fault_ticks * TICK_UNITS
        self.liveness_units = liveness_ticks * TICK_UNITS
        self.trace = trace
        self.node_factory = node_factory
        self.now = 0
        self._seq = 0
        self._events: list = []
        self.hosts = {i: _Host(i, bootstrap_voters=self.node_ids) for i in self.node_ids}
        self._next_node_id = nodes + 1
        self.replace_pending: set[int] = set()  # removed voters to retire, not re-add
        self.clients = [_Client(c) for c in range(1, CLIENTS + 1)]
        self.cut: set[tuple[int, int]] = set()
        self.healed = False
        self.heal_time = 0
        self.heal_mark = 0
        # Network weather, re-drawn by chaos events; calm values after healing.
        self.loss = 0.0
        self.dup = 0.0
        self.delay_max = 20
        self.slow_link_p = 0.0
        self.paused_until_max = 0
        # Probability that a newly elected leader is struck (isolated or crashed) before it
        # has replicated much: the schedules behind Figure 8 and most lost-commit bugs.
        self.strike_new_leader_p = self.rng.choice((0.0, 0.2, 0.5))
        self.leader_sends_before_fsync = self.rng.random() < 0.5
        # Safety must not depend on the optional election refinements.
        self.pre_vote = self.rng.random() < 0.8
        self.check_quorum = self.rng.random() < 0.8
        # Observations for the checks.
        self.leader_of_term: dict[int, int] = {}
        self.entry_ids: dict[tuple[int, int], tuple] = {}
        self.commit_term: dict[int, int] = {}  # index -> lowest term seen committing it
        self.committed_entry_term: dict[int, int] = {}
        # (index, term) of the highest entry known committed.
        self.highest_commit = (0, 0)
        self.applied_entries: dict[int, tuple] = {}
        self.history: list[Operation] = []
        self._hist_clock = 0
        self.stats = dict.fromkeys(
            (
                "events",
                "messages",
                "crashes",
                "elections",
                "ops",
                "snapshots_installed",
                "compactions",
                "config_changes",
                "transfers",
                "machines_replaced",
            ),
            0,
        )

    # ------------------------------------------------------------------ scheduling

    def _at(self, when: int, kind: int, a=None, b=None) -> None:
        self._seq += 1
        heapq.heappush(self._events, (when, self._seq, kind, a, b))

    def _log(self, text: str) -> None:
        self.trace(f"{self.now:>8} {text}")

    def _hist_time(self) -> int:
        self._hist_clock += 1
        return self._hist_clock

    def run(self) -> None:
        """Run the whole scenario; raises Violation on any failed check."""
        rng = self.rng
        for i in self.node_ids:
            host = self.hosts[i]
            host.compact_every = rng.choice((5, 20, 80))
            self._start(host)
        self._weather()
        for c in self.clients:
            self._at(rng.randrange(5 * TICK_UNITS), _EV_CLIENT_WAKE, c, None)
        self._at(rng.randrange(2, 20) * TICK_UNITS, _EV_CHAOS)
        self._at(self.fault_units, _EV_HEAL_ALL)
        deadline = self.fault_units + self.liveness_units
        events = self._events
        while events:
            when, _, kind, a, b = heapq.heappop(events)
            if when > deadline:
                break
            self.now = when
            self.stats["events"] += 1
            try:
                self._dispatch(kind, a, b)
            except AssertionError as exc:
                # The core asserts its own invariants (e.g. never truncate a committed
                # entry); one firing is a finding like any other.
                raise Violation(f"assertion failed inside the core: {exc!r}") from exc
            if self.healed and self._converged():
                break
        self._check_liveness()
        self.stats["ticks_to_converge"] = (self.now - self.heal_time) // TICK_UNITS
        self._check_history()

    def _dispatch(self, kind: int, a, b) -> None:
        if self.now < self.paused_until_max and kind in _HOST_EVENTS:
            host = self._event_host(kind, a)
            if self.now < host.paused_until:
                # A paused process (GC pause, SIGSTOP, a VM migrating) does nothing; what
                # arrived meanwhile waits in its socket buffers and is handled, in order,
                # the moment it resumes.
                self._at(host.paused_until, kind, a, b)
                return
        if kind == _EV_DELIVER:
            self._deliver(a)
        elif kind == _EV_TICK:
            host = a
            if host.up and host.incarnation == b:
                host.core.tick()
                self._after_core(host)
                self._at(self.now + host.tick_units, _EV_TICK, host, b)
        elif kind == _EV_FSYNC:
            self._fsync_done(a, b)
        elif kind == _EV_CLIENT_REQUEST:
            self._serve_request(a, b)
        elif kind == _EV_CLIENT_RESPONSE:
            self._client_response(a, b)
        elif kind == _EV_CLIENT_WAKE:
            self._client_wake(a, b)
        elif kind == _EV_CHAOS:
            self._chaos()
        elif kind == _EV_RESTART:
            if not a.up and not a.retired and not self.healed:
                self._start(a)
        elif kind == _EV_HEAL_LINK:
            self.cut.discard(a)
        elif kind == _EV_HEAL_ALL:
            self._heal_all()
        elif kind == _EV_JANITOR:
            self._janitor()
        elif kind == _EV_STRIKE_LEADER:
            self._strike_leader(a, b)

    def _event_host(self, kind: int, a) -> _Host:
        if kind == _EV_DELIVER:
            return self.hosts[a.dst]
        if kind == _EV_CLIENT_REQUEST:
            return self.hosts[a]
        return a

    # ------------------------------------------------------------------ hosts

    def _start(self, host: _Host) -> None:
        host.incarnation += 1
        d = host.durable
        config = RaftConfig(
            node_id=host.node_id,
            election_ticks=ELECTION_TICKS,
            heartbeat_ticks=HEARTBEAT_TICKS,
            max_entries_per_append=self.rng.choice((1, 1, 2, 4, 64)),
            max_inflight_appends=self.rng.choice((1, 2, 4, 256)),
            pre_vote=self.pre_vote,
            check_quorum=self.check_quorum,
        )
        node_rng = random.Random(self.rng.getrandbits(64))
        host.core = self.node_factory(
            config,
            host.bootstrap_voters,
            node_rng,
            hard_state=d.hard_state,
            snapshot=d.snapshot,
            entries=list(d.entries),
        )
        host.kv = KvStore.from_bytes(d.snapshot.data) if d.snapshot is not None else KvStore()
        host.applied = d.snapshot.index if d.snapshot is not None else 0
        host.unsynced = None
        host.pending_writes = {}
        host.pending_reads = {}
        host.read_states = []
        host.leader_term_seen = 0
        host.up = True
        if self.trace:
            self._log(
                f"start n{host.node_id} inc={host.incarnation} term={host.core.term} "
                f"commit={host.core.commit_index} last={host.core.last_index}"
            )
        self._at(
            self.now + self.rng.randrange(1, host.tick_units + 1),
            _EV_TICK,
            host,
            host.incarnation,
        )
        self._after_core(host)

    def _crash(self, host: _Host) -> None:
        if host.unsynced is not None and self.rng.random() < 0.5:
            # The page cache happened to reach the disk before the crash.
            host.durable.write(host.unsynced)
        host.up = False
        host.incarnation += 1
        host.core = None
        host.unsynced = None
        self.stats["crashes"] += 1
        if self.trace:
            self._log(f"crash n{host.node_id}")

    def _after_core(self, host: _Host) -> None:
        """Check what changed in `host`'s core, then hand its Ready to storage."""
        core = host.core
        if core.role == LEADER:
            self._observe_leader(host, core)
        if host.unsynced is not None or not core.has_ready():
            return
        rd = core.ready()
        if rd.entries:
            self._check_log_matching(host, core, rd)
        host.unsynced = rd
        host.sent_early = self.leader_sends_before_fsync and self._may_send_early(host, rd)
        if host.sent_early:
            for m in rd.messages:
                self._send(m)
        delay = self.rng.randrange(1, 10)
        if self.now < host.disk_slow_until:
            delay += self.rng.randrange(50, 600)
        self._at(self.now + delay, _EV_FSYNC, host, host.incarnation)

    @staticmethod
    def _may_send_early(host: _Host, rd: Ready) -> bool:
        """node.py's overlap of a leader's own fsync with its followers' (dissertation
        §10.2.1): a leader whose term and vote are already durable may send before its
        fsync. Simulated so that the argument for it is checked, not just made."""
        if host.core.role != LEADER or rd.snapshot is not None:
            return False
        hs = rd.hard_state
        if hs is None:
            return True
        durable = host.durable.hard_state
        return durable is not None and (durable.term, durable.vote) == (
            hs.term,
            hs.vote,
        )

    def _fsync_done(self, host: _Host, incarnation: int) -> None:
        if not host.up or host.incarnation != incarnation:
            return
        rd = host.unsynced
        hs_before = host.durable.hard_state
        host.durable.write(rd)
        hs = host.durable.hard_state
        if (
            hs_before is not None
            and hs is not None
            and (hs.term < hs_before.term or hs.commit < hs_before.commit)
        ):
            raise Violation(f"n{host.node_id} durable hard state went back: {hs_before} -> {hs}")
        if not host.sent_early:
            for m in rd.messages:
                self._send(m)
        if rd.snapshot is not None:
            host.kv = KvStore.from_bytes(rd.snapshot.data)
            host.applied = rd.snapshot.index
            self.stats["snapshots_installed"] += 1
            if self.trace:
                self._log(f"n{host.node_id} installed snapshot @{rd.snapshot.index}")
        for e in rd.committed:
            self._apply(host, e)
        if rd.read_states:
            host.read_states.extend(rd.read_states)
        if host.read_states:
            self._serve_reads(host)
        host.unsynced = None
        core = host.core
        core.advance(rd)
        if rd.entries or rd.snapshot is not None:
            self._check_commit_is_safe()
        snap_index = core.snapshot.index if core.snapshot is not None else 0
        if host.applied - snap_index >= host.compact_every:
            snapshot = core.compact(host.applied, host.kv.to_bytes())
            host.durable.compact(snapshot)
            self.stats["compactions"] += 1
            if self.trace:
                self._log(f"n{host.node_id} compacted to {snapshot.index}")
        self._after_core(host)

    def _apply(self, host: _Host, e) -> None:
        if e.index != host.applied + 1:
            raise Violation(f"n{host.node_id} applied {e.index} after {host.applied}")
        seen = self.applied_entries.get(e.index)
        ident = (e.term, e.kind, e.data)
        if seen is None:
            self.applied_entries[e.index] = ident
        elif seen != ident:
            raise Violation(
                f"state machine safety: n{host.node_id} applied {ident} at {e.index}, "
                f"another node applied {seen}"
            )
        committed_term = self.committed_entry_term.get(e.index)
        if committed_term is not None and committed_term != e.term:
            raise Violation(
                f"n{host.node_id} applied term {e.term} at {e.index}, committed was "
                f"term {committed_term}"
            )
        host.applied = e.index
        if e.kind == EntryKind.NORMAL:
            host.kv.apply(e.data)
        request = host.pending_writes.pop(e.index, None)
        if request is not None:
            client, op_id, _, _, key, value = request
            if e.data == encode_put(client, op_id, key, value):
                self._respond(host, request, "ok", None)
            else:
                self._respond(host, request, "retry", None)

    # ------------------------------------------------------------------ checks

    def _observe_leader(self, host: _Host, core: RaftNode) -> None:
        term = core.term
        if host.leader_term_seen != term:
            holder = self.leader_of_term.get(term)
            if holder is not None and holder != host.node_id:
                raise Violation(f"election safety: n{holder} and n{host.node_id} lead term {term}")
            self.leader_of_term[term] = host.node_id
            host.leader_term_seen = term
            host.commit_recorded = core.commit_index
            self.stats["elections"] += 1
            if self.trace:
                self._log(f"n{host.node_id} leads term {term} (last={core.last_index})")
            self._check_leader_completeness(host, core)
            if not self.healed and self.rng.random() < self.strike_new_leader_p:
                self._at(
                    self.now + self.rng.randrange(0, 3 * self.delay_max + 20),
                    _EV_STRIKE_LEADER,
                    host,
                    term,
                )
        commit = core.commit_index
        # A commit counts once the leader's own copy is durable: before that nobody has
        # been told of it (the Ready that carries it waits for the fsync), and with the
        # leader overlap a crash may still take the entry back.
        if commit > host.commit_recorded and host.durable.term_at(commit) == core.term_at(commit):
            for index in range(host.commit_recorded + 1, commit + 1):
                entry_term = core.term_at(index)
                if entry_term is None:
                    continue  # compacted within this step; nothing left to compare
                known = self.committed_entry_term.get(index)
                if known is None:
                    self.committed_entry_term[index] = entry_term
                elif known != entry_term:
                    raise Violation(
                        f"state machine safety: n{host.node_id} (term {term}) committed term "
                        f"{entry_term} at {index}, earlier commit was term {known}"
                    )
                first = self.commit_term.get(index)
                if first is None or term < first:
                    self.commit_term[index] = term
            host.commit_recorded = commit
            top = core.term_at(commit)
            if top is not None and commit > self.highest_commit[0]:
                self.highest_commit = (commit, top)
            self._check_commit_is_safe()

    def _log_views(self, host: _Host) -> list[tuple[int, int, bool, tuple[int, ...]]]:
        """The logs `host` could campaign or vote with: its memory (if up) and its disk
        (after a crash). Each as (last term, last index, holds the highest committed entry,
        voters)."""
        index, term = self.highest_commit
        views = []
        if host.up:
            core = host.core
            snap_index = core.snapshot.index if core.snapshot is not None else 0
            holds = index <= snap_index or core.term_at(index) == term
            views.append((core.term_at(core.last_index), core.last_index, holds, core.voters))
        d = host.durable
        base = d.snapshot.index if d.snapshot is not None else 0
        if d.entries:
            last_term, last_index = d.entries[-1].term, d.entries[-1].index
        elif d.snapshot is not None:
            last_term, last_index = d.snapshot.term, d.snapshot.index
        else:
            last_term, last_index = 0, 0
        if index <= base:
            holds = True
        else:
            offset = index - base - 1
            holds = offset < len(d.entries) and d.entries[offset].term == term
        voters = host.bootstrap_voters
        if d.snapshot is not None:
            voters = d.snapshot.voters
        for e in reversed(d.entries):
            if e.kind == EntryKind.CONFIG:
                voters = decode_voters(e.data)
                break
        views.append((last_term, last_index, holds, voters))
        return views

    def _check_commit_is_safe(self) -> None:
        """No node lacking the highest committed entry may be able to win an election.

        A stronger, earlier form of leader completeness: it fires as soon as some schedule of
        crashes and timeouts *could* elect a leader without a committed entry, instead of
        waiting for the simulation to stumble on that schedule. For each log a node could
        campaign with (memory or disk) that lacks the entry, count the voters of its
        configuration that would grant it a vote with some log they could hold.
        """
        if self.highest_commit[0] == 0:
            return
        views = {h.node_id: self._log_views(h) for h in self._members()}
        for candidate, candidate_views in views.items():
            for last_term, last_index, holds, voters in candidate_views:
                if holds or candidate not in voters:
                    continue
                grantors = [
                    v
                    for v in voters
                    if v == candidate
                    or any(
                        (last_term, last_index) >= (v_term, v_index)
                        for v_term, v_index, _, _ in views.get(v, ())
                    )
                ]
                if len(grantors) > len(voters) // 2:
                    raise Violation(
                        f"committed entry (index, term) {self.highest_commit} is not safe: "
                        f"n{candidate} lacks it (last term {last_term}, last index "
                        f"{last_index}) and could be elected by {grantors} of {list(voters)}"
                    )

    def _check_leader_completeness(self, host: _Host, core: RaftNode) -> None:
        term = core.term
        snap_index = core.snapshot.index if core.snapshot is not None else 0
        for index, committed_in in self.commit_term.items():
            if committed_in >= term or index <= snap_index:
                continue
            have = core.term_at(index)
            if have != self.committed_entry_term[index]:
                raise Violation(
                    f"leader completeness: n{host.node_id} leads term {term} with term {have} "
                    f"at {index}, but term {self.committed_entry_term[index]} was committed "
                    f"there in term {committed_in}"
                )

    def _check_log_matching(self, host: _Host, core: RaftNode, rd: Ready) -> None:
        prev_term = core.term_at(rd.entries[0].index - 1)
        ids = self.entry_ids
        for e in rd.entries:
            key = (e.index, e.term)
            ident = (e.kind, e.data, prev_term)
            seen = ids.get(key)
            if seen is None:
                ids[key] = ident
            elif seen[:2] != ident[:2] or seen[2] != prev_term:
                raise Violation(
                    f"log matching: n{host.node_id} holds (kind, data, previous term) {ident} "
                    f"at (index, term) {key}, another log holds {seen}"
                )
            prev_term = e.term

    def _converged(self) -> bool:
        if not all(c.completed_after_heal for c in self.clients):
            return False
        leaders = [h for h in self._members() if h.up and h.core.role == LEADER]
        if len(leaders) != 1:
            return False
        leader = leaders[0].core
        if leader.voters != self.node_ids:
            return False
        target = leader.commit_index
        if leader.term_at(target) != leader.term:
            return False
        return all(h.up and h.applied == target and h.unsynced is None for h in self._members())

    def _check_liveness(self) -> None:
        if not self._converged():
            state = ", ".join(
                f"n{h.node_id}:{h.core.role}/t{h.core.term}/c{h.core.commit_index}/a{h.applied}"
                f"/v{list(h.core.voters)}"
                if h.up
                else f"n{h.node_id}:down"
                for h in self._members()
            )
            waiting = [c.client_id for c in self.clients if not c.completed_after_heal]
            raise Violation(
                f"liveness: not converged {self.liveness_units // TICK_UNITS} ticks after "
                f"healing ({state}; clients without a completed op: {waiting})"
            )
        kvs = {h.node_id: h.kv.values for h in self._members()}
        if len({tuple(sorted(v.items())) for v in kvs.values()}) != 1:
            raise Violation(f"replicas converged on different states: {kvs}")

    def _check_history(self) -> None:
        for client in self.clients:
            if client.op is not None and client.op[1] == "put":
                # Still in flight at the end: it may have taken effect.
                _, _, key, value, call, _ = client.op
                self.history.append(
                    Operation(client.client_id, ("put", key, value), call, None, None)
                )
        # The converged replicas' state is a final read of every key: acknowledged writes
        # must have survived every crash to the end, not only until the last client read.
        final = self._members()[0].kv.values
        for key in KEYS:
            call = self._hist_time()
            self.history.append(Operation(0, ("get", key), call, final.get(key), self._hist_time()))
        self.stats["ops"] = len(self.history)
        result = check(self.history, KvModel(), steps_max=LINEARIZABILITY_STEPS_MAX)
        if result.ok is False:
            ops = "\n  ".join(repr(op) for op in sorted(result.failing_part, key=lambda o: o.call))
            raise Violation(f"linearizability: history of one key is not linearizable:\n  {ops}")
        if result.ok is None:
            raise Violation("linearizability: checker search bound exceeded")

    # ------------------------------------------------------------------ network

    def _send(self, m: Message) -> None:
        rng = self.rng
        self.stats["messages"] += 1
        if (m.src, m.dst) in self.cut or rng.random() < self.loss:
            if self.trace:
                self._log(f"drop {_fmt(m)}")
            return
        copies = 2 if rng.random() < self.dup else 1
        for _ in range(copies):
            delay = rng.randrange(1, self.delay_max + 1)
            if rng.random() < self.slow_link_p:
                delay += rng.randrange(100, 1000)
            self._at(self.now + delay, _EV_DELIVER, m)

    def _deliver(self, m: Message) -> None:
        host = self.hosts.get(m.dst)
        if host is None or not host.up or (m.src, m.dst) in self.cut:
            return
        if self.trace:
            self._log(f"recv {_fmt(m)}")
        host.core.step(m)
        self._after_core(host)

    # ------------------------------------------------------------------ clients

    def _client_wake(self, client: _Client, token) -> None:
        if token is None:
            self._next_op(client)
            return
        op_id, attempt = token
        if client.op is None or client.op[0] != op_id or client.attempt != attempt:
            return  # answered already
        started_at = client.op[5]
        if self.now - started_at >= OP_TIMEOUT_TICKS * TICK_UNITS:
            op_id, kind, key, value, call, _ = client.op
            if kind == "put":
                # Outcome unknown: it may still take effect, at any later time, or never.
                self.history.append(
                    Operation(client.client_id, ("put", key, value), call, None, None)
                )
            if self.trace:
                self._log(f"c{client.client_id} gives up op {op_id}")
            client.op = None
            self._at(self.now + 1, _EV_CLIENT_WAKE, client, None)
            return
        client.leader_hint = None
        self._attempt(client)

    def _next_op(self, client: _Client) -> None:
        rng = self.rng
        op_id = client.next_op_id
        client.next_op_id += 1
        key = rng.choice(KEYS)
        if rng.random() < 0.5:
            op = (op_id, "put", key, f"{client.client_id}.{op_id}")
        else:
            op = (op_id, "get", key, "")
        client.op = (*op, self._hist_time(), self.now)
        client.attempt = 0
        self._attempt(client)

    def _attempt(self, client: _Client) -> None:
        rng = self.rng
        client.attempt += 1
        op_id, kind, key, value, _, _ = client.op
        target = client.leader_hint
        if target is None or (kind == "get" and rng.random() < 0.3):
            target = rng.choice(self.node_ids)
        request = (client.client_id, op_id, client.attempt, kind, key, value)
        if self.trace:
            self._log(f"c{client.client_id} -> n{target} {request}")
        if rng.random() >= self.loss:
            self._at(
                self.now + rng.randrange(1, self.delay_max + 1),
                _EV_CLIENT_REQUEST,
                target,
                request,
            )
        self._at(
            self.now + ATTEMPT_TIMEOUT_TICKS * TICK_UNITS,
            _EV_CLIENT_WAKE,
            client,
            (op_id, client.attempt),
        )

    def _serve_request(self, node_id: int, request: tuple) -> None:
        host = self.hosts[node_id]
        if not host.up:
            return
        client, op_id, attempt, kind, key, value = request
        core = host.core
        if kind == "put":
            try:
                index = core.propose(encode_put(client, op_id, key, value))
            except NotLeader as exc:
                self._respond(host, request, "redirect", exc.leader_id)
                return
            except ProposalRefused:
                self._respond(host, request, "retry", None)
                return
            host.pending_writes[index] = request
        else:
            if core.role != LEADER and core.leader_id is None:
                self._respond(host, request, "retry", None)
                return
            context = _READ_CONTEXT.pack(client, op_id, attempt)
            host.pending_reads[context] = request
            core.read_index(context)
        self._after_core(host)

    def _serve_reads(self, host: _Host) -> None:
        waiting = []
        for rs in host.read_states:
            if rs.index > host.applied:
                waiting.append(rs)
                continue
            request = host.pending_reads.pop(rs.context, None)
            if request is not None:
                self._respond(host, request, "ok", host.kv.values.get(request[4]))
        host.read_states = waiting

    def _respond(self, host: _Host, request: tuple, status: str, value) -> None:
        rng = self.rng
        if rng.random() < self.loss:
            return
        response = (request[1], request[2], status, value, host.node_id)
        self._at(
            self.now + rng.randrange(1, self.delay_max + 1),
            _EV_CLIENT_RESPONSE,
            self.clients[request[0] - 1],
            response,
        )

    def _client_response(self, client: _Client, response: tuple) -> None:
        op_id, attempt, status, value, node_id = response
        if client.op is None or client.op[0] != op_id:
            return
        if self.trace:
            self._log(f"c{client.client_id} <- n{node_id} op {op_id} {status} {value!r}")
        if status == "ok":
            _, kind, key, put_value, call, _ = client.op
            if kind == "put":
                op = Operation(
                    client.client_id,
                    ("put", key, put_value),
                    call,
                    None,
                    self._hist_time(),
                )
            else:
                op = Operation(client.client_id, ("get", key), call, value, self._hist_time())
            self.history.append(op)
            client.leader_hint = node_id
            client.op = None
            if self.healed and call > self.heal_mark:
                client.completed_after_heal = True
            think = self.rng.randrange(0, 3 * TICK_UNITS)
            self._at(self.now + think, _EV_CLIENT_WAKE, client, None)
        elif attempt == client.attempt:
            # Back off a little: during an election every node answers "retry" at once.
            client.leader_hint = value if status == "redirect" else None
            client.attempt += 1
            self._at(
                self.now + self.rng.randrange(TICK_UNITS // 2, 2 * TICK_UNITS),
                _EV_CLIENT_WAKE,
                client,
                (op_id, client.attempt),
            )

    # ------------------------------------------------------------------ faults

    def _weather(self) -> None:
        rng = self.rng
        self.loss = rng.choice((0.0, 0.0, 0.02, 0.1, 0.3))
        self.dup = rng.choice((0.0, 0.02, 0.1))
        self.delay_max = rng.choice((5, 20, 80, 300))
        self.slow_link_p = rng.choice((0.0, 0.01, 0.05))
        if self.trace:
            self._log(
                f"weather loss={self.loss} dup={self.dup} delay_max={self.delay_max} "
                f"slow={self.slow_link_p}"
            )

    def _chaos(self) -> None:
        if self.healed:
            return
        rng = self.rng
        hosts = self._members()
        leaders = [h for h in hosts if h.up and h.core.role == LEADER]
        action = rng.randrange(10)
        if action == 0:
            # Leaders are the interesting victims: they hold entries nobody else has yet.
            host = rng.choice(leaders if leaders and rng.random() < 0.7 else hosts)
            if host.up:
                self._crash(host)
                self._at(self.now + rng.randrange(1, 20) * TICK_UNITS, _EV_RESTART, host)
        elif action == 1:
            # Symmetric partition into two sides.
            side = {i for i in self.node_ids if rng.random() < 0.5}
            duration = rng.randrange(2, 40) * TICK_UNITS
            for a in self.node_ids:
                for b in self.node_ids:
                    if a != b and (a in side) != (b in side):
                        self.cut.add((a, b))
                        self._at(self.now + duration, _EV_HEAL_LINK, (a, b))
            if self.trace:
                self._log(f"partition {sorted(side)} | rest for {duration}")
        elif action == 2:
            a, b = rng.sample(self.node_ids, 2)
            self.cut.add((a, b))
            self._at(self.now + rng.randrange(5, 80) * TICK_UNITS, _EV_HEAL_LINK, (a, b))
            if self.trace:
                self._log(f"cut one way n{a} -> n{b}")
        elif action == 3:
            host = rng.choice(leaders if leaders and rng.random() < 0.5 else hosts)
            host.disk_slow_until = self.now + rng.randrange(5, 50) * TICK_UNITS
            if self.trace:
                self._log(f"slow disk n{host.node_id} until {host.disk_slow_until}")
        elif action == 4:
            host = rng.choice(hosts)
            host.tick_units = rng.randrange(TICK_UNITS // 2, 2 * TICK_UNITS)
            if self.trace:
                self._log(f"clock n{host.node_id} tick={host.tick_units}")
        elif action == 5:
            self._weather()
        elif action == 6:
            if self.pre_vote:
                # Without pre-vote, a member left behind with a stale configuration can keep
                # raising the term in lockstep with the rightful candidate and stall the
                # election forever (Raft dissertation §4.2.3); safety still holds, but the
                # liveness check after healing could not, so such seeds skip membership
                # changes.
                self._reconfigure()
        elif action == 7:
            if leaders:
                core = leaders[0].core
                target = rng.choice(self.node_ids)
                try:
                    core.transfer_leadership(target)
                    self.stats["transfers"] += 1
                except RaftError:
                    pass
                if self.trace:
                    self._log(f"transfer n{core.node_id} -> n{target}")
                self._after_core(leaders[0])
        elif action == 8:
            host = rng.choice(leaders if leaders and rng.random() < 0.5 else hosts)
            host.paused_until = self.now + rng.randrange(2, 40) * TICK_UNITS
            self.paused_until_max = max(self.paused_until_max, host.paused_until)
            if self.trace:
                self._log(f"pause n{host.node_id} until {host.paused_until}")
        else:
            # Isolate one node both ways.
            if leaders and rng.random() < 0.5:
                victim = leaders[0].node_id
            else:
                victim = rng.choice(self.node_ids)
            duration = rng.randrange(2, 40) * TICK_UNITS
            for other in self.node_ids:
                if other != victim:
                    for link in ((victim, other), (other, victim)):
                        self.cut.add(link)
                        self._at(self.now + duration, _EV_HEAL_LINK, link)
            if self.trace:
                self._log(f"isolate n{victim} for {duration}")
        self._at(self.now + rng.randrange(1, 20) * TICK_UNITS, _EV_CHAOS)

    def _strike_leader(self, host: _Host, term: int) -> None:
        if self.healed or not host.up or host.core.role != LEADER or host.core.term != term:
            return
        rng = self.rng
        if rng.random() < 0.5:
            self._crash(host)
            self._at(self.now + rng.randrange(1, 20) * TICK_UNITS, _EV_RESTART, host)
            return
        duration = rng.randrange(2, 40) * TICK_UNITS
        for other in self.node_ids:
            if other != host.node_id:
                for link in ((host.node_id, other), (other, host.node_id)):
                    self.cut.add(link)
                    self._at(self.now + duration, _EV_HEAL_LINK, link)
        if self.trace:
            self._log(f"isolate new leader n{host.node_id} for {duration}")

    def _reconfigure(self) -> bool:
        leaders = [h for h in self._members() if h.up and h.core.role == LEADER]
        if not leaders:
            return False
        host = max(leaders, key=lambda h: h.core.term)
        core = host.core
        missing = [i for i in self.node_ids if i not in core.voters]
        try:
            if missing and missing[0] in self.replace_pending and not self.healed:
                # The core refuses a change while the previous one is uncommitted, so once
                # this proposal is accepted the removal is committed and the old machine
                # may go: retiring it earlier could leave a committed configuration whose
                # quorum needs it.
                new_id = self._next_node_id
                core.propose_membership(add=new_id)
                self.replace_pending.discard(missing[0])
                self._replace_machine(self.hosts[missing[0]], new_id)
            elif missing:
                core.propose_membership(add=missing[0])
            elif not self.healed and len(self.node_ids) > 2:
                victim = self.rng.choice(self.node_ids)
                core.propose_membership(remove=victim)
                if self.rng.random() < 0.5:
                    self.replace_pending.add(victim)
            else:
                return False
        except RaftError:
            return False
        self.stats["config_changes"] += 1
        if self.trace:
            self._log(f"n{core.node_id} proposes voters change from {core.voters}")
        # (A leader cannot retire itself here: once its own removal commits it steps down.)
        self._after_core(host)
        return True

    def _replace_machine(self, host: _Host, new_id: int) -> None:
        """Retire a removed member for good; a new, empty machine takes a new id.

        Ids are never reused (as etcd's member ids are not): a node id names one disk, and a
        leader, even a stale one, may remember what that disk acknowledged. The new machine
        knows no voters until it learns them from the log, then joins through a snapshot or
        the whole log.
        """
        if host.up:
            self._crash(host)
        host.retired = True
        new = _Host(new_id, bootstrap_voters=())
        self._next_node_id = new_id + 1
        self.hosts[new_id] = new
        self.node_ids = tuple(sorted((*[i for i in self.node_ids if i != host.node_id], new_id)))
        self.stats["machines_replaced"] += 1
        if self.trace:
            self._log(f"n{host.node_id} retired; new empty machine n{new_id}")
        self._at(self.now + self.rng.randrange(1, 5) * TICK_UNITS, _EV_RESTART, new)

    def _members(self) -> list[_Host]:
        return [self.hosts[i] for i in self.node_ids]

    def _heal_all(self) -> None:
        self.healed = True
        self.heal_time = self.now
        self.heal_mark = self._hist_time()
        self.cut.clear()
        self.loss = 0.0
        self.dup = 0.0
        self.delay_max = 20
        self.slow_link_p = 0.0
        for host in self._members():
            host.disk_slow_until = 0
            host.tick_units = TICK_UNITS
            if not host.up:
                self._start(host)
        if self.trace:
            self._log("heal all faults")
        self._at(self.now + TICK_UNITS, _EV_JANITOR)

    def _janitor(self) -> None:
        """After healing, restore the full membership (removed voters are added back)."""
        self._reconfigure()
        self._at(self.now + TICK_UNITS, _EV_JANITOR)


def _fmt(m: Message) -> str:
    extra = ""
    if m.entries:
        extra = f" entries={m.entries[0].index}..{m.entries[-1].index}"
    if m.snapshot is not None:
        extra += f" snapshot@{m.snapshot.index}"
    if m.reject:
        extra = f" REJECT hint={m.reject_hint}{extra}"
    return (
        f"{m.kind.name} n{m.src}->n{m.dst} t{m.term} idx={m.index} lt={m.log_term} "
        f"c={m.commit}{extra}"
    )


def run_seed(seed: int, nodes: int = 3, *, trace=None, node_factory=RaftNode, **kw) -> Simulation:
    sim = Simulation(seed, nodes, trace=trace, node_factory=node_factory, **kw)
    sim.run()
    return sim


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m warrenmq.cluster.raft.sim")
    parser.add_argument("--seeds", type=int, default=100, help="number of seeds to run")
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--nodes", type=int, default=3, help="cluster size")
    parser.add_argument("--trace", action="store_true", help="print every event")
    parser.add_argument("--soak", type=float, default=0.0, help="run seeds for this many seconds")
    args = parser.parse_args(argv)
    trace = print if args.trace else None
    started = time.monotonic()
    seed = args.start
    ran = 0
    failures = 0
    while True:
        if args.soak:
            if time.monotonic() - started >= args.soak:
                break
        elif ran >= args.seeds:
            break
        try:
            sim = run_seed(seed, args.nodes, trace=trace)
            if trace:
                print(f"seed {seed} passed: {sim.stats}")
        except Exception as exc:  # noqa: BLE001 - a crash of the simulator is a finding too
            failures += 1
            print(f"seed {seed} FAILED: {type(exc).__name__}: {exc}", flush=True)
            print(
                f"  replay: python -m warrenmq.cluster.raft.sim --seeds 1 --start {seed} "
                f"--nodes {args.nodes} --trace",
                flush=True,
            )
        ran += 1
        seed += 1
    elapsed = time.monotonic() - started
    print(
        f"{ran} seeds ({args.start}..{seed - 1}), {args.nodes} nodes: {failures} failed, "
        f"{elapsed:.1f} s, {ran / elapsed if elapsed else 0:.1f} seeds/s"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

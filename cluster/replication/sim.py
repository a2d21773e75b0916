"""Deterministic simulation of partition replication under faults, with safety checks at
every step and convergence checked after healing.

One seeded `random.Random` drives one event heap (virtual time in microseconds, then
insertion order). Each node is a `ReplicationNode` over `MemoryLog`s (in-memory batches in
the real batch format; the unfsynced tail is lost on a crash), driven like the broker will
drive it: fetch requests, responses and metadata go through the codec and a network that
loses, duplicates, delays and reorders messages and cuts links; fsyncs complete after a disk
delay (group commit: one in flight per log). The controller models the metadata Raft: it
applies AlterIsr only at the partition_epoch it names, hears nodes' heartbeats, elects a new
leader from the ISR when a leader goes quiet (no leader when no ISR member is alive) and
broadcasts partition states. Clients append to whichever node thinks it leads and count a
batch confirmed once that leader's HW covers it.

Checked at every step:
* a leader's HW never goes down within its epoch;
* every batch ever below a leader's HW ("committed") keeps its bytes: every later leader
  holds all of them when it takes over, and every member of the controller's ISR holds them
  durably, whenever it joins, whenever the HW moves and whenever its log shrinks;
* a confirmed batch is committed.
After the fault phase every fault is healed and within `CONVERGE_S` every replica's log must
equal its leader's byte for byte, fsynced, the HW at the end, and every confirmed batch in it.

    python -m warrenmq.cluster.replication.sim --seeds 1000 [--start S]
"""

from __future__ import annotations

import argparse
import heapq
import random
import sys
import time
from bisect import bisect_left, insort
from collections.abc import Callable
from dataclasses import dataclass, field

from warrenmq.log.errors import LogError

from .codec import decode, encode
from .config import ReplicationConfig
from .memory_log import MemoryLog
from .messages import (
    NO_LEADER,
    AlterIsr,
    FetchRequest,
    FetchResponse,
    PartitionKey,
    PartitionState,
)
from .node import PendingFetch, ReplicationNode

CONTROLLER = -100
KEYS: tuple[PartitionKey, ...] = (b"q1.messages", b"q1.acks", "stream.7")
US = 1_000_000
TICK_US = 20_000
CONTROLLER_TICK_US = 50_000
SESSION_TIMEOUT_US = 400_000
FAULT_PHASE_US = 3 * US
CONVERGE_S = 30
CONFIG = ReplicationConfig(
    replica_lag_s=0.3,
    alter_isr_retry_s=0.2,
    fetch_max_bytes=600,
    fetch_max_wait_s=0.05,
    fetch_timeout_s=0.3,
    fetch_in_flight_max=2,
    fetch_backoff_s=0.02,
)


class Violation(Exception):
    """A safety or convergence property failed."""


@dataclass(slots=True)
class SimNode:
    node_id: int
    core: ReplicationNode
    logs: dict[PartitionKey, MemoryLog]
    states: dict[PartitionKey, PartitionState] = field(default_factory=dict)
    alive: bool = True
    incarnation: int = 0
    syncing: set[PartitionKey] = field(default_factory=set)
    disk_slow: bool = False


class Simulation:
    def __init__(
        self,
        seed: int,
        nodes: int = 3,
        node_class: type[ReplicationNode] = ReplicationNode,
        trace: Callable[[str], None] | None = None,
    ) -> None:
        self.rng = random.Random(seed)
        self.now_us = 0
        self.events: list[tuple[int, int, str, tuple]] = []
        self.seq = 0
        self.trace = trace
        self.node_class = node_class
        self.nodes = {
            i: SimNode(i, self._core(i), {key: MemoryLog() for key in KEYS}) for i in range(nodes)
        }
        self.cut: set[tuple[int, int]] = set()
        self.loss = self.rng.choice((0.0, 0.01, 0.05))
        self.duplication = self.rng.choice((0.0, 0.01))
        # The controller: partition states, and when it last heard each node.
        replica_count = min(3, nodes)
        self.states: dict[PartitionKey, PartitionState] = {}
        for index, key in enumerate(KEYS):
            replicas = tuple((index + r) % nodes for r in range(replica_count))
            self.states[key] = PartitionState(replicas, replicas[0], 1, replicas, 1)
        self.heard = dict.fromkeys(self.nodes, 0)
        self.incarnations = dict.fromkeys(self.nodes, 1)
        for node in self.nodes.values():
            node.states = dict(self.states)
        # What the checks remember: committed batches by key and base offset, the end of the
        # committed prefix, the highest HW seen per (key, leader epoch), confirms.
        self.committed: dict[PartitionKey, dict[int, bytes]] = {key: {} for key in KEYS}
        self.committed_bases: dict[PartitionKey, list[int]] = {key: [] for key in KEYS}
        self.committed_end = dict.fromkeys(KEYS, 0)
        self.hw_seen: dict[tuple[PartitionKey, int], int] = {}
        self.unconfirmed: list[tuple[int, int, PartitionKey, int, int, bytes]] = []
        self.confirmed: list[tuple[PartitionKey, int, bytes]] = []
        self.faults_on = True
        self.stats = dict.fromkeys(
            ("messages", "crashes", "elections", "isr_changes", "confirms", "appends"), 0
        )

    def _core(self, node_id: int) -> ReplicationNode:
        return self.node_class(node_id, CONFIG)

    # -- plumbing --------------------------------------------------------------------------

    def log(self, text: str) -> None:
        if self.trace is not None:
            self.trace(f"{self.now_us:>10} {text}")

    def at(self, delay_us: int, kind: str, *args: object) -> None:
        self.seq += 1
        heapq.heappush(self.events, (self.now_us + delay_us, self.seq, kind, args))

    def send(self, source: int, target: int, message: object) -> None:
        # Metadata and heartbeats stand for the metadata Raft's traffic: not this codec's.
        data = message if isinstance(message, tuple) else encode(message)  # type: ignore[arg-type]
        if (source, target) in self.cut or self.rng.random() < self.loss:
            return
        self.stats["messages"] += 1
        copies = 2 if self.rng.random() < self.duplication else 1
        for _ in range(copies):
            delay = self.rng.randint(200, 5_000)
            if self.rng.random() < 0.05:
                delay += self.rng.randint(10_000, 100_000)
            self.at(delay, "deliver", source, target, data)

    @property
    def now(self) -> float:
        return self.now_us / US

    # -- the run ---------------------------------------------------------------------------

    def run(self) -> Simulation:
        for node in self.nodes.values():
            self._start(node)
        self.at(CONTROLLER_TICK_US, "controller")
        self.at(self.rng.randint(1_000, 20_000), "publish")
        self.at(self.rng.randint(100_000, 400_000), "chaos")
        self.at(FAULT_PHASE_US, "heal")
        deadline = FAULT_PHASE_US + CONVERGE_S * US
        while self.events:
            when, _, kind, args = heapq.heappop(self.events)
            self.now_us = when
            if when > deadline:
                raise Violation(f"not converged {CONVERGE_S} s after healing: {self._lag()}")
            if kind == "converged":
                if self._converged():
                    return self
                continue
            try:
                getattr(self, "_on_" + kind)(*args)
            except LogError as exc:
                raise Violation(f"a replica's log diverged from its leader's: {exc}") from exc
        raise Violation("ran out of events")

    def _start(self, node: SimNode) -> None:
        node.alive = True
        node.incarnation += 1
        node.core = self._core(node.node_id)
        node.syncing = set()
        for key, state in node.states.items():
            if node.incarnation == 1:
                self._apply(node, key, state)
            else:
                node.core.recover(key, state, node.logs[key], self.now)
        self.at(self.rng.randint(0, TICK_US), "tick", node.node_id, node.incarnation)

    def _on_tick(self, node_id: int, incarnation: int) -> None:
        node = self.nodes[node_id]
        if not node.alive or node.incarnation != incarnation:
            return
        node.core.tick(self.now)
        self.send(node_id, CONTROLLER, ("heartbeat", node_id, incarnation))
        self._pump(node)
        self.at(TICK_US + self.rng.randint(-4_000, 4_000), "tick", node_id, incarnation)

    def _on_deliver(self, source: int, target: int, data: bytes | tuple) -> None:
        if target == CONTROLLER:
            self._controller_receive(source, data)
            return
        node = self.nodes[target]
        if not node.alive:
            return
        if isinstance(data, tuple):
            _, key, state = data
            known = node.states.get(key)
            if known is None or state.partition_epoch > known.partition_epoch:
                node.states[key] = state
                self._apply(node, key, state)
            self._pump(node)
            return
        message = decode(data)
        if isinstance(message, FetchRequest):
            pending = node.core.handle_fetch(message, self.now)
            if pending is not None:
                self._answer(node, pending)
        elif isinstance(message, FetchResponse):
            for key in node.core.handle_response(source, message, self.now):
                self._check_shrink(node, key)
        self._pump(node)

    def _apply(self, node: SimNode, key: PartitionKey, state: PartitionState) -> None:
        before = node.core.leaders.get(key)
        node.core.apply(key, state, node.logs[key], self.now)
        after = node.core.leaders.get(key)
        if after is not None and after is not before:
            self.log(f"n{node.node_id} leads {key!r} epoch {state.leader_epoch}")
            # A node restarted with stale metadata may lead an old epoch: fenced, not checked.
            if state.leader_epoch == self.states[key].leader_epoch:
                self._check_holds_committed(node, key, durably=False, why="a new leader")

    def _answer(self, node: SimNode, pending: PendingFetch) -> None:
        for read in pending.reads:
            if pending.budget_bytes <= 0:
                break
            log = node.logs[read.key]
            pending.fill(
                read.key, log.read_batches(read.offset, read.end_offset, pending.budget_bytes)
            )
        self.send(node.node_id, pending.replica, pending.response())

    def _pump(self, node: SimNode) -> None:
        core = node.core
        for proposal in core.take_alter_isr():
            self.send(node.node_id, CONTROLLER, proposal)
        for key, hw in core.take_high_watermarks().items():
            self._on_high_watermark(node, key, hw)
        for pending in core.ready_fetches(self.now):
            self._answer(node, pending)
        for leader, request in core.poll_fetches(self.now):
            self.send(node.node_id, leader, request)
        for key, log in node.logs.items():
            if log.durable_offset < log.end_offset and key not in node.syncing:
                node.syncing.add(key)
                delay = self.rng.randint(500, 8_000) * (10 if node.disk_slow else 1)
                self.at(
                    delay, "fsync", node.node_id, node.incarnation, key, log.end_offset, log.changes
                )

    def _on_fsync(
        self, node_id: int, incarnation: int, key: PartitionKey, end: int, changes: int
    ) -> None:
        node = self.nodes[node_id]
        if not node.alive or node.incarnation != incarnation:
            return
        node.syncing.discard(key)
        log = node.logs[key]
        if log.changes == changes:
            log.durable_offset = max(log.durable_offset, min(end, log.end_offset))
        node.core.durable(key, self.now)
        self._pump(node)

    # -- clients ---------------------------------------------------------------------------

    def _on_publish(self) -> None:
        if self.faults_on:
            self.at(self.rng.randint(1_000, 15_000), "publish")
        key = self.rng.choice(KEYS)
        for node in self.nodes.values():
            leader = node.core.leaders.get(key)
            if not node.alive or leader is None or leader.stepped_aside:
                continue
            log = node.logs[key]
            self.stats["appends"] += 1
            count = self.rng.randint(1, 3)
            records = [
                (b"", b"k", b"", b"n%d-%d-%d" % (node.node_id, self.stats["appends"], i))
                for i in range(count)
            ]
            base = log.append(records, leader.leader_epoch, self.now_us // 1000)
            self.unconfirmed.append(
                (node.node_id, leader.leader_epoch, key, base, base + count, log.batches[-1])
            )
            node.core.appended(key, self.now)
            self._pump(node)

    def _on_high_watermark(self, node: SimNode, key: PartitionKey, hw: int) -> None:
        leader = node.core.leaders[key]
        epoch = leader.leader_epoch
        seen = self.hw_seen.get((key, epoch), -1)
        if hw < seen:
            raise Violation(f"{key!r} HW went down from {seen} to {hw} in epoch {epoch}")
        self.hw_seen[(key, epoch)] = hw
        log = node.logs[key]
        committed = self.committed[key]
        for index, base in enumerate(log.bases):
            if base >= hw:
                break
            batch = log.batches[index]
            known = committed.get(base)
            if known is None:
                committed[base] = batch
                insort(self.committed_bases[key], base)
            elif known != batch:
                raise Violation(
                    f"{key!r} committed batch at {base} changed (HW {hw} of n{node.node_id})"
                )
        self.committed_end[key] = max(self.committed_end[key], hw)
        for member in self.states[key].isr:
            self._check_holds_committed(self.nodes[member], key, durably=True, why="an ISR member")
        still = []
        for entry in self.unconfirmed:
            node_id, entry_epoch, entry_key, base, end, batch = entry
            if node_id == node.node_id and entry_key == key and entry_epoch == epoch and end <= hw:
                if committed.get(base) != batch:
                    raise Violation(f"confirmed batch {key!r}@{base} is not the committed one")
                self.confirmed.append((key, base, batch))
                self.stats["confirms"] += 1
            else:
                still.append(entry)
        self.unconfirmed = still

    # -- checks ----------------------------------------------------------------------------

    def _check_holds_committed(
        self, node: SimNode, key: PartitionKey, *, durably: bool, why: str
    ) -> None:
        log = node.logs[key]
        end = self.committed_end[key]
        if end <= log.start_offset:
            return
        held = log.durable_offset if durably else log.end_offset
        if held < end:
            raise Violation(
                f"{why} n{node.node_id} holds {key!r} only to {held}"
                f"{' durably' if durably else ''}, committed to {end}"
            )
        committed = self.committed[key]
        bases = self.committed_bases[key]
        for base in bases[bisect_left(bases, max(log.verified_offset, log.start_offset)) :]:
            if log.batch_at(base) != committed[base]:
                raise Violation(f"{why} n{node.node_id} differs from the committed {key!r}@{base}")
        log.verified_offset = end

    def _check_shrink(self, node: SimNode, key: PartitionKey) -> None:
        if node.node_id in self.states[key].isr:
            self._check_holds_committed(node, key, durably=False, why="an ISR member")

    # -- the controller --------------------------------------------------------------------

    def _controller_receive(self, source: int, data: object) -> None:
        if isinstance(data, tuple):
            _, node_id, incarnation = data
            self.heard[node_id] = self.now_us
            if incarnation > self.incarnations[node_id]:
                # A restarted leader may have lost its unfsynced tail: a new leader epoch.
                self.incarnations[node_id] = incarnation
                for key, state in self.states.items():
                    if state.leader == node_id:
                        self._elect(key, state, {node_id}, restarted=node_id)
            return
        message = decode(data)  # type: ignore[arg-type]
        if not isinstance(message, AlterIsr):
            return
        state = self.states[message.key]
        if (
            message.leader != state.leader
            or message.leader_epoch != state.leader_epoch
            or message.partition_epoch != state.partition_epoch
            or message.leader not in message.isr
            or not set(message.isr) <= set(state.replicas)
        ):
            return
        self.stats["isr_changes"] += 1
        self._set_state(
            message.key,
            PartitionState(
                state.replicas,
                state.leader,
                state.leader_epoch,
                message.isr,
                state.partition_epoch + 1,
            ),
        )
        for member in message.isr:
            if member not in state.isr:
                self._check_holds_committed(
                    self.nodes[member], message.key, durably=True, why="a joining ISR member"
                )

    def _set_state(self, key: PartitionKey, state: PartitionState) -> None:
        self.log(f"controller {key!r}: {state}")
        self.states[key] = state
        for node_id in self.nodes:
            self.send(CONTROLLER, node_id, ("state", key, state))

    def _on_controller(self) -> None:
        self.at(CONTROLLER_TICK_US, "controller")
        alive = {n for n, at in self.heard.items() if self.now_us - at <= SESSION_TIMEOUT_US}
        for key, state in self.states.items():
            if state.leader == NO_LEADER or state.leader not in alive:
                self._elect(key, state, alive)
        # Metadata reaches every node in the end, as the metadata Raft's log does.
        for key, state in self.states.items():
            for node_id in self.nodes:
                if self.rng.random() < 0.2:
                    self.send(CONTROLLER, node_id, ("state", key, state))

    def _elect(
        self,
        key: PartitionKey,
        state: PartitionState,
        alive: set[int],
        restarted: int | None = None,
    ) -> None:
        """A new leader from the ISR: the old leader drops out of the ISR unless it merely
        restarted; no alive ISR member means no leader."""
        if restarted == state.leader:
            isr = state.isr
            candidates = [restarted]
        else:
            isr = (
                state.isr
                if state.leader == NO_LEADER
                else tuple(r for r in state.isr if r != state.leader)
            )
            candidates = [r for r in isr if r in alive]
        if candidates:
            leader = self.rng.choice(candidates)
            self.stats["elections"] += 1
        elif state.leader == NO_LEADER:
            return
        else:
            leader, isr = NO_LEADER, state.isr
        self._set_state(
            key,
            PartitionState(
                state.replicas, leader, state.leader_epoch + 1, isr, state.partition_epoch + 1
            ),
        )

    # -- faults ----------------------------------------------------------------------------

    def _on_chaos(self) -> None:
        if not self.faults_on:
            return
        self.at(self.rng.randint(100_000, 600_000), "chaos")
        ids = list(self.nodes)
        choice = self.rng.random()
        node = self.nodes[self.rng.choice(ids)]
        if choice < 0.3:
            if node.alive and sum(n.alive for n in self.nodes.values()) > 1:
                self._crash(node)
                self.at(self.rng.randint(50_000, 1_500_000), "restart", node.node_id)
        elif choice < 0.5:
            self.log(f"isolate n{node.node_id}")
            for other in [*ids, CONTROLLER]:
                if other != node.node_id:
                    self.cut.add((node.node_id, other))
                    self.cut.add((other, node.node_id))
            self.at(self.rng.randint(100_000, 1_500_000), "heal_links")
        elif choice < 0.65:
            other = self.rng.choice([*ids, CONTROLLER])
            if other != node.node_id:
                self.cut.add((node.node_id, other))
                if self.rng.random() < 0.5:
                    self.cut.add((other, node.node_id))
                self.at(self.rng.randint(100_000, 1_000_000), "heal_links")
        elif choice < 0.75:
            node.disk_slow = not node.disk_slow
        elif choice < 0.85:
            self.cut.clear()

    def _crash(self, node: SimNode) -> None:
        self.log(f"crash n{node.node_id}")
        self.stats["crashes"] += 1
        node.alive = False
        node.incarnation += 1
        for key, log in node.logs.items():
            log.crash()
            if node.node_id in self.states[key].isr:
                self._check_holds_committed(node, key, durably=True, why="a crashed ISR member")

    def _on_restart(self, node_id: int) -> None:
        node = self.nodes[node_id]
        if not node.alive:
            self.log(f"restart n{node_id}")
            self._start(node)

    def _on_heal_links(self) -> None:
        self.cut.clear()

    def _on_heal(self) -> None:
        self.faults_on = False
        self.cut.clear()
        self.loss = self.duplication = 0.0
        for node in self.nodes.values():
            node.disk_slow = False
            if not node.alive:
                self._start(node)
        self.at(100_000, "converged")

    # -- convergence -----------------------------------------------------------------------

    def _lag(self) -> str:
        parts = []
        for key, state in self.states.items():
            ends = {
                n: (self.nodes[n].logs[key].end_offset, self.nodes[n].logs[key].durable_offset)
                for n in state.replicas
            }
            hw = (
                self.nodes[state.leader].core.high_watermark(key)
                if state.leader != NO_LEADER
                else None
            )
            parts.append(f"{key!r} {state} ends {ends} hw {hw}")
        return "; ".join(parts)

    def _converged(self) -> bool:
        self.at(100_000, "converged")
        for key, state in self.states.items():
            if state.leader == NO_LEADER or set(state.isr) != set(state.replicas):
                return False
            leader = self.nodes[state.leader]
            if leader.core.leaders.get(key) is None:
                return False
            reference = leader.logs[key]
            if leader.core.high_watermark(key) != reference.end_offset:
                return False
            for replica in state.replicas:
                log = self.nodes[replica].logs[key]
                if (log.start_offset, log.batches, log.durable_offset) != (
                    reference.start_offset,
                    reference.batches,
                    reference.end_offset,
                ):
                    return False
        for key, base, batch in self.confirmed:
            final = self.nodes[self.states[key].leader].logs[key]
            if final.batch_at(base) != batch:
                raise Violation(f"confirmed {key!r}@{base} lost")
        return True


def run_seed(seed: int, nodes: int = 3, **kw: object) -> Simulation:
    return Simulation(seed, nodes, **kw).run()  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--trace", action="store_true", help="print the events of each seed")
    args = parser.parse_args(argv)
    started_s = time.monotonic()
    for seed in range(args.start, args.start + args.seeds):
        try:
            run_seed(seed, args.nodes, trace=print if args.trace else None)
        except Violation as exc:
            print(f"seed {seed}: {exc}")
            return 1
    print(f"{args.seeds} seeds passed in {time.monotonic() - started_s:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

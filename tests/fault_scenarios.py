"""The fault tests' scenarios (issue 12): a `FaultCluster`, a workload on it, a nemesis that
injects one kind of fault for `fault_s` and heals for `heal_s`, again and again for
`duration_s`; then everything healed, killed nodes restarted (today a queue lives on its
leader only, so its messages come back with its node), the queues drained and the history
checked. `RESULTS` collects a row per scenario run, which the suite prints at its end.

Nemeses: the partition shapes RabbitMQ's Jepsen tests use for quorum queues (random halves,
majorities ring, the leader isolated, a bridge), the leader SIGKILLed, a node paused
(SIGSTOP), a node's clock jumping (libfaketime, when installed), the links between nodes
slow, the leader's disk slow (its fsyncs delayed, `native/slow_fsync.c`).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from pathlib import Path

from fault_cluster import LIBFAKETIME, FaultCluster
from fault_workload import CLIENT_ERRORS, CONSUMER_MANNERS, QueueWorkload, StreamWorkload, connect
from history_checker import Depth, Verdict, check_queues, check_streams
from http_api import HttpApi, path

DECLARE_TIMEOUT_S = 30.0
LEADER = 1
CLOCK_JUMP_S = 60
LINK_DELAY_S = 0.2
FSYNC_DELAY_S = 0.2
NEMESES = (
    "random-halves",
    "majorities-ring",
    "isolated-leader",
    "bridge",
    "kill-leader",
    "pause",
    "clock-jump",
    "slow-links",
    "slow-disk",
)

RESULTS: list[dict[str, object]] = []


@dataclass(frozen=True)
class Scenario:
    nemesis: str
    dead_lettering: bool = False
    streams: bool = False
    duration_s: float = 8.0
    fault_s: float = 3.0
    heal_s: float = 2.0
    seed: int = 0

    @property
    def name(self) -> str:
        kind = "streams" if self.streams else "dlx" if self.dead_lettering else "queues"
        return f"{self.nemesis}/{kind}/{self.fault_s:g}s"


async def declare(cluster: FaultCluster, node: int, declaring) -> None:
    """`declaring(channel)` through `node`, again until the cluster has a metadata leader."""
    deadline_s = time.monotonic() + DECLARE_TIMEOUT_S
    while True:
        try:
            connection = await connect(cluster.amqp_url(node))
            try:
                await declaring(await connection.channel())
                return
            finally:
                await connection.close()
        except CLIENT_ERRORS:
            if time.monotonic() > deadline_s:
                raise
            await asyncio.sleep(0.2)


async def declare_queues(cluster: FaultCluster, dead_lettering: bool):
    """Queues `q1`… led by node 1 (the leader the nemeses isolate and kill); with
    dead-lettering, `q{n}.dlq` led by node 2, so a dead letter crosses a link between nodes.

    One node leads them all because today two nodes that forward publishes to each other
    at once stop getting confirms (test_cluster_crossed_forwarding.py): with queues on every
    node, the workload would measure that and little else."""
    queues, dead_letter_queues = [], {}
    for number in cluster.nodes:
        queue = f"q{number}"
        arguments = {}
        if dead_lettering:
            dead_letter_queue = dead_letter_queues[queue] = f"{queue}.dlq"
            arguments = {
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": dead_letter_queue,
            }
            await declare(
                cluster, 2, lambda ch, q=dead_letter_queue: ch.declare_queue(q, durable=True)
            )
        await declare(
            cluster,
            LEADER,
            lambda ch, q=queue, a=arguments: ch.declare_queue(q, durable=True, arguments=a),
        )
        queues.append(queue)
    return queues, dead_letter_queues


async def declare_super_stream(cluster: FaultCluster) -> list[str]:
    partitions = len(cluster.nodes)

    async def declaring(channel) -> None:
        await channel.declare_exchange(
            "ss",
            "x-super-stream",
            durable=True,
            arguments={"x-super-stream-partitions": partitions},
        )

    await declare(cluster, LEADER, declaring)
    return [f"ss-{n}" for n in range(partitions)]


async def held(cluster: FaultCluster, queue: str) -> int:
    """The messages `queue` holds, ready or unacked, as any node's management API says (the
    ready count alone would miss messages a consumer lost to a fault still holds)."""
    for node in cluster.nodes:
        api = HttpApi(cluster.nodes[node].http_url)
        try:
            reply = await asyncio.to_thread(api.get, path("api", "queues", "/", queue))
        except OSError:
            continue
        if reply.status == 200:
            return reply.json["messages_ready"] + reply.json["messages_unacknowledged"]
    raise AssertionError(f"no node told what {queue} holds")


class Nemesis:
    """Injects `scenario.nemesis` into `cluster` and heals it, and knows what to undo."""

    def __init__(self, cluster: FaultCluster, scenario: Scenario, leader: int) -> None:
        self.cluster = cluster
        self.scenario = scenario
        self.leader = leader
        self.rng = random.Random(scenario.seed)
        self.crashed: set[int] = set()

    async def inject(self) -> None:
        cluster, nemesis = self.cluster, self.scenario.nemesis
        if nemesis == "random-halves":
            cluster.random_halves(self.rng)
        elif nemesis == "majorities-ring":
            cluster.majorities_ring()
        elif nemesis == "isolated-leader":
            cluster.isolated(self.leader)
        elif nemesis == "bridge":
            cluster.bridge(self.leader)
        elif nemesis == "kill-leader":
            await cluster.crash(self.leader)
            self.crashed.add(self.leader)
        elif nemesis == "pause":
            cluster.pause(self.rng.choice(sorted(cluster.nodes)))
        elif nemesis == "clock-jump":
            cluster.jump_clock(self.rng.choice(sorted(cluster.nodes)), CLOCK_JUMP_S)
        elif nemesis == "slow-links":
            cluster.slow(LINK_DELAY_S)
        elif nemesis == "slow-disk":
            cluster.slow_disk(self.leader, FSYNC_DELAY_S)
        else:
            raise ValueError(f"no nemesis {nemesis!r}")

    async def heal(self) -> None:
        cluster = self.cluster
        cluster.heal()
        for node in list(cluster.paused):
            cluster.resume(node)
        if cluster.fake_clock:
            for node in cluster.nodes:
                cluster.jump_clock(node, 0)
        if cluster.slow_fsync is not None:
            for node in cluster.nodes:
                cluster.slow_disk(node, 0)
        for node in sorted(self.crashed):
            await cluster.restart(node)
        self.crashed.clear()


async def run_scenario(directory: Path, scenario: Scenario) -> Verdict:
    """Run `scenario` on a new cluster in `directory`; its verdict, its row in `RESULTS`."""
    cluster = FaultCluster(
        directory,
        fake_clock=scenario.nemesis == "clock-jump",
        slow_disks=scenario.nemesis == "slow-disk",
    )
    if scenario.nemesis == "clock-jump" and not LIBFAKETIME.exists():
        raise RuntimeError(f"clock jumps need libfaketime ({LIBFAKETIME})")
    rng = random.Random(scenario.seed)

    def urls() -> list[str]:
        return [cluster.amqp_url(node) for node in cluster.nodes if cluster.running(node)]

    workload: QueueWorkload | StreamWorkload | None = None
    try:
        await cluster.boot()
        if scenario.streams:
            partitions = await declare_super_stream(cluster)
            workload = StreamWorkload(urls, rng, "ss", partitions, super_stream=True)
            workload.start(publishers=2, group_members=2)
        else:
            queues, dead_letter_queues = await declare_queues(cluster, scenario.dead_lettering)
            workload = QueueWorkload(urls, rng, queues, dead_letter_queues)
            workload.start(publishers_per_queue=1, manners=CONSUMER_MANNERS)
        nemesis = Nemesis(cluster, scenario, LEADER)
        deadline_s = time.monotonic() + scenario.duration_s
        while time.monotonic() < deadline_s:
            await asyncio.sleep(scenario.heal_s)
            await nemesis.inject()
            await asyncio.sleep(scenario.fault_s)
            await nemesis.heal()
        await asyncio.sleep(scenario.heal_s)
        await workload.stop()
        if isinstance(workload, StreamWorkload):
            await workload.read_all()
            verdict = check_streams(workload.history)
        else:
            await workload.drain()
            for queue in [*queues, *dead_letter_queues.values()]:
                workload.history.depths.append(Depth(queue, await held(cluster, queue)))
            verdict = check_queues(workload.history)
    finally:
        await cluster.shutdown()
        if workload is not None and directory.exists():
            with open(directory / "publishes.tsv", "w") as log:
                for row in workload.publish_log:
                    print(*row, sep="\t", file=log)
    RESULTS.append({"scenario": scenario.name, **verdict.row(), "violations": verdict.violations})
    return verdict


def results_table(rows: list[dict[str, object]]) -> list[str]:
    columns = ("scenario", "published", "confirmed", "consumed", "lost", "duplicated")
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in columns]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)) + "  violations"]
    for row in rows:
        cells = [str(row[c]).ljust(w) for c, w in zip(columns, widths, strict=True)]
        violations = row["violations"]
        lines.append("  ".join(cells) + "  " + (", ".join(violations) if violations else "none"))
    return lines

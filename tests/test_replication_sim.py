"""The deterministic partition-replication simulator: healthy seeds pass, replays are
deterministic, and deliberately broken leaders and nodes are caught."""

import os

import pytest

from warrenmq.cluster.replication.leader import PartitionLeader
from warrenmq.cluster.replication.node import ReplicationNode
from warrenmq.cluster.replication.sim import Violation, run_seed

# About 60 ms a seed on one core: the default run stays well inside a minute.
SEEDS = int(os.environ.get("WARREN_REPL_SIM_SEEDS", "500"))


def first_failure(seeds, **kw):
    for seed in seeds:
        try:
            run_seed(seed, **kw)
        except Violation as exc:
            return seed, str(exc)
    return None


def test_many_seeds_keep_every_confirm_and_converge():
    assert first_failure(range(SEEDS)) is None


@pytest.mark.slow
def test_thousands_of_seeds_with_three_and_five_nodes():
    assert first_failure(range(SEEDS, SEEDS + 3000)) is None
    assert first_failure(range(300), nodes=5) is None


def test_faults_happen_and_work_gets_done():
    totals: dict[str, int] = {}
    for seed in range(10):
        for name, count in run_seed(seed).stats.items():
            totals[name] = totals.get(name, 0) + count
    assert totals["crashes"] > 5 and totals["elections"] > 5 and totals["isr_changes"] > 20
    assert totals["confirms"] > 1000


def traced(seed):
    lines: list[str] = []
    run_seed(seed, trace=lines.append)
    return lines


def test_replaying_a_seed_gives_the_same_trace():
    first, second = traced(5), traced(5)
    assert len(first) > 20 and first == second
    assert traced(6) != first


class CommitsOnOwnFsync(PartitionLeader):
    """Confirms what the leader alone has fsynced: a crash before the followers fetched
    loses confirmed messages."""

    __slots__ = ()

    def update_high_watermark(self) -> bool:
        durable = min(self.log.durable_offset, self.log.end_offset)
        if durable > self.high_watermark:
            self.high_watermark = durable
            return True
        return False


class ExpandsWithoutEpochStart(PartitionLeader):
    """Lets a follower into the ISR once it holds the HW, though a new leader's HW may lag
    what the previous leader committed (Kafka's KIP-207 check left out)."""

    __slots__ = ()

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.epoch_start_offset = 0


class ResumesLeadingAfterRestart(ReplicationNode):
    """Leads again in the epoch it led before a crash: it writes new batches at offsets of
    the lost tail its followers still hold, under the same epoch."""

    def recover(self, key, state, log, now) -> None:
        self.apply(key, state, log, now)


def node_with(leader_class):
    return type("Node", (ReplicationNode,), {"leader_class": leader_class})


@pytest.mark.parametrize(
    ("node_class", "message"),
    [
        (node_with(CommitsOnOwnFsync), "holds"),
        (node_with(ExpandsWithoutEpochStart), "joining ISR member"),
        (ResumesLeadingAfterRestart, ""),
    ],
)
def test_the_checker_catches_planted_bugs(node_class, message):
    found = first_failure(range(200), node_class=node_class)
    assert found is not None, f"{node_class.__name__}: no seed of 200 found the bug"
    assert message in found[1]

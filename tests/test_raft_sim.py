"""The deterministic Raft simulator: healthy seeds pass, replays are deterministic, and
deliberately broken cores and hosts are caught."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

from warrenmq.cluster.raft import sim
from warrenmq.cluster.raft.core import RaftNode
from warrenmq.cluster.raft.sim import Simulation, Violation, run_seed


def first_failure(seeds, **kw):
    for seed in seeds:
        try:
            run_seed(seed, **kw)
        except Violation as exc:
            return seed, str(exc)
    return None


def test_a_few_seeds_pass_with_three_nodes():
    for seed in range(8):
        s = run_seed(seed)
        assert s.stats["elections"] >= 1 and s.stats["ops"] > 0
        # Every fault kind actually happened somewhere in these runs, not only in theory.
        assert s.healed


def test_a_few_seeds_pass_with_five_nodes():
    for seed in range(3):
        run_seed(seed, 5)


def test_faults_are_exercised():
    s = run_seed(3)
    assert s.stats["crashes"] > 0
    assert s.stats["messages"] > 1000
    assert any(op.ret is not None and op.input[0] == "get" for op in s.history)
    assert any(op.ret is not None and op.input[0] == "put" for op in s.history)


def traced(seed):
    lines: list[str] = []
    run_seed(seed, trace=lines.append)
    return lines


def test_replaying_a_seed_gives_the_same_trace():
    first, second = traced(11), traced(11)
    assert len(first) > 1000 and first == second
    assert traced(12) != first


class CountsOldTermReplicas(RaftNode):
    """Commits entries of earlier terms by counting replicas: the Figure 8 bug."""

    def _commit_allowed(self, index: int) -> bool:
        return True


class ReadsWithoutConfirmingLeadership(RaftNode):
    """Serves ReadIndex at its own commit index without a heartbeat round: a deposed
    leader that has not noticed yet serves stale reads."""

    def _leader_read(self, context: bytes, requester: int) -> None:
        self._release_read(self._commit, context, requester)


class VotesIgnoringLogs(RaftNode):
    """Grants votes without the up-to-date log check (§5.4.1)."""

    def _log_up_to_date(self, last_term: int, last_index: int) -> bool:
        return True


class SendsBeforeFsync(Simulation):
    """A host that sends a Ready's messages before its fsync completes: acks and votes then
    promise state that a crash can take back."""

    def _after_core(self, host):
        super()._after_core(host)
        rd = host.unsynced
        if rd is not None and rd.messages:
            for m in rd.messages:
                self._send(m)
            rd.messages = []


@pytest.mark.slow
def test_figure_8_commit_bug_is_caught():
    # The schedule needs three leaders in a row with divergent tails; with five nodes about
    # 2% of seeds produce it (0.5-1.5% with three), so scan until one does.
    found = first_failure(range(400), nodes=5, node_factory=CountsOldTermReplicas)
    assert found is not None
    assert "not safe" in found[1] or "leader completeness" in found[1]


def test_stale_reads_are_caught_by_the_linearizability_check():
    found = first_failure(range(30), node_factory=ReadsWithoutConfirmingLeadership)
    assert found is not None and "linearizab" in found[1]


def test_votes_ignoring_logs_are_caught():
    found = first_failure(range(30), node_factory=VotesIgnoringLogs)
    assert found is not None


def test_sending_before_fsync_is_caught():
    for seed in range(60):
        try:
            SendsBeforeFsync(seed).run()
        except Violation:
            return
    pytest.fail("a host that acknowledges before fsync went unnoticed for 60 seeds")


def test_cli_reports_a_failing_seed_with_its_replay_command(monkeypatch, capsys):
    def broken_run(self):
        raise Violation("injected")

    monkeypatch.setattr(Simulation, "run", broken_run)
    assert sim.main(["--seeds", "2", "--start", "40"]) == 1
    out = capsys.readouterr().out
    assert "seed 40 FAILED: Violation: injected" in out
    assert "--seeds 1 --start 41 --nodes 3 --trace" in out


def test_cli_passes_a_few_seeds():
    assert sim.main(["--seeds", "3", "--nodes", "3"]) == 0


def test_soak_runs_seeds_until_the_time_is_up(capsys):
    assert sim.main(["--soak", "0.5", "--start", "500"]) == 0
    assert "seeds (500.." in capsys.readouterr().out


@pytest.mark.slow
def test_thousand_seeds_in_a_subprocess():
    result = subprocess.run(
        [sys.executable, "-m", "warrenmq.cluster.raft.sim", "--seeds", "1000"],
        capture_output=True,
        text=True,
        timeout=290,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "1000 seeds" in result.stdout and "0 failed" in result.stdout


class NeverCampaigns(RaftNode):
    """Never starts an election: safe, but not live."""

    def _promotable(self) -> bool:
        return False


def test_a_cluster_that_cannot_elect_a_leader_fails_liveness():
    with pytest.raises(Violation, match="liveness"):
        run_seed(0, node_factory=NeverCampaigns)


def test_replay_is_identical_across_processes_and_hash_seeds():
    def trace_digest(hash_seed: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "warrenmq.cluster.raft.sim", "--seeds", "1"]
            + ["--start", "77", "--trace"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
        )
        lines = [line for line in result.stdout.splitlines() if "seeds/s" not in line]
        assert len(lines) > 1000
        return hashlib.sha256("\n".join(lines).encode()).hexdigest()

    assert trace_digest("1") == trace_digest("2")


def test_core_throughput_bench_runs():
    from warrenmq.cluster.raft import sim_bench

    assert sim_bench.run(nodes=3, entries=2000, batch=50, entry_bytes=10) > 0


@pytest.mark.slow
def test_two_hundred_five_node_seeds():
    for seed in range(200):
        run_seed(seed, 5)

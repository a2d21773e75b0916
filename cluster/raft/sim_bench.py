"""Throughput of the Raft core alone: N cores in one process, a lossless instant network,
no disk. It measures what the core costs per committed entry (the ceiling any host loop can
reach), not what a real cluster does; `bench.py` measures that.

    python -m warrenmq.cluster.raft.sim_bench [--nodes 3] [--entries 200000] [--batch 100]
"""

from __future__ import annotations

import argparse
import random
import time

from warrenmq.cluster.raft.core import LEADER, Message, RaftConfig, RaftNode

_ELECTION_TICKS_MAX = 1000


def _pump(nodes: dict[int, RaftNode]) -> None:
    """Hand every Ready over and deliver every message until the cluster is quiet."""
    inflight: list[Message] = []
    while True:
        for node in nodes.values():
            if node.has_ready():
                rd = node.ready()
                inflight.extend(rd.messages)
                node.advance(rd)
        if not inflight:
            return
        batch, inflight = inflight, []
        for m in batch:
            nodes[m.dst].step(m)


def run(nodes: int, entries: int, batch: int, entry_bytes: int) -> float:
    """Commit `entries` proposals, `batch` per round; returns committed entries per second."""
    ids = tuple(range(1, nodes + 1))
    cluster = {i: RaftNode(RaftConfig(node_id=i), ids, random.Random(i)) for i in ids}
    leader = cluster[1]
    for _ in range(_ELECTION_TICKS_MAX):
        if leader.role == LEADER:
            break
        leader.tick()
        _pump(cluster)
    assert leader.role == LEADER
    payload = b"x" * entry_bytes
    target = leader.last_index + entries
    started = time.perf_counter()
    for _ in range(entries // batch):
        for _ in range(batch):
            leader.propose(payload)
        _pump(cluster)
    elapsed = time.perf_counter() - started
    assert all(n.commit_index == target for n in cluster.values())
    return entries / elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m warrenmq.cluster.raft.sim_bench")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--entries", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=100, help="proposals per Ready round")
    parser.add_argument("--entry-bytes", type=int, default=100)
    args = parser.parse_args(argv)
    rate = run(args.nodes, args.entries, args.batch, args.entry_bytes)
    print(
        f"{args.nodes} cores in one process, {args.entries} entries of {args.entry_bytes} B "
        f"in batches of {args.batch}: {rate:,.0f} committed entries/s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

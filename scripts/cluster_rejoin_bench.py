"""Rejoin time: a node of a 3-node local cluster (`LocalCluster`, what `warren cluster up`
runs) holding N declared queues is stopped (SIGTERM) and started again; timed from the
process start until it serves: its AMQP port opens a connection and its /api/nodes shows it
applied what the metadata leader had committed when it started.

    .venv/bin/python scripts/cluster_rejoin_bench.py --queues 10000 [--restarts 3]

The queues are declared with x-queue-leader-locator balanced, so each node leads a third and
forwards to the others; the node restarted is a follower (no election in the figure).
"""

import argparse
import asyncio
import json
import logging
import statistics
import sys
import tempfile
import time
import urllib.request
from base64 import b64encode
from pathlib import Path

import aiormq

from warrenmq.server.local_cluster import LocalCluster

AUTH = "Basic " + b64encode(b"guest:guest").decode()
POLL_S = 0.01


async def declare_all(url: str, queues: int, concurrency: int) -> float:
    connection = await aiormq.connect(url)
    channels = [await connection.channel() for _ in range(concurrency)]
    names = iter(range(queues))
    arguments = {"x-queue-leader-locator": "balanced"}

    async def worker(channel):
        for i in names:
            await channel.queue_declare(f"rejoin-q{i}", durable=True, arguments=arguments)

    started = time.perf_counter()
    await asyncio.gather(*(worker(channel) for channel in channels))
    took = time.perf_counter() - started
    await connection.close()
    return took


def local_raft(cluster: LocalCluster, node: int) -> dict | None:
    """The node's own raft block of /api/nodes, or None while it does not answer."""
    request = urllib.request.Request(
        cluster.nodes[node].http_url + "/api/nodes", headers={"Authorization": AUTH}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            items = json.load(response)
    except OSError:
        return None
    return next(item["raft"] for item in items if item["node_id"] == node)


def leader(cluster: LocalCluster) -> int:
    for node in cluster.nodes:
        raft = local_raft(cluster, node)
        if raft is not None and raft["role"] == "leader":
            return node
    raise RuntimeError("no metadata leader")


async def amqp_answers(url: str) -> bool:
    try:
        connection = await aiormq.connect(url)
    except (OSError, aiormq.exceptions.AMQPError):
        return False
    await connection.close()
    return True


def time_rejoin(cluster: LocalCluster, node: int, leading: int) -> tuple[float, float]:
    """(seconds until AMQP answers, seconds until also caught up) for one restart."""
    cluster.signal(node, 15)
    while cluster.running(node):
        time.sleep(POLL_S)
    target = local_raft(cluster, leading)["commit_index"]
    started = time.perf_counter()
    cluster.start(node)
    amqp_s = None
    while True:
        if amqp_s is None and asyncio.run(amqp_answers(cluster.nodes[node].amqp_url)):
            amqp_s = time.perf_counter() - started
        if amqp_s is not None:
            raft = local_raft(cluster, node)
            if raft is not None and raft["applied_index"] >= target:
                return amqp_s, time.perf_counter() - started
        if not cluster.running(node):
            raise RuntimeError(f"node {node} exited: {cluster.log_tail(node)}")
        time.sleep(POLL_S)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--restarts", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    # Its refused connections while the node starts are expected; aiormq logs each.
    logging.getLogger("aiormq").setLevel(logging.CRITICAL)
    with tempfile.TemporaryDirectory() as directory:
        cluster = LocalCluster(Path(directory) / "cluster", 3)
        cluster.start_all()
        try:
            took = asyncio.run(
                declare_all(cluster.nodes[1].amqp_url, args.queues, args.concurrency)
            )
            print(f"{args.queues} queues declared through node 1 in {took:.1f} s")
            leading = leader(cluster)
            node = next(n for n in cluster.nodes if n != leading)
            results = []
            for restart in range(1, args.restarts + 1):
                amqp_s, caught_up_s = time_rejoin(cluster, node, leading)
                results.append(caught_up_s)
                print(
                    f"restart {restart} of node {node}: AMQP answers after {amqp_s:.2f} s, "
                    f"caught up after {caught_up_s:.2f} s"
                )
            print(
                f"rejoin with {args.queues} queues (3 nodes, median of {args.restarts}): "
                f"{statistics.median(results):.2f} s"
            )
        finally:
            cluster.stop()


if __name__ == "__main__":
    sys.exit(main())

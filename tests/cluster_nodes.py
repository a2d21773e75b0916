"""Broker nodes as real processes (`warren cluster up`, `server/local_cluster.py`) and what
the cluster tests ask of them: the `warren` CLI, clients of a node, the metadata leader."""

from __future__ import annotations

import subprocess
import sys
import time

import pika
from brokers import connect
from http_api import HttpApi

from warrenmq.server.local_cluster import LocalCluster

WARREN = [sys.executable, "-m", "warrenmq.server.cli"]
ELECTION_WAIT_S = 30.0


def warren(*args: str) -> str:
    done = subprocess.run([*WARREN, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def up(directory, nodes: int) -> LocalCluster:
    """`warren cluster up --nodes N`: the cluster it recorded in `directory`."""
    printed = warren("cluster", "up", "--nodes", str(nodes), "--data-dir", str(directory))
    assert printed.count("amqp://guest:guest@127.0.0.1:") == nodes
    return LocalCluster.recorded(directory)


def down(cluster: LocalCluster) -> None:
    """`warren cluster down`: every node recorded, those added since `up` too."""
    warren("cluster", "down", "--data-dir", str(cluster.directory))
    assert not any(cluster.running(node) for node in cluster.nodes)


def api(cluster: LocalCluster, node: int) -> HttpApi:
    return HttpApi(cluster.nodes[node].http_url)


def amqp(cluster: LocalCluster, node: int) -> pika.BlockingConnection:
    return connect(cluster.nodes[node].amqp_port)


def leader(cluster: LocalCluster, among=(1, 2, 3)) -> int:
    for node in among:
        for item in api(cluster, node).get("/api/nodes").json:
            if item["raft"]["role"] == "leader" and item["node_id"] in among:
                return item["node_id"]
    raise AssertionError("no leader known")


def local_raft(cluster: LocalCluster, node: int) -> dict:
    """The metadata group as `node` runs it (role, indexes, snapshot_index)."""
    (item,) = [i for i in api(cluster, node).get("/api/nodes").json if i["node_id"] == node]
    return item["raft"]


def queue_nodes(cluster: LocalCluster, node: int) -> dict[str, str]:
    return {q["name"]: q["node"] for q in api(cluster, node).get("/api/queues").json}


def declare_until_it_works(cluster: LocalCluster, node: int, queue: str) -> None:
    """Declare through `node`, again while the cluster elects a new leader."""
    deadline_s = time.monotonic() + ELECTION_WAIT_S
    while True:
        try:
            connection = amqp(cluster, node)
            connection.channel().queue_declare(queue, durable=True)
            connection.close()
            return
        except pika.exceptions.AMQPError:
            if time.monotonic() > deadline_s:
                raise
            time.sleep(0.2)

"""A private RabbitMQ cluster on this machine: N ``rabbitmq-server`` nodes, each with its own
name, ports and directory (``compat_tests/rabbitmq_reference.py``'s ``ReferenceNode``, without
the HTTP plugins), one Erlang cookie, joined into one cluster.

The nodes boot at once; then every node but the first leaves its app (``rabbitmqctl -n NODE
stop_app``), joins the first (``join_cluster``) and starts it again, and the cluster is ready
once every node lists all N as running. As a context manager (for tests and benchmarks)::

    with RabbitMQCluster.create(3) as cluster:
        cluster.urls        # each node's amqp:// URL
        cluster.queue_members("q")   # leader and members of a quorum queue
        cluster.kill(node)  # SIGKILL one node (a failover)

and as a command line, the state between start and stop kept in a JSON file (default
warren-rabbitmq-cluster.json in the temporary directory, or $WARREN_RABBITMQ_CLUSTER_STATE)::

    python scripts/rabbitmq_cluster.py start [--nodes 3] [--state FILE]   # prints the URLs
    python scripts/rabbitmq_cluster.py stop [--state FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

# compat_tests is a folder of test modules, not a package: its launcher is found by path.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "compat_tests"))

from rabbitmq_reference import (  # noqa: E402
    BOOT_SECONDS_MAX,
    ReferenceNode,
    ReferenceUnavailable,
    unavailable_reason,
    wait_for_port,
)

JOIN_SECONDS_MAX = 120.0
POLL_S = 0.5

__all__ = ["RabbitMQCluster", "ReferenceNode", "ReferenceUnavailable", "unavailable_reason"]


def default_state_path() -> Path:
    configured = os.environ.get("WARREN_RABBITMQ_CLUSTER_STATE")
    if configured:
        return Path(configured)
    return Path(tempfile.gettempdir()) / "warren-rabbitmq-cluster.json"


class RabbitMQCluster:
    """N reference nodes joined into one cluster; ``start`` boots and joins, ``stop`` stops
    every node and removes its files."""

    def __init__(self, nodes: list[ReferenceNode]) -> None:
        assert nodes
        self.nodes = nodes

    @classmethod
    def create(cls, size: int = 3) -> RabbitMQCluster:
        """Nodes on free ports with a fresh shared cookie, not started."""
        if size < 1:
            raise ValueError("a cluster has at least one node")
        cookie = secrets.token_hex(20)
        return cls([ReferenceNode.create(http=False, cookie=cookie) for _ in range(size)])

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    def node_named(self, nodename: str) -> ReferenceNode:
        return next(node for node in self.nodes if node.nodename == nodename)

    def start(self) -> None:
        """Boot every node at once, join them to the first, and wait until all N run."""
        try:
            with ThreadPoolExecutor(len(self.nodes)) as pool:
                list(pool.map(ReferenceNode.start, self.nodes))
            first = self.nodes[0]
            for node in self.nodes[1:]:
                node.ctl("stop_app")
                node.ctl("join_cluster", first.nodename)
                node.ctl("start_app")
            self.wait_running(JOIN_SECONDS_MAX)
        except BaseException:
            self.stop()
            raise

    def running_nodes(self) -> set[str]:
        """The cluster's running nodes, as the first live node of ours reports them."""
        for node in self.nodes:
            if node.pid and node.alive():
                status = json.loads(node.ctl("cluster_status", "--formatter", "json"))
                return set(status["running_nodes"])
        return set()

    def wait_running(self, seconds_max: float) -> None:
        """Until every node is running in the cluster and accepts AMQP connections."""
        wanted = {node.nodename for node in self.nodes}
        deadline = time.monotonic() + seconds_max
        while (running := self.running_nodes()) != wanted:
            if time.monotonic() > deadline:
                raise TimeoutError(f"running {sorted(running)}, not all of {sorted(wanted)}")
            time.sleep(POLL_S)
        for node in self.nodes:
            wait_for_port("127.0.0.1", node.amqp_port, BOOT_SECONDS_MAX, node.alive)

    def queue_members(self, queue: str, vhost: str = "/") -> dict[str, object]:
        """A queue's ``leader`` and ``members`` (node names), as a live node lists them."""
        for node in self.nodes:
            if node.pid and node.alive():
                columns = ("name", "leader", "members")
                listed = json.loads(
                    node.ctl("list_queues", "-p", vhost, *columns, "--formatter", "json")
                )
                for item in listed:
                    if item["name"] == queue:
                        return {"leader": item["leader"], "members": item["members"]}
                raise KeyError(f"no queue {queue!r} in vhost {vhost!r}")
        raise RuntimeError("no node of the cluster is running")

    def kill(self, node: ReferenceNode) -> None:
        """SIGKILL the node's process group (its Erlang VM with it) and reap it."""
        try:
            os.killpg(node.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            os.waitpid(node.pid, 0)
        except ChildProcessError:
            # Not our child (started by another process, `start` on the command line): wait
            # until the process is gone.
            while node.alive():
                time.sleep(0.01)

    def stop(self) -> None:
        """Stop every node (politely, then SIGKILL) and remove their directories."""
        with ThreadPoolExecutor(len(self.nodes)) as pool:
            list(pool.map(ReferenceNode.stop, self.nodes))

    def __enter__(self) -> RabbitMQCluster:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("--nodes", type=int, default=3, help="nodes in the cluster (default 3)")
    parser.add_argument("--state", help="JSON file that remembers the nodes (see above)")
    args = parser.parse_args(argv)
    state = Path(args.state) if args.state else default_state_path()
    if args.action == "start":
        if state.exists():
            parser.error(f"{state} exists: a cluster may still run (stop it first)")
        cluster = RabbitMQCluster.create(args.nodes)
        cluster.start()
        state.write_text(json.dumps([asdict(node) for node in cluster.nodes]))
        print("\n".join(cluster.urls))
        return 0
    cluster = RabbitMQCluster([ReferenceNode(**node) for node in json.loads(state.read_text())])
    cluster.stop()
    state.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Issue 12's cluster benchmark: a 3-node Warren cluster (`LocalCluster`, what `warren cluster
up` runs) against a 3-node RabbitMQ cluster (scripts/rabbitmq_cluster.py) on this machine, in
one run, each scenario alternating between the two:

* ``publish`` and ``e2e`` (`warren bench`'s scenarios): confirmed publish, and publish with
  consumption, of ``--messages`` persistent messages;
* ``steady``: end-to-end and confirm latency (p50/p99) at a steady ``--rate`` (10,000 msgs/s);
* ``failover``: a publisher with confirms on a surviving node, the queue leader's node
  SIGKILLed, and the time until confirms resume (server/bench/failover.py).

Every queue is declared ``x-queue-type: quorum`` with ``x-quorum-initial-group-size`` the
cluster's size, through node 1, and its leader and members are read back from each broker
(RabbitMQ: ``rabbitmqctl list_queues name leader members``; Warren: its management API's
``node``, and ``members`` when it gives them) and reported beside the figures, so a queue
that is not replicated shows as such.

    .venv/bin/python scripts/cluster_bench.py [--messages 50000] [--rate 10000] [--seconds 10]

Prints a table, and the whole report as JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import tempfile
import urllib.parse
import urllib.request
from base64 import b64encode
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pamqp import commands
from rabbitmq_cluster import RabbitMQCluster

from warrenmq.server.bench import failover, loadgen, wire
from warrenmq.server.bench.client import ClientConnection
from warrenmq.server.local_cluster import LocalCluster

AUTH = "Basic " + b64encode(b"guest:guest").decode()
SCENARIO_TIMEOUT_S = 300.0
FIGURES = {
    "publish": ("msgs_per_s", "confirm_latency_ms_p50", "confirm_latency_ms_p99"),
    "e2e": ("msgs_per_s", "latency_ms_p50", "latency_ms_p99"),
    "steady": (
        "confirm_latency_ms_p50",
        "confirm_latency_ms_p99",
        "latency_ms_p50",
        "latency_ms_p99",
        "rate_achieved_msgs_per_s",
        "rate_achieved",
    ),
    "failover": ("failover_ms",),
}


@dataclass
class Side:
    """One broker's cluster as the benchmark drives it."""

    name: str
    urls: list[str]
    members: Callable[[str], dict[str, Any]]
    """A queue's leader and members, by node name."""
    kill_leader: Callable[[str], tuple[Callable[[], None], list[str]]]
    """For a queue: a function that SIGKILLs its leader's node, and the other nodes' URLs."""


def warren_side(cluster: LocalCluster) -> Side:
    def members(queue: str) -> dict[str, Any]:
        path = f"/api/queues/%2F/{urllib.parse.quote(queue, safe='')}"
        request = urllib.request.Request(
            cluster.nodes[1].http_url + path, headers={"Authorization": AUTH}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            item = json.load(response)
        return {"leader": item["node"], "members": item.get("members", [item["node"]])}

    def kill_leader(queue: str) -> tuple[Callable[[], None], list[str]]:
        leader = int(members(queue)["leader"].rpartition("@")[2])
        others = [node.amqp_url for node_id, node in cluster.nodes.items() if node_id != leader]
        return (lambda: cluster.kill(leader)), others

    urls = [node.amqp_url for node in cluster.nodes.values()]
    return Side("Warren", urls, members, kill_leader)


def rabbitmq_side(cluster: RabbitMQCluster) -> Side:
    def kill_leader(queue: str) -> tuple[Callable[[], None], list[str]]:
        leader = cluster.node_named(str(cluster.queue_members(queue)["leader"]))
        others = [node.url for node in cluster.nodes if node is not leader]
        return (lambda: cluster.kill(leader)), others

    return Side("RabbitMQ", cluster.urls, cluster.queue_members, kill_leader)


async def amqp_call(url: str, method: Any, reply: type) -> None:
    connection = await ClientConnection.open(wire.parse_url(url))
    try:
        channel = await connection.open_channel()
        await connection.call(channel, method, reply)
    finally:
        await connection.close()


async def measured_scenario(side: Side, options: loadgen.Options) -> dict[str, Any]:
    """The scenario through node 1, then the queue's members, then the queue deleted."""
    report = await loadgen.run_scenario(side.urls[0], options)
    report["queue_members"] = side.members(options.queue)
    await amqp_call(
        side.urls[0], commands.Queue.Delete(queue=options.queue), commands.Queue.DeleteOk
    )
    return report


async def failover_run(side: Side, args: argparse.Namespace) -> dict[str, Any]:
    queue = f"warren-bench-failover-{side.name.lower()}-{secrets.token_hex(3)}"
    arguments = {"x-queue-type": "quorum", **replicas(args)}
    declare = commands.Queue.Declare(queue=queue, durable=True, arguments=arguments)
    await amqp_call(side.urls[0], declare, commands.Queue.DeclareOk)
    members = side.members(queue)
    kill, survivors = side.kill_leader(queue)
    report = await failover.measure_failover(
        survivors,
        queue,
        kill,
        rate_per_s=args.failover_rate,
        before_s=args.failover_before,
        resume_s_max=args.resume_max,
    )
    return {"queue_members": members, "publisher_urls": survivors, **report}


def scenario_options(scenario: str, side: Side, args: argparse.Namespace) -> loadgen.Options:
    paced = scenario == "steady"
    return loadgen.Options(
        scenario=scenario,
        queue=f"warren-bench-{scenario}-{side.name.lower()}-{secrets.token_hex(3)}",
        queue_type="quorum",
        queue_arguments=replicas(args),
        messages=round(args.rate * args.seconds) if paced else args.messages,
        rate_per_s=args.rate if paced else None,
        keep_queue=True,
        timeout_s=SCENARIO_TIMEOUT_S,
    )


def replicas(args: argparse.Namespace) -> dict[str, int | str]:
    return {"x-quorum-initial-group-size": args.nodes}


async def run_all(sides: list[Side], args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for scenario in ("publish", "e2e", "steady"):
        results[scenario] = {}
        for side in sides:
            options = scenario_options(scenario, side, args)
            results[scenario][side.name] = await measured_scenario(side, options)
    results["failover"] = {side.name: await failover_run(side, args) for side in sides}
    return results


def table(results: dict[str, Any], names: list[str]) -> str:
    lines = [
        f"| scenario | figure | {' | '.join(names)} | ratio {names[0]}/{names[1]} |",
        "|---|---|" + "---|" * (len(names) + 1),
    ]
    for scenario, figures in FIGURES.items():
        reports = results[scenario]
        for figure in figures:
            values = [reports[name].get(figure) for name in names]
            both = all(
                isinstance(value, (int, float)) and not isinstance(value, bool) for value in values
            )
            ratio = f"{values[0] / values[1]:.2f}" if both and values[1] else ""
            cells = " | ".join("—" if value is None else str(value) for value in values)
            lines.append(f"| {scenario} | {figure} | {cells} | {ratio} |")
        members = " | ".join(str(len(reports[name]["queue_members"]["members"])) for name in names)
        lines.append(f"| {scenario} | queue members | {members} | |")
    verdicts = " | ".join(results["failover"][name]["verdict"] for name in names)
    lines.append(f"| failover | verdict | {verdicts} | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nodes", type=int, default=3, help="nodes per cluster (default 3)")
    parser.add_argument("--messages", type=int, default=50_000, help="publish/e2e messages")
    parser.add_argument("--rate", type=float, default=10_000.0, help="steady msgs/s")
    parser.add_argument("--seconds", type=float, default=10.0, help="steady seconds")
    parser.add_argument("--failover-rate", type=float, default=1000.0, help="failover msgs/s")
    parser.add_argument(
        "--failover-before", type=float, default=3.0, help="seconds of publishing before the kill"
    )
    parser.add_argument(
        "--resume-max", type=float, default=30.0, help="seconds to wait for confirms to resume"
    )
    parser.add_argument("--json", action="store_true", help="also print the whole report")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="warren-cluster-bench-") as directory:
        with (
            LocalCluster(directory, args.nodes) as warren,
            RabbitMQCluster.create(args.nodes) as rabbitmq,
        ):
            sides = [warren_side(warren), rabbitmq_side(rabbitmq)]
            results = loadgen.run_loop(lambda: run_all(sides, args))
    if args.json:
        print(json.dumps(results, indent=2))
    print(table(results, [side.name for side in sides]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

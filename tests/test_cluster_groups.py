"""One consumer group whose members connect to different nodes of a 3-node cluster (three
`warren serve` processes): the node leading the super stream's partition 0 coordinates it.
Each partition has one member at a time, every record is acked once, and the partitions of
a member that cancels, closes its connection or loses its node go to the others, which
resume from the committed offsets."""

from __future__ import annotations

import time

import pytest
from cluster_nodes import amqp, api, down, up
from http_api import path

SUPER = "orders"
GROUP = "g"
# Partitions 0 and 1 on node 2 (the coordinator), 2 and 3 on node 1; node 3 leads none.
PLACEMENT = {0: 2, 1: 2, 2: 1, 3: 1}
WAIT_S = 60.0

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(tmp_path):
    running = up(tmp_path / "cluster", 3)
    yield running
    down(running)


class Member:
    """A member of the group on one node: what it was delivered, acked, and holds."""

    def __init__(self, cluster, node: int, tag: str, ack: bool = True) -> None:
        self.tag = tag
        self.connection = amqp(cluster, node)
        self.channel = self.connection.channel()
        self.channel.basic_qos(prefetch_count=10)
        self.ack = ack
        self.delivered: list[tuple[str, int]] = []
        self.acked: list[tuple[str, int]] = []
        self.held: list[tuple[int, tuple[str, int]]] = []
        self.channel.basic_consume(
            SUPER,
            self._received,
            consumer_tag=tag,
            arguments={"x-consumer-group": GROUP, "x-stream-offset": "first"},
        )

    def _received(self, channel, method, properties, body) -> None:
        headers = properties.headers
        record = (headers["x-stream-partition"], headers["x-stream-offset"])
        self.delivered.append(record)
        if self.ack:
            channel.basic_ack(method.delivery_tag)
            self.acked.append(record)
        else:
            self.held.append((method.delivery_tag, record))

    def pump(self) -> None:
        if self.connection.is_open:
            self.connection.process_data_events(time_limit=0.02)


def until(members, condition, what: str) -> None:
    """Serve the members' connections until `condition()` holds."""
    deadline_s = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline_s, what
        for member in members:
            member.pump()


def group_on(cluster, node: int) -> dict | None:
    groups = api(cluster, node).get(path("api", "groups", "/")).json
    return next((g for g in groups if g["super_stream"] == SUPER and g["group"] == GROUP), None)


def settled_with(cluster, node: int, tags: set[str]) -> bool:
    """The group (as `node` shows it) has exactly these members, each partition one of
    them, nothing moving."""
    group = group_on(cluster, node)
    return (
        group is not None
        and set(group["members"]) == tags
        and all(p["member"] in tags and not p["moving"] for p in group["partitions"])
    )


def owners(cluster) -> dict[str, str]:
    group = group_on(cluster, 2)
    assert group is not None
    return {p["partition"]: p["member"] for p in group["partitions"]}


def declare_super_stream(cluster) -> None:
    for index, node in PLACEMENT.items():
        connection = amqp(cluster, node)
        connection.channel().queue_declare(
            f"{SUPER}-{index}", durable=True, arguments={"x-queue-type": "stream"}
        )
        connection.close()
    connection = amqp(cluster, 1)
    channel = connection.channel()
    channel.exchange_declare(SUPER, "x-super-stream", durable=True)
    for index in PLACEMENT:
        channel.queue_bind(
            f"{SUPER}-{index}",
            SUPER,
            str(index),
            arguments={"x-stream-partition-order": index},
        )
    connection.close()
    nodes = {q["name"]: q["node"] for q in api(cluster, 3).get("/api/queues").json}
    assert {nodes[f"{SUPER}-{i}"] for i in PLACEMENT} == {"warren@1", "warren@2"}
    assert all(nodes[f"{SUPER}-{i}"] == f"warren@{n}" for i, n in PLACEMENT.items())


def publish(cluster, first: int, count: int) -> set[str]:
    """`count` records over every partition, through node 1, confirmed."""
    connection = amqp(cluster, 1)
    channel = connection.channel()
    channel.confirm_delivery()
    bodies = set()
    for number in range(first, first + count):
        body = f"r{number}"
        channel.basic_publish(SUPER, str(number % len(PLACEMENT)), body.encode())
        bodies.add(body)
    connection.close()
    return bodies


def committed(cluster) -> int:
    """The group's committed offsets, summed over the partitions (what its members acked,
    as the partitions' nodes have it)."""
    query = f"/consumer/offsets?group={GROUP}&topic={SUPER}"
    return sum(o["offset"] for o in api(cluster, 2).get(query).json["offsets"])


def acked(members) -> list[tuple[str, int]]:
    return [record for member in members for record in member.acked]


def test_members_on_three_nodes_form_one_group_and_hand_over(cluster):
    declare_super_stream(cluster)
    m1 = Member(cluster, 1, "m1")
    m2 = Member(cluster, 2, "m2")
    m3 = Member(cluster, 3, "m3")
    members = [m1, m2, m3]
    # One group, as every node shows it: its coordinator (2) and the members' nodes.
    until(members, lambda: settled_with(cluster, 2, {"m1", "m2", "m3"}), "one group of three")
    for node in (1, 3):
        assert settled_with(cluster, node, {"m1", "m2", "m3"})
    assigned = owners(cluster)
    assert set(assigned.values()) == {"m1", "m2", "m3"}

    # Each partition goes to its one member; every record is acked once.
    total = 40
    publish(cluster, 0, total)
    until(members, lambda: len(acked(members)) == total, "every record acked")
    for member in members:
        assert all(assigned[partition] == member.tag for partition, _ in member.delivered)
    assert len(set(acked(members))) == total

    # The topic API's commit sees the members, wherever connected: 409.
    commit = {"group": GROUP, "topic": SUPER, "offsets": [{"partition": 0, "offset": 0}]}
    for node in (1, 2, 3):
        assert api(cluster, node).post("/consumer/commit", commit).status == 409

    # m1 holds what it is delivered unacked, then cancels: its partitions go to m2 and m3,
    # which get what it did not ack again, and nothing it acked.
    m1.ack = False
    publish(cluster, total, 40)
    total += 40
    until(members, lambda: len(acked(members)) + len(m1.held) == total, "delivered, some held")
    m1_partitions = {p for p, tag in assigned.items() if tag == "m1"}
    assert m1.held and {partition for _, (partition, _) in m1.held} <= m1_partitions
    m1.channel.basic_cancel("m1")
    members.remove(m1)
    until(members, lambda: settled_with(cluster, 2, {"m2", "m3"}), "m1's partitions moved")
    until(members, lambda: len(set(acked([m1, *members]))) == total, "m1's held records again")
    assert len(acked([m1, *members])) == total
    held = {record for _, record in m1.held}
    assert held <= set(m2.acked) | set(m3.acked)

    # A member whose connection closes: its partitions go to the others.
    m4 = Member(cluster, 1, "m4")
    members.append(m4)
    until(members, lambda: settled_with(cluster, 2, {"m2", "m3", "m4"}), "m4 joined")
    publish(cluster, total, 20)
    total += 20
    until(members, lambda: len(acked([m1, *members])) == total, "every record acked")
    m4.connection.close()
    members.remove(m4)
    until(members, lambda: settled_with(cluster, 2, {"m2", "m3"}), "m4's partitions moved")
    publish(cluster, total, 20)
    total += 20
    until(members, lambda: len(acked([m1, m4, *members])) == total, "every record acked")
    assert len(set(acked([m1, m4, *members]))) == total

    # m3's node is killed: the coordinator gives its partitions to m2, which resumes after
    # what m3 acked.
    assert any(tag == "m3" for tag in owners(cluster).values())
    until(members, lambda: committed(cluster) == total, "every ack reached its partition")
    cluster.kill(3)
    members.remove(m3)
    until(members, lambda: settled_with(cluster, 2, {"m2"}), "m3's partitions moved")
    publish(cluster, total, 20)
    total += 20
    everyone = [m1, m3, m4, m2]
    until(members, lambda: len(set(acked(everyone))) == total, "every record acked")
    assert len(acked(everyone)) == total
    m2.connection.close()
    # Every member gone: the topic API may commit again.
    until([], lambda: group_on(cluster, 1) is None or not group_on(cluster, 1)["members"], "")
    assert api(cluster, 1).post("/consumer/commit", commit).status == 204

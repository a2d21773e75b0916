"""Membership of a cluster of real `warren serve` processes, changed through `warren cluster
join|leave|remove` (the CLI, through the HTTP API): a node holding data grows to three, the
new nodes catching up by snapshot; a node leaves or is removed and stays removed; members
come and go while clients declare and publish."""

from __future__ import annotations

import subprocess
import threading
import time

import pika
import pytest
from cluster_nodes import WARREN, amqp, api, down, local_raft, queue_nodes, up, warren
from http_api import eventually, name, path

# Small, so that the log a joining node needs was compacted long before it joins.
SNAPSHOT_ENTRIES = 20


@pytest.fixture
def compacting(monkeypatch):
    """The nodes started from here on compact their metadata log every SNAPSHOT_ENTRIES."""
    monkeypatch.setenv("WARREN_METADATA_SNAPSHOT_ENTRIES", str(SNAPSHOT_ENTRIES))


def join_command(cluster, node: int, through: int) -> list[str]:
    raft_address = f"127.0.0.1:{cluster.nodes[node].raft_port}"
    url = cluster.nodes[through].http_url
    return ["cluster", "join", str(node), raft_address, "--url", url]


def join(cluster, through: int) -> int:
    """A new node started with --join, added by `warren cluster join` through `through`;
    returns its id once it serves."""
    node = cluster.add().node_id
    cluster.start(node, join=True)
    assert f"node {node} added" in warren(*join_command(cluster, node, through))
    cluster.wait_listening(node)
    return node


def join_before_it_starts(cluster, through: int) -> int:
    """`join`, the node started only once the group lost its leader to the change: a lone
    voter that adds a second hears from no quorum until that one answers."""
    node = cluster.add().node_id
    joining = subprocess.Popen(
        [*WARREN, *join_command(cluster, node, through)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stepped_down = eventually(lambda: local_raft(cluster, through)["role"], "follower", 30)
        assert stepped_down == "follower"
        cluster.start(node, join=True)
        printed, errors = joining.communicate(timeout=120)
    finally:
        joining.kill()
    assert joining.returncode == 0, errors
    assert f"node {node} added" in printed
    cluster.wait_listening(node)
    return node


def members(cluster, node: int) -> set[int]:
    """The nodes `node` knows of: the group's voters and the nodes the metadata records."""
    return {item["node_id"] for item in api(cluster, node).get("/api/nodes").json}


@pytest.mark.slow
def test_a_node_holding_data_grows_to_three_and_the_new_ones_catch_up_by_snapshot(
    tmp_path, compacting
):
    cluster = up(tmp_path / "cluster", 1)
    try:
        connection = amqp(cluster, 1)
        channel = connection.channel()
        exchange, old = name("ex"), name("old")
        channel.exchange_declare(exchange, "direct", durable=True)
        queues = [name("q") for _ in range(3 * SNAPSHOT_ENTRIES)]
        for queue in [old, *queues]:
            channel.queue_declare(queue, durable=True)
        channel.queue_bind(old, exchange, "key")
        channel.confirm_delivery()
        channel.basic_publish(exchange, "key", b"kept", pika.BasicProperties(delivery_mode=2))
        connection.close()
        assert local_raft(cluster, 1)["snapshot_index"] > 0

        new_nodes = [join_before_it_starts(cluster, through=1), join(cluster, through=1)]
        assert new_nodes == [2, 3]
        status = warren("cluster", "status", "--url", cluster.nodes[3].http_url)
        assert status.count("follower") + status.count("leader") == 3
        for node in new_nodes:
            # Its log starts after a snapshot: it never held the entries before it.
            assert local_raft(cluster, node)["snapshot_index"] > 0
            # It serves as soon as it listens: every queue, on node 1, with its binding.
            placed = queue_nodes(cluster, node)
            assert {queue: placed.get(queue) for queue in [old, *queues]} == dict.fromkeys(
                [old, *queues], "warren@1"
            )
            bindings = api(cluster, node).get(path("api", "queues", "/", old, "bindings")).json
            assert [b["source"] for b in bindings if b["source"]] == [exchange]

        publisher = amqp(cluster, 2)
        channel = publisher.channel()
        channel.confirm_delivery()
        channel.basic_publish(exchange, "key", b"new", pika.BasicProperties(delivery_mode=2))
        publisher.close()
        consumer = amqp(cluster, 3)
        channel = consumer.channel()
        assert channel.queue_declare(old, passive=True).method.message_count == 2
        received = [channel.basic_get(old, auto_ack=True)[2] for _ in range(2)]
        assert received == [b"kept", b"new"]
        consumer.close()
    finally:
        down(cluster)


def refusal(cluster, node: int) -> str | None:
    """Why `node` refused an AMQP connection (pika keeps connection.close's code and text
    only in its message), or None if it accepted one."""
    try:
        amqp(cluster, node).close()
    except pika.exceptions.ProbableAccessDeniedError as refused:
        return str(refused)
    return None


def assert_refused(cluster, node: int) -> None:
    """The removed node answers connection.open with 530 and why."""
    refused = eventually(lambda: refusal(cluster, node) is not None, True)
    assert refused, f"node {node} still accepts connections"
    expected = f"(530) 'NOT_ALLOWED - node warren@{node} was removed from the cluster'"
    assert expected in refusal(cluster, node)


def assert_serving_metadata(cluster, members: list[int]) -> None:
    """A queue declared through each member is seen through every other."""
    declared = {}
    for node in members:
        declared[name(f"after-{node}")] = f"warren@{node}"
        connection = amqp(cluster, node)
        connection.channel().queue_declare(list(declared)[-1], durable=True)
        connection.close()
    for node in members:
        seen = eventually(
            lambda n=node: {q: queue_nodes(cluster, n).get(q) for q in declared}, declared
        )
        assert seen == declared


@pytest.mark.slow
def test_a_node_that_leaves_or_is_removed_refuses_clients_and_stays_removed(tmp_path):
    cluster = up(tmp_path / "cluster", 3)
    try:
        printed = warren("cluster", "leave", "--url", cluster.nodes[3].http_url)
        assert "node 3 left the cluster" in printed
        assert eventually(lambda: members(cluster, 1), {1, 2}) == {1, 2}
        assert_serving_metadata(cluster, [1, 2])
        assert_refused(cluster, 3)

        # Back to three, then one removed by another member.
        node = join(cluster, through=2)
        assert_serving_metadata(cluster, [1, 2, node])
        printed = warren("cluster", "remove", "2", "--url", cluster.nodes[1].http_url)
        assert "node 2 removed" in printed
        assert_serving_metadata(cluster, [1, node])
        assert_refused(cluster, 2)
        assert eventually(lambda: members(cluster, 1), {1, node}) == {1, node}

        for removed in (2, 3):
            cluster.kill(removed)
            cluster.start(removed)
            cluster.wait_listening(removed)
            assert_refused(cluster, removed)
        assert_serving_metadata(cluster, [1, node])
    finally:
        down(cluster)


# Between a load client's calls: a steady load all through the membership changes, bounded
# so that checking every answered call afterwards stays short (unpaced, a run piled up tens
# of thousands of queues and outlasted the test timeout on a loaded machine).
LOAD_PAUSE_S = 0.02


class Load:
    """Clients working through the membership change, each on its own thread: one declares
    queues through `declare_node`, one publishes with confirms through `publish_node` to
    `queue`. What the broker answered OK is recorded; a connection lost mid-call leaves that
    call's outcome unknown (not recorded), and the client connects again."""

    def __init__(self, cluster, declare_node: int, publish_node: int, queue: str) -> None:
        self.cluster = cluster
        self.queue = queue
        self.declared: list[str] = []
        self.confirmed: list[bytes] = []
        self.errors: list[Exception] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(declare_node, self._declare)),
            threading.Thread(target=self._run, args=(publish_node, self._publish)),
        ]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def wait_for_progress(self) -> None:
        """Until both clients got another answer."""
        declared, confirmed = len(self.declared), len(self.confirmed)
        eventually(lambda: len(self.declared) > declared and len(self.confirmed) > confirmed, True)

    def _run(self, node: int, work) -> None:
        while not self._stop.is_set():
            try:
                connection = amqp(self.cluster, node)
                try:
                    work(connection.channel())
                finally:
                    if connection.is_open:
                        connection.close()
            except pika.exceptions.AMQPError as error:
                self.errors.append(error)
                time.sleep(0.1)

    def _declare(self, channel) -> None:
        while not self._stop.wait(LOAD_PAUSE_S):
            queue = name("load")
            channel.queue_declare(queue, durable=True)
            self.declared.append(queue)

    def _publish(self, channel) -> None:
        channel.confirm_delivery()
        while not self._stop.wait(LOAD_PAUSE_S):
            body = name("m").encode()
            channel.basic_publish("", self.queue, body, pika.BasicProperties(delivery_mode=2))
            self.confirmed.append(body)


@pytest.mark.slow
def test_declares_and_confirms_answered_during_membership_changes_are_kept(tmp_path):
    cluster = up(tmp_path / "cluster", 3)
    try:
        target = name("target")
        connection = amqp(cluster, 1)
        connection.channel().queue_declare(target, durable=True)
        connection.close()
        with Load(cluster, declare_node=1, publish_node=2, queue=target) as load:
            load.wait_for_progress()
            added = join(cluster, through=3)
            load.wait_for_progress()
            printed = warren("cluster", "remove", "3", "--url", cluster.nodes[2].http_url)
            assert "node 3 removed" in printed
            load.wait_for_progress()
        assert load.declared and load.confirmed
        for node in (1, 2, added):
            expected = dict.fromkeys(load.declared, "warren@1")
            seen = eventually(
                lambda n=node: {q: queue_nodes(cluster, n).get(q) for q in load.declared},
                expected,
            )
            assert seen == expected
        consumer = amqp(cluster, added)
        channel = consumer.channel()
        stored = channel.queue_declare(target, passive=True).method.message_count
        assert stored >= len(load.confirmed)
        channel.basic_qos(prefetch_count=1000)
        received = set()
        for method, _, body in channel.consume(target, auto_ack=True, inactivity_timeout=30):
            assert method is not None, f"{len(received)} of {stored} arrived"
            received.add(body)
            if len(received) == stored:
                break
        consumer.close()
        assert set(load.confirmed) <= received
    finally:
        down(cluster)

"""Three `warren serve` processes as one cluster (started by `warren cluster up`): metadata
declared through one node is usable there at once and seen by the others, placement, a
metadata leader SIGKILLed, the whole cluster restarted, `warren cluster status`."""

from __future__ import annotations

import json
import signal
import stat
from pathlib import Path

import pika
import pytest
from cluster_nodes import (
    amqp,
    api,
    declare_until_it_works,
    down,
    leader,
    local_raft,
    queue_nodes,
    up,
    warren,
)
from http_api import eventually, name, path

from warrenmq.cluster.raft.core import RaftConfig


@pytest.fixture
def cluster(tmp_path):
    running = up(tmp_path / "cluster", 3)
    yield running
    down(running)


def test_what_a_follower_declares_is_usable_there_at_once_and_seen_everywhere(cluster):
    follower = next(node for node in (1, 2, 3) if node != leader(cluster))
    connection = amqp(cluster, follower)
    channel = connection.channel()
    exchange, queue = name("ex"), name("q")
    channel.exchange_declare(exchange, "direct", durable=True)
    channel.queue_declare(queue, durable=True)
    channel.queue_bind(queue, exchange, "key")
    channel.confirm_delivery()
    channel.basic_publish(exchange, "key", b"at once")
    assert channel.basic_get(queue, auto_ack=True)[2] == b"at once"
    connection.close()
    for other in {1, 2, 3} - {follower}:
        http = api(cluster, other)
        seen = eventually(lambda h=http: h.get(path("api", "exchanges", "/", exchange)).status, 200)
        assert seen == 200
        placed = eventually(
            lambda n=other: queue_nodes(cluster, n).get(queue), f"warren@{follower}"
        )
        assert placed == f"warren@{follower}"
        bindings = http.get(path("api", "queues", "/", queue, "bindings")).json
        assert [b["source"] for b in bindings if b["source"]] == [exchange]


def test_client_local_queues_land_on_the_connected_node_and_balanced_ones_spread(cluster):
    for node in (1, 2, 3):
        connection = amqp(cluster, node)
        local = name(f"local{node}")
        connection.channel().queue_declare(local, durable=True)
        connection.close()
        assert queue_nodes(cluster, node)[local] == f"warren@{node}"
    counts = {node: 0 for node in (1, 2, 3)}
    for placed in queue_nodes(cluster, 1).values():
        counts[int(placed.partition("@")[2])] += 1
    connection = amqp(cluster, 2)
    channel = connection.channel()
    declared = [name("balanced") for _ in range(6)]
    expected = {}
    for queue in declared:
        channel.queue_declare(queue, durable=True, arguments={"x-queue-leader-locator": "balanced"})
        # The member leading the fewest queues, ties to the lowest id.
        chosen = min(counts, key=lambda node: (counts[node], node))
        counts[chosen] += 1
        expected[queue] = f"warren@{chosen}"
    connection.close()
    placed = queue_nodes(cluster, 2)
    assert {queue: placed[queue] for queue in declared} == expected
    assert len(set(expected.values())) == 3
    # Each leader hosts its queue: a publish and a get through it work.
    for queue, node in expected.items():
        connection = amqp(cluster, int(node.partition("@")[2]))
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("", queue, b"m")
        assert channel.basic_get(queue, auto_ack=True)[2] == b"m"
        connection.close()


def test_work_on_a_queue_another_node_leads_is_forwarded_to_it(cluster):
    connection = amqp(cluster, 1)
    queue = name("q")
    connection.channel().queue_declare(queue, durable=True)
    connection.close()
    assert queue_nodes(cluster, 1)[queue] == "warren@1"

    publisher = amqp(cluster, 2)
    channel = publisher.channel()
    channel.confirm_delivery()
    for body in (b"one", b"two", b"three"):
        channel.basic_publish(
            "", queue, body, pika.BasicProperties(delivery_mode=2, message_id=body.decode())
        )
    # A passive declare through node 2 counts what node 1 holds.
    assert channel.queue_declare(queue, passive=True).method.message_count == 3
    publisher.close()

    consumer = amqp(cluster, 3)
    channel = consumer.channel()
    method, properties, body = channel.basic_get(queue)
    assert (body, properties.message_id) == (b"one", "one")
    channel.basic_nack(method.delivery_tag, requeue=True)
    received = []
    channel.basic_qos(prefetch_count=10)
    for method, _, body in channel.consume(queue, inactivity_timeout=10):
        assert method is not None, f"only {received} arrived through node 3"
        received.append((body, method.redelivered))
        channel.basic_ack(method.delivery_tag)
        if len(received) == 3:
            break
    channel.cancel()
    assert received == [(b"one", True), (b"two", False), (b"three", False)]
    assert channel.queue_purge(queue).method.message_count == 0
    channel.queue_delete(queue)
    consumer.close()
    eventually(lambda: queue in queue_nodes(cluster, 1), False)


def test_declares_through_the_survivors_work_after_the_metadata_leader_is_killed(cluster):
    killed = leader(cluster)
    cluster.kill(killed)
    survivors = [node for node in (1, 2, 3) if node != killed]
    for node in survivors:
        queue = name(f"after-kill-{node}")
        declare_until_it_works(cluster, node, queue)
        assert queue_nodes(cluster, node)[queue] == f"warren@{node}"
    # Balanced placement skips the node that is down, as RabbitMQ's does.
    connection = amqp(cluster, survivors[0])
    channel = connection.channel()
    balanced = [name("balanced-after-kill") for _ in range(4)]
    for queue in balanced:
        channel.queue_declare(queue, durable=True, arguments={"x-queue-leader-locator": "balanced"})
    connection.close()
    placed = queue_nodes(cluster, survivors[0])
    assert {placed[queue] for queue in balanced} <= {f"warren@{node}" for node in survivors}
    status = warren("cluster", "status", "--url", cluster.nodes[survivors[0]].http_url)
    assert "leader" in status and f"warren@{killed}" in status


def test_the_nodes_share_a_random_secret_kept_from_other_users_and_command_lines(cluster):
    """`warren cluster up` makes the secret the nodes prove to each other: in cluster.json,
    readable by its owner only, and in each node's environment, never its command line
    (which every local user can read). Restarted, they keep it: the restart tests below
    need that to form a cluster again."""
    state = cluster.directory / "cluster.json"
    assert stat.S_IMODE(state.stat().st_mode) == 0o600
    secret = json.loads(state.read_text())["secret"]
    assert len(secret) >= 32
    for node in cluster.nodes.values():
        assert secret.encode() not in Path(f"/proc/{node.pid}/cmdline").read_bytes()
        environment = Path(f"/proc/{node.pid}/environ").read_bytes().split(b"\0")
        assert f"WARREN_CLUSTER_SECRET={secret}".encode() in environment


def test_the_whole_cluster_restarted_keeps_its_metadata(cluster):
    connection = amqp(cluster, 3)
    channel = connection.channel()
    exchange, queue = name("ex"), name("q")
    channel.exchange_declare(exchange, "topic", durable=True)
    channel.queue_declare(queue, durable=True)
    channel.queue_bind(queue, exchange, "a.#")
    channel.confirm_delivery()
    channel.basic_publish(exchange, "a.b", b"kept", pika.BasicProperties(delivery_mode=2))
    connection.close()
    cluster.stop()
    cluster.start_all()
    for node in (1, 2, 3):
        http = api(cluster, node)
        placed = eventually(lambda n=node: queue_nodes(cluster, n).get(queue), "warren@3")
        assert placed == "warren@3"
        assert http.get(path("api", "exchanges", "/", exchange)).json["type"] == "topic"
    connection = amqp(cluster, 3)
    assert connection.channel().basic_get(queue, auto_ack=True)[2] == b"kept"
    connection.close()


def test_transient_exchanges_outlive_a_rolling_restart_not_a_whole_cluster_one(cluster):
    """As RabbitMQ's RAM tables: a node that comes back while another that held them runs
    has them (it asked the others for their boots, `NodeStarted`); the whole cluster stopped
    at once forgets them."""
    exchange = name("transient")
    connection = amqp(cluster, 1)
    connection.channel().exchange_declare(exchange, "fanout", durable=False)
    connection.close()
    target = path("api", "exchanges", "/", exchange)
    for node in (1, 2, 3):
        cluster.kill(node)
        cluster.start(node)
        cluster.wait_listening(node)
    for node in (1, 2, 3):
        assert api(cluster, node).get(target).status == 200
    cluster.stop()
    cluster.start_all()
    for node in (1, 2, 3):
        assert eventually(lambda n=node: api(cluster, n).get(target).status, 404) == 404


def test_a_node_resumed_behind_the_compacted_log_serves_the_snapshot_it_installs(
    tmp_path, monkeypatch
):
    """A running node that fell behind the leader's compacted log gets a snapshot, which
    applies no entry one by one: it still serves the queues declared meanwhile (forwarded
    to their leader) and no longer the ones deleted meanwhile."""
    snapshot_entries = 20
    monkeypatch.setenv("WARREN_METADATA_SNAPSHOT_ENTRIES", str(snapshot_entries))
    cluster = up(tmp_path / "cluster", 3)
    resumed = 0
    try:
        through = leader(cluster)
        resumed = next(node for node in (1, 2, 3) if node != through)
        connection = amqp(cluster, through)
        channel = connection.channel()
        gone = name("gone")
        channel.queue_declare(gone, durable=True)
        known = eventually(lambda: queue_nodes(cluster, resumed).get(gone), f"warren@{through}")
        assert known == f"warren@{through}"
        behind_at = local_raft(cluster, resumed)["snapshot_index"]

        cluster.signal(resumed, signal.SIGSTOP)
        # The stopped node's socket buffers take the appends the leader pipelines to it
        # until that many are unanswered; it gets the entries after those (but the last
        # few, after the leader's last snapshot) only as a snapshot.
        pipelined = RaftConfig.max_inflight_appends
        declared = [name("meanwhile") for _ in range(pipelined + 4 * snapshot_entries)]
        for queue in declared:
            channel.queue_declare(queue, durable=True)
        channel.queue_delete(gone)
        connection.close()
        cluster.signal(resumed, signal.SIGCONT)

        last = declared[-1]
        placed = eventually(lambda: queue_nodes(cluster, resumed).get(last), f"warren@{through}")
        assert placed == f"warren@{through}"
        assert local_raft(cluster, resumed)["snapshot_index"] > behind_at
        connection = amqp(cluster, resumed)
        channel = connection.channel()
        for queue in declared:
            channel.queue_declare(queue, passive=True)
        channel.confirm_delivery()
        for queue in (declared[pipelined + snapshot_entries], last):
            channel.basic_publish("", queue, b"after the snapshot", mandatory=True)
            assert channel.basic_get(queue, auto_ack=True)[2] == b"after the snapshot"
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            channel.queue_declare(gone, passive=True)
        assert closed.value.reply_code == 404
        connection.close()
    finally:
        if resumed:
            cluster.signal(resumed, signal.SIGCONT)
        down(cluster)

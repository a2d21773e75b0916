"""A node whose metadata lags (it hears nothing from the others for a while) still answers
every metadata question as of now: what it does not have yet is a read, and waits for a
Raft read point (`read_barrier`) before "nothing to do" is answered. Three in-process nodes;
one of the followers stops taking Raft frames while a queue is declared through the leader.
"""

from __future__ import annotations

import threading
import time

import pika
import pika.exceptions
import pytest
from brokers import ThreadBroker
from http_api import HttpApi, eventually, path
from ports import free_ports

from warrenmq.server.metadata import commands as c

DEAF_S = 1.0


@pytest.fixture
def nodes(tmp_path):
    peers = ",".join(f"{node}=127.0.0.1:{port}" for node, port in enumerate(free_ports(3), 1))
    nodes = [ThreadBroker(tmp_path / str(n), node_id=n, cluster=peers) for n in (1, 2, 3)]
    starting = [threading.Thread(target=node.start) for node in nodes]
    for thread in starting:
        thread.start()
    for thread in starting:
        thread.join()
    try:
        yield nodes
    finally:
        for node in reversed(nodes):
            node.stop()


def _ready(nodes) -> tuple:
    """The leader, and a follower, once there is a leader."""
    deadline = time.monotonic() + 10
    while True:
        roles = {node.broker.store.group.raft.role: node for node in nodes}
        if "leader" in roles and "follower" in roles:
            return roles["leader"], roles["follower"]
        assert time.monotonic() < deadline, "no leader"
        time.sleep(0.05)


def _deaf_for_a_while(node) -> None:
    """`node` drops every Raft frame it receives for DEAF_S (its own frames still leave):
    the leader commits without it, and it cannot learn of anything meanwhile."""
    transport = node.broker.store.group.transport
    hearing = transport.on_frame
    transport.on_frame = lambda frame: None
    threading.Timer(DEAF_S, lambda: setattr(transport, "on_frame", hearing)).start()


def _exists(node, name: str) -> bool:
    return node.broker.store.state.queue("/", name) is not None


def _declared_through(node, name: str) -> None:
    connection = node.connect()
    connection.channel().queue_declare(name, durable=True)
    connection.close()


def test_a_delete_through_a_lagging_node_deletes_a_queue_it_has_not_heard_of(nodes):
    leader, lagging = _ready(nodes)
    _deaf_for_a_while(lagging)
    _declared_through(leader, "late")
    assert not _exists(lagging, "late")
    connection = lagging.connect()
    connection.channel().queue_delete("late")
    connection.close()
    # The delete was answered after the declare was: the queue is gone everywhere.
    assert not _exists(lagging, "late")
    assert eventually(lambda: _exists(leader, "late"), False) is False


def test_an_http_delete_through_a_lagging_node_finds_what_it_has_not_heard_of(nodes):
    leader, lagging = _ready(nodes)
    _deaf_for_a_while(lagging)
    leader.call(
        leader.broker.store.apply(c.SetPolicy("/", "late", "^x", {"max-length": 1}, 0, "queues"))
    )
    api = HttpApi(lagging.management_url)
    assert api.delete(path("api", "policies", "/", "late")).status == 204
    assert "late" not in leader.broker.store.state.policies("/")


def test_a_passive_declare_through_a_lagging_node_sees_a_queue_declared_elsewhere(nodes):
    leader, lagging = _ready(nodes)
    _deaf_for_a_while(lagging)
    _declared_through(leader, "seen")
    connection = lagging.connect()
    try:
        assert connection.channel().queue_declare("seen", passive=True).method.queue == "seen"
    except pika.exceptions.ChannelClosedByBroker as closed:
        pytest.fail(f"a stale read: {closed}")
    finally:
        connection.close()


def test_a_declare_racing_one_through_another_node_does_not_host_the_queue_here(nodes):
    """Two nodes declare one new queue at once: the other node's declare commits first (it
    leads the queue), so this node's, which found no record when it began and opened the
    storage, turns out a redeclaration. It forwards the queue rather than host a second,
    local one, which shadowed the forwarder: later incarnations of the name then found a
    stale forwarder here, and requests went to a node that did not lead the queue. The race
    is made certain by hiding the record from this node's first look."""
    leader, racing = _ready(nodes)
    connection = leader.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("raced", durable=True)
    channel.basic_publish("", "raced", b"on the leader", pika.BasicProperties(delivery_mode=2))
    connection.close()
    eventually(lambda: "raced" in racing.broker.vhosts["/"].remote, True)
    state = racing.broker.store.state
    state.queue = _first_look_misses(state.queue, "raced")
    try:
        connection = racing.connect()
        declared = connection.channel().queue_declare("raced", durable=True)
        connection.close()
    finally:
        del state.queue
    assert declared.method.message_count == 1
    vhost = racing.broker.vhosts["/"]
    assert "raced" not in vhost.queues
    assert vhost.remote["raced"].node == leader.broker.node_id


def _first_look_misses(lookup, name: str):
    missed = []

    def look(vhost: str, queue: str):
        if queue == name and not missed:
            missed.append(queue)
            return None
        return lookup(vhost, queue)

    return look

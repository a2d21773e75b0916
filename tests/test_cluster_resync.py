"""`ClusterNode.resync`: a running node that installs a metadata snapshot (it fell behind the
leader's compacted log) applies none of the entries the snapshot covers one by one, so its
running side takes the whole state at once. Two in-process nodes (test_forwarding's): node B
misses the entries applied meanwhile as such a node does (its listener does not hear of
them, its state changes), then resyncs; each test fails if its step of `resync` is left
out. tests/test_cluster_nodes.py has the process-level test of queues declared meanwhile."""

from __future__ import annotations

from contextlib import contextmanager

import pika
import pytest
import test_forwarding
from http_api import HttpApi, path
from test_forwarding import QUEUE

from warrenmq.server.metadata import commands as c
from warrenmq.server.metadata.records import QueueRecord

A, B = 1, 2
# Nodes A and B; the queue QUEUE led by A, forwarded by B.
nodes = test_forwarding.nodes


async def _on_loop(function):
    return function()


@contextmanager
def behind(node):
    """Within: `node` applies entries to its state but its running side does not hear of
    them; after: it has applied all of them and resyncs, as after installing a snapshot."""
    machine = node.broker.store.machine
    listener = machine.listener
    machine.listener = None
    try:
        yield
        caught_up(node)
    finally:
        machine.listener = listener
    node.call(_on_loop(node.broker.node.resync))


def caught_up(node) -> None:
    """Until `node` applied every entry committed so far."""
    node.call(node.broker.store.read_barrier())


def through(node, command: c.Command):
    """`command` proposed through `node`'s store; returns once applied there."""
    return node.call(node.broker.store.apply(command))


def declare_led_by(node, leader: int, name: str, arguments=None) -> None:
    """A durable queue whose record says `leader` leads it, proposed through `node`."""
    command = c.DeclareQueue("/", name, durable=True, arguments=arguments or {}, node=leader)
    through(node, command)


def vhost_of(node, name: str = "/"):
    return node.broker.vhosts.get(name)


def test_a_forwarded_queue_deleted_meanwhile_is_retired(nodes):
    a, b = nodes
    forwarder = vhost_of(b).remote[QUEUE]
    with behind(b):
        through(a, c.DeleteQueue("/", QUEUE))
        assert vhost_of(b).remote.get(QUEUE) is forwarder
    assert QUEUE not in vhost_of(b).remote
    assert vhost_of(b).served_queue(QUEUE) is None
    connection = b.connect()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        connection.channel().queue_declare(QUEUE, passive=True)
    assert closed.value.reply_code == 404


def test_a_hosted_queue_deleted_meanwhile_is_retired_with_its_data(nodes):
    a, b = nodes
    declare_led_by(a, B, "on-b")
    caught_up(b)
    hosted = vhost_of(b).queues["on-b"]
    directory = vhost_of(b).queue_directory("on-b")
    assert directory.exists()
    with behind(b):
        through(a, c.DeleteQueue("/", "on-b"))
    assert "on-b" not in vhost_of(b).queues
    assert hosted.deleted
    assert not directory.exists()


def test_a_queue_whose_leader_changed_meanwhile_is_served_where_it_now_is(nodes):
    """QUEUE, led by A, deleted and declared again led by B: B hosts it and forwards it no
    more; "moved", led by B, deleted and declared again led by A: B forwards it to A."""
    a, b = nodes
    declare_led_by(a, B, "moved")
    caught_up(b)
    with behind(b):
        through(a, c.DeleteQueue("/", QUEUE))
        declare_led_by(a, B, QUEUE)
        through(a, c.DeleteQueue("/", "moved"))
        declare_led_by(a, A, "moved")
    vhost = vhost_of(b)
    assert QUEUE in vhost.queues and QUEUE not in vhost.remote
    assert "moved" in vhost.remote and "moved" not in vhost.queues
    assert vhost.remote["moved"].node == A
    connection = b.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    for name in (QUEUE, "moved"):
        channel.basic_publish("", name, name.encode(), mandatory=True)
        assert channel.basic_get(name, auto_ack=True)[2] == name.encode()
    connection.close()


def test_policies_set_changed_and_cleared_meanwhile_apply(nodes):
    a, b = nodes
    declare_led_by(a, B, "capped-1")
    declare_led_by(a, B, "capped-2")
    declare_led_by(a, B, "limited-1")
    through(a, c.SetPolicy("/", "limit", "^limited-", {"max-length": 5}, apply_to="queues"))
    through(a, c.SetPolicy("/", "old", "^capped-2", {"max-length": 7}, apply_to="queues"))
    caught_up(b)
    assert vhost_of(b).queues["limited-1"].effective_arguments.get("x-max-length") == 5
    with behind(b):
        through(a, c.SetPolicy("/", "cap", "^capped-", {"max-length": 1}, apply_to="queues"))
        through(a, c.SetPolicy("/", "limit", "^limited-", {"max-length": 2}, apply_to="queues"))
        through(a, c.ClearPolicy("/", "old"))
    queues = vhost_of(b).queues
    assert queues["capped-1"].effective_arguments.get("x-max-length") == 1
    assert queues["capped-2"].effective_arguments.get("x-max-length") == 1
    assert queues["limited-1"].effective_arguments.get("x-max-length") == 2
    with behind(b):
        through(a, c.ClearPolicy("/", "cap"))
    assert "x-max-length" not in queues["capped-1"].effective_arguments


def test_vhosts_added_and_deleted_meanwhile_are_hosted_and_retired(nodes):
    a, b = nodes
    through(a, c.DeclareVhost("old"))
    through(a, c.DeclareQueue("old", "in-old", durable=True, node=B))
    caught_up(b)
    old = vhost_of(b, "old")
    hosted = old.queues["in-old"]
    with behind(b):
        through(a, c.DeleteVhost("old"))
        through(a, c.DeclareVhost("new"))
        assert vhost_of(b, "old") is old and vhost_of(b, "new") is None
    assert vhost_of(b, "old") is None
    assert hosted.deleted
    assert vhost_of(b, "new") is not None
    through(b, c.SetPermissions("guest", "new", ".*", ".*", ".*"))
    connection = b.connect(virtual_host="new")
    connection.channel().queue_declare("there", durable=True)
    connection.close()


def test_a_delayed_exchange_deleted_meanwhile_drops_its_store(nodes):
    """B holds what was published through it to a delayed exchange: the exchange deleted
    meanwhile, the store goes with its messages."""
    a, b = nodes
    delayed_type = {"x-delayed-type": "direct"}
    through(b, c.DeclareExchange("/", "dx", "x-delayed-message", True, arguments=delayed_type))
    through(b, c.Bind("/", "dx", QUEUE, routing_key="k"))
    connection = b.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    held = pika.BasicProperties(headers={"x-delay": 3_600_000}, delivery_mode=2)
    channel.basic_publish("dx", "k", b"held an hour", held)
    connection.close()
    delayed = vhost_of(b).delayed
    store = delayed.stores["dx"]
    with behind(b):
        through(a, c.DeleteExchange("/", "dx"))
    assert "dx" not in delayed.stores
    assert store.deleted


def test_the_http_api_of_a_resynced_node_lists_what_it_serves(nodes):
    a, b = nodes
    with behind(b):
        through(a, c.DeleteQueue("/", QUEUE))
        declare_led_by(a, A, "later")
    http = HttpApi(b.management_url)
    assert http.get(path("api", "queues", "/", QUEUE)).status == 404
    assert http.get(path("api", "queues", "/", "later")).json["node"] == "warren@1"
    assert set(vhost_of(b).remote) == {"later"}
    assert isinstance(a.broker.store.state.queue("/", "later"), QueueRecord)


@pytest.mark.xfail(
    strict=True,
    reason="a queue record has no identity beyond its name: resync cannot tell a queue "
    "deleted and declared again on the same leader meanwhile from the one it hosts, whose "
    "messages come back",
)
def test_a_hosted_queue_deleted_and_declared_again_meanwhile_is_a_new_empty_queue(nodes):
    a, b = nodes
    declare_led_by(a, B, "again")
    caught_up(b)
    connection = b.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    channel.basic_publish(
        "", "again", b"of the deleted queue", pika.BasicProperties(delivery_mode=2)
    )
    connection.close()
    with behind(b):
        through(a, c.DeleteQueue("/", "again"))
        declare_led_by(a, B, "again")
    connection = b.connect()
    assert connection.channel().queue_declare("again", passive=True).method.message_count == 0
    connection.close()

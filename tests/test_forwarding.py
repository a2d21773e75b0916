"""Forwarding between two nodes of one cluster (`server/forward`): real pika clients on real
sockets to node B, the queue declared through node A (client-local placement: A leads it),
so every client of B works on A's queue through the link.
"""

from __future__ import annotations

import asyncio
import threading

import pika
import pika.exceptions
import pytest
from brokers import ThreadBroker
from http_api import HttpApi, eventually, path
from ports import free_ports

from warrenmq.amqp.replies import ProtocolError
from warrenmq.cluster.transport import PeerTransport
from warrenmq.server.forward import wire
from warrenmq.server.metadata import commands as c

QUEUE = "q"
SECRET = "s3cret"


def _placed_on_a(a, b, name: str = QUEUE, **declare) -> None:
    connection = a.connect()
    connection.channel().queue_declare(name, durable=True, **declare)
    connection.close()
    # B forwards once it applied the declare.
    eventually(lambda: name in b.broker.vhosts["/"].remote, True)


def _two_nodes(tmp_path, secret_of_b: str = SECRET):
    """Nodes 1 (A) and 2 (B) of one metadata group, started side by side: each waits for
    the other to elect a leader."""
    peers = ",".join(f"{node}=127.0.0.1:{port}" for node, port in enumerate(free_ports(2), 1))
    nodes = [
        ThreadBroker(tmp_path / "a", node_id=1, cluster=peers, cluster_secret=SECRET),
        ThreadBroker(tmp_path / "b", node_id=2, cluster=peers, cluster_secret=secret_of_b),
    ]
    starting = [threading.Thread(target=node.start) for node in nodes]
    for thread in starting:
        thread.start()
    for thread in starting:
        thread.join()
    return nodes


@pytest.fixture
def nodes(tmp_path):
    a, b = _two_nodes(tmp_path)
    try:
        _placed_on_a(a, b)
        yield a, b
    finally:
        for node in (b, a):
            node.stop()


def _ready_on(node, name: str = QUEUE) -> int:
    connection = node.connect()
    count = connection.channel().queue_declare(name, passive=True).method.message_count
    connection.close()
    return count


def _publish(node, bodies, name: str = QUEUE, persistent: bool = True) -> None:
    connection = node.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    for body in bodies:
        channel.basic_publish(
            "",
            name,
            body,
            pika.BasicProperties(delivery_mode=2 if persistent else 1),
            mandatory=True,
        )
    connection.close()


def _consume(node, count: int, name: str = QUEUE, **consume) -> list:
    connection = node.connect()
    channel = connection.channel()
    got = []
    for method, _, body in channel.consume(name, inactivity_timeout=10, **consume):
        assert method is not None, f"only {len(got)} of {count} arrived"
        got.append((method, body))
        if not consume.get("auto_ack"):
            channel.basic_ack(method.delivery_tag)
        if len(got) == count:
            break
    channel.cancel()
    connection.close()
    return got


def test_published_via_b_is_stored_on_a_before_the_confirm(nodes):
    a, b = nodes
    bodies = [b"m%d" % i for i in range(50)]
    _publish(b, bodies)
    # Every publish was confirmed: A holds them all, B holds none of its own.
    assert _ready_on(a) == 50
    assert b.broker.vhosts["/"].queues.get(QUEUE) is None
    assert [body for _, body in _consume(a, 50)] == bodies


def test_confirm_via_b_waits_for_the_owners_fsync(nodes):
    a, b = nodes
    fsync_started, release = _hold_fsync(a, QUEUE)
    publisher = threading.Thread(target=_publish, args=(b, [b"durable"]))
    publisher.start()
    assert fsync_started.wait(10)
    # A has the message and its fsync has not finished: B's client has no confirm yet.
    assert publisher.is_alive()
    a.loop.call_soon_threadsafe(release.set)
    publisher.join(10)
    assert not publisher.is_alive()
    assert _ready_on(a) == 1


def _hold_fsync(node, name: str) -> tuple[threading.Event, asyncio.Event]:
    """Hold the fsyncs of the queue `name` on `node`: (set once one started, the event on
    the node's loop that lets it finish)."""
    engine = node.broker.vhosts["/"].queues[name].engine
    fsync = engine.commit
    fsync_started = threading.Event()
    release = node.call(_event())

    async def held_commit():
        fsync_started.set()
        await release.wait()
        return await fsync()

    engine.commit = held_commit
    return fsync_started, release


async def _event() -> asyncio.Event:
    return asyncio.Event()


def test_transaction_via_b(nodes):
    a, b = nodes
    connection = b.connect()
    channel = connection.channel()
    channel.tx_select()
    channel.basic_publish("", QUEUE, b"in-tx")
    assert _ready_on(a) == 0
    channel.tx_commit()
    assert _ready_on(a) == 1
    connection.close()


def test_transient_publish_via_b(nodes):
    a, b = nodes
    _publish(b, [b"t1", b"t2"], persistent=False)
    assert _ready_on(a) == 2


def test_published_via_a_is_consumed_via_b_and_acked_on_a(nodes):
    a, b = nodes
    bodies = [b"x%d" % i for i in range(30)]
    _publish(a, bodies)
    got = _consume(b, 30)
    assert [body for _, body in got] == bodies
    assert not any(method.redelivered for method, _ in got)
    assert _ready_on(a) == 0
    # Acked on A, not merely delivered: nothing comes back once B's consumer is gone.
    connection = a.connect()
    method, _, _ = connection.channel().basic_get(QUEUE)
    assert method is None
    connection.close()


def test_prefetch_holds_through_the_link(nodes):
    a, b = nodes
    _publish(a, [b"p%d" % i for i in range(10)])
    connection = b.connect()
    channel = connection.channel()
    channel.basic_qos(prefetch_count=3)
    received = []
    channel.basic_consume(QUEUE, lambda ch, method, props, body: received.append(method))
    _pump(connection, lambda: len(received) >= 3)
    connection.process_data_events(time_limit=0.5)
    assert len(received) == 3
    channel.basic_ack(received[-1].delivery_tag, multiple=True)
    _pump(connection, lambda: len(received) >= 6)
    connection.process_data_events(time_limit=0.5)
    assert len(received) == 6
    connection.close()


def _pump(connection, done, rounds_max: int = 100) -> None:
    """Process a blocking connection's events until `done()` (or give up after a while)."""
    for _ in range(rounds_max):
        if done():
            return
        connection.process_data_events(time_limit=0.1)


def test_a_stream_is_consumed_via_b_from_an_offset_with_acks_for_credit(nodes):
    a, b = nodes
    _placed_on_a(a, b, "s", arguments={"x-queue-type": "stream"})
    _publish(a, [b"s%d" % i for i in range(10)], "s")
    connection = b.connect()
    channel = connection.channel()
    channel.basic_qos(prefetch_count=2)
    received = []
    channel.basic_consume(
        "s",
        lambda ch, method, props, body: received.append(
            (method, props.headers["x-stream-offset"], body)
        ),
        consumer_tag="reader",
        arguments={"x-stream-offset": 6},
    )
    _pump(connection, lambda: len(received) >= 2)
    connection.process_data_events(time_limit=0.5)
    assert len(received) == 2
    channel.basic_ack(received[-1][0].delivery_tag, multiple=True)
    _pump(connection, lambda: len(received) >= 4)
    assert [(offset, body) for _, offset, body in received] == [
        (offset, b"s%d" % offset) for offset in range(6, 10)
    ]
    channel.basic_ack(received[-1][0].delivery_tag, multiple=True)
    # A's own stream consumer, under the client's tag, took the acks: its tracked offset.
    stream = a.broker.vhosts["/"].queues["s"]
    eventually(lambda: stream.tracked.get("reader"), 10)
    connection.close()


def test_nack_via_b_redelivers(nodes):
    a, b = nodes
    _publish(a, [b"again"])
    connection = b.connect()
    channel = connection.channel()
    method, _, body = next(channel.consume(QUEUE, inactivity_timeout=10))
    assert body == b"again" and not method.redelivered
    channel.basic_nack(method.delivery_tag, requeue=True)
    method, _, body = next(channel.consume(QUEUE, inactivity_timeout=10))
    assert body == b"again" and method.redelivered
    channel.basic_reject(method.delivery_tag, requeue=False)
    channel.cancel()
    connection.close()
    assert _ready_on(a) == 0


def test_unacked_via_b_returns_on_a_when_the_client_goes(nodes):
    a, b = nodes
    _publish(a, [b"held"])
    connection = b.connect()
    channel = connection.channel()
    method, _, _ = next(channel.consume(QUEUE, inactivity_timeout=10))
    assert method is not None
    connection.close()
    [(method, body)] = _consume(a, 1)
    assert body == b"held" and method.redelivered


def test_get_via_b(nodes):
    a, b = nodes
    _publish(a, [b"g1", b"g2"])
    connection = b.connect()
    channel = connection.channel()
    method, _, body = channel.basic_get(QUEUE)
    assert body == b"g1" and method.message_count == 1
    channel.basic_ack(method.delivery_tag)
    method, _, body = channel.basic_get(QUEUE, auto_ack=True)
    assert body == b"g2" and method.message_count == 0
    assert channel.basic_get(QUEUE) == (None, None, None)
    connection.close()
    assert _ready_on(a) == 0


def test_passive_declare_purge_and_delete_via_b(nodes):
    a, b = nodes
    _publish(a, [b"1", b"2", b"3"])
    connection = b.connect()
    channel = connection.channel()
    assert channel.queue_declare(QUEUE, passive=True).method.message_count == 3
    assert channel.queue_declare(QUEUE, durable=True).method.message_count == 3
    assert channel.queue_purge(QUEUE).method.message_count == 3
    assert _ready_on(a) == 0
    _publish(a, [b"4"])
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.queue_delete(QUEUE, if_empty=True)
    assert closed.value.reply_code == 406
    assert "not empty" in closed.value.reply_text
    channel = connection.channel()
    assert channel.queue_delete(QUEUE).method.message_count == 1
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.queue_declare(QUEUE, passive=True)
    assert closed.value.reply_code == 404
    connection.close()
    connection = a.connect()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        connection.channel().queue_declare(QUEUE, passive=True)
    connection.close()


def test_a_request_for_a_queue_declared_again_on_another_node_finds_it_gone(nodes):
    """B asks A about "moved", which was deleted and declared again on B before the request
    arrived (the race a linearizability run meets): A answers 404 for every request, as for
    a deleted queue, not an internal error."""
    a, b = nodes
    connection = b.connect()
    connection.channel().queue_declare("moved", durable=True)
    connection.close()
    eventually(lambda: "moved" in a.broker.vhosts["/"].remote, True)

    async def ask(kind: wire.Kind, *fields):
        link = b.broker.forwarding.link(1)
        try:
            await link.request(kind, link.next_id(), "/", "moved", *fields)
        except ProtocolError as error:
            return error.code, error.text
        return None

    gone = (404, "no queue 'moved' in vhost '/'")
    assert b.call(ask(wire.Kind.STATS)) == gone
    assert b.call(ask(wire.Kind.PURGE)) == gone
    assert b.call(ask(wire.Kind.GET)) == gone
    assert b.call(ask(wire.Kind.DELETE, False, False)) == gone
    assert b.call(ask(wire.Kind.CONSUME, "ctag", False, {})) == gone
    assert _ready_on(b, "moved") == 0


def test_exclusive_consumer_refused_by_the_owner(nodes):
    a, b = nodes
    holder = a.connect()
    holder.channel().basic_consume(QUEUE, lambda *_: None, exclusive=True)
    connection = b.connect()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        connection.channel().basic_consume(QUEUE, lambda *_: None)
    assert closed.value.reply_code == 403
    assert "in exclusive use" in closed.value.reply_text
    connection.close()
    holder.close()


def test_owner_gone_nacks_publishes_and_cancels_consumers(nodes):
    a, b = nodes
    _publish(a, [b"before"])
    consuming = b.connect()
    consumer_channel = consuming.channel()
    cancelled = []
    consumer_channel.add_on_cancel_callback(cancelled.append)
    received = []
    consumer_channel.basic_consume(QUEUE, lambda ch, method, props, body: received.append(body))
    _pump(consuming, lambda: received)
    assert received == [b"before"]
    a.stop()
    _pump(consuming, lambda: cancelled)
    assert len(cancelled) == 1
    publishing = b.connect()
    channel = publishing.channel()
    channel.confirm_delivery()
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", QUEUE, b"lost", mandatory=True)
    publishing.close()
    consuming.close()


class Publisher:
    """A confirming channel as the tick sees it: what it was told."""

    def __init__(self) -> None:
        self.failed: list[int] = []
        self.confirmed: list[int] = []

    def publish_failed(self, tag: int) -> None:
        self.failed.append(tag)

    def confirm(self, through: int, refused) -> None:
        self.confirmed.append(through)


def test_a_publish_staged_for_an_owner_that_stopped_leading_is_nacked_not_confirmed(nodes):
    """The queue's leader moves (a failover) after a publish was staged for the old one and
    before the tick sent it: the tick skips a retired queue, so the publish is refused
    there and then; confirmed, nothing would hold it."""
    a, b = nodes
    vhost = b.broker.vhosts["/"]
    publisher = Publisher()

    async def stage_then_move() -> None:
        vhost.publish("", QUEUE, b"", b"moved", persistent=True, publisher=(publisher, 1))
        vhost.stop_forwarding(vhost.remote[QUEUE])
        await b.broker.after_commit()

    b.call(stage_then_move())
    assert publisher.failed == [1]
    assert _ready_on(a) == 0


def test_a_node_without_the_secret_gets_no_metadata_and_sends_none(tmp_path):
    """Nodes 1 and 2 share the secret; "node 3" proves a guess. The two serve as a majority
    of three, and no Raft frame crosses between them and the third, either way (the
    forwarding link's own handshake: tests/test_forwarding_handshake.py)."""
    addresses = {node: ("127.0.0.1", port) for node, port in enumerate(free_ports(3), 1)}
    peers = ",".join(f"{node}={host}:{port}" for node, (host, port) in addresses.items())
    a, b = (
        ThreadBroker(tmp_path / name, node_id=node, cluster=peers, cluster_secret=SECRET)
        for name, node in (("a", 1), ("b", 2))
    )
    heard_by_impostor: list[bytes] = []
    impostor = PeerTransport(3, addresses, heard_by_impostor.append, secret="guess")
    loop = asyncio.new_event_loop()
    impostor_thread = threading.Thread(target=loop.run_forever)
    impostor_thread.start()
    asyncio.run_coroutine_threadsafe(impostor.start(), loop).result(5)
    starting = [threading.Thread(target=node.start) for node in (a, b)]
    for thread in starting:
        thread.start()
    for thread in starting:
        thread.join()
    try:
        _placed_on_a(a, b)
        _publish(b, [b"kept"])
        assert _ready_on(a) == 1
        refused = [node.broker.store.group.transport.stats.handshakes_refused for node in (a, b)]
        assert all(count > 0 for count in refused)
        assert heard_by_impostor == []
        assert impostor.stats.connects == 0
    finally:
        for node in (b, a):
            node.stop()
        asyncio.run_coroutine_threadsafe(impostor.close(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        impostor_thread.join()
        loop.close()


def _dead_lettering_on_a_to_b(a, b, source: str, target: str, queue_type: str) -> None:
    """`target` led by B, and `source` led by A dead-lettering to it."""
    arguments = {"x-queue-type": queue_type}
    _placed_on_a(b, a, target, arguments=arguments)
    dead_letter_to_target = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": target}
    _placed_on_a(a, b, source, arguments={**arguments, **dead_letter_to_target})


def test_a_dead_letter_leaves_its_queue_only_once_the_other_node_stored_it(nodes):
    a, b = nodes
    _dead_lettering_on_a_to_b(a, b, "src", "dlq", "classic")
    source = a.broker.vhosts["/"].queues["src"]
    settled = []
    dead_lettered = source.dead_lettered

    def spied(offsets):
        settled.append(offsets)
        dead_lettered(offsets)

    source.dead_lettered = spied
    fsync_started, release = _hold_fsync(b, "dlq")
    _publish(a, [b"doomed"], name="src")
    connection = a.connect()
    channel = connection.channel()
    method, _, _ = channel.basic_get("src")
    channel.basic_reject(method.delivery_tag, requeue=False)
    assert fsync_started.wait(10)
    # B has the dead letter and has not stored it yet: A keeps the source message.
    assert settled == []
    b.loop.call_soon_threadsafe(release.set)
    assert eventually(lambda: len(settled), 1) == 1
    assert _ready_on(b, "dlq") == 1
    assert _ready_on(a, "src") == 0
    method, properties, body = channel.basic_get("dlq", auto_ack=True)
    assert body == b"doomed"
    [death] = properties.headers["x-death"]
    assert (death["queue"], death["reason"]) == ("src", "rejected")
    connection.close()
    # Counted where it died, as RabbitMQ's global counters are each node's own.
    assert a.broker.dead_letter_counts.counts == {("classic", "at_least_once", "rejected"): 1}
    assert b.broker.dead_letter_counts.counts == {}


def test_failed_deliveries_cross_the_link_both_ways(nodes):
    a, b = nodes
    _dead_lettering_on_a_to_b(a, b, "work", "retry", "quorum")
    _publish(b, [b"job"], name="work")
    connection = b.connect()
    channel = connection.channel()
    method, properties, _ = channel.basic_get("work")
    assert not (properties.headers or {}).get("x-delivery-count")
    # A failed delivery, told to A by B's settle, and counted by A on the next delivery.
    channel.basic_reject(method.delivery_tag, requeue=True)
    method, properties, _ = channel.basic_get("work")
    assert properties.headers["x-delivery-count"] == 1
    # Dead-lettered by A into B's queue, it carries both failures there.
    channel.basic_reject(method.delivery_tag, requeue=False)
    assert eventually(lambda: _ready_on(b, "retry"), 1) == 1
    method, properties, body = channel.basic_get("retry", auto_ack=True)
    assert body == b"job"
    assert properties.headers["x-delivery-count"] == 2
    connection.close()


def test_a_queue_led_elsewhere_has_its_own_timeouts_on_the_entry_node(nodes):
    a, b = nodes
    _placed_on_a(a, b, "timed", arguments={"x-visibility-timeout": 30_000})
    remote = b.broker.vhosts["/"].remote["timed"]
    # B's channels hold the deliveries, so B enforces the queue's timeouts, not its defaults.
    assert (remote.consumer_timeout_ms, remote.visibility_timeout_ms) == (None, 30_000)
    a.call(
        a.broker.store.apply(
            c.SetPolicy("/", "timeouts", "^timed$", {"consumer-timeout": 5_000}, 0, "queues")
        )
    )
    assert eventually(lambda: remote.consumer_timeout_ms, 5_000) == 5_000


def test_the_topic_api_and_a_group_member_via_b_reach_the_partitions_a_leads(nodes):
    a, b = nodes
    connection = a.connect()
    channel = connection.channel()
    channel.exchange_declare(
        "orders", "x-super-stream", durable=True, arguments={"x-super-stream-partitions": 2}
    )
    channel.confirm_delivery()
    for i in range(20):
        channel.basic_publish("orders", f"k{i}", b"%d" % i)
    connection.close()
    remote = b.broker.vhosts["/"].remote
    eventually(lambda: bool({"orders-0", "orders-1"} & remote.keys()), True)
    # Placement spreads the partitions: one of them at least is A's.
    on_a = next(p for p in (0, 1) if f"orders-{p}" in remote)
    api = HttpApi(b.management_url)
    records = {}
    for partition in (0, 1):
        got = api.get(path("topics", "orders", "messages") + f"?partition={partition}&limit=5")
        assert got.status == 200, got.raw
        records[partition] = got.json["records"]
        following = got.json["next_offset"]
        rest = api.get(
            path("topics", "orders", "messages") + f"?partition={partition}&offset={following}"
        )
        records[partition] += rest.json["records"]
    assert sorted(r["value"] for rs in records.values() for r in rs) == list(range(20))
    ends = {p: len(rs) for p, rs in records.items()}
    assert [r["offset"] for r in records[on_a]] == list(range(ends[on_a]))
    assert ends[on_a] >= 1
    committed = {p: ends[p] - (p == on_a) for p in (0, 1)}
    commit = {
        "group": "g",
        "topic": "orders",
        "offsets": [{"partition": p, "offset": o} for p, o in committed.items()],
    }
    assert api.post("/consumer/commit", commit).status == 204
    assert api.get("/consumer/offsets?group=g&topic=orders").json["offsets"] == [
        {"topic": "orders", "partition": p, "offset": o} for p, o in committed.items()
    ]
    stream_on_a = a.broker.vhosts["/"].queues[f"orders-{on_a}"]
    assert stream_on_a.tracked.get("group:g") == committed[on_a]
    # A member connected to B resumes from the group's offset on A's partition; its ack
    # moves that offset there.
    connection = b.connect()
    channel = connection.channel()
    channel.basic_qos(prefetch_count=100)
    got = []
    channel.basic_consume(
        "orders",
        lambda ch, method, props, body: (
            got.append((props.headers["x-stream-partition"], props.headers["x-stream-offset"])),
            ch.basic_ack(method.delivery_tag),
        ),
        arguments={"x-consumer-group": "g", "x-stream-offset": "first"},
    )
    _pump(connection, lambda: got)
    connection.process_data_events(time_limit=0.3)
    assert got == [(f"orders-{on_a}", ends[on_a] - 1)]
    eventually(lambda: stream_on_a.tracked.get("group:g"), ends[on_a])
    connection.close()

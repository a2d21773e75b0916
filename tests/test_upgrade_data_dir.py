"""An old release's data dir (tests/fixtures/upgrade-*.tar.gz: the last release before the
metadata went through Raft, stopped by SIGTERM or SIGKILL; tests/upgrade_fixture.py says what
it holds, scripts/make_upgrade_fixtures.py made it) started by this code's `warren serve`:
everything in it is there with its contents, it can be used, and it stays so through a
restart, a SIGKILL, and as the first node of a cluster another node joins."""

from __future__ import annotations

import signal
import tarfile
import time
import uuid
from pathlib import Path

import pika
import pytest
import upgrade_fixture as f
from brokers import WarrenProcess, connect
from cluster_nodes import api, local_raft
from http_api import HttpApi, eventually, path
from test_cluster_membership import join

from warrenmq.server.local_cluster import LocalCluster

FIXTURES = Path(__file__).parent / "fixtures"
# Delayed messages fall due this long after the fixture was made: at once, unless it was
# made just now.
DELAYED_WAIT_S = 30.0
SETTLE_S = 15.0


@pytest.fixture(params=f.FIXTURES)
def old_data_dir(request, tmp_path) -> tuple[Path, str]:
    """An old release's data dir, extracted, and how it was stopped."""
    with tarfile.open(FIXTURES / f"upgrade-{request.param}.tar.gz") as archive:
        archive.extractall(tmp_path / "old", filter="data")
    return tmp_path / "old" / "data", request.param


def as_user(port: int, user: str, vhost: str = f.LEGACY, password: str | None = None):
    password = f.USERS[user][0] if password is None else password
    credentials = pika.PlainCredentials(user, password)
    return connect(port, virtual_host=vhost, credentials=credentials)


# The metadata: vhosts, limits, users and their passwords, permissions, policies, exchanges,
# queues with their arguments, bindings, streams and super streams.


def check_metadata(http: HttpApi, port: int) -> None:
    vhosts = {item["name"] for item in http.get("/api/vhosts").json}
    assert vhosts == {"/", f.LEGACY}
    (limits,) = http.get(path("api", "vhost-limits", f.LEGACY)).json
    assert limits["value"] == f.VHOST_LIMITS
    check_users(http, port)
    policies = {p["name"]: p for p in http.get("/api/policies").json}
    assert set(policies) == set(f.POLICIES)
    for name, (vhost, pattern, apply_to, priority, definition) in f.POLICIES.items():
        policy = policies[name]
        assert (policy["vhost"], policy["pattern"], policy["apply-to"]) == (
            vhost,
            pattern,
            apply_to,
        )
        assert (policy["priority"], policy["definition"]) == (priority, definition)
    for name, (kind, arguments) in f.EXCHANGES.items():
        exchange = http.get(path("api", "exchanges", f.LEGACY, name)).json
        assert (exchange["type"], exchange["durable"]) == (kind, True)
        assert exchange["arguments"] == arguments
    for name, (arguments, _) in f.QUEUES.items():
        queue = http.get(path("api", "queues", f.LEGACY, name)).json
        assert (queue["durable"], queue["arguments"]) == (True, arguments), name
    assert http.get(path("api", "queues", "/", f.ROOT_QUEUE)).status == 200
    bindings = {
        (b["source"], b["destination"], b["destination_type"], b["routing_key"])
        for b in http.get(path("api", "bindings", f.LEGACY)).json
        if b["source"]
    }
    expected = {(s, d, "exchange", k) for s, d, k in f.EXCHANGE_BINDINGS}
    expected |= {
        (exchange, queue, "queue", key)
        for queue, (_, queue_bindings) in f.QUEUES.items()
        for exchange, key in queue_bindings
    }
    assert expected <= bindings
    (match,) = http.get(path("api", "queues", f.LEGACY, "match.q", "bindings")).json[1:]
    assert match["arguments"] == f.MATCH_ARGUMENTS
    stream = http.get(path("api", "queues", f.LEGACY, f.STREAM)).json
    assert (stream["type"], stream["arguments"]) == ("stream", f.STREAM_ARGUMENTS)
    (super_stream,) = http.get(path("api", "super-streams", f.LEGACY)).json
    partitions = [f"{f.SUPER_STREAM}-{p}" for p in range(f.PARTITIONS)]
    assert (super_stream["name"], super_stream["partitions"]) == (f.SUPER_STREAM, partitions)


def check_users(http: HttpApi, port: int) -> None:
    users = {u["name"]: u for u in http.get("/api/users").json}
    assert set(users) == set(f.USERS)
    for user, (password, tags, permissions) in f.USERS.items():
        assert users[user]["tags"] == [tags]
        assert http.as_user(user, password).get("/api/whoami").json["name"] == user
        assert http.as_user(user, "wrong").get("/api/whoami").status == 401
        granted = {
            p["vhost"]: (p["configure"], p["write"], p["read"])
            for p in http.get(path("api", "users", user, "permissions")).json
        }
        assert granted == permissions
    as_user(port, "alice").close()
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        as_user(port, "alice", password="guest")
    bob = as_user(port, "bob")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as refused:
        bob.channel().queue_declare("bob.q", durable=True)
    assert refused.value.reply_code == 403
    bob.close()


# The messages.


def bodies(channel, queue: str) -> list[tuple[bytes, bool, pika.BasicProperties]]:
    """What `queue` holds, in order: got without ack (the caller's channel close requeues)."""
    held = []
    while (got := channel.basic_get(queue))[0] is not None:
        method, properties, body = got
        held.append((body, method.redelivered, properties))
    return held


def check_orders(channel, stopped_by: str) -> None:
    """orders.q: the unacked at the stop come back redelivered, the acked do not come back,
    every property as published. `stopped_by`: how the old release stopped, on the first
    start after it."""
    held = bodies(channel, "orders.q")
    numbers = range(f.ACKED_ORDERS, f.ORDERS)
    assert [body for body, _, _ in held] == [f"order-{i}".encode() for i in numbers]
    for i, (_, redelivered, properties) in zip(numbers, held, strict=True):
        for key, value in f.order_properties(i).items():
            assert getattr(properties, key) == value, (i, key)
        if i < f.ACKED_ORDERS + f.UNACKED_ORDERS:
            assert redelivered, i
        elif stopped_by == "sigterm":
            # After a crash the queue cannot know which were delivered: all are redelivered.
            assert not redelivered, i


def check_queues(port: int, expected: dict[str, list[bytes]], dead_letters, delayed) -> None:
    """The queues hold the `expected` bodies, dead.q the `dead_letters` (body: x-death
    reason), later.q the `delayed` ((body, x-delay) routed once due) and root.q its one."""
    connection = as_user(port, "alice")
    channel = connection.channel()
    for queue, queue_bodies in expected.items():
        assert [body for body, _, _ in bodies(channel, queue)] == queue_bodies, queue
    dead = {body: p.headers["x-death"][0]["reason"] for body, _, p in bodies(channel, "dead.q")}
    assert dead == dead_letters
    routed = waited_for(channel, "later.q", len(delayed), DELAYED_WAIT_S)
    assert [(body, -p.headers["x-delay"]) for body, _, p in routed] == delayed
    connection.close()
    root = as_user(port, "guest", "/")
    assert [body for body, _, _ in bodies(root.channel(), f.ROOT_QUEUE)] == [b"root-0"]
    root.close()


def waited_for(channel, queue: str, count: int, timeout_s: float):
    deadline_s = time.monotonic() + timeout_s
    held = bodies(channel, queue)
    while len(held) < count and time.monotonic() < deadline_s:
        channel.basic_recover(requeue=True)
        time.sleep(0.2)
        held = bodies(channel, queue)
    return held


def read_stream(port: int, stream: str, count: int, **consume_options) -> list:
    """The first `count` deliveries (method, properties, body) of a new consumer: acked by an
    untracked one (a tag of the server's form), left unacked by a `consumer_tag` given."""
    tracked = "consumer_tag" in consume_options
    consume_options.setdefault("consumer_tag", f"amq.ctag-{uuid.uuid4().hex}")
    connection = as_user(port, "alice")
    channel = connection.channel()
    channel.basic_qos(prefetch_count=count)
    got = []
    channel.basic_consume(stream, lambda _, *delivery: got.append(delivery), **consume_options)
    deadline_s = time.monotonic() + SETTLE_S
    while len(got) < count and time.monotonic() < deadline_s:
        connection.process_data_events(0.1)
    assert len(got) == count, f"{stream} delivered {len(got)} of {count}"
    if not tracked:
        channel.basic_ack(got[-1][0].delivery_tag, multiple=True)
    connection.close()
    return got


def check_streams(http: HttpApi, port: int, records: int, clicks: int) -> None:
    """log.s holds record-0 … record-(records - 1), its tracker resumes at TRACKED; clicks'
    partitions hold click-0 … click-(clicks - 1) and GROUP's commits."""
    got = read_stream(port, f.STREAM, records, arguments={"x-stream-offset": 0})
    assert [body for _, _, body in got] == [f"record-{i}".encode() for i in range(records)]
    assert [p.headers["i"] for _, p, _ in got] == list(range(records))
    stream = http.get(path("api", "streams", f.LEGACY, f.STREAM)).json
    assert stream["tracked_offsets"] == {f.TRACKER: f.TRACKED}
    # The tracker resumes where it acked up to (left unacked: it stays there).
    ((_, _, body),) = read_stream(port, f.STREAM, 1, consumer_tag=f.TRACKER)
    assert body == f"record-{f.TRACKED}".encode()
    query = f"/consumer/offsets?group={f.GROUP}&topic={f.SUPER_STREAM}&vhost={f.LEGACY}"
    committed = {o["partition"]: o["offset"] for o in http.get(query).json["offsets"]}
    seen = []
    for partition in range(f.PARTITIONS):
        name = f"{f.SUPER_STREAM}-{partition}"
        held = stream_length(http, name)
        got = [
            body for _, _, body in read_stream(port, name, held, arguments={"x-stream-offset": 0})
        ]
        seen += got
        early = [b for b in got if int(b.split(b"-")[1]) < f.CLICKS_COMMITTED]
        assert got[: len(early)] == early
        assert committed.get(partition, 0) == len(early)
    assert sorted(seen) == sorted(f"click-{i}".encode() for i in range(clicks))


def stream_length(http: HttpApi, name: str) -> int:
    return http.get(path("api", "streams", f.LEGACY, name)).json["messages"]


def check_everything(http: HttpApi, port: int, stopped_by: str) -> None:
    """What the old release left, on the first start after it."""
    check_metadata(http, port)
    connection = as_user(port, "alice")
    check_orders(connection.channel(), stopped_by)
    connection.close()
    check_queues(port, f.EXPECTED_QUEUES, f.DEAD_LETTERS, f.DELAYED)
    check_streams(http, port, f.STREAM_RECORDS, f.CLICKS_COMMITTED + f.CLICKS_LATER)


AFTER_USE = {
    **f.EXPECTED_QUEUES,
    "orders.q": [b"order-new"],
    "new.q": [b"new-0"],
    "capped.q": [b"capped-2", b"capped-3"],
    "limited": [b"limited-2", b"limited-3", b"limited-4"],
    "broadcast.a": [b"to-all", b"audited"],
    "broadcast.b": [b"to-all", b"audited"],
    "prio.q": [b"prio-4", b"prio-2"],
}
DEAD_AFTER_USE = {**f.DEAD_LETTERS, b"limited-1": "maxlen", b"ttl-1": "expired"}
DELAYED_AFTER_USE = [*f.DELAYED, (b"later-2", 100)]


def use(port: int) -> None:
    """Consume and publish through what the old release declared, so that its arguments,
    policies and bindings act (AFTER_USE is what the queues hold then); declare a queue."""
    connection = as_user(port, "alice")
    channel = connection.channel()
    for queue in ("orders.q", "prio.q"):
        while (method := channel.basic_get(queue)[0]) is not None:
            channel.basic_ack(method.delivery_tag)
    channel.confirm_delivery()
    channel.queue_declare("new.q", durable=True)
    published = [
        ("orders", "order.created", b"order-new", {}),
        ("", "new.q", b"new-0", {}),
        ("", "capped.q", b"capped-3", {}),
        ("", "limited", b"limited-4", {}),
        ("", "ttl.q", b"ttl-1", {}),
        ("events", "x.audit", b"audited", {}),
        ("", "prio.q", b"prio-2", {"priority": 2}),
        ("", "prio.q", b"prio-4", {"priority": 4}),
        ("later", "later", b"later-2", {"headers": {"x-delay": 100}}),
        ("", f.STREAM, f"record-{f.STREAM_RECORDS}".encode(), {"headers": {"i": f.STREAM_RECORDS}}),
        (f.SUPER_STREAM, "user-new", f"click-{f.CLICKS_COMMITTED + f.CLICKS_LATER}".encode(), {}),
    ]
    for exchange, key, body, properties in published:
        channel.basic_publish(
            exchange, key, body, pika.BasicProperties(delivery_mode=2, **properties)
        )
    deadline_s = time.monotonic() + SETTLE_S
    while b"ttl-1" not in [body for body, _, _ in bodies(channel, "dead.q")]:
        assert time.monotonic() < deadline_s, "ttl-1 did not expire into dead.q"
        channel.basic_recover(requeue=True)
        time.sleep(0.2)
    connection.close()


def check_after_use(http: HttpApi, port: int) -> None:
    check_metadata(http, port)
    check_queues(port, AFTER_USE, DEAD_AFTER_USE, DELAYED_AFTER_USE)
    check_streams(http, port, f.STREAM_RECORDS + 1, f.CLICKS_COMMITTED + f.CLICKS_LATER + 1)


def test_an_old_data_dir_upgrades_in_place_and_stays_usable(old_data_dir, tmp_path):
    data_dir, stopped_by = old_data_dir
    broker = WarrenProcess(data_dir, log_path=tmp_path / "warren.log")
    broker.start()
    try:
        http = HttpApi(broker.management_url)
        check_everything(http, broker.port, stopped_by)
        use(broker.port)
        check_after_use(http, broker.port)
        for signum in (signal.SIGTERM, signal.SIGKILL):
            broker.stop(signum)
            broker.start()
            check_after_use(HttpApi(broker.management_url), broker.port)
        assert "Traceback" not in broker.log_since_start()
    finally:
        broker.kill()


def test_an_old_data_dir_is_the_first_node_of_a_cluster(old_data_dir, tmp_path):
    """Started with --node-id and --cluster, the old data dir's node leads a cluster of one;
    a second node joins and serves all of it (the queues and streams node 1 leads, through
    the link); node 1, SIGKILLed and started again, still has it."""
    data_dir, stopped_by = old_data_dir
    cluster = LocalCluster(tmp_path / "cluster", 1)
    cluster.directory.mkdir()
    data_dir.rename(cluster.directory / "node-1")
    with cluster:
        node = cluster.nodes[1]
        check_everything(api(cluster, 1), node.amqp_port, stopped_by)
        assert local_raft(cluster, 1)["role"] == "leader"
        second = join(cluster, through=1)
        http = api(cluster, second)
        queues = sorted(q["name"] for q in api(cluster, 1).get("/api/queues").json)
        names = eventually(lambda: sorted(q["name"] for q in http.get("/api/queues").json), queues)
        assert names == queues
        check_metadata(http, cluster.nodes[second].amqp_port)
        check_queues(cluster.nodes[second].amqp_port, f.EXPECTED_QUEUES, f.DEAD_LETTERS, f.DELAYED)
        # /api/streams/V/NAME answers on the stream's node only: node 1's figures, node 2's
        # consumers.
        clicks = f.CLICKS_COMMITTED + f.CLICKS_LATER
        check_streams(api(cluster, 1), cluster.nodes[second].amqp_port, f.STREAM_RECORDS, clicks)
        # The old data, now in a cluster's log, through a SIGKILL of its node.
        cluster.kill(1)
        cluster.start(1)
        cluster.wait_listening(1)
        check_metadata(api(cluster, 1), node.amqp_port)
        check_queues(node.amqp_port, f.EXPECTED_QUEUES, f.DEAD_LETTERS, f.DELAYED)
        check_streams(api(cluster, 1), node.amqp_port, f.STREAM_RECORDS, clicks)

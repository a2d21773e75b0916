"""Regenerate tests/fixtures/upgrade-sigterm.tar.gz and upgrade-sigkill.tar.gz: data dirs of
an old Warren release (tests/upgrade_fixture.py RELEASE, the last commit before the metadata
went through Raft), filled through real clients (pika, the management API) as
tests/upgrade_fixture.py describes, then stopped by SIGTERM or SIGKILL.

    .venv/bin/python scripts/make_upgrade_fixtures.py [--release-dir DIR]

Without --release-dir, the release is checked out (`git worktree add --detach`) in a
temporary folder and given its own venv (`make install`); with it, DIR must be such a
checkout with its .venv already installed. The clients run in this venv, the broker in the
release's. tests/test_upgrade_data_dir.py starts the current `warren serve` on them.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pika

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import upgrade_fixture as f  # noqa: E402
from brokers import HTTP_LISTENING, WARREN_LISTENING, connect, warren_serve  # noqa: E402
from http_api import HttpApi, path  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures"
START_S_MAX = 60.0
SETTLE_S_MAX = 30.0


class OldBroker:
    """The release's `warren serve` on a data dir, on free ports."""

    def __init__(self, release_dir: Path, data_dir: Path) -> None:
        old_python = str(release_dir / ".venv" / "bin" / "python")
        # The release's serve takes the same options as this one's.
        command = [old_python, *warren_serve(data_dir)[1:], "--log-level", "warning"]
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd="/")
        line = self.process.stdout.readline()
        listening = WARREN_LISTENING.search(line)
        assert listening, f"the old release did not start: {line!r}"
        self.port = int(listening.group(1))
        http_ports = dict(HTTP_LISTENING.findall(line))
        self.api = HttpApi(f"http://127.0.0.1:{http_ports['management']}")

    def connect(self, vhost: str = "/", user: str = "guest") -> pika.BlockingConnection:
        password = f.USERS[user][0]
        credentials = pika.PlainCredentials(user, password)
        return connect(self.port, virtual_host=vhost, credentials=credentials)

    def stop(self, signum: int) -> None:
        self.process.send_signal(signum)
        self.process.wait(30)


def declare_metadata(api: HttpApi) -> None:
    assert api.put(path("api", "vhosts", f.LEGACY), {}).status in (201, 204)
    for name, value in f.VHOST_LIMITS.items():
        assert api.put(path("api", "vhost-limits", f.LEGACY, name), {"value": value}).status < 300
    for user, (password, tags, permissions) in f.USERS.items():
        assert (
            api.put(path("api", "users", user), {"password": password, "tags": tags}).status < 300
        )
        for vhost, (configure, write, read) in permissions.items():
            granted = {"configure": configure, "write": write, "read": read}
            assert api.put(path("api", "permissions", vhost, user), granted).status < 300
    for name, (vhost, pattern, apply_to, priority, definition) in f.POLICIES.items():
        policy = {
            "pattern": pattern,
            "apply-to": apply_to,
            "priority": priority,
            "definition": definition,
        }
        assert api.put(path("api", "policies", vhost, name), policy).status < 300


def declare_topology(channel) -> None:
    for name, (kind, arguments) in f.EXCHANGES.items():
        channel.exchange_declare(name, kind, durable=True, arguments=arguments)
    for source, destination, key in f.EXCHANGE_BINDINGS:
        channel.exchange_bind(destination, source, key)
    for name, (arguments, bindings) in f.QUEUES.items():
        channel.queue_declare(name, durable=True, arguments=arguments)
        for exchange, key in bindings:
            arguments = f.MATCH_ARGUMENTS if f.EXCHANGES[exchange][0] == "headers" else None
            channel.queue_bind(name, exchange, key, arguments=arguments)
    channel.queue_declare(f.STREAM, durable=True, arguments=f.STREAM_ARGUMENTS)
    channel.exchange_declare(
        f.SUPER_STREAM,
        "x-super-stream",
        durable=True,
        arguments={"x-super-stream-partitions": f.PARTITIONS},
    )


def persistent(headers=None, **properties) -> pika.BasicProperties:
    return pika.BasicProperties(delivery_mode=2, headers=headers, **properties)


def publish_messages(channel) -> None:
    channel.confirm_delivery()
    for i in range(f.ORDERS):
        properties = pika.BasicProperties(**f.order_properties(i))
        channel.basic_publish("orders", "order.created", f"order-{i}".encode(), properties)
    for exchange, key, body, headers in f.PUBLISHED:
        channel.basic_publish(exchange, key, body, persistent(headers))
    for body, priority in f.PRIORITIES:
        channel.basic_publish("", "prio.q", body, persistent(priority=priority))
    publish_records(channel, range(f.TRACKED))
    for i in range(f.CLICKS_COMMITTED):
        channel.basic_publish(f.SUPER_STREAM, f"user-{i}", f"click-{i}".encode(), persistent())


def publish_records(channel, numbers) -> None:
    for i in numbers:
        channel.basic_publish("", f.STREAM, f"record-{i}".encode(), persistent({"i": i}))


def ack_orders(channel) -> None:
    for _ in range(f.ACKED_ORDERS):
        method, _, _ = channel.basic_get("orders.q")
        channel.basic_ack(method.delivery_tag)


def consume(connection, queue: str, count: int, **consume_options) -> tuple:
    """The delivery tags of the first `count` deliveries of a new consumer, on a channel
    whose prefetch is `count`; the channel is left open, unacked."""
    channel = connection.channel()
    channel.basic_qos(prefetch_count=count)
    tags = []
    channel.basic_consume(
        queue, lambda channel, method, *_: tags.append(method.delivery_tag), **consume_options
    )
    deadline_s = time.monotonic() + SETTLE_S_MAX
    while len(tags) < count and time.monotonic() < deadline_s:
        connection.process_data_events(0.1)
    assert len(tags) == count, f"{queue} delivered {len(tags)} of {count}"
    return channel, tags


def track_stream(broker: OldBroker) -> None:
    """The consumer TRACKER acks the first TRACKED records (all there are yet): its tracked
    offset; then the others are published."""
    connection = broker.connect(f.LEGACY)
    arguments = {"x-stream-offset": 0}
    channel, tags = consume(
        connection, f.STREAM, f.TRACKED, consumer_tag=f.TRACKER, arguments=arguments
    )
    channel.basic_ack(tags[-1], multiple=True)
    wait_for(lambda: tracked(broker) == f.TRACKED, "the tracked offset")
    connection.close()
    # Published only now: the tracker's channel had nothing left to reject as it closed.
    connection = broker.connect(f.LEGACY)
    channel = connection.channel()
    channel.confirm_delivery()
    publish_records(channel, range(f.TRACKED, f.STREAM_RECORDS))
    connection.close()


def tracked(broker: OldBroker) -> int:
    stream = broker.api.get(path("api", "streams", f.LEGACY, f.STREAM)).json
    return stream["tracked_offsets"].get(f.TRACKER, -1)


def commit_group(broker: OldBroker) -> None:
    """GROUP's one member acks the first CLICKS_COMMITTED clicks; then CLICKS_LATER more."""
    connection = broker.connect(f.LEGACY)
    arguments = {"x-consumer-group": f.GROUP, "x-stream-offset": "first"}
    channel, tags = consume(connection, f.SUPER_STREAM, f.CLICKS_COMMITTED, arguments=arguments)
    for tag in tags:
        channel.basic_ack(tag)
    wait_for(lambda: committed(broker) == f.CLICKS_COMMITTED, "the group's commits")
    connection.close()
    connection = broker.connect(f.LEGACY)
    channel = connection.channel()
    channel.confirm_delivery()
    for i in range(f.CLICKS_COMMITTED, f.CLICKS_COMMITTED + f.CLICKS_LATER):
        channel.basic_publish(f.SUPER_STREAM, f"user-{i}", f"click-{i}".encode(), persistent())
    connection.close()


def committed(broker: OldBroker) -> int:
    query = f"/consumer/offsets?group={f.GROUP}&topic={f.SUPER_STREAM}&vhost={f.LEGACY}"
    reply = broker.api.get(query)
    return sum(item["offset"] for item in reply.json["offsets"]) if reply.status == 200 else -1


def wait_for(condition, what: str) -> None:
    deadline_s = time.monotonic() + SETTLE_S_MAX
    while not condition():
        assert time.monotonic() < deadline_s, f"{what} did not settle"
        time.sleep(0.1)


def messages(broker: OldBroker, queue: str) -> int:
    return broker.api.get(path("api", "queues", f.LEGACY, queue)).json["messages"]


def fill(broker: OldBroker) -> pika.BlockingConnection:
    """Declare and publish everything; returns the connection holding orders.q's unacked
    deliveries, left open for the stop."""
    declare_metadata(broker.api)
    root = broker.connect("/")
    root_channel = root.channel()
    root_channel.queue_declare(f.ROOT_QUEUE, durable=True)
    root_channel.confirm_delivery()
    root_channel.basic_publish("", f.ROOT_QUEUE, b"root-0", persistent())
    root.close()
    connection = broker.connect(f.LEGACY)
    channel = connection.channel()
    declare_topology(channel)
    publish_messages(channel)
    ack_orders(channel)
    connection.close()
    track_stream(broker)
    commit_group(broker)
    wait_for(lambda: messages(broker, "orders.q") == f.ORDERS - f.ACKED_ORDERS, "orders' acks")
    holder = broker.connect(f.LEGACY)
    channel = holder.channel()
    for _ in range(f.UNACKED_ORDERS):
        method, _, _ = channel.basic_get("orders.q")
        assert method is not None
    channel = holder.channel()
    channel.confirm_delivery()
    channel.basic_publish("", "ttl.q", b"ttl-0", persistent())
    for body, delay in f.DELAYED:
        channel.basic_publish("later", "later", body, persistent({"x-delay": delay}))
    return holder


def make(release_dir: Path, how: str) -> Path:
    with tempfile.TemporaryDirectory() as scratch:
        data_dir = Path(scratch) / "data"
        broker = OldBroker(release_dir, data_dir)
        try:
            holder = fill(broker)
            # The unacked deliveries stay with a live client until the signal.
            assert holder.is_open
            broker.stop(signal.SIGTERM if how == "sigterm" else signal.SIGKILL)
        finally:
            if broker.process.poll() is None:
                broker.process.kill()
        FIXTURES.mkdir(exist_ok=True)
        target = FIXTURES / f"upgrade-{how}.tar.gz"
        with tarfile.open(target, "w:gz") as archive:
            archive.add(data_dir, arcname="data")
        return target


def checkout(scratch: Path) -> Path:
    release_dir = scratch / "release"
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", str(release_dir), f.RELEASE],
        check=True,
    )
    subprocess.run(["make", "-C", str(release_dir), "install"], check=True)
    return release_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release-dir", type=Path, help="a checkout of RELEASE with its .venv")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        release_dir = options.release_dir or checkout(Path(scratch))
        try:
            for how in f.FIXTURES:
                target = make(release_dir, how)
                print(f"{target}: {target.stat().st_size} bytes")
        finally:
            if options.release_dir is None:
                subprocess.run(
                    ["git", "-C", str(REPO), "worktree", "remove", "--force", str(release_dir)],
                    check=True,
                )


if __name__ == "__main__":
    main()

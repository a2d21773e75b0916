"""Policies reaching queues while they run: `WorkQueue.apply_arguments` on a fake clock, then the
broker in-process, changed by `warren policies` from another process (the broker follows the
metadata once a second) and by a command of its own store, across a restart."""

from __future__ import annotations

import subprocess
import sys
import time

import pika
import pytest
from doubles import work_queue

from warrenmq.server.metadata import commands as c
from warrenmq.server.queue import LogQueue, QueueConfig
from warrenmq.server.queue.work_queue import WorkQueue

T0 = 1_700_000_000_000
CONFIG = QueueConfig(delivered_mark_lead=1 << 40)
# The broker looks for metadata changes once a second; a busy machine may take longer.
FOLLOW_S_MAX = 10.0


@pytest.fixture
def queue(tmp_path):
    engine = LogQueue.open(tmp_path / "q", CONFIG)
    yield work_queue(engine, "q", **{"x-max-length": 5})
    engine.close()


def publish(queue: WorkQueue, now_ms: int, *bodies: bytes) -> None:
    for body in bodies:
        assert queue.stage((b"", b"q", b"\x00\x00", body), False)
    queue.flush(now_ms)


def drain(queue: WorkQueue, now_ms: int) -> list[bytes]:
    bodies = []
    while (message := queue.take(now_ms)) is not None:
        queue.ack([message.offset])
        bodies.append(message.body)
    return bodies


# --- the queue ------------------------------------------------------------------------------


def test_apply_arguments_rereads_every_setting_and_keeps_the_declared_arguments(queue):
    assert queue.effective_arguments is queue.arguments
    effective = {
        "x-max-length": 2,
        "x-max-length-bytes": 100,
        "x-message-ttl": 50,
        "x-overflow": "reject-publish-dlx",
        "x-expires": 1000,
        "x-single-active-consumer": True,
        "x-dead-letter-exchange": "dlx",
        "x-dead-letter-routing-key": "dead",
        "x-delivery-limit": 3,
        "x-consumer-timeout": 60_000,
    }
    queue.apply_arguments(effective)
    assert queue.arguments == {"x-max-length": 5}
    assert queue.effective_arguments == effective
    assert (queue.length_max, queue.bytes_max, queue.message_ttl_ms) == (2, 100, 50)
    assert queue.reject_when_full and queue.dead_letter_refused
    assert queue.single_active and queue.expires_ms == 1000
    assert (queue.dead_letter_exchange, queue.dead_letter_routing_key) == ("dlx", "dead")
    assert queue.delivery_limit == 3 and queue.counts_deliveries
    assert queue.consumer_timeout_ms == 60_000
    queue.apply_arguments({})
    assert (queue.length_max, queue.bytes_max, queue.message_ttl_ms, queue.expires_ms) == (
        None,
        None,
        None,
        None,
    )
    assert not (queue.reject_when_full or queue.dead_letter_refused or queue.single_active)
    assert (queue.dead_letter_exchange, queue.dead_letter_routing_key) == (None, None)
    assert queue.delivery_limit is None and not queue.counts_deliveries
    assert queue.consumer_timeout_ms is None


def test_a_lower_length_limit_drops_the_oldest_once_enforced(queue):
    publish(queue, T0, b"1", b"2", b"3", b"4", b"5")
    queue.apply_arguments({"x-max-length": 2})
    assert queue.enforce_length() == 3
    assert drain(queue, T0) == [b"4", b"5"]


def test_a_new_ttl_counts_from_when_each_message_was_stored(queue):
    """Where Warren differs: RabbitMQ fixes a message's expiry when it enqueues it, so a TTL
    set later spares the messages already there."""
    publish(queue, T0, b"old")
    publish(queue, T0 + 100, b"new")
    queue.apply_arguments({"x-message-ttl": 150})
    assert queue.run_timers(T0 + 160) == T0 + 250
    assert drain(queue, T0 + 160) == [b"new"]


def test_a_byte_limit_set_on_a_live_queue_counts_what_arrives_from_then_on(queue):
    publish(queue, T0, b"aaaa", b"bbbb")
    queue.apply_arguments({"x-max-length-bytes": 10})
    publish(queue, T0, b"cccc", b"dddd")
    assert queue.ready_bytes == 8
    publish(queue, T0, b"eeee")
    # 12 bytes counted: the head goes, though it is one of the uncounted.
    assert queue.ready_count == 4 and queue.ready_bytes == 8
    queue.apply_arguments({})
    assert queue.ready_bytes == 0
    publish(queue, T0, b"ffff")
    assert queue.ready_bytes == 0 and queue.ready_count == 5


# --- the broker -----------------------------------------------------------------------------


def policies_cli(data_dir, *argv: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "warrenmq.server.admin_cli", "policies", *argv, "--data-dir"]
        + [str(data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def message_count(channel, queue: str) -> int:
    return channel.queue_declare(queue, passive=True).method.message_count


def wait_for_count(channel, queue: str, expected: int) -> None:
    deadline = time.monotonic() + FOLLOW_S_MAX
    while message_count(channel, queue) != expected:
        assert time.monotonic() < deadline, f"{queue} never held {expected} messages"
        time.sleep(0.05)


def publish_bodies(channel, queue: str, *bodies: bytes) -> None:
    for body in bodies:
        channel.basic_publish("", queue, body)
    # A round trip, so the publishes are stored before the test looks.
    channel.queue_declare(queue, passive=True)


def test_a_policy_set_and_cleared_from_the_cli_reaches_running_queues(tmp_path, start_broker):
    running = start_broker(tmp_path)
    connection = running.connect()
    channel = connection.channel()
    channel.queue_declare("orders.eu", durable=True)
    channel.queue_declare("orders.us", durable=True, arguments={"x-max-length": 1})
    channel.queue_declare("audit", durable=True)
    for queue in ("orders.eu", "orders.us", "audit"):
        publish_bodies(channel, queue, b"1", b"2", b"3")
    assert message_count(channel, "orders.us") == 1

    policies_cli(
        tmp_path, "set", "limit", "^orders\\.", '{"max-length": 2}', "--apply-to", "queues"
    )
    # No client connects meanwhile: the broker follows the metadata by itself.
    wait_for_count(channel, "orders.eu", 2)
    assert message_count(channel, "orders.us") == 1  # its own limit is the smaller
    assert message_count(channel, "audit") == 3
    publish_bodies(channel, "orders.eu", b"4")
    assert [channel.basic_get("orders.eu", auto_ack=True)[2] for _ in range(2)] == [b"3", b"4"]

    # A queue declared after the policy takes it at once.
    channel.queue_declare("orders.asia", durable=True)
    publish_bodies(channel, "orders.asia", b"1", b"2", b"3")
    assert message_count(channel, "orders.asia") == 2

    policies_cli(tmp_path, "clear", "limit")
    deadline = time.monotonic() + FOLLOW_S_MAX
    while True:
        publish_bodies(channel, "orders.asia", b"more")
        if message_count(channel, "orders.asia") > 2:
            break
        assert time.monotonic() < deadline, "the cleared policy still limits the queue"
    connection.close()


def test_policies_apply_to_recovered_queues_and_by_the_brokers_own_store(tmp_path, start_broker):
    running = start_broker(tmp_path)
    connection = running.connect()
    channel = connection.channel()
    channel.queue_declare("q", durable=True)
    publish_bodies(channel, "q", b"1", b"2", b"3")
    connection.close()
    running.stop()

    policies_cli(tmp_path, "set", "limit", "^q$", '{"max-length": 1}')
    running = start_broker(tmp_path)
    connection = running.connect()
    channel = connection.channel()
    # Recovery enforces the limit the policy set while the broker was down.
    assert message_count(channel, "q") == 1
    assert channel.basic_get("q", auto_ack=True)[2] == b"3"

    # What an in-process caller (the HTTP API) does: apply the command, then apply_policies.
    broker = running.broker

    async def set_policy(command):
        await broker.store.apply(command)
        broker.apply_policies()

    running.call(set_policy(c.SetPolicy("/", "limit", "^q$", {"max-length": 3})))
    publish_bodies(channel, "q", b"4", b"5", b"6", b"7")
    assert message_count(channel, "q") == 3

    # A smaller x-expires through the policy: the unused queue goes (a passive declare renews
    # the lease, so it is looked at less often than the lease lasts).
    channel.queue_declare("short-lived", arguments={"x-expires": 60_000})
    running.call(set_policy(c.SetPolicy("/", "expire", "^short", {"expires": 300})))
    deadline = time.monotonic() + FOLLOW_S_MAX
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        while time.monotonic() < deadline:
            channel.queue_declare("short-lived", passive=True)
            time.sleep(0.6)
    connection.close()

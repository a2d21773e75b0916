"""Resource alarms: the monitor driven by injected samples, the connection machine's paused
heartbeat monitor, and a broker whose memory watermark a test moves (as `rabbitmqctl
set_vm_memory_high_watermark` does) with pika publishers and consumers."""

from __future__ import annotations

import logging
import time
import urllib.request

import pika
import pytest
from http_api import HttpApi
from pamqp import body as content_body
from pamqp import commands, frame, header
from protocol import connected
from raw_client import RawClient

from warrenmq.amqp import events
from warrenmq.server.alarms import (
    DISK,
    MEMORY,
    RESOURCE_CHECK_READ_BYTES,
    ResourceMonitor,
    blocked_reason,
    disk_free_limit_bytes,
    memory_limit_bytes,
)
from warrenmq.server.config import BrokerConfig, ConfigError

GIB = 1 << 30
WAIT_S_MAX = 20.0


class Samples:
    """Memory and free disk a test sets, and the alarm changes the monitor reported."""

    def __init__(self) -> None:
        self.memory_bytes = 0
        self.disk_free_bytes = GIB
        self.changes: list[frozenset[str]] = []

    def monitor(self, memory_limit_bytes=1000, disk_free_limit_bytes=500) -> ResourceMonitor:
        return ResourceMonitor(
            memory_limit_bytes,
            disk_free_limit_bytes,
            lambda: self.memory_bytes,
            lambda: self.disk_free_bytes,
            self.changes.append,
        )


def test_alarms_are_raised_above_the_watermark_and_below_the_limit_and_cleared_after():
    samples = Samples()
    monitor = samples.monitor()
    monitor.check()
    assert monitor.alarms == frozenset() and samples.changes == []
    samples.memory_bytes = 1000
    monitor.check()
    assert samples.changes == [], "at the watermark is not above it"
    samples.memory_bytes = 1001
    monitor.check()
    monitor.check()
    assert samples.changes == [frozenset({MEMORY})], "reported once, as it changes"
    samples.disk_free_bytes = 499
    monitor.check()
    assert samples.changes[-1] == frozenset({MEMORY, DISK})
    assert (monitor.memory_used_bytes, monitor.disk_free_bytes) == (1001, 499)
    samples.memory_bytes = 10
    monitor.check()
    assert samples.changes[-1] == frozenset({DISK})
    samples.disk_free_bytes = 500
    monitor.check()
    assert samples.changes[-1] == frozenset()
    assert len(samples.changes) == 4


def test_alarm_changes_are_logged(caplog):
    samples = Samples()
    monitor = samples.monitor()
    samples.disk_free_bytes = 1
    with caplog.at_level(logging.WARNING, logger="warrenmq.server"):
        monitor.check()
        samples.disk_free_bytes = GIB
        monitor.check()
    assert "disk resource limit alarm set" in caplog.text
    assert "Publishers will be blocked until this alarm clears" in caplog.text
    assert "disk resource limit alarm cleared" in caplog.text


def test_blocked_reason_is_rabbit_readers():
    assert blocked_reason(frozenset({MEMORY})) == "low on memory"
    assert blocked_reason(frozenset({DISK})) == "low on disk"
    assert blocked_reason(frozenset({DISK, MEMORY})) == "low on memory & disk"


def test_limits_from_the_settings():
    default = BrokerConfig()
    assert memory_limit_bytes(default, 10 * GIB) == 6 * GIB
    assert disk_free_limit_bytes(default, 10 * GIB) == 50_000_000
    absolute = BrokerConfig(memory_high_watermark_bytes=123, memory_high_watermark_relative=0.1)
    assert memory_limit_bytes(absolute, 10 * GIB) == 123
    relative = BrokerConfig(disk_free_limit_relative=1.5)
    assert disk_free_limit_bytes(relative, 2 * GIB) == 3 * GIB
    assert memory_limit_bytes(BrokerConfig(memory_high_watermark_relative=0), GIB) == 0
    for name in ("memory_high_watermark_relative", "disk_free_limit_bytes"):
        with pytest.raises(ConfigError, match=name):
            BrokerConfig(**{name: -1})
    with pytest.raises(ConfigError, match="resource_check_interval_ms"):
        BrokerConfig(resource_check_interval_ms=0)


def test_a_paused_heartbeat_monitor_keeps_a_silent_client_and_still_sends_heartbeats():
    conn = connected()
    assert conn.heartbeat_s == 60
    conn.data_to_send()
    conn.pause_heartbeat_monitor()
    assert conn.next_tick_at() == 30.0, "only the next heartbeat to send"
    assert conn.tick(1000.0) is None
    assert conn.data_to_send(), "a heartbeat went out"
    assert not conn.finished
    conn.resume_heartbeat_monitor(1000.0)
    assert conn.tick(1119.0) is None
    closed = conn.tick(1120.0)
    assert isinstance(closed, events.ConnectionClosed), "monitored again from the resume"


# -- a broker whose memory watermark the test moves -------------------------------------------


def _set_watermark(running, limit_bytes: int) -> None:
    """As rabbitmqctl set_vm_memory_high_watermark absolute: the next check applies it."""

    async def set_limit():
        running.broker.resources.memory_limit_bytes = limit_bytes

    running.call(set_limit(), WAIT_S_MAX)


def _wait(connection: pika.BlockingConnection, condition) -> None:
    deadline = time.monotonic() + WAIT_S_MAX
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        connection.process_data_events(time_limit=0.05)


def _ready(running, queue: str) -> int:
    return running.broker.vhosts["/"].queues[queue].ready_count


def test_a_publisher_is_blocked_as_it_publishes_and_unblocked_when_the_alarm_clears(
    start_broker, tmp_path
):
    running = start_broker(tmp_path, resource_check_interval_ms=10)
    publisher = running.connect()
    notices: list[str] = []
    publisher.add_on_connection_blocked_callback(
        lambda _conn, frame: notices.append(frame.method.reason)
    )
    publisher.add_on_connection_unblocked_callback(lambda _conn, _frame: notices.append("go"))
    channel = publisher.channel()
    channel.queue_declare("q")
    channel.basic_publish("", "q", b"first")
    _wait(publisher, lambda: _ready(running, "q") == 1)
    _set_watermark(running, 1)
    _wait(publisher, lambda: running.broker.blocked_reason)
    channel.queue_declare("q2")
    publisher.process_data_events(time_limit=0.2)
    assert notices == [], "declaring is not publishing"
    channel.basic_publish("", "q", b"second")
    _wait(publisher, lambda: notices)
    assert notices == ["low on memory"]

    # Another connection consumes, acks and purges meanwhile; the blocked one is not read.
    consumer = running.connect()
    consuming = consumer.channel()
    method, _, body = consuming.basic_get("q")
    assert body == b"first"
    consuming.basic_ack(method.delivery_tag)
    assert consuming.queue_declare("q", passive=True).method.message_count == 0
    assert consuming.queue_purge("q").method.message_count == 0
    api = HttpApi(running.management_url)
    node = api.get("/api/nodes").json[0]
    assert node["mem_alarm"] is True and node["disk_free_alarm"] is False
    assert node["mem_limit"] == 1
    states = {c["state"] for c in api.get("/api/connections").json}
    assert states == {"blocked", "blocking"}
    health = api.get("/api/health/checks/alarms")
    assert health.status == 503
    assert health.json == {
        "status": "failed",
        "reason": "There are alarms in effect in the cluster",
        "alarms": [{"node": node["name"], "resource": "memory"}],
    }
    with urllib.request.urlopen(running.metrics_url + "/metrics", timeout=10) as response:
        metrics = response.read().decode()
    assert "rabbitmq_alarms_memory_used_watermark 1.0" in metrics
    assert "rabbitmq_alarms_free_disk_space_watermark 0.0" in metrics

    _set_watermark(running, 1 << 50)
    _wait(publisher, lambda: notices[-1] == "go")
    assert notices == ["low on memory", "go"]
    _wait(publisher, lambda: _ready(running, "q") == 1)
    assert consuming.basic_get("q", auto_ack=True)[2] == b"second"
    health = api.get("/api/health/checks/local-alarms")
    assert (health.status, health.json) == (200, {"status": "ok"})
    assert {c["state"] for c in api.get("/api/connections").json} == {"running"}
    consumer.close()
    publisher.close()


def test_input_past_the_read_bound_samples_memory_without_waiting_for_the_timer(
    start_broker, tmp_path
):
    # The timer would sample next in an hour: only the bytes read can raise the alarm.
    running = start_broker(tmp_path, resource_check_interval_ms=3_600_000)
    setup = running.connect()
    setup.channel().queue_declare("q")
    _set_watermark(running, 1)
    chunk = b"x" * (100 << 10)
    with RawClient("127.0.0.1", running.port) as raw:
        raw.handshake()
        raw.open_channel(1)
        raw.send(1, commands.Basic.Publish(exchange="", routing_key="q"))
        raw.send(1, header.ContentHeader(0, 16 << 20, commands.Basic.Properties()))
        port = raw.sock.getsockname()[1]
        (connection,) = [c for c in list(running.broker.connections) if c.peer[1] == port]
        sent = 0
        while sent + len(chunk) < RESOURCE_CHECK_READ_BYTES - (1 << 20):
            raw.send(1, content_body.ContentBody(chunk))
            sent += len(chunk)
        _wait(setup, lambda: connection.received_bytes >= sent)
        assert running.broker.blocked_reason == "", "sampled before the bound was read"
        for _ in range((RESOURCE_CHECK_READ_BYTES - sent) // len(chunk) + 2):
            raw.send(1, content_body.ContentBody(chunk))
        _wait(setup, lambda: running.broker.blocked_reason)
        assert running.broker.blocked_reason == "low on memory"
        # The next body frame is where the alarm blocks the connection.
        raw.send(1, content_body.ContentBody(chunk))
        _wait(setup, lambda: connection.blocked)
    setup.close()


def test_consumers_keep_receiving_during_an_alarm(start_broker, tmp_path):
    running = start_broker(tmp_path, resource_check_interval_ms=10)
    setup = running.connect()
    channel = setup.channel()
    channel.queue_declare("q")
    for number in range(100):
        channel.basic_publish("", "q", str(number).encode())
    _wait(setup, lambda: _ready(running, "q") == 100)
    _set_watermark(running, 1)
    consumer = running.connect()
    consuming = consumer.channel()
    consuming.basic_qos(prefetch_count=10)
    received = []
    consuming.basic_consume(
        "q",
        lambda ch, method, _props, body: (received.append(body), ch.basic_ack(method.delivery_tag)),
    )
    _wait(consumer, lambda: len(received) == 100)
    assert running.broker.blocked_reason == "low on memory"
    consumer.close()
    setup.close()


def test_a_client_without_the_capability_is_blocked_without_notice(start_broker, tmp_path):
    running = start_broker(tmp_path, memory_high_watermark_bytes=1, resource_check_interval_ms=10)
    parameters = pika.ConnectionParameters(
        "127.0.0.1", running.port, client_properties={"capabilities": {}}
    )
    publisher = pika.BlockingConnection(parameters)
    channel = publisher.channel()
    channel.queue_declare("q")
    channel.basic_publish("", "q", b"first")
    channel.basic_publish("", "q", b"second")
    _wait(publisher, lambda: running.broker.connections and _blocked(running))
    publisher.process_data_events(time_limit=0.3)
    # Blocked at "first"'s content header: its body waits unread with "second".
    assert _ready(running, "q") == 0
    _set_watermark(running, 1 << 50)
    _wait(publisher, lambda: _ready(running, "q") == 2)
    publisher.close()


def _blocked(running) -> bool:
    return all(connection.blocked for connection in list(running.broker.connections))


def test_a_body_on_its_way_blocks_its_connection(start_broker, tmp_path):
    running = start_broker(tmp_path, memory_high_watermark_bytes=1, resource_check_interval_ms=10)
    setup = running.connect()
    setup.channel().queue_declare("q")
    body_bytes = 8 << 20
    chunk = b"x" * (100 << 10)
    with RawClient("127.0.0.1", running.port) as raw:
        raw.handshake()
        raw.open_channel(1)
        raw.send(1, commands.Basic.Publish(exchange="", routing_key="q"))
        raw.send(1, header.ContentHeader(0, body_bytes, commands.Basic.Properties()))
        raw.send(1, content_body.ContentBody(chunk))
        port = raw.sock.getsockname()[1]
        (connection,) = [c for c in list(running.broker.connections) if c.peer[1] == port]
        _wait(setup, lambda: connection.blocked)
        sent = len(chunk)
        # Less than the socket buffers hold, so these sends do not wait for the broker.
        for _ in range(5):
            raw.send(1, content_body.ContentBody(chunk))
            sent += len(chunk)
        setup.process_data_events(time_limit=0.3)
        assert connection.received_bytes < 2 * len(chunk) + 4096, "not read while blocked"
        _set_watermark(running, 1 << 50)
        while sent < body_bytes:
            part = chunk[: body_bytes - sent]
            raw.send(1, content_body.ContentBody(part))
            sent += len(part)
        _wait(setup, lambda: _ready(running, "q") == 1)
    setup.close()


def test_a_publisher_is_blocked_at_the_content_header_before_its_body_is_read(
    start_broker, tmp_path
):
    """rabbit_reader blocks after the content header when an alarm is in effect: a body
    sent with its header in one write is not taken until the alarm clears."""
    running = start_broker(tmp_path, memory_high_watermark_bytes=1, resource_check_interval_ms=10)
    setup = running.connect()
    setup.channel().queue_declare("q")
    with RawClient("127.0.0.1", running.port) as raw:
        raw.handshake()
        raw.open_channel(1)
        raw.send_bytes(
            frame.marshal(commands.Basic.Publish(exchange="", routing_key="q"), 1)
            + frame.marshal(header.ContentHeader(0, 5, commands.Basic.Properties()), 1)
            + frame.marshal(content_body.ContentBody(b"whole"), 1)
        )
        port = raw.sock.getsockname()[1]
        (connection,) = [c for c in list(running.broker.connections) if c.peer[1] == port]
        _wait(setup, lambda: connection.blocked)
        setup.process_data_events(time_limit=0.3)
        assert _ready(running, "q") == 0
        _set_watermark(running, 1 << 50)
        _wait(setup, lambda: _ready(running, "q") == 1)
    setup.close()

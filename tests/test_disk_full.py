"""A broker on a 64 MB tmpfs (the tests mount it; root only): the disk alarm blocks confirmed
publishers before the disk fills and unblocks them once a queue's deletion frees space; a
disk filled past the alarm (its limit 0) refuses publishes with nacks and metadata changes
wait, and all carries on by itself once space returns. Every confirmed message is there,
before and after a restart."""

from __future__ import annotations

import os
import subprocess
import threading
import time

import pika
import pytest
from brokers import WarrenProcess
from http_api import HttpApi

TMPFS_BYTES = 64 << 20
BODY = b"x" * 65536
PERSISTENT = pika.BasicProperties(delivery_mode=2)
WAIT_S_MAX = 30.0

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


@pytest.fixture
def small_disk(tmp_path):
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", str(mount_point)],
        check=True,
    )
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=True)


@pytest.fixture
def broker_on(small_disk, tmp_path, monkeypatch):
    started = []

    def start(**settings):
        for name, value in settings.items():
            monkeypatch.setenv(f"WARREN_{name.upper()}", str(value))
        process = WarrenProcess(small_disk / "data", log_path=tmp_path / "warren.log")
        started.append(process)
        return process.start()

    yield start
    for process in started:
        process.kill()


def _wait(connection: pika.BlockingConnection, condition) -> None:
    deadline = time.monotonic() + WAIT_S_MAX
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        connection.process_data_events(time_limit=0.05)


def _bodies(broker: WarrenProcess, queue: str) -> list[bytes]:
    connection = broker.connect()
    channel = connection.channel()
    bodies = []
    while (got := channel.basic_get(queue, auto_ack=False))[0] is not None:
        bodies.append(got[2])
    connection.close()
    return bodies


def test_the_disk_alarm_blocks_publishers_until_a_deleted_queue_frees_space(broker_on):
    broker = broker_on()
    publisher = broker.connect(blocked_connection_timeout=None)
    notices: list[str] = []
    publisher.add_on_connection_blocked_callback(
        lambda _conn, frame: notices.append(frame.method.reason)
    )
    publisher.add_on_connection_unblocked_callback(lambda _conn, _frame: notices.append("go"))
    channel = publisher.channel()
    channel.confirm_delivery()
    channel.queue_declare("fill", durable=True)
    channel.queue_declare("keep", durable=True)
    kept = []
    number = 0
    while not notices:
        channel.basic_publish("", "fill", BODY, PERSISTENT)
        number += 1
        # pika's blocking adapter runs the blocked callback here only. The publish that got
        # the connection blocked was taken; the next one would not be read until unblocked.
        publisher.process_data_events(time_limit=0)
        if number % 10 == 0 and not notices:
            channel.basic_publish("", "keep", str(number).encode(), PERSISTENT)
            kept.append(str(number).encode())
        assert number * len(BODY) < TMPFS_BYTES, "never blocked"
    assert notices == ["low on disk"]
    api = HttpApi(broker.management_url)
    assert api.get("/api/nodes").json[0]["disk_free_alarm"] is True
    assert api.get("/api/health/checks/alarms").status == 503

    other = broker.connect()
    other.channel().queue_delete("fill")
    _wait(publisher, lambda: notices[-1] == "go")
    assert notices == ["low on disk", "go"]
    channel.basic_publish("", "keep", b"after", PERSISTENT)
    kept.append(b"after")
    assert api.get("/api/nodes").json[0]["disk_free_alarm"] is False
    other.close()
    publisher.close()
    assert _bodies(broker, "keep") == kept
    broker.stop()
    broker.start()
    assert _bodies(broker, "keep") == kept


def test_a_disk_filled_past_the_alarm_refuses_publishes_and_recovers_once_space_returns(
    broker_on, small_disk
):
    ballast = small_disk / "ballast"
    ballast.write_bytes(b"\0" * (8 << 20))
    broker = broker_on(disk_free_limit_bytes=0)
    publisher = broker.connect(blocked_connection_timeout=None)
    channel = publisher.channel()
    channel.confirm_delivery()
    channel.queue_declare("fill", durable=True)
    confirmed = 0
    with pytest.raises(pika.exceptions.NackError):
        while True:
            channel.basic_publish("", "fill", BODY, PERSISTENT)
            confirmed += 1
            assert confirmed * len(BODY) < TMPFS_BYTES, "never refused"
    # Small messages too, until the last bytes are gone.
    with pytest.raises(pika.exceptions.NackError):
        while True:
            channel.basic_publish("", "fill", b"y" * 100, PERSISTENT)
            confirmed += 1

    declared = threading.Event()

    def declare():
        connection = broker.connect(blocked_connection_timeout=None)
        connection.channel().queue_declare("declared-when-full", durable=True)
        declared.set()
        connection.close()

    declaring = threading.Thread(target=declare)
    declaring.start()
    assert not declared.wait(2.0), "a metadata change waits for space"
    assert broker.process.poll() is None
    ballast.unlink()
    declaring.join(WAIT_S_MAX)
    assert declared.is_set()
    channel.basic_publish("", "fill", BODY, PERSISTENT)
    confirmed += 1
    publisher.close()
    passive = broker.connect()
    assert passive.channel().queue_declare("fill", passive=True).method.message_count == confirmed
    passive.close()
    broker.stop()
    broker.start()
    check = broker.connect()
    check_channel = check.channel()
    assert check_channel.queue_declare("fill", passive=True).method.message_count == confirmed
    check_channel.queue_declare("declared-when-full", passive=True)
    check.close()

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


def _wait_until(condition) -> None:
    deadline = time.monotonic() + WAIT_S_MAX
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


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
    setup = broker.connect()
    setup.channel().queue_declare("fill", durable=True)
    setup.channel().queue_declare("keep", durable=True)
    setup.close()
    notices: list[str] = []
    kept: list[bytes] = []
    stop = threading.Event()
    failures: list[BaseException] = []

    def publish() -> None:
        # A blocked connection is read no more, so a publish of its own may wait, unconfirmed,
        # until the alarm clears (its body half read, say): the publisher runs on its own
        # thread, as a blocked application would, and the test frees space meanwhile.
        try:
            publisher = broker.connect(blocked_connection_timeout=None)
            publisher.add_on_connection_blocked_callback(
                lambda _conn, frame: notices.append(frame.method.reason)
            )
            publisher.add_on_connection_unblocked_callback(
                lambda _conn, _frame: notices.append("go")
            )
            channel = publisher.channel()
            channel.confirm_delivery()
            number = 0
            while not stop.is_set():
                number += 1
                channel.basic_publish("", "fill", BODY, PERSISTENT)
                if number % 10 == 0:
                    channel.basic_publish("", "keep", str(number).encode(), PERSISTENT)
                    kept.append(str(number).encode())
                # pika's blocking adapter runs the blocked callbacks here only.
                publisher.process_data_events(time_limit=0)
                assert number * len(BODY) < TMPFS_BYTES, "never blocked"
            channel.basic_publish("", "keep", b"after", PERSISTENT)
            kept.append(b"after")
            publisher.process_data_events(time_limit=0)
            publisher.close()
        except BaseException as error:
            failures.append(error)

    api = HttpApi(broker.management_url)
    publisher = threading.Thread(target=publish)
    publisher.start()
    _wait_until(lambda: failures or api.get("/api/nodes").json[0]["disk_free_alarm"])
    assert not failures, failures
    assert api.get("/api/health/checks/alarms").status == 503
    _wait_until(
        lambda: failures or any(c["state"] == "blocked" for c in api.get("/api/connections").json)
    )
    assert not failures, failures

    other = broker.connect()
    other.channel().queue_delete("fill")
    other.close()
    _wait_until(lambda: failures or "go" in notices)
    stop.set()
    publisher.join(WAIT_S_MAX)
    assert not publisher.is_alive() and not failures, failures
    assert notices == ["low on disk", "go"]
    assert api.get("/api/nodes").json[0]["disk_free_alarm"] is False
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
        # Its metadata log entry is bigger than a page: a small one may fit in the slack of
        # the log's last page, which needs no space and rightly completes.
        connection.channel().queue_declare(
            "declared-when-full", durable=True, arguments={"x-note": "n" * 16384}
        )
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

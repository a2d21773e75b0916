"""A queue's storage that cannot be opened: at declare (no record is left behind, 541), at
recovery (that queue is unavailable, the others carry on), and a start that fails outright
(one line, exit status 1, at once)."""

from __future__ import annotations

import asyncio
import errno
import socket
import sqlite3
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pika
import pika.exceptions
import pytest
from brokers import DURABLE_QUEUE, warren_serve

from warrenmq.server import broker as broker_module
from warrenmq.server.metadata import METADATA_FILE
from warrenmq.server.metadata.state import Limits
from warrenmq.server.queue.dead_letter_counts import DeadLetterCounts
from warrenmq.server.vhost import SHUTDOWN_CONCURRENT_MAX, VirtualHost, directory_name


def stored_queues(data_dir):
    with sqlite3.connect(data_dir / METADATA_FILE) as db:
        return sorted(name for (name,) in db.execute("SELECT name FROM queues"))


def queue_directory(data_dir, name):
    return data_dir / "queues" / directory_name("/") / directory_name(name)


def assert_recorded_queues(running, data_dir, names):
    """The metadata holds exactly these queues; so do its rows, soon (a view of the metadata
    log, written in the background)."""

    async def metadata_queues():
        return sorted(running.broker.store.state.queues("/"))

    assert running.call(metadata_queues()) == names
    wait_until(lambda: stored_queues(data_dir) == names)


def wait_until(condition, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.fixture
def failing_open(monkeypatch):
    """LogQueue.open fails with EMFILE for queues named "doomed*", as it did when the
    process ran out of descriptors."""
    real_open = broker_module.LogQueue.open

    def open_or_fail(directory, *args, **kwargs):
        if "doomed" in str(directory):
            raise OSError(errno.EMFILE, "Too many open files", str(directory))
        return real_open(directory, *args, **kwargs)

    monkeypatch.setattr(broker_module.LogQueue, "open", open_or_fail)


def test_a_declare_whose_storage_cannot_open_leaves_no_record(tmp_path, failing_open, start_broker):
    data_dir = tmp_path / "data"
    running = start_broker(data_dir)
    connection = running.connect()
    channel = connection.channel()
    channel.queue_declare("kept", durable=True)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as excinfo:
        channel.queue_declare("doomed", durable=True)
    code, text = excinfo.value.args
    assert code == 541
    assert text == (
        "INTERNAL_ERROR - cannot declare queue 'doomed' in vhost '/': EMFILE (Too many open files)"
    )
    assert str(tmp_path) not in text, "no server path goes to the client"
    connection = running.connect()
    channel = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        channel.queue_declare("doomed", passive=True)
    assert excinfo.value.args[0] == 404
    connection.close()
    assert_recorded_queues(running, data_dir, ["kept"])
    wait_until(lambda: not queue_directory(data_dir, "doomed").exists())
    running.stop()
    running = start_broker(data_dir)
    assert set(running.broker.vhosts["/"].queues) == {"kept"}
    assert running.broker.vhosts["/"].failed == {}


def test_a_declare_refused_after_its_storage_opened_removes_the_storage(tmp_path, start_broker):
    data_dir = tmp_path / "data"
    running = start_broker(data_dir)
    running.broker.store.state.limits = Limits(queues_per_vhost_max=1)
    connection = running.connect()
    channel = connection.channel()
    channel.queue_declare("first", durable=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        channel.queue_declare("second", durable=True)
    assert excinfo.value.args[0] == 406
    connection.close()
    assert_recorded_queues(running, data_dir, ["first"])
    wait_until(lambda: not queue_directory(data_dir, "second").exists())
    assert "second" not in running.broker.vhosts["/"].queues


def test_concurrent_declares_of_one_new_queue_share_its_storage(
    tmp_path, monkeypatch, start_broker
):
    """A declare racing another declare's metadata command, and a use once that applied but
    before its declarer resumed, find the queue; its files are never opened twice."""
    opened = []
    real_open = broker_module.LogQueue.open

    def counting(directory, *args, **kwargs):
        opened.append(directory)
        return real_open(directory, *args, **kwargs)

    monkeypatch.setattr(broker_module.LogQueue, "open", counting)
    running = start_broker(tmp_path / "data")
    vhost = running.broker.vhosts["/"]

    async def race():
        async def use():
            while vhost.store.state.queue("/", "shared") is None:
                await asyncio.sleep(0)
            assert "shared" not in vhost.queues, "the declarers have not resumed yet"
            return vhost.get_queue("shared", "o")

        return await asyncio.gather(
            vhost.declare_queue("shared", **DURABLE_QUEUE),
            vhost.declare_queue("shared", **DURABLE_QUEUE),
            use(),
        )

    first, second, used = running.call(race())
    assert first is second is used is vhost.queues["shared"]
    assert len(opened) == 1


def test_a_queue_whose_files_cannot_open_is_unavailable_and_the_others_recover(
    tmp_path, start_broker
):
    data_dir = tmp_path / "data"
    running = start_broker(data_dir)
    connection = running.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    for name in ("a", "b", "c"):
        channel.queue_declare(name, durable=True)
        channel.basic_publish("", name, name.encode(), pika.BasicProperties(delivery_mode=2))
    connection.close()
    running.stop()
    # Damage beyond what the log's recovery handles: the ack log's directory is a file.
    acks = queue_directory(data_dir, "b") / "acks"
    moved = acks.with_name("acks.moved")
    acks.rename(moved)
    acks.write_bytes(b"not a directory")

    running = start_broker(data_dir)
    vhost = running.broker.vhosts["/"]
    assert set(vhost.queues) == {"a", "c"} and set(vhost.failed) == {"b"}
    connection = running.connect()
    channel = connection.channel()
    for name in ("a", "c"):
        assert channel.basic_get(name, auto_ack=True)[2] == name.encode()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        channel.queue_declare("b", passive=True)
    assert excinfo.value.args == (
        404,
        "NOT_FOUND - queue 'b' in vhost '/' has crashed and failed to restart",
    )
    channel = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        channel.basic_get("b")
    assert excinfo.value.args[0] == 404
    # Publishing to it drops the message for that queue only; the connection carries on.
    channel = connection.channel()
    channel.basic_publish("", "b", b"lost")
    # Repaired, the next declare opens it again, with its message.
    acks.unlink()
    moved.rename(acks)
    assert channel.queue_declare("b", durable=True).method.message_count == 1
    assert channel.basic_get("b", auto_ack=True)[2] == b"b"
    assert vhost.failed == {}
    connection.close()
    assert stored_queues(data_dir) == ["a", "b", "c"]


def test_a_fatal_start_up_error_exits_non_zero_at_once(warren_process):
    data_dir = warren_process.data_dir
    # A first run leaves recovered queues behind: their files are open when start fails.
    connection = warren_process.start().connect()
    channel = connection.channel()
    for i in range(20):
        channel.queue_declare(f"q{i}", durable=True)
        channel.basic_publish("", f"q{i}", b"m")
    connection.close()
    assert warren_process.stop() == 0
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        started = time.monotonic()
        process = subprocess.Popen(
            warren_serve(data_dir, taken.getsockname()[1]),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            _, stderr = process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            pytest.fail("warren serve hung after a failed start")
        assert process.returncode == 1
        assert time.monotonic() - started < 5
        failures = [line for line in stderr.splitlines() if "CRITICAL" in line]
        assert len(failures) == 1 and "start-up failed: OSError" in failures[0]
        assert "address already in use" in failures[0]
        assert "Traceback" not in stderr
    finally:
        taken.close()


def test_clean_shutdown_runs_queues_side_by_side_and_one_failure_closes_only_its_queue():
    running = []
    peak = [0]
    closed = []

    class Engine:
        def __init__(self, name):
            self.name = name

        async def shutdown(self):
            running.append(self)
            peak[0] = max(peak[0], len(running))
            await asyncio.sleep(0.001)
            running.remove(self)
            if self.name == "bad":
                raise OSError(errno.EIO, "Input/output error")

        def close(self):
            closed.append(self.name)

    vhost = VirtualHost(
        "/",
        Path("/nonexistent"),
        store=None,
        open_engine=None,
        batch_records_max=1,
        staged=None,
        wake=None,
        deliver_reply=None,
        background=None,
        clock=lambda: 0,
        confirm=lambda handoff, tag: None,
        open_delayed=None,
        dead_letter_counts=DeadLetterCounts(),
    )
    names = ["bad"] + [f"q{i}" for i in range(500)]
    vhost.queues = {
        name: SimpleNamespace(name=name, engine=Engine(name), flush=lambda now_ms: None)
        for name in names
    }
    asyncio.run(vhost.shutdown())
    assert peak[0] == SHUTDOWN_CONCURRENT_MAX
    assert closed == ["bad"]

"""Durability: `warren serve` killed with SIGKILL while publishers wait for confirms.

After a restart every confirmed message is there exactly once (or was acknowledged before
the crash), and every message that was delivered but not acknowledged comes back with
redelivered=True. Also: a clean SIGTERM closes clients with 320 and keeps everything, and
durable topology (exchanges, queues, bindings) survives while transient topology does not.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time

import pika
import pika.exceptions
import pytest
from brokers import WARREN_LISTENING, WarrenProcess, connect, warren_serve

QUEUE = "durable-work"


def _publisher(port, prefix, confirmed, stop):
    try:
        connection = connect(port)
        channel = connection.channel()
        channel.confirm_delivery()
        properties = pika.BasicProperties(delivery_mode=2)
        n = 0
        while not stop.is_set():
            body = f"{prefix}-{n}".encode()
            channel.basic_publish("", QUEUE, body, properties)
            # basic_publish in confirm mode returns once the broker confirmed the message.
            confirmed.append(body)
            n += 1
    except (pika.exceptions.AMQPError, OSError):
        return


def _consumer(port, acked, unacked, stop):
    """Acks every other message it gets; the rest stay unacked until the crash."""
    try:
        connection = connect(port)
        channel = connection.channel()
        channel.basic_qos(prefetch_count=50)
        for method, _, body in channel.consume(QUEUE, inactivity_timeout=0.05):
            if stop.is_set():
                break
            if method is None:
                continue
            if method.delivery_tag % 2:
                channel.basic_ack(method.delivery_tag)
                acked.add(body)
            else:
                unacked.add(body)
    except (pika.exceptions.AMQPError, OSError):
        return


def crash_cycle(warren_process, cycle, seconds=1.0):
    """Publish and consume under load, SIGKILL the broker; returns what the clients saw."""
    warren_process.start()
    setup = warren_process.connect()
    setup.channel().queue_declare(QUEUE, durable=True)
    setup.close()
    confirmed_lists = [[], []]
    acked, unacked = set(), set()
    stop = threading.Event()
    threads = [
        threading.Thread(
            target=_publisher, args=(warren_process.port, f"c{cycle}p{i}", confirmed_lists[i], stop)
        )
        for i in range(2)
    ]
    threads.append(
        threading.Thread(target=_consumer, args=(warren_process.port, acked, unacked, stop))
    )
    for thread in threads:
        thread.start()
    time.sleep(seconds)
    warren_process.kill()
    stop.set()
    for thread in threads:
        thread.join(10)
    confirmed = set(confirmed_lists[0]) | set(confirmed_lists[1])
    return confirmed, acked, unacked


def drain_all(warren_process):
    connection = warren_process.connect()
    channel = connection.channel()
    got = []
    while True:
        method, _, body = channel.basic_get(QUEUE, auto_ack=False)
        if method is None:
            break
        got.append((body, method.redelivered))
    channel.basic_ack(0, multiple=True)
    connection.close()
    return got


def check_recovered(confirmed, acked, unacked, recovered):
    bodies = [body for body, _ in recovered]
    assert len(bodies) == len(set(bodies)), "a message came back twice"
    redelivered = {body for body, flag in recovered if flag}
    missing = confirmed - set(bodies) - acked
    assert not missing, f"{len(missing)} confirmed messages lost, e.g. {sorted(missing)[:3]}"
    lost_unacked = unacked - set(bodies)
    assert not lost_unacked, f"unacked messages lost: {sorted(lost_unacked)[:3]}"
    not_flagged = unacked - redelivered
    assert not not_flagged, f"unacked at the crash but not redelivered: {sorted(not_flagged)[:3]}"


def test_sigkill_with_confirming_publishers_loses_no_confirmed_message(warren_process):
    confirmed, acked, unacked = crash_cycle(warren_process, 0)
    assert len(confirmed) > 50 and unacked
    warren_process.start()
    recovered = drain_all(warren_process)
    check_recovered(confirmed, acked, unacked, recovered)


def _declarer(port, prefix, declared, stop):
    try:
        connection = connect(port)
        channel = connection.channel()
        n = 0
        while not stop.is_set():
            name = f"{prefix}-{n}"
            channel.queue_declare(name, durable=True)
            declared.append(name)
            n += 1
    except (pika.exceptions.AMQPError, OSError):
        return


def test_sigkill_mid_declares_loses_no_declared_queue(warren_process):
    """Every durable queue whose declare-ok a client got is there after a SIGKILL: its
    metadata log entry was fsynced (the SQLite rows, a view, may lag and are rewritten)."""
    warren_process.start()
    declared_lists = [[] for _ in range(4)]
    stop = threading.Event()
    threads = [
        threading.Thread(
            target=_declarer, args=(warren_process.port, f"q{i}", declared_lists[i], stop)
        )
        for i in range(4)
    ]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    warren_process.kill()
    stop.set()
    for thread in threads:
        thread.join(10)
    declared = [name for names in declared_lists for name in names]
    assert len(declared) > 20
    warren_process.start()
    connection = warren_process.connect()
    missing = []
    for name in declared:
        channel = connection.channel()
        try:
            channel.queue_declare(name, passive=True)
            channel.close()
        except pika.exceptions.ChannelClosedByBroker:
            missing.append(name)
    connection.close()
    assert not missing, f"{len(missing)} declared queues lost, e.g. {missing[:3]}"


@pytest.mark.slow
def test_crash_loop(warren_process):
    """Several SIGKILLs in a row on the same data; each restart checks the previous run."""
    for cycle in range(6):
        confirmed, acked, unacked = crash_cycle(warren_process, cycle, seconds=0.7)
        warren_process.start()
        recovered = drain_all(warren_process)
        check_recovered(confirmed, acked, unacked, recovered)
        warren_process.kill()


def test_sigterm_closes_clients_with_320_and_keeps_everything(warren_process):
    warren_process.start()
    connection = warren_process.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    channel.exchange_declare("keep-x", "topic", durable=True)
    channel.exchange_declare("drop-x", "fanout", durable=False)
    channel.queue_declare("keep-q", durable=True)
    channel.queue_declare("drop-q", durable=False)
    channel.queue_bind("keep-q", "keep-x", "a.#")
    for i in range(100):
        channel.basic_publish("keep-x", "a.b", b"%d" % i, pika.BasicProperties(delivery_mode=2))
    warren_process.process.send_signal(signal.SIGTERM)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as excinfo:
        connection.process_data_events(time_limit=5)
    assert excinfo.value.args == (320, "CONNECTION_FORCED - broker forced connection closure")
    assert warren_process.process.wait(15) == 0
    warren_process.start()
    connection = warren_process.connect()
    channel = connection.channel()
    assert channel.queue_declare("keep-q", passive=True).method.message_count == 100
    channel.exchange_declare("keep-x", passive=True)
    channel.basic_publish("keep-x", "a.c", b"after")
    method, _, body = channel.basic_get("keep-q", auto_ack=True)
    assert body == b"0" and not method.redelivered
    for missing in (
        lambda open_channel: open_channel.queue_declare("drop-q", passive=True),
        lambda open_channel: open_channel.exchange_declare("drop-x", passive=True),
    ):
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
            missing(channel)
        assert excinfo.value.args[0] == 404
        channel = connection.channel()
    connection.close()


def test_serve_reads_flags_over_environment(tmp_path):
    env = dict(os.environ, WARREN_PORT="1", WARREN_LOG_LEVEL="warning")
    process = subprocess.Popen(
        warren_serve(tmp_path / "d"),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        line = process.stdout.readline()
        assert WARREN_LISTENING.search(line) and not line.strip().endswith(":1")
        assert (tmp_path / "d" / "metadata.sqlite3").exists()
        process.send_signal(signal.SIGTERM)
        assert process.wait(15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.fixture
def small_disk(tmp_path):
    """A 32 MiB tmpfs of its own, so the test can fill a disk without filling the machine's."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=32m", "tmpfs", str(mount_point)], check=True
    )
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=False)


def _fill(path, leave_bytes):
    """Write a file that leaves about `leave_bytes` free on path's filesystem."""
    stat = os.statvfs(path.parent)
    size = max(0, stat.f_bavail * stat.f_frsize - leave_bytes)
    with open(path, "wb") as filler:
        filler.truncate(0)
        chunk = b"\0" * (1 << 20)
        while size > 0:
            size -= filler.write(chunk[: min(size, len(chunk))])


def test_a_full_disk_nacks_publishes_and_loses_no_confirmed_message(small_disk, monkeypatch):
    # The disk alarm off (its limit 0): a disk that fills anyway (test_disk_full.py has the
    # alarm blocking publishers before it does).
    monkeypatch.setenv("WARREN_DISK_FREE_LIMIT_BYTES", "0")
    process = WarrenProcess(small_disk / "data")
    try:
        process.start()
        connection = process.connect()
        channel = connection.channel()
        channel.queue_declare(QUEUE, durable=True)
        channel.confirm_delivery()
        persistent = pika.BasicProperties(delivery_mode=2)
        _fill(small_disk / "filler", leave_bytes=2 << 20)
        confirmed, nacked = [], []
        for n in range(400):
            body = b"%06d" % n + b"x" * (32 << 10)
            try:
                channel.basic_publish("", QUEUE, body, persistent)
                confirmed.append(body)
            except pika.exceptions.NackError:
                nacked.append(body)
        assert confirmed and nacked, (len(confirmed), len(nacked))
        # Space comes back: the same queue stores and confirms again, on the same channel.
        os.unlink(small_disk / "filler")
        for n in range(400, 410):
            body = b"%06d" % n
            channel.basic_publish("", QUEUE, body, persistent)
            confirmed.append(body)
        process.kill()
        process.start()
        recovered = [body for body, _ in drain_all(process)]
        missing = [body[:6] for body in confirmed if body not in recovered]
        assert not missing, f"{len(missing)} confirmed messages lost, e.g. {missing[:3]}"
        assert len(recovered) == len(set(recovered)), "a message came back twice"
        # What was nacked was taken back out of the log: only confirmed messages, in order.
        assert recovered == confirmed
    finally:
        process.kill()


def test_sigkill_while_dead_lettering_loses_no_message(warren_process):
    """Every message rejected to a dead-letter queue is, after a SIGKILL and a restart, in
    the dead-letter queue or back in its source (at least once: never lost)."""
    source, target = "dl-source", "dl-target"
    warren_process.start()
    connection = warren_process.connect()
    channel = connection.channel()
    channel.queue_declare(target, durable=True)
    channel.queue_declare(
        source,
        durable=True,
        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": target},
    )
    channel.confirm_delivery()
    sent = [f"m{i}".encode() for i in range(3000)]
    for body in sent:
        channel.basic_publish("", source, body, pika.BasicProperties(delivery_mode=2))
    channel.basic_qos(prefetch_count=100)
    rejected = 0
    for method, _, _ in channel.consume(source, inactivity_timeout=1):
        if method is None:
            break
        channel.basic_reject(method.delivery_tag, requeue=False)
        rejected += 1
        if rejected == 1500:
            warren_process.kill()
            break
    warren_process.start()
    connection = warren_process.connect()
    channel = connection.channel()
    found: list[bytes] = []
    for queue in (source, target):
        while True:
            method, properties, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                break
            found.append(body)
            if queue == target:
                assert properties.headers["x-death"][0]["reason"] == "rejected"
    connection.close()
    missing = set(sent) - set(found)
    assert not missing, f"{len(missing)} messages lost, e.g. {sorted(missing)[:3]}"


def test_sigterm_after_the_data_dir_was_deleted_exits_with_an_error_not_a_hang(tmp_path):
    """Its last writes fail (the metadata group's hard state, the queues' marks); the process
    used to wait forever on the metadata database's thread that the failure left open."""
    warren_process = WarrenProcess(tmp_path / "data", log_path=tmp_path / "warren.log")
    warren_process.start()
    connection = warren_process.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(QUEUE, durable=True)
    channel.basic_publish("", QUEUE, b"lost with its dir", pika.BasicProperties(delivery_mode=2))
    connection.close()
    shutil.rmtree(warren_process.data_dir)
    try:
        assert warren_process.stop(timeout_s=15) == 1
    finally:
        warren_process.kill()
    assert "stopping failed: FileNotFoundError" in warren_process.log_since_start()

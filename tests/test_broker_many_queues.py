"""Many durable queues under a 4,096-descriptor limit: `warren serve` as a subprocess.

The issue: every queue kept six files open, so with RLIMIT_NOFILE at 20,000 the 3,330th
durable declare failed with EMFILE, its record was saved all the same, and the broker could
not restart. Now the queues' files are a bounded pool. Each run here declares plain durable
queues and priority queues (x-max-priority 255) using all 255 levels, publishes to and
consumes from a sample, restarts with SIGTERM and then with SIGKILL, and checks that every
queue and message came back and that nothing ran out of descriptors. It prints what it
measured: declare and recovery times, peak open descriptors, the broker's RSS.
"""

from __future__ import annotations

import os
import re
import resource
import signal
import threading
import time

import pika
import pytest
from brokers import WarrenProcess

NOFILE = 4096
CLIENTS = 8
LEVELS = 255
RECOVERED = re.compile(r"vhost '/': \d+ exchanges, (\d+) queues recovered, (\d+) unavailable")
OUT_OF_DESCRIPTORS = ("Too many open files", "EMFILE", "ENFILE")


def _limit_descriptors():
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


class LimitedBroker(WarrenProcess):
    """`warren serve` with RLIMIT_NOFILE at NOFILE; its log goes to a file we can search."""

    def __init__(self, data_dir, log_path):
        super().__init__(
            data_dir, log_level="info", log_path=log_path, preexec_fn=_limit_descriptors
        )
        self.fds_peak = 0

    def start(self, timeout_s):
        super().start(timeout_s)
        threading.Thread(target=self._sample_descriptors, args=(self.process,), daemon=True).start()
        return self

    def _sample_descriptors(self, process):
        directory = f"/proc/{process.pid}/fd"
        while process.poll() is None:
            try:
                self.fds_peak = max(self.fds_peak, len(os.listdir(directory)))
            except OSError:
                return
            time.sleep(0.05)

    def rss_bytes(self):
        with open(f"/proc/{self.process.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def check_recovered(self, expected_queues):
        text = self.log_since_start()
        match = RECOVERED.search(text)
        assert match, text[-2000:]
        assert (int(match.group(1)), int(match.group(2))) == (expected_queues, 0)

    def check_never_out_of_descriptors(self):
        text = self.log_path.read_text(errors="replace")
        for marker in OUT_OF_DESCRIPTORS:
            assert marker not in text, f"{marker} in the broker's log"
        assert "Traceback" not in text, text[text.index("Traceback") :][:2000]
        assert self.fds_peak < NOFILE // 2 + 256, f"{self.fds_peak} descriptors open at once"


def in_parallel(port, names, work, *, setup=None):
    """work(channel, name) for every name, over CLIENTS connections at once."""
    errors = []

    def run(chunk):
        try:
            connection = pika.BlockingConnection(
                pika.ConnectionParameters("127.0.0.1", port, connection_attempts=3, retry_delay=1)
            )
            channel = connection.channel()
            if setup is not None:
                setup(channel)
            for name in chunk:
                work(channel, name)
            connection.close()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run, args=(names[i::CLIENTS],)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def timed(call, *args):
    """(what call(*args) returns, the seconds it took)."""
    started = time.monotonic()
    result = call(*args)
    return result, time.monotonic() - started


def persistent(priority=None):
    return pika.BasicProperties(delivery_mode=2, priority=priority)


def message_count(channel, name):
    return channel.queue_declare(name, passive=True).method.message_count


def many_queues(tmp_path, plain_count, priority_count, sample_every, timeout_s):
    """The whole scenario; returns what it measured."""
    plain = [f"q{i:06d}" for i in range(plain_count)]
    priority = [f"p{i:04d}" for i in range(priority_count)]
    sample = plain[::sample_every]
    sampled = set(sample)
    broker = LimitedBroker(tmp_path / "data", tmp_path / "broker.log")
    report = {}
    try:
        broker.start(timeout_s)
        report["rss_empty_mb"] = broker.rss_bytes() / 2**20

        started = time.monotonic()
        in_parallel(broker.port, plain, lambda ch, name: ch.queue_declare(name, durable=True))
        report["declare_plain_s"] = time.monotonic() - started
        rss_idle = broker.rss_bytes()
        report["rss_idle_queue_bytes"] = (rss_idle - report["rss_empty_mb"] * 2**20) / plain_count
        report["rss_after_plain_mb"] = rss_idle / 2**20

        def declare_and_fill(channel, name):
            channel.queue_declare(name, durable=True, arguments={"x-max-priority": LEVELS})
            for level in range(1, LEVELS + 1):
                channel.basic_publish(
                    "", name, b"%s:%d" % (name.encode(), level), persistent(level)
                )
            channel.tx_commit()

        started = time.monotonic()
        in_parallel(broker.port, priority, declare_and_fill, setup=lambda ch: ch.tx_select())
        report["declare_and_fill_priority_s"] = time.monotonic() - started

        def fill_sample(channel, name):
            for i in range(3):
                channel.basic_publish("", name, b"%s:%d" % (name.encode(), i), persistent())
            channel.tx_commit()

        in_parallel(broker.port, sample, fill_sample, setup=lambda ch: ch.tx_select())

        def take_sample(channel, name):
            method, _, body = channel.basic_get(name)
            assert body == b"%s:0" % name.encode()
            channel.basic_ack(method.delivery_tag)

        in_parallel(broker.port, sample, take_sample)

        def take_highest(channel, name):
            for level in range(LEVELS, LEVELS - 5, -1):
                method, properties, body = channel.basic_get(name)
                assert (properties.priority, body) == (level, b"%s:%d" % (name.encode(), level))
                channel.basic_ack(method.delivery_tag)

        in_parallel(broker.port, priority, take_highest)
        report["rss_after_use_mb"] = broker.rss_bytes() / 2**20
        broker.check_never_out_of_descriptors()

        # SIGTERM: a clean stop, then everything comes back.
        status, report["sigterm_stop_s"] = timed(broker.stop, signal.SIGTERM, timeout_s)
        assert status == 0
        _, report["recovery_after_sigterm_s"] = timed(broker.start, timeout_s)
        report["rss_after_recovery_mb"] = broker.rss_bytes() / 2**20
        broker.check_recovered(plain_count + priority_count)

        def check_plain(channel, name):
            assert message_count(channel, name) == (2 if name in sampled else 0)

        in_parallel(broker.port, plain, check_plain)

        def check_priority_and_take(channel, name):
            assert message_count(channel, name) == LEVELS - 5
            method, properties, _ = channel.basic_get(name)
            assert properties.priority == LEVELS - 5
            channel.basic_ack(method.delivery_tag)

        in_parallel(broker.port, priority, check_priority_and_take)

        def confirm_one_more(channel, name):
            channel.basic_publish("", name, b"%s:3" % name.encode(), persistent())

        in_parallel(broker.port, sample, confirm_one_more, setup=lambda ch: ch.confirm_delivery())
        broker.check_never_out_of_descriptors()

        # SIGKILL: whatever was confirmed or committed is there after the restart.
        broker.stop(signal.SIGKILL, timeout_s)
        _, report["recovery_after_sigkill_s"] = timed(broker.start, timeout_s)
        broker.check_recovered(plain_count + priority_count)

        def check_plain_after_kill(channel, name):
            count = message_count(channel, name)
            if name not in sampled:
                assert count == 0
                return
            assert count == 3
            assert [channel.basic_get(name, auto_ack=True)[2] for _ in range(3)] == [
                b"%s:%d" % (name.encode(), i) for i in (1, 2, 3)
            ]

        in_parallel(broker.port, plain, check_plain_after_kill)

        def check_priority_after_kill(channel, name):
            assert message_count(channel, name) == LEVELS - 6
            assert channel.basic_get(name, auto_ack=True)[1].priority == LEVELS - 6

        in_parallel(broker.port, priority, check_priority_after_kill)
        broker.check_never_out_of_descriptors()
        status = broker.stop(signal.SIGTERM, timeout_s)
        assert status == 0
        report["fds_peak"] = broker.fds_peak
        return report
    finally:
        broker.kill()


def print_report(capsys, title, report):
    with capsys.disabled():
        print(f"\n{title}")
        for key, value in report.items():
            print(
                f"  {key:28} {value:12.2f}"
                if isinstance(value, float)
                else f"  {key:28} {value:12}"
            )


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_5000_queues_and_20_priority_queues_of_255_levels_under_4096_descriptors(tmp_path, capsys):
    report = many_queues(
        tmp_path, plain_count=5_000, priority_count=20, sample_every=50, timeout_s=120
    )
    print_report(capsys, "5,000 queues + 20 x 255 priority levels, RLIMIT_NOFILE 4096", report)


@pytest.mark.soak
@pytest.mark.timeout(4 * 3600)
def test_100000_queues_and_1000_priority_queues_of_255_levels_under_4096_descriptors(
    tmp_path, capsys
):
    report = many_queues(
        tmp_path, plain_count=100_000, priority_count=1_000, sample_every=100, timeout_s=1800
    )
    print_report(capsys, "100,000 queues + 1,000 x 255 priority levels, RLIMIT_NOFILE 4096", report)

"""Dead-lettering across crashes: a dead letter is never lost and never doubled. The window
that matters lies between the targets' fsync and the source's acknowledgement; the journal
(`server/dead_letter_journal.py`) closes it."""

from __future__ import annotations

import random
import shutil
import time

import pika
import pytest
from brokers import ThreadBroker, WarrenProcess

DLX_ARGUMENTS = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"}


def _bodies(channel, queue: str) -> list[bytes]:
    got = []
    while True:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return got
        got.append(body)


def test_dead_letters_the_target_stored_leave_a_source_that_lost_its_acks(tmp_path):
    """The crash window, made exactly: the source's files as they were while its messages
    were delivered (and not yet rejected), the dead-letter queue's and the journal's as they
    were after the rejects. Recovered, the source lets go of what the dead-letter queue has."""
    data = tmp_path / "data"
    broker = ThreadBroker(data)
    broker.start()
    connection = broker.connect()
    channel = connection.channel()
    channel.queue_declare("dlq", durable=True)
    channel.queue_declare("src", durable=True, arguments=DLX_ARGUMENTS)
    channel.confirm_delivery()
    for index in range(3):
        channel.basic_publish("", "src", b"m%d" % index, pika.BasicProperties(delivery_mode=2))
    tags = [channel.basic_get("src")[0].delivery_tag for _ in range(3)]
    source_directory = broker.broker.vhosts["/"].queue_directory("src")
    # Delivered and unacked: on disk, below the delivered mark.
    before_rejects = tmp_path / "src-before-rejects"
    shutil.copytree(source_directory, before_rejects)
    for tag in tags:
        channel.basic_reject(tag, requeue=False)
    deadline = time.monotonic() + 5
    while channel.queue_declare("dlq", passive=True).method.message_count < 3:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    connection.close()
    broker.stop()
    shutil.rmtree(source_directory)
    shutil.copytree(before_rejects, source_directory)

    broker = ThreadBroker(data)
    broker.start()
    try:
        connection = broker.connect()
        channel = connection.channel()
        assert _bodies(channel, "src") == []
        assert _bodies(channel, "dlq") == [b"m0", b"m1", b"m2"]
        connection.close()
    finally:
        broker.stop()


@pytest.mark.slow
def test_sigkill_while_dead_lettering_loses_and_doubles_nothing(tmp_path):
    """A consumer rejects everything from src into dlq while `warren serve` is killed, twice;
    in the end every confirmed message is in exactly one of the two queues."""
    process = WarrenProcess(tmp_path / "data", log_level="info", log_path=tmp_path / "log")
    rnd = random.Random(5)
    messages = 20_000
    try:
        process.start()
        connection = process.connect()
        channel = connection.channel()
        channel.queue_declare("dlq", durable=True)
        channel.queue_declare("src", durable=True, arguments=DLX_ARGUMENTS)
        channel.confirm_delivery()
        for index in range(messages):
            channel.basic_publish("", "src", b"m%d" % index, pika.BasicProperties(delivery_mode=2))
        connection.close()
        for _ in range(2):
            connection = process.connect()
            channel = connection.channel()
            channel.basic_qos(prefetch_count=500)
            channel.basic_consume(
                "src",
                lambda ch, method, _, __: ch.basic_reject(method.delivery_tag, requeue=False),
            )
            kill_at = time.monotonic() + rnd.uniform(0.2, 0.8)
            while time.monotonic() < kill_at:
                connection.process_data_events(time_limit=0.05)
            process.kill()
            process.start()
        connection = process.connect()
        channel = connection.channel()
        deadline = time.monotonic() + 30
        while True:
            # Dead-lettering that was under way settles first.
            counts = [
                channel.queue_declare(queue, passive=True).method.message_count
                for queue in ("src", "dlq")
            ]
            if sum(counts) == messages:
                break
            assert time.monotonic() < deadline, counts
            time.sleep(0.1)
        found = _bodies(channel, "src") + _bodies(channel, "dlq")
        assert sorted(found) == sorted(b"m%d" % index for index in range(messages))
        connection.close()
        log = (tmp_path / "log").read_text()
        print("recovered hand-offs:", log.count("stored before a crash leave it now"))
    finally:
        process.kill()

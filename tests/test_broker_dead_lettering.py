"""Dead-lettering in a running broker: the hand-off between a queue and its dead-letter
targets (a dead letter leaves its queue only once every target holds it durably)."""

from __future__ import annotations

import errno
import threading
import time

import pika

SOURCE, TARGET = "dl-source", "dl-target"


def wait_for(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_dead_letter_leaves_its_queue_only_once_its_target_committed(start_broker, tmp_path):
    running = start_broker(tmp_path)
    connection = running.connect()
    channel = connection.channel()
    channel.queue_declare(TARGET, durable=True)
    channel.queue_declare(
        SOURCE,
        durable=True,
        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": TARGET},
    )
    channel.confirm_delivery()
    channel.basic_publish("", SOURCE, b"doomed", pika.BasicProperties(delivery_mode=2))
    queues = running.broker.vhosts["/"].queues
    source, target = queues[SOURCE], queues[TARGET]
    # The target's fsync waits until the test lets it through.
    release = threading.Event()
    commit = target.commit

    async def held_commit() -> None:
        await running.loop.run_in_executor(None, release.wait)
        await commit()

    target.commit = held_commit
    try:
        method, _, _ = channel.basic_get(SOURCE)
        channel.basic_reject(method.delivery_tag, requeue=False)
        wait_for(lambda: target.ready_count == 1)
        time.sleep(0.2)
        # Written to the target, not yet durable there: still in flight in the source.
        assert source.engine.unacked_count == 1
    finally:
        release.set()
    wait_for(lambda: source.engine.unacked_count == 0)
    method, properties, body = channel.basic_get(TARGET, auto_ack=True)
    assert body == b"doomed"
    assert properties.headers["x-death"][0]["queue"] == SOURCE
    connection.close()


def test_a_dead_letter_its_target_could_not_store_is_kept_and_published_again(
    start_broker, tmp_path
):
    """A full disk under the dead-letter queue: the expired message stays in its source (in
    flight), and once the target can write again it arrives, once."""
    running = start_broker(tmp_path)
    connection = running.connect()
    channel = connection.channel()
    channel.queue_declare(TARGET, durable=True)
    channel.queue_declare(
        SOURCE,
        durable=True,
        arguments={
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": TARGET,
            "x-message-ttl": 50,
        },
    )
    queues = running.broker.vhosts["/"].queues
    source, target = queues[SOURCE], queues[TARGET]
    append = target.engine.append
    attempts = []
    disk_full = threading.Event()
    disk_full.set()

    def append_unless_full(records, timestamp_ms=None):
        attempts.append(len(records))
        if disk_full.is_set():
            raise OSError(errno.ENOSPC, "No space left on device")
        return append(records, timestamp_ms)

    target.engine.append = append_unless_full
    channel.confirm_delivery()
    channel.basic_publish("", SOURCE, b"doomed", pika.BasicProperties(delivery_mode=2))
    wait_for(lambda: attempts)
    # Not retried at once (which would spin: die, fail, die again every tick); kept.
    time.sleep(0.5)
    assert len(attempts) == 1
    assert source.engine.unacked_count == 1 and target.ready_count == 0
    disk_full.clear()
    wait_for(lambda: target.ready_count == 1)
    wait_for(lambda: source.engine.unacked_count == 0)
    method, properties, body = channel.basic_get(TARGET, auto_ack=True)
    assert body == b"doomed" and properties.headers["x-death"][0]["reason"] == "expired"
    assert channel.basic_get(TARGET)[0] is None
    connection.close()

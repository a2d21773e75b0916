"""Delayed messages across a SIGKILL of `warren serve`: every held message that was
confirmed (here: committed in a transaction) reaches each of its queues exactly once, whether
the kill came before it was due, while it was being routed, or after."""

from __future__ import annotations

import random
import time

import pika
from brokers import WarrenProcess

MESSAGES = 3000
# Delays within half a second (6,000 due a second), so that hand-offs are under way all the
# time; the kill lands in the middle.
DELAY_MS_MIN, DELAY_MS_MAX = 1000, 1500
QUEUES = ("a", "b")
RESUMED = "were being routed at a crash"


def _hold(process: WarrenProcess, cycle: int, rnd: random.Random) -> list[bytes]:
    """Declare a delayed fanout exchange to two durable queues and hold MESSAGES in it,
    committed (durable) in one transaction; returns their bodies."""
    connection = process.connect()
    channel = connection.channel()
    exchange = f"dx-{cycle}"
    channel.exchange_declare(
        exchange, "x-delayed-message", durable=True, arguments={"x-delayed-type": "fanout"}
    )
    for queue in QUEUES:
        channel.queue_declare(f"{queue}-{cycle}", durable=True)
        channel.queue_bind(f"{queue}-{cycle}", exchange)
    channel.tx_select()
    bodies = [f"c{cycle}-m{index}".encode() for index in range(MESSAGES)]
    for body in bodies:
        delay = rnd.randint(DELAY_MS_MIN, DELAY_MS_MAX)
        properties = pika.BasicProperties(delivery_mode=2, headers={"x-delay": delay})
        channel.basic_publish(exchange, "", body, properties)
    channel.tx_commit()
    connection.close()
    return bodies


def _collect(process: WarrenProcess, cycle: int) -> dict[str, list[bytes]]:
    """Once nothing is held any more, every body in each queue."""
    connection = process.connect()
    channel = connection.channel()
    deadline = time.monotonic() + 30
    counts = None
    while True:
        # Stable, and at least as many as were held: routing is over.
        time.sleep(0.5)
        now = [
            channel.queue_declare(f"{queue}-{cycle}", passive=True).method.message_count
            for queue in QUEUES
        ]
        if now == counts and min(now) >= MESSAGES:
            break
        assert time.monotonic() < deadline, f"queues never settled: {now}"
        counts = now
    got = {}
    for queue in QUEUES:
        bodies = []
        while True:
            method, _, body = channel.basic_get(f"{queue}-{cycle}", auto_ack=True)
            if method is None:
                break
            bodies.append(body)
        got[queue] = bodies
    connection.close()
    return got


def test_sigkill_while_routing_delayed_messages_delivers_each_once(tmp_path):
    process = WarrenProcess(tmp_path / "data", log_level="info", log_path=tmp_path / "log")
    rnd = random.Random(8)
    resumed = 0
    try:
        for cycle in range(2):
            process.start()
            bodies = _hold(process, cycle, rnd)
            time.sleep((DELAY_MS_MIN + DELAY_MS_MAX) / 2000)
            process.kill()
            process.start()
            resumed += RESUMED in process.log_since_start()
            got = _collect(process, cycle)
            for queue in QUEUES:
                assert len(got[queue]) == len(set(got[queue])), f"{queue}: a message came twice"
                missing = set(bodies) - set(got[queue])
                assert not missing, f"{queue}: {len(missing)} lost, e.g. {sorted(missing)[:3]}"
            process.kill()
    finally:
        process.kill()
    # The kill interrupted hand-offs (the point of the test), at least once.
    assert resumed

"""A redrive of 100,000 dead letters across SIGKILLs of `warren serve`: the broker resumes the
task when it starts again, and every dead letter reaches its source queue exactly once (none
lost, none doubled), wherever the kills landed."""

from __future__ import annotations

import random
import time

import pika
import pytest
from brokers import WarrenProcess
from http_api import HttpApi, path

MESSAGES = 100_000
KILLS = 3


def _task(api: HttpApi, task_id: str) -> dict:
    reply = api.get(path("api", "dlq", "redrives", task_id))
    assert reply.status == 200, reply
    return reply.json


@pytest.mark.slow
def test_sigkill_mid_redrive_moves_each_dead_letter_exactly_once(tmp_path):
    process = WarrenProcess(tmp_path / "data", log_level="info", log_path=tmp_path / "log")
    rnd = random.Random(11)
    try:
        process.start()
        connection = process.connect()
        channel = connection.channel()
        channel.queue_declare("dlq", durable=True)
        channel.queue_declare(
            "orders",
            durable=True,
            arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"},
        )
        # Expired at once: each dead-lettered, without its expiration, into dlq.
        expiring = pika.BasicProperties(delivery_mode=2, expiration="0")
        for index in range(MESSAGES):
            channel.basic_publish("", "orders", b"m%d" % index, expiring)
        deadline = time.monotonic() + 120
        while channel.queue_declare("dlq", passive=True).method.message_count < MESSAGES:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        connection.close()

        api = HttpApi(process.management_url)
        started = api.post(path("api", "dlq", "/", "dlq", "redrive"), {})
        assert started.status == 201, started
        task_id = started.json["id"]
        moved_at_kill = 0
        for _ in range(KILLS):
            # Somewhere in the next stretch of the task, mid-batch as likely as not.
            target = moved_at_kill + rnd.randint(5_000, (MESSAGES - moved_at_kill) // 3)
            while _task(api, task_id)["moved"] < target:
                time.sleep(0.005)
            # Anywhere in the batch under way (a batch takes some tens of milliseconds).
            time.sleep(rnd.uniform(0, 0.03))
            process.kill()
            process.start()
            api = HttpApi(process.management_url)
            task = _task(api, task_id)
            assert task["state"] == "running", task
            moved_at_kill = task["moved"]
        deadline = time.monotonic() + 120
        while (task := _task(api, task_id))["state"] == "running":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert task["state"] == "done" and task["error"] is None, task

        connection = process.connect()
        channel = connection.channel()
        assert channel.queue_declare("dlq", passive=True).method.message_count == 0
        assert channel.queue_declare("orders", passive=True).method.message_count == MESSAGES
        channel.basic_qos(prefetch_count=1000)
        bodies: list[bytes] = []

        def take(channel, method, properties, body):
            bodies.append(body)
            if len(bodies) % 500 == 0 or len(bodies) == MESSAGES:
                channel.basic_ack(method.delivery_tag, multiple=True)

        channel.basic_consume("orders", take)
        deadline = time.monotonic() + 120
        while len(bodies) < MESSAGES:
            assert time.monotonic() < deadline
            connection.process_data_events(time_limit=0.2)
        assert sorted(bodies) == sorted(b"m%d" % index for index in range(MESSAGES))
        connection.close()
    finally:
        process.kill()

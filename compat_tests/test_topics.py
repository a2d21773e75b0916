"""The topic API (Warren's, `/topics/...` and `/consumer/...` beside the management API) and
AMQP on one broker: the same records and the same committed offsets either way, with pika as
the AMQP client. RabbitMQ has no topic API, so every test is Warren's only."""

from __future__ import annotations

import pika
import pytest
from management_client import path
from pika_helpers import run_events_until

pytestmark = pytest.mark.warren_only  # RabbitMQ has no topic API


def super_stream(channel, name: str, partitions: int) -> None:
    channel.exchange_declare(
        name, "x-super-stream", durable=True, arguments={"x-super-stream-partitions": partitions}
    )


def read_all(management, topic: str, partitions: int) -> list[dict]:
    records = []
    for partition in range(partitions):
        reply = management.get(
            path("topics", topic, "messages") + f"?partition={partition}&value_format=string"
        )
        assert reply.status == 200, reply.raw
        records += reply.json["records"]
    return records


def test_what_pika_publishes_to_a_super_stream_http_reads(channel, management, uid):
    super_stream(channel, uid, 3)
    channel.confirm_delivery()
    for i in range(12):
        channel.basic_publish(
            uid, f"key-{i}", f"body-{i}".encode(), pika.BasicProperties(headers={"i": i})
        )
    records = read_all(management, uid, 3)
    assert sorted((r["key"], r["value"], r["headers"]["i"]) for r in records) == sorted(
        (f"key-{i}", f"body-{i}", i) for i in range(12)
    )
    for record in records:
        assert record["timestamp"] > 0
    # Each partition's offsets count from 0 in the order pika published.
    for partition in range(3):
        offsets = [r["offset"] for r in records if r["partition"] == partition]
        assert offsets == list(range(len(offsets)))


def test_what_http_posts_a_pika_stream_consumer_reads(connection, management, uid):
    channel = connection.channel()
    channel.queue_declare(uid, durable=True, arguments={"x-queue-type": "stream"})
    posted = management.post(
        path("topics", uid, "messages"),
        {
            "value_format": "string",
            "records": [{"key": f"k{i}", "value": f"v{i}", "headers": {"n": i}} for i in range(5)],
        },
    )
    assert posted.status == 200, posted.raw
    assert posted.json["offsets"] == [{"partition": 0, "offset": i} for i in range(5)]
    got = []
    channel.basic_qos(prefetch_count=10)
    channel.basic_consume(
        uid,
        lambda ch, method, properties, body: got.append(
            (properties.headers["x-stream-offset"], method.routing_key, body, properties.headers)
        ),
        arguments={"x-stream-offset": "first"},
    )
    run_events_until(connection, lambda: len(got) >= 5, 10)
    assert [(offset, key, body) for offset, key, body, _ in got] == [
        (i, f"k{i}", f"v{i}".encode()) for i in range(5)
    ]
    assert [headers["n"] for *_, headers in got] == list(range(5))


def test_an_http_commit_is_where_a_pika_group_member_resumes(connection, management, uid):
    channel = connection.channel()
    super_stream(channel, uid, 2)
    channel.confirm_delivery()
    for i in range(20):
        channel.basic_publish(uid, f"key-{i}", str(i).encode())
    records = read_all(management, uid, 2)
    ends = {p: sum(1 for r in records if r["partition"] == p) for p in range(2)}
    # Partition 0 done up to (not including) its last 2 records, partition 1 entirely.
    committed = {0: ends[0] - 2, 1: ends[1]}
    commit = {
        "group": "billing",
        "topic": uid,
        "offsets": [{"partition": p, "offset": o} for p, o in committed.items()],
    }
    assert management.post("/consumer/commit", commit).status == 204
    shown = management.get(f"/consumer/offsets?group=billing&topic={uid}").json
    assert shown["offsets"] == [
        {"topic": uid, "partition": p, "offset": o} for p, o in committed.items()
    ]
    got = []
    member = connection.channel()
    member.basic_qos(prefetch_count=100)
    member.basic_consume(
        uid,
        lambda ch, method, properties, body: (
            got.append(
                (properties.headers["x-stream-partition"], properties.headers["x-stream-offset"])
            ),
            ch.basic_ack(method.delivery_tag),
        ),
        arguments={"x-consumer-group": "billing", "x-stream-offset": "first"},
    )
    run_events_until(connection, lambda: len(got) >= 2, 10)
    connection.process_data_events(time_limit=0.3)
    assert sorted(got) == [(f"{uid}-0", ends[0] - 2), (f"{uid}-0", ends[0] - 1)]

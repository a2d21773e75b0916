"""GET /topics/T/batches and /topics/T/partitions (server/http/topic_batches.py): a topic's
stored batches verbatim, decoded and CRC-checked by the reader (spark/decode.py), and each
partition's offsets."""

from __future__ import annotations

import time

import pytest
from brokers import declare_stream
from http_api import HttpApi, add_user, name, path

from warrenmq.log.errors import CorruptBatchError
from warrenmq.spark import decode
from warrenmq.spark.client import Client, OffsetOutOfRange


@pytest.fixture
def api(module_broker) -> HttpApi:
    return HttpApi(module_broker.management_url)


def publish(client: Client, topic: str, values) -> None:
    client.publish(topic, {"records": [{"key": "k", "value": value} for value in values]})


def test_batches_are_the_stored_records_from_the_offset_asked(module_broker, topic_client):
    stream = name("fetch")
    declare_stream(module_broker, stream)
    for start in range(0, 30, 10):
        publish(topic_client, stream, range(start, start + 10))
    data = topic_client.batches(stream, 0, 15)
    located = decode.locate(data)
    # Whole batches: from the one holding offset 15, to the end.
    assert located.offsets.tolist() == list(range(10, 30))
    assert located.next_offset == 30
    assert topic_client.batches(stream, 0, 30) == b""
    assert topic_client.batches(stream, 0, 1_000) == b""

    # One batch at least, whatever max_bytes says; whole batches only.
    one = decode.locate(topic_client.batches(stream, 0, 0, max_bytes=1))
    assert one.offsets.tolist() == list(range(10))

    flipped = bytearray(data)
    flipped[-1] ^= 0xFF
    with pytest.raises(CorruptBatchError, match="CRC mismatch"):
        decode.locate(bytes(flipped))


def test_partitions_give_offsets_and_the_offset_for_a_timestamp(module_broker, api, topic_client):
    events = name("parts")
    assert api.put(path("api", "super-streams", "/", events), {"partitions": 2}).status == 201
    topic_client.publish(events, {"records": [{"value": i, "partition": i % 2} for i in range(6)]})
    time.sleep(0.05)
    topic_client.publish(events, {"records": [{"value": i, "partition": 0} for i in range(6, 8)]})
    partitions = topic_client.partitions(events)
    assert [(p.stream, p.first_offset, p.next_offset) for p in partitions] == [
        (f"{events}-0", 0, 5),
        (f"{events}-1", 0, 3),
    ]
    assert partitions[0].offset_for_timestamp is None
    stamped = decode.locate(topic_client.batches(events, 0, 3)).timestamps_ms.tolist()
    later = topic_client.partitions(events, stamped[-1])
    assert later[0].offset_for_timestamp == 3
    assert topic_client.partitions(events, 0)[1].offset_for_timestamp == 0
    assert topic_client.partitions(events, stamped[-1] + 60_000)[0].offset_for_timestamp is None


def test_an_offset_retention_deleted_is_416_with_the_first_offset(module_broker, topic_client):
    stream = name("gone")
    declare_stream(
        module_broker,
        stream,
        **{"x-stream-max-segment-size-bytes": 2_000, "x-max-length-bytes": 6_000},
    )
    for start in range(0, 1000, 50):
        publish(topic_client, stream, range(start, start + 50))
    first = topic_client.partitions(stream)[0].first_offset
    assert first > 0
    with pytest.raises(OffsetOutOfRange) as refused:
        topic_client.batches(stream, 0, 0)
    assert refused.value.first_offset == first
    assert decode.locate(topic_client.batches(stream, 0, first)).offsets[0] == first


def test_reading_batches_needs_read_permission(module_broker, api):
    stream = name("private")
    declare_stream(module_broker, stream)
    writer = add_user(api, "management", {"/": (".*", ".*", "^$")})
    for route in ("batches", "partitions"):
        reply = writer.get(f"/topics/{stream}/{route}")
        assert reply.status == 401, route
    assert api.get(f"/topics/{stream}/batches?max_bytes=0").status == 400
    assert api.get(f"/topics/{name('missing')}/partitions").status == 404

"""/api/streams/V/NAME and the fields the console's streams and groups views read: offsets,
storage, retention, publish rates, tracked offsets with their lag; /api/groups' lag per
partition."""

from __future__ import annotations

import pika
import pytest
from http_api import HttpApi, eventually, path

DAY_MS = 24 * 60 * 60 * 1000


@pytest.fixture
def api(module_broker) -> HttpApi:
    return HttpApi(module_broker.management_url)


def ack_below(offset_max: int):
    """Acks each delivery below `offset_max`, holds the rest: the tracked offset stops there."""

    def on_message(channel, method, properties, body) -> None:
        if properties.headers["x-stream-offset"] < offset_max:
            channel.basic_ack(method.delivery_tag)

    return on_message


def test_one_stream_shows_offsets_retention_rates_and_tracked_lag(module_broker, api):
    connection = module_broker.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(
        "audit",
        durable=True,
        arguments={
            "x-queue-type": "stream",
            "x-max-age": "1D",
            "x-stream-max-segment-size-bytes": 1_000_000,
        },
    )
    for _ in range(5):
        channel.basic_publish("", "audit", b"entry")
    channel.basic_qos(prefetch_count=100)
    channel.basic_consume(
        "audit", ack_below(3), consumer_tag="auditor", arguments={"x-stream-offset": "first"}
    )
    connection.process_data_events(time_limit=0.3)
    target = path("api", "streams", "/", "audit")
    lags = eventually(lambda: api.get(target).json["tracked_offset_lags"], {"auditor": 2})
    assert lags == {"auditor": 2}
    stream = api.get(target).json
    assert stream["type"] == "stream"
    assert (stream["first_offset"], stream["last_offset"], stream["next_offset"]) == (0, 4, 5)
    assert stream["messages"] == 5 and stream["segments"] == 1 and stream["bytes"] > 0
    assert stream["consumers"] == 1
    assert stream["tracked_offsets"] == {"auditor": 3}
    assert stream["max_age_ms"] == DAY_MS
    assert stream["max_length_bytes"] is None
    assert stream["max_segment_size_bytes"] == 1_000_000
    assert stream["arguments"]["x-max-age"] == "1D"
    assert stream["message_stats"]["publish"] == 5
    assert "rate" in stream["message_stats"]["publish_details"]
    # The listing carries the same fields (without the per-tag lag).
    [listed] = [s for s in api.get(path("api", "streams", "/")).json if s["name"] == "audit"]
    assert listed["last_offset"] == 4 and listed["max_age_ms"] == DAY_MS
    connection.close()


def test_an_empty_stream_has_no_last_offset(module_broker, api):
    connection = module_broker.connect()
    connection.channel().queue_declare(
        "empty-stream", durable=True, arguments={"x-queue-type": "stream"}
    )
    connection.close()
    stream = api.get(path("api", "streams", "/", "empty-stream")).json
    assert (stream["first_offset"], stream["last_offset"], stream["messages"]) == (0, None, 0)


@pytest.mark.parametrize(
    "segments",
    [("/", "no-such-stream"), ("/", "a-classic-queue"), ("no-such-vhost", "audit")],
)
def test_what_is_no_stream_is_rabbitmqs_404(module_broker, api, segments):
    connection = module_broker.connect()
    connection.channel().queue_declare("a-classic-queue")
    connection.close()
    reply = api.get(path("api", "streams", *segments))
    assert reply.status == 404
    assert reply.json == {"error": "Object Not Found", "reason": "Not Found"}


def test_groups_lag_per_partition_counts_from_the_committed_offset(module_broker, api):
    assert api.put(path("api", "super-streams", "/", "ledger"), {"partitions": 2}).status == 201
    connection = module_broker.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    for partition, count in ((0, 5), (1, 3)):
        pinned = pika.BasicProperties(headers={"x-stream-partition": partition})
        for _ in range(count):
            channel.basic_publish("ledger", "any", b"m", pinned)
    member = connection.channel()
    member.basic_qos(prefetch_count=100)
    member.basic_consume(
        "ledger",
        ack_below(1),
        consumer_tag="clerk",
        arguments={"x-consumer-group": "books", "x-stream-offset": "first"},
    )
    connection.process_data_events(time_limit=0.3)

    def partitions():
        [group] = api.get(path("api", "groups", "/")).json
        return {
            p["partition"]: (p["member"], p["committed_offset"], p["lag"])
            for p in group["partitions"]
        }

    expected = {"ledger-0": ("clerk", 1, 4), "ledger-1": ("clerk", 1, 2)}
    assert eventually(partitions, expected) == expected
    connection.close()


def test_streams_page_and_filter_by_name_as_queues_do(api):
    """RabbitMQ's page, page_size, name and use_regex, as the console's streams view sends
    them: the counts cover streams only, the filter narrows before the page is cut."""
    vhost = "paged-streams"
    assert api.put(path("api", "vhosts", vhost)).status == 201
    stream = {"durable": True, "arguments": {"x-queue-type": "stream"}}
    for index in range(5):
        assert api.put(path("api", "queues", vhost, f"page-{index}"), stream).status == 201
    assert api.put(path("api", "queues", vhost, "page-classic"), {"durable": True}).status == 201
    base = path("api", "streams", vhost)
    paged = api.get(base + "?page=2&page_size=2").json
    assert {key: value for key, value in paged.items() if key != "items"} == {
        "total_count": 5,
        "filtered_count": 5,
        "item_count": 2,
        "page": 2,
        "page_size": 2,
        "page_count": 3,
    }
    assert [(s["vhost"], s["name"]) for s in paged["items"]] == [
        (vhost, "page-2"),
        (vhost, "page-3"),
    ]
    # Whole streams on the page, with their offsets.
    assert paged["items"][0]["next_offset"] == 0 and "message_stats" in paged["items"][0]
    filtered = api.get(base + "?page=1&page_size=2&name=PAGE-[134]&use_regex=true").json
    assert (filtered["filtered_count"], filtered["page_count"]) == (3, 2)
    assert [s["name"] for s in filtered["items"]] == ["page-1", "page-3"]
    substring = api.get(path("api", "streams") + "?page=1&name=GE-4&columns=name").json
    assert substring["items"] == [{"name": "page-4"}]
    assert api.get(base + "?page=0").json["error"] == "invalid_pagination_parameters"
    assert api.get(base + "?page=x").status == 400
    assert api.get(base + "?page=4&page_size=2").json["error"] == "page_out_of_range"
    # No page asked: the plain list, as before.
    assert [s["name"] for s in api.get(base).json] == [f"page-{index}" for index in range(5)]

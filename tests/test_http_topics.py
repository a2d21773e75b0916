"""The topic API (server/http/topics.py) against an in-process broker over real sockets: each
route, both ways of giving keys and values, batches, long polls, idempotent producers, groups'
committed offsets shared with AMQP, RabbitMQ's answers to bad input, and (on a `warren
serve` killed with SIGKILL) that an acknowledged record is never lost."""

from __future__ import annotations

import base64
import signal
import threading
import time

import pika
import pytest
from http_api import HttpApi, add_user, eventually, name, path

from warrenmq.exchanges.super_stream import partition_index
from warrenmq.server.http import topics


@pytest.fixture
def api(module_broker) -> HttpApi:
    return HttpApi(module_broker.management_url)


def super_stream(api: HttpApi, partitions: int) -> str:
    topic = name("orders")
    assert (
        api.put(path("api", "super-streams", "/", topic), {"partitions": partitions}).status == 201
    )
    return topic


def stream(api: HttpApi) -> str:
    topic = name("log")
    declared = {"durable": True, "arguments": {"x-queue-type": "stream"}}
    assert api.put(path("api", "queues", "/", topic), declared).status == 201
    return topic


def messages(topic: str, **query) -> str:
    target = path("topics", topic, "messages")
    return target + ("?" + "&".join(f"{k}={v}" for k, v in query.items()) if query else "")


def post(api: HttpApi, topic: str, body) -> list[dict]:
    reply = api.post(messages(topic), body)
    assert reply.status == 200, reply.raw
    return reply.json["offsets"]


def read(api: HttpApi, topic: str, **query) -> list[dict]:
    reply = api.get(messages(topic, **query))
    assert reply.status == 200, reply.raw
    return reply.json["records"]


def refusal(reply) -> tuple[int, str]:
    return reply.status, reply.json["reason"]


def consume(channel, queue: str, count: int, arguments: dict, tag: str = "") -> list:
    """(method, properties, body) of each delivery a pika consumer of `queue` gets (and acks),
    once `count` came (or 10 s passed) and a moment more showed no other."""
    got = []

    def on_message(ch, method, properties, body):
        got.append((method, properties, body))
        ch.basic_ack(method.delivery_tag)

    channel.basic_qos(prefetch_count=100)
    channel.basic_consume(queue, on_message, consumer_tag=tag or None, arguments=arguments)
    deadline = time.monotonic() + 10
    while len(got) < count and time.monotonic() < deadline:
        channel.connection.process_data_events(time_limit=0.1)
    channel.connection.process_data_events(time_limit=0.3)
    return got


# -- publishing and reading -----------------------------------------------------------------------


def test_a_batch_lands_where_the_super_stream_routes_each_key_or_where_it_says(api):
    topic = super_stream(api, 3)
    keys = ["alpha", "beta", "gamma", "delta"]
    records = [{"key": key, "value": {"n": n}} for n, key in enumerate(keys)]
    records.append({"key": "alpha", "value": "explicit", "partition": 2, "headers": {"h": 7}})
    offsets = post(api, topic, {"records": records})
    expected = [partition_index(key, 3) for key in keys] + [2]
    assert [item["partition"] for item in offsets] == expected
    # Offsets count per partition, in the records' order.
    seen: dict[int, int] = {}
    for item in offsets:
        assert item["offset"] == seen.get(item["partition"], 0)
        seen[item["partition"]] = item["offset"] + 1
    by_partition = {p: read(api, topic, partition=p) for p in range(3)}
    for item, given in zip(offsets, records, strict=True):
        found = by_partition[item["partition"]][item["offset"]]
        assert (found["partition"], found["offset"]) == (item["partition"], item["offset"])
        assert found["key"] == given["key"] and found["value"] == given["value"]
        assert found["headers"] == given.get("headers", {})
        assert found["timestamp"] > 1_600_000_000_000
    assert sum(len(records) for records in by_partition.values()) == 5


def test_one_record_without_records_goes_to_partition_0_of_a_stream(api):
    topic = stream(api)
    assert post(api, topic, {"value": "one"}) == [{"partition": 0, "offset": 0}]
    assert post(api, topic, {"records": [{"value": 2, "partition": 0}]}) == [
        {"partition": 0, "offset": 1}
    ]
    got = read(api, topic)
    assert [(r["offset"], r["key"], r["value"]) for r in got] == [(0, None, "one"), (1, None, 2)]


def test_formats_round_trip_and_a_record_says_when_it_cannot_be_shown_as_asked(api, module_broker):
    topic = stream(api)
    binary = bytes(range(256))
    post(
        api,
        topic,
        {
            "key_format": "string",
            "value_format": "base64",
            "records": [
                {"key": "k1", "value": base64.b64encode(b"plain text").decode()},
                {"key": "k2", "value": base64.b64encode(binary).decode()},
            ],
        },
    )
    post(
        api, topic, {"value_format": "string", "key_format": "json", "key": {"id": 1}, "value": "{"}
    )
    as_base64 = read(api, topic, value_format="base64", key_format="base64")
    assert [base64.b64decode(r["value"]) for r in as_base64] == [b"plain text", binary, b"{"]
    assert base64.b64decode(as_base64[2]["key"]) == b'{"id":1}'
    as_json = read(api, topic, key_format="json")
    assert as_json[0]["value"] == "plain text" and as_json[0]["value_format"] == "string"
    assert as_json[1]["value_format"] == "base64"
    assert base64.b64decode(as_json[1]["value"]) == binary
    assert as_json[2]["key"] == {"id": 1} and "key_format" not in as_json[2]
    assert as_json[0]["key"] == "k1" and as_json[0]["key_format"] == "string"
    as_string = read(api, topic, value_format="string", key_format="string")
    assert [r["value"] for r in as_string[::2]] == ["plain text", "{"]
    assert as_string[2]["key"] == '{"id":1}' and "value_format" not in as_string[0]
    # An AMQP consumer gets the stored bytes: the JSON key as the routing key.
    connection = module_broker.connect()
    delivered = consume(connection.channel(), topic, 3, {"x-stream-offset": "first"})
    connection.close()
    got = [(method.routing_key, body) for method, _, body in delivered]
    assert got == [("k1", b"plain text"), ("k2", binary), ('{"id":1}', b"{")]


def test_amqp_publishes_read_over_http_and_http_posts_consumed_over_amqp(api, module_broker):
    topic = super_stream(api, 2)
    connection = module_broker.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    channel.basic_publish(
        topic, "from-amqp", b'{"a":1}', pika.BasicProperties(headers={"trace": "t1"})
    )
    partition = partition_index("from-amqp", 2)
    [record] = read(api, topic, partition=partition)
    assert (record["key"], record["value"], record["headers"]) == (
        "from-amqp",
        {"a": 1},
        {"trace": "t1"},
    )
    [placed] = post(api, topic, {"key": "from-http", "value": "v", "headers": {"trace": "t2"}})
    received = consume(
        channel, f"{topic}-{placed['partition']}", 1, {"x-stream-offset": placed["offset"]}
    )
    connection.close()
    [(method, properties, body)] = received
    assert (method.exchange, method.routing_key, body) == (topic, "from-http", b'"v"')
    assert properties.headers["trace"] == "t2"
    assert properties.headers["x-stream-offset"] == placed["offset"]
    assert properties.delivery_mode == 2


def test_get_pages_with_offset_and_limit_and_says_where_to_go_on(api):
    topic = stream(api)
    post(api, topic, {"records": [{"value": n} for n in range(25)]})
    reply = api.get(messages(topic, offset=5, limit=10)).json
    assert [r["value"] for r in reply["records"]] == list(range(5, 15))
    assert reply["next_offset"] == 15
    reply = api.get(messages(topic, offset=20)).json
    assert [r["value"] for r in reply["records"]] == list(range(20, 25))
    assert reply == {"records": reply["records"], "next_offset": 25}
    assert api.get(messages(topic, offset=99)).json == {"records": [], "next_offset": 99}


# -- long polls -----------------------------------------------------------------------------------


def test_a_long_poll_returns_once_a_record_is_appended(api):
    topic = stream(api)
    result = {}

    def poll():
        result["reply"] = api.get(messages(topic, offset=0, timeout_ms=30_000))

    reader = threading.Thread(target=poll)
    reader.start()
    time.sleep(0.3)
    assert reader.is_alive()
    post(api, topic, {"value": "woken"})
    reader.join(30)
    assert not reader.is_alive()
    assert [r["value"] for r in result["reply"].json["records"]] == ["woken"]


def test_a_long_poll_with_nothing_to_read_answers_empty_after_its_timeout(api):
    topic = stream(api)
    post(api, topic, {"value": "before"})
    started = time.monotonic()
    reply = api.get(messages(topic, offset=1, timeout_ms=300))
    assert time.monotonic() - started >= 0.29
    assert reply.status == 200 and reply.json == {"records": [], "next_offset": 1}


# -- idempotent producers -------------------------------------------------------------------------


def test_a_retried_post_of_a_producer_appends_nothing_twice(api):
    topic = super_stream(api, 2)
    batch = {
        "producer": "p1",
        "records": [{"key": f"k{n}", "value": n, "sequence": n} for n in range(6)],
    }
    first = post(api, topic, batch)
    assert all(item["offset"] is not None for item in first)
    again = post(api, topic, batch)
    assert again == [
        {"partition": item["partition"], "offset": None, "duplicate": True} for item in first
    ]
    extended = dict(batch, records=batch["records"] + [{"key": "k6", "value": 6, "sequence": 6}])
    assert [item.get("duplicate", False) for item in post(api, topic, extended)] == [True] * 6 + [
        False
    ]
    values = sorted(r["value"] for p in range(2) for r in read(api, topic, partition=p))
    assert values == list(range(7))
    record = read(api, topic, partition=first[0]["partition"])[0]
    assert record["headers"]["x-producer-id"] == "p1"
    assert api.post(messages(topic), {"producer": "p1", "value": 1}).status == 400


# -- committed offsets ----------------------------------------------------------------------------


def test_an_http_commit_is_where_an_amqp_group_member_resumes_and_amqp_acks_show(
    api, module_broker
):
    topic = super_stream(api, 2)
    post(api, topic, {"records": [{"value": n, "partition": n % 2} for n in range(10)]})
    group = name("g")
    commit = {"group": group, "topic": topic, "offsets": [{"partition": 0, "offset": 3}]}
    assert api.post("/consumer/commit", commit).status == 204
    commit["offsets"] = [{"partition": 1, "offset": 5}]
    assert api.post("/consumer/commit", commit).status == 204
    assert api.get(f"/consumer/offsets?group={group}").json == {
        "group": group,
        "offsets": [
            {"topic": topic, "partition": 0, "offset": 3},
            {"topic": topic, "partition": 1, "offset": 5},
        ],
    }
    connection = module_broker.connect()
    delivered = consume(
        connection.channel(),
        topic,
        2,
        {"x-consumer-group": group, "x-stream-offset": "first"},
        tag="m1",
    )
    received = [
        (properties.headers["x-stream-partition"], properties.headers["x-stream-offset"])
        for _, properties, _ in delivered
    ]
    # Offset 3 of partition 0 is the next to read: offsets 3 and 4 there, none below 5 on 1.
    assert sorted(received) == [(f"{topic}-0", 3), (f"{topic}-0", 4)]
    # With a member, the group's acks commit: an HTTP commit is refused.
    assert api.post("/consumer/commit", commit).status == 409
    connection.close()
    acked = [
        {"topic": topic, "partition": 0, "offset": 5},
        {"topic": topic, "partition": 1, "offset": 5},
    ]
    target = f"/consumer/offsets?group={group}&topic={topic}"
    assert eventually(lambda: api.get(target).json["offsets"], acked) == acked


def test_commits_are_checked(api):
    topic = stream(api)
    post(api, topic, {"records": [{"value": n} for n in range(3)]})

    def commit(body):
        return api.post("/consumer/commit", body)

    good = {"group": "g", "topic": topic, "offsets": [{"partition": 0, "offset": 3}]}
    assert commit(good).status == 204
    assert api.get(f"/consumer/offsets?group=g&topic={topic}").json["offsets"] == [
        {"topic": topic, "partition": 0, "offset": 3}
    ]
    assert commit(dict(good, offsets=[{"partition": 0, "offset": 4}])).status == 400
    assert commit(dict(good, offsets=[{"partition": 1, "offset": 0}])).status == 400
    assert commit(dict(good, offsets=[{"partition": 0, "offset": "1"}])).status == 400
    assert commit(dict(good, offsets=[])).status == 400
    assert commit(dict(good, group="")).status == 400
    assert commit(dict(good, group="g" * 256)).status == 400
    assert commit(dict(good, topic=name("missing"))).status == 404
    assert api.get("/consumer/offsets").status == 400
    assert api.get("/consumer/offsets?group=nobody").json == {"group": "nobody", "offsets": []}


# -- bad input and permissions --------------------------------------------------------------------


def test_bad_input_is_refused_as_the_management_api_refuses_it(api):
    topic = stream(api)
    target = messages(topic)
    assert refusal(api.post(target, raw=b"{not json")) == (400, "not_json")
    assert api.post(target, {"value": "***", "value_format": "base64"}).status == 400
    assert api.post(target, {"value": 5, "value_format": "string"}).status == 400
    assert api.post(target, {"value": 5, "value_format": "yaml"}).status == 400
    assert api.post(target, {"records": "no"}).status == 400
    assert api.post(target, {"records": []}).status == 400
    assert api.post(target, {"records": [1]}).status == 400
    assert api.post(target, {"records": [{"key": "k"}]}).status == 400
    assert api.post(target, {"value": 1, "partition": 1}).status == 400
    assert api.post(target, {"value": 1, "partition": "0"}).status == 400
    assert api.post(target, {"value": 1, "headers": []}).status == 400
    assert api.post(target, {"value": 1, "headers": {"CC": ["x"]}}).status == 400
    assert api.post(target, {"value": 1, "key_format": "string", "key": "k" * 256}).status == 400
    assert (
        api.post(
            target, {"key": base64.b64encode(b"\xff").decode(), "key_format": "base64", "value": 1}
        ).status
        == 400
    )
    assert refusal(api.get(messages(topic, limit=0)))[0] == 400
    assert refusal(api.get(messages(topic, limit=10_001)))[0] == 400
    assert api.get(messages(topic, limit=10_000)).status == 200
    assert refusal(api.get(messages(topic, offset="x"))) == (400, ["not_integer", "x"])
    assert api.get(messages(topic, partition=1)).status == 400
    assert api.get(messages(topic, timeout_ms=60_001)).status == 400
    missing = api.get(messages(name("missing")))
    assert (missing.status, missing.json) == (
        404,
        {"error": "Object Not Found", "reason": "Not Found"},
    )
    assert api.post(messages(name("missing")), {"value": 1}).status == 404
    assert api.get(messages(topic, vhost="no-such-vhost")).status == 404
    assert api.get(messages("t" * 256)).status == 400
    assert api.delete(target).status == 405


def test_each_limit_takes_its_largest_value_and_refuses_one_more(api):
    topic = stream(api)
    target = messages(topic)
    most = topics.RECORDS_PER_POST_MAX
    assert len(post(api, topic, {"records": [{"value": i} for i in range(most)]})) == most
    assert api.post(target, {"records": [{"value": 1}] * (most + 1)}).status == 400
    assert post(api, topic, {"key": "k" * 255, "value": 1})[0]["offset"] == most
    assert read(api, topic, offset=most)[0]["key"] == "k" * 255
    # Records are there: a long poll at the largest timeout answers at once.
    assert api.get(messages(topic, timeout_ms=topics.TIMEOUT_MS_MAX)).status == 200
    assert len(read(api, topic, limit=topics.LIMIT_MAX)) == topics.LIMIT_MAX
    # A name of 255 bytes is a name (none such: 404); of 256, not one (400).
    assert api.get(messages("t" * 255)).status == 404


def test_permissions_are_the_amqp_ones(api):
    topic = stream(api)
    post(api, topic, {"value": "x"})
    assert api.get(messages(topic), auth=False).status == 401
    writer = add_user(api, "management", {"/": ("", f"^{topic}$", "")})
    reader = add_user(api, "management", {"/": ("", "", f"^{topic}$")})
    outsider = add_user(api, "management", {})
    assert writer.post(messages(topic), {"value": "y"}).status == 200
    assert refusal(writer.get(messages(topic))) == (401, "Access refused.")
    assert [r["value"] for r in read(reader, topic)] == ["x", "y"]
    assert refusal(reader.post(messages(topic), {"value": "z"})) == (401, "Access refused.")
    commit = {"group": "g", "topic": topic, "offsets": [{"partition": 0, "offset": 1}]}
    assert reader.post("/consumer/commit", commit).status == 204
    assert writer.post("/consumer/commit", commit).status == 401
    refused = outsider.get(messages(topic))
    assert refusal(refused) == (401, "User not authorised to access virtual host")
    # A super stream is written through its exchange, as AMQP publishes to it.
    orders = super_stream(api, 2)
    exchange_writer = add_user(api, "management", {"/": ("", f"^{orders}$", "")})
    assert exchange_writer.post(messages(orders), {"value": 1}).status == 200


# -- durability -----------------------------------------------------------------------------------


def test_every_acknowledged_record_survives_a_sigkill(warren_process):
    warren_process.start()
    api = HttpApi(warren_process.management_url)
    topic = super_stream(api, 3)
    acknowledged = []
    for batch in range(20):
        records = [{"key": f"k{batch}-{n}", "value": f"{batch}-{n}"} for n in range(50)]
        offsets = post(api, topic, {"records": records})
        acknowledged += [
            (item["partition"], item["offset"], record["value"])
            for item, record in zip(offsets, records, strict=True)
        ]
    warren_process.process.send_signal(signal.SIGKILL)
    warren_process.process.wait(30)
    warren_process.start()
    api = HttpApi(warren_process.management_url)
    stored = {
        (p, r["offset"], r["value"])
        for p in range(3)
        for r in read(api, topic, partition=p, limit=10_000)
    }
    assert set(acknowledged) <= stored

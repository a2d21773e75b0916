"""Super streams end to end: `warren streams add-super` and `warren streams list` against an
in-process broker's HTTP API, the exchange declared over AMQP with its partition count,
publishes routed by the stream clients' hash, all of it kept across a restart; `warren groups`
and the tables both print."""

from __future__ import annotations

import json

import pika
import pytest
from brokers import ThreadBroker
from printed_tables import printed_tables

from warrenmq.exchanges.super_stream import PARTITION_ORDER, partition_index
from warrenmq.server import cli


def warren(broker, capsys, *argv: str) -> tuple[int, str, str]:
    status = cli.main(["streams", *argv, "--url", broker.management_url])
    out = capsys.readouterr()
    return status, out.out, out.err


def counts(channel, name: str, partitions: int) -> list[int]:
    return [
        channel.queue_declare(f"{name}-{order}", passive=True).method.message_count
        for order in range(partitions)
    ]


def test_add_super_list_route_and_restart(tmp_path, capsys):
    broker = ThreadBroker(tmp_path / "data").start()
    try:
        assert warren(broker, capsys, "add-super", "orders", "--partitions", "3")[0] == 0
        # Again: nothing changes.
        assert warren(broker, capsys, "add-super", "orders", "--partitions", "3")[0] == 0
        status, _, error = warren(broker, capsys, "add-super", "bad", "--partitions", "0")
        assert status == 1 and "x-super-stream-partitions" in error
        connection = broker.connect()
        channel = connection.channel()
        channel.exchange_declare(
            "events", "x-super-stream", durable=True, arguments={"x-super-stream-partitions": 2}
        )
        channel.confirm_delivery()
        keys = [f"customer-{i}" for i in range(30)]
        for key in keys:
            channel.basic_publish("orders", key, key.encode())
            channel.basic_publish("events", key, key.encode())
        channel.basic_publish(
            "orders", "any", b"pinned", pika.BasicProperties(headers={"x-stream-partition": 1})
        )
        expected = [sum(partition_index(k, 3) == order for k in keys) for order in range(3)]
        expected[1] += 1
        assert counts(channel, "orders", 3) == expected
        events = [sum(partition_index(k, 2) == order for k in keys) for order in range(2)]
        assert counts(channel, "events", 2) == events
        connection.close()

        status, out, _ = warren(broker, capsys, "list", "--json")
        listed = json.loads(out)
        assert [s["partitions"] for s in listed["super_streams"]] == [
            ["events-0", "events-1"],
            ["orders-0", "orders-1", "orders-2"],
        ]
        assert {s["name"]: s["messages"] for s in listed["streams"]} == {
            **{f"orders-{order}": expected[order] for order in range(3)},
            **{f"events-{order}": events[order] for order in range(2)},
        }
        size = {s["name"]: s["bytes"] for s in listed["streams"]}
        status, out, _ = warren(broker, capsys, "list")
        assert status == 0
        [(stream_headings, streams), (super_headings, supers)] = printed_tables(out)
        assert stream_headings == [
            "vhost", "stream", "first", "last", "next", "messages", "bytes", "segments",
            "consumers", "tracked offsets",
        ]  # fmt: skip
        assert {row["stream"]: row for row in streams}["orders-1"] == {
            "vhost": "/",
            "stream": "orders-1",
            "first": "0",
            "last": str(expected[1] - 1),
            "next": str(expected[1]),
            "messages": str(expected[1]),
            "bytes": str(size["orders-1"]),
            "segments": "1",
            "consumers": "0",
            "tracked offsets": "",
        }
        assert [row["stream"] for row in streams] == [
            "events-0", "events-1", "orders-0", "orders-1", "orders-2"
        ]  # fmt: skip
        assert super_headings == ["vhost", "super stream", "partitions"]
        assert supers == [
            {"vhost": "/", "super stream": "events", "partitions": "events-0, events-1"},
            {"vhost": "/", "super stream": "orders", "partitions": "orders-0, orders-1, orders-2"},
        ]

        broker.stop()
        broker = ThreadBroker(tmp_path / "data").start()
        connection = broker.connect()
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("orders", keys[0], b"after")
        expected[partition_index(keys[0], 3)] += 1
        assert counts(channel, "orders", 3) == expected
        connection.close()
    finally:
        broker.stop()


def test_warren_groups_shows_members_assignments_and_lag(tmp_path, capsys):
    broker = ThreadBroker(tmp_path / "data").start()
    try:
        assert warren(broker, capsys, "add-super", "pay", "--partitions", "2")[0] == 0
        connection = broker.connect()
        channel = connection.channel()
        channel.confirm_delivery()
        for i in range(10):
            channel.basic_publish("pay", f"k{i}", b"x")
        member = connection.channel()
        member.basic_qos(prefetch_count=100)
        member.basic_consume(
            "pay",
            lambda ch, method, properties, body: ch.basic_ack(method.delivery_tag),
            consumer_tag="m1",
            arguments={"x-consumer-group": "g1", "x-stream-offset": "first"},
        )
        connection.process_data_events(time_limit=1)
        status = cli.main(["groups", "--json", "--url", broker.management_url])
        groups = json.loads(capsys.readouterr().out)
        assert status == 0
        assert [(g["group"], g["members"]) for g in groups] == [("g1", ["m1"])]
        assert {p["partition"]: (p["member"], p["lag"]) for p in groups[0]["partitions"]} == {
            "pay-0": ("m1", 0),
            "pay-1": ("m1", 0),
        }
        committed = {p["partition"]: p["committed_offset"] for p in groups[0]["partitions"]}

        def group_rows(members: str, owner: str) -> list[dict[str, str]]:
            return [
                {
                    "vhost": "/",
                    "group": "g1",
                    "super stream": "pay",
                    "members": members,
                    "partition": partition,
                    "owner": owner,
                    "committed": str(committed[partition]),
                    "lag": "0",
                }
                for partition in ("pay-0", "pay-1")
            ]

        assert cli.main(["groups", "--url", broker.management_url]) == 0
        [(headings, rows)] = printed_tables(capsys.readouterr().out)
        assert headings == [
            "vhost", "group", "super stream", "members", "partition", "owner", "committed", "lag"
        ]  # fmt: skip
        assert rows == group_rows("1", "m1")
        connection.close()
        # No member left: the committed offsets stay, and show.
        assert cli.main(["groups", "--url", broker.management_url]) == 0
        assert printed_tables(capsys.readouterr().out) == [(headings, group_rows("0", ""))]
        # They are the partitions' tracked offsets too.
        status, out, _ = warren(broker, capsys, "list")
        streams = printed_tables(out)[0][1]
        assert {row["stream"]: row["tracked offsets"] for row in streams} == {
            partition: f"group:g1={committed[partition]}" for partition in ("pay-0", "pay-1")
        }
    finally:
        broker.stop()


def test_delete_super_removes_the_exchange_and_its_partitions_for_good(tmp_path, capsys):
    broker = ThreadBroker(tmp_path / "data").start()
    try:
        assert warren(broker, capsys, "add-super", "orders", "--partitions", "3")[0] == 0
        assert warren(broker, capsys, "add-super", "kept", "--partitions", "1")[0] == 0
        connection = broker.connect()
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("orders", "k", b"gone with it")
        connection.close()
        status, out, _ = warren(broker, capsys, "delete-super", "orders")
        assert status == 0 and "orders deleted" in out
        status, _, error = warren(broker, capsys, "delete-super", "orders")
        assert status == 1 and "no super stream" in error
        # A plain exchange is not a super stream: refused, and left alone.
        status, _, error = warren(broker, capsys, "delete-super", "amq.direct")
        assert status == 1 and "no super stream" in error

        def listed() -> dict:
            return json.loads(warren(broker, capsys, "list", "--json")[1])

        assert [s["name"] for s in listed()["super_streams"]] == ["kept"]
        assert [s["name"] for s in listed()["streams"]] == ["kept-0"]
        broker.stop()
        broker = ThreadBroker(tmp_path / "data").start()
        assert [s["name"] for s in listed()["streams"]] == ["kept-0"]
        connection = broker.connect()
        channel = connection.channel()
        for name in ("orders-0", "orders-1", "orders-2"):
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
                channel.queue_declare(name, passive=True)
            assert closed.value.reply_code == 404
            channel = connection.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
            channel.exchange_declare("orders", passive=True)
        assert closed.value.reply_code == 404
        connection.close()
    finally:
        broker.stop()


def test_deleting_a_super_stream_cancels_its_groups_members(tmp_path, capsys):
    broker = ThreadBroker(tmp_path / "data").start()
    try:
        assert warren(broker, capsys, "add-super", "pay", "--partitions", "2")[0] == 0
        connection = broker.connect()
        publisher = connection.channel()
        publisher.confirm_delivery()
        for i in range(10):
            publisher.basic_publish("pay", f"k{i}", b"old")
        member = connection.channel()
        member.basic_qos(prefetch_count=100)
        cancelled, received = [], []

        def consume(tag: str) -> None:
            member.basic_consume(
                "pay",
                lambda ch, method, properties, body: (
                    received.append(body),
                    ch.basic_ack(method.delivery_tag),
                ),
                consumer_tag=tag,
                arguments={"x-consumer-group": "g1", "x-stream-offset": "first"},
            )

        member.add_on_cancel_callback(cancelled.append)
        consume("m1")
        connection.process_data_events(time_limit=1)
        assert received == [b"old"] * 10
        assert warren(broker, capsys, "delete-super", "pay")[0] == 0
        connection.process_data_events(time_limit=1)
        assert [frame.method.consumer_tag for frame in cancelled] == ["m1"]
        assert cli.main(["groups", "--json", "--url", broker.management_url]) == 0
        assert json.loads(capsys.readouterr().out) == []

        # Declared again, the super stream's group starts afresh on the new partitions.
        assert warren(broker, capsys, "add-super", "pay", "--partitions", "2")[0] == 0
        publisher.basic_publish("pay", "k1", b"new")
        received.clear()
        consume("m2")
        connection.process_data_events(time_limit=1)
        assert received == [b"new"]
        connection.close()
    finally:
        broker.stop()


def test_a_group_consume_checks_the_group_name_before_the_partitions(tmp_path, capsys):
    """406 for a group name that is not one comes before 404 for a partition that is not a
    stream (a classic queue bound with a partition order)."""
    broker = ThreadBroker(tmp_path / "data").start()
    try:
        assert warren(broker, capsys, "add-super", "mixed", "--partitions", "1")[0] == 0
        connection = broker.connect()
        channel = connection.channel()
        channel.queue_declare("mixed-classic", durable=True)
        channel.queue_bind(
            "mixed-classic", "mixed", "mixed-classic", arguments={PARTITION_ORDER: 1}
        )

        def refused(super_stream: str, group) -> tuple[int, str]:
            nonlocal channel
            channel.basic_qos(prefetch_count=10)
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
                channel.basic_consume(
                    super_stream, lambda *_: None, arguments={"x-consumer-group": group}
                )
            channel = connection.channel()
            return closed.value.reply_code, closed.value.reply_text

        code, text = refused("mixed", "")
        assert code == 406 and "x-consumer-group" in text
        code, text = refused("mixed", "g")
        assert code == 404 and "not streams" in text
        connection.close()
    finally:
        broker.stop()

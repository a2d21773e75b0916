"""Node B's own services on a queue node A leads (`server/forward`): its HTTP API shows A's
figures for it, its DLQ tools browse, export, purge and redrive it (the task runs on A), and
its delayed exchanges hand due messages to it, all through the link."""

from __future__ import annotations

import json

import pika
import test_forwarding
from http_api import HttpApi, eventually, path
from test_dlq_tools import dead_letters, warren
from test_forwarding import QUEUE, _consume, _publish, _ready_on

from warrenmq.server.forward import owner

# Node A leading QUEUE, node B forwarding to it.
nodes = test_forwarding.nodes


def test_the_http_api_of_b_shows_the_owners_figures(nodes):
    a, b = nodes
    _publish(b, [b"1", b"2", b"3"])
    connection = a.connect()
    channel = connection.channel()
    channel.basic_qos(prefetch_count=1)
    channel.basic_consume(QUEUE, lambda *args: None)
    connection.process_data_events(time_limit=1)
    api = HttpApi(b.management_url)
    shown = api.get(path("api", "queues", "/", QUEUE)).json
    assert shown["node"] == "warren@1"
    assert (shown["messages"], shown["messages_ready"], shown["messages_unacknowledged"]) == (
        3,
        2,
        1,
    )
    assert shown["consumers"] == 1
    assert shown["message_stats"]["publish"] == 3
    assert shown["message_stats"]["deliver"] == 1
    listed = {q["name"]: q for q in api.get("/api/queues").json}
    assert listed[QUEUE]["messages"] == 3
    connection.close()


def test_dlq_tools_of_b_browse_export_and_purge_a_queue_a_leads(nodes, capsys, monkeypatch):
    a, b = nodes
    bodies = [b"a", b"b", b"c", b"\xff\x00d"]
    _publish(b, bodies)
    # One message per answer: B asks again from where each stopped.
    monkeypatch.setattr(owner, "PEEK_REPLY_BYTES", 1)
    consumer = a.connect()
    channel = consumer.channel()
    method, _, _ = channel.basic_get(QUEUE)
    status, out, _ = warren(b, capsys, "peek", QUEUE, "-n", "3", "--json")
    assert status == 0
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["body_preview"] for line in lines] == ["a", "b", "c"]
    assert [line["state"] for line in lines] == ["unacked", "ready", "ready"]
    status, exported, _ = warren(b, capsys, "export", QUEUE)
    assert status == 0
    offsets = [json.loads(line)["offset"] for line in exported.splitlines()]
    assert len(offsets) == len(bodies)
    assert offsets[:3] == [line["offset"] for line in lines]
    # Browsing consumed nothing.
    channel.basic_nack(method.delivery_tag, requeue=True)
    consumer.close()
    assert _ready_on(a) == len(bodies)
    assert warren(b, capsys, "purge", QUEUE)[0] == 0
    assert _ready_on(a) == 0
    status, out, _ = warren(b, capsys, "import", QUEUE, stdin=exported.encode())
    assert status == 0 and out.strip() == f"imported {len(bodies)}, refused 0"
    got = [a.connect().channel().basic_get(QUEUE, auto_ack=True)[2] for _ in bodies]
    assert got == bodies


def test_a_delayed_exchange_on_b_hands_due_messages_to_as_queue(nodes):
    """B holds the delayed messages (the exchange's store is where they were published) and,
    when they are due, stages them on A's queue through the link."""
    a, b = nodes
    connection = b.connect()
    channel = connection.channel()
    channel.exchange_declare(
        "dx", "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"}
    )
    channel.queue_bind(QUEUE, "dx", "k")
    channel.confirm_delivery()
    for delay in (300, 100, 200):
        channel.basic_publish(
            "dx",
            "k",
            str(delay).encode(),
            pika.BasicProperties(delivery_mode=2, headers={"x-delay": delay}),
        )
    connection.close()
    got = [body for _, body in _consume(a, 3)]
    assert got == [b"100", b"200", b"300"]


def test_a_redrive_through_b_runs_on_a_and_moves_dead_letters_to_a_queue_b_leads(nodes, capsys):
    a, b = nodes
    dead_letters(a, "src", "dlq", [b"x", b"y"])
    # Their source queue is now one B leads.
    connection = a.connect()
    connection.channel().queue_delete("src")
    connection.close()
    connection = b.connect()
    connection.channel().queue_declare("src", durable=True)
    connection.close()
    eventually(lambda: "src" in a.broker.vhosts["/"].remote, True)
    status, out, err = warren(b, capsys, "redrive", "dlq", "--json")
    assert status == 0, err
    task = json.loads(out)
    assert (task["state"], task["moved"]) == ("done", 2)
    assert list(a.broker.redrives.tasks) == [task["id"]] and not b.broker.redrives.tasks
    status, out, _ = warren(b, capsys, "redrives", "--json")
    assert [listed["id"] for listed in json.loads(out)] == [task["id"]]
    assert _ready_on(a, "dlq") == 0
    channel = b.connect().channel()
    assert [channel.basic_get("src", auto_ack=True)[2] for _ in range(2)] == [b"x", b"y"]

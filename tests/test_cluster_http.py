"""The management API of a 3-node cluster (`warren cluster up`) shows the cluster's view from
whichever node it is asked, as RabbitMQ's aggregates its nodes' figures: messages, DLQs,
connections, channels and consumers on other nodes show on node 1. A node cut off from the
other two (SIGSTOPped) still answers what it can alone, partial and saying so, and refuses
metadata reads it cannot confirm with 503 and AMQP's 541, after a bounded wait."""

from __future__ import annotations

import signal

import pika
import pytest
from brokers import connect as connect_to
from cluster_nodes import amqp, api, down, up
from http_api import add_user, eventually, name, path

from warrenmq.server.http.node_views import MISSING_NODES_HEADER


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    running = up(tmp_path_factory.mktemp("cluster"), 3)
    yield running
    down(running)


@pytest.fixture
def vhost(cluster):
    """A vhost of the test's own (guest, its creator, may use it): its figures are the
    test's alone."""
    created = name("vhost")
    http = api(cluster, 1)
    assert http.put(path("api", "vhosts", created), {}).status == 201
    for node in (2, 3):
        # A metadata read there waits until that node holds the vhost.
        assert api(cluster, node).get(path("api", "vhosts", created)).status == 200
    yield created
    http.delete(path("api", "vhosts", created))


def connect(cluster, node: int, vhost: str) -> pika.BlockingConnection:
    return connect_to(cluster.nodes[node].amqp_port, virtual_host=vhost)


def test_messages_a_queue_led_by_node_3_holds_count_in_node_1s_totals(cluster, vhost):
    connection = connect(cluster, 3, vhost)
    channel = connection.channel()
    queue = name("q")
    channel.queue_declare(queue, durable=True)
    channel.confirm_delivery()
    for _ in range(3):
        channel.basic_publish("", queue, b"on node 3")
    http = api(cluster, 1)
    assert http.get(path("api", "queues", vhost, queue)).json["node"] == "warren@3"

    def vhost_figures():
        item = http.get(path("api", "vhosts", vhost)).json
        return item["messages"], item["messages_ready"], item["message_stats"]["publish"]

    assert eventually(vhost_figures, (3, 3, 3)) == (3, 3, 3)
    # A user of this vhost alone: the overview's totals are its own.
    user = add_user(http, "monitoring", {vhost: (".*", ".*", ".*")})
    overview = user.get("/api/overview")
    assert overview.json["queue_totals"]["messages"] == 3
    assert MISSING_NODES_HEADER.lower() not in overview.headers
    admin = http.get("/api/overview").json
    assert admin["queue_totals"]["messages"] >= 3
    assert admin["object_totals"]["connections"] >= 1
    assert admin["object_totals"]["channels"] >= 1
    assert admin["message_stats"]["publish"] >= 3
    connection.close()


def test_the_default_exchange_lists_every_queue_whichever_node_leads_it(cluster, vhost):
    connection = connect(cluster, 3, vhost)
    queue = name("q")
    connection.channel().queue_declare(queue, durable=True)
    connection.close()
    http = api(cluster, 1)
    bindings = http.get(path("api", "exchanges", vhost, "amq.default", "bindings", "source"))
    assert [b["destination"] for b in bindings.json] == [queue]


def test_a_dlq_node_2_leads_lists_on_node_1_with_its_source_on_node_3(cluster, vhost):
    dlq, source = name("dlq"), name("src")
    on_2 = connect(cluster, 2, vhost)
    on_2.channel().queue_declare(dlq, durable=True)
    on_3 = connect(cluster, 3, vhost)
    channel = on_3.channel()
    dead_lettered = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}
    channel.queue_declare(source, durable=True, arguments=dead_lettered)
    channel.confirm_delivery()
    channel.basic_publish("", source, b"to be rejected")
    method, _, _ = channel.basic_get(source)
    channel.basic_reject(method.delivery_tag, requeue=False)
    http = api(cluster, 1)

    def listed():
        return [
            (item["name"], item["dead_letter_sources"], item["messages"], item["by_source"])
            for item in http.get(path("api", "dlq", vhost)).json
        ]

    expected = [(dlq, [source], 1, {source: 1})]
    assert eventually(listed, expected) == expected
    (item,) = http.get(path("api", "dlq", vhost)).json
    assert item["by_reason"] == {"rejected": 1}
    on_2.close()
    on_3.close()


def test_a_consumer_on_node_3_of_a_queue_node_2_leads_shows_on_node_1(cluster, vhost):
    queue, tag = name("q"), name("tag")
    on_2 = connect(cluster, 2, vhost)
    on_2.channel().queue_declare(queue, durable=True)
    on_3 = connect(cluster, 3, vhost)
    on_3.channel().basic_consume(queue, lambda *delivered: None, consumer_tag=tag)
    on_3.process_data_events(0)
    http = api(cluster, 1)

    def consumers():
        return [
            (c["consumer_tag"], c["queue"]["name"], c["channel_details"]["node"])
            for c in http.get(path("api", "consumers", vhost)).json
        ]

    assert eventually(consumers, [(tag, queue, "warren@3")]) == [(tag, queue, "warren@3")]
    for node in (1, 2, 3):
        # Node 2 leads the queue: its consumer there is the link's, listed by node 3.
        shown = api(cluster, node).get(path("api", "queues", vhost, queue))
        assert shown.status == 200
        assert shown.json["consumers"] == 1
        assert [c["consumer_tag"] for c in shown.json["consumer_details"]] == [tag]
    connections = http.get(path("api", "vhosts", vhost, "connections")).json
    assert sorted(c["node"] for c in connections) == ["warren@2", "warren@3"]
    channels = http.get(path("api", "vhosts", vhost, "channels")).json
    assert sorted(c["node"] for c in channels) == ["warren@2", "warren@3"]
    (on_node_3,) = [c for c in connections if c["node"] == "warren@3"]
    found = http.get(path("api", "connections", on_node_3["name"]))
    assert found.status == 200 and found.json["node"] == "warren@3"
    on_2.close()
    on_3.close()


def test_a_connection_to_node_3_is_listed_and_closed_through_node_1(cluster, vhost):
    """As RabbitMQ's management API, which closes a connection on whichever node holds it."""
    on_3 = connect(cluster, 3, vhost)
    on_3.channel().confirm_delivery()
    http = api(cluster, 1)
    (shown,) = http.get(path("api", "vhosts", vhost, "connections")).json
    channels = http.get(path("api", "connections", shown["name"], "channels"))
    assert channels.status == 200
    assert [(c["name"], c["confirm"]) for c in channels.json] == [(shown["name"] + " (1)", True)]
    stranger = add_user(http, "management", {vhost: (".*", ".*", ".*")})
    assert stranger.delete(path("api", "connections", shown["name"])).status == 401
    closed = http.delete(path("api", "connections", shown["name"]), headers={"X-Reason": "moved"})
    assert closed.status == 204
    with pytest.raises(pika.exceptions.ConnectionClosed) as excinfo:
        on_3.process_data_events(5)
    assert excinfo.value.args[:2] == (320, "CONNECTION_FORCED - moved")
    assert http.delete(path("api", "connections", shown["name"])).status == 404
    assert http.get(path("api", "connections", shown["name"], "channels")).status == 404


def test_a_stream_node_2_leads_is_listed_and_shown_by_node_1(cluster, vhost):
    stream = name("stream")
    on_2 = connect(cluster, 2, vhost)
    channel = on_2.channel()
    channel.queue_declare(
        stream,
        durable=True,
        arguments={"x-queue-type": "stream", "x-queue-leader-locator": "client-local"},
    )
    channel.confirm_delivery()
    for number in range(3):
        channel.basic_publish("", stream, b"%d" % number)
    on_2.close()
    http = api(cluster, 1)
    listed = http.get(path("api", "streams", vhost)).json
    assert [(s["name"], s["node"], s["messages"]) for s in listed] == [(stream, "warren@2", 3)]
    shown = http.get(path("api", "streams", vhost, stream))
    assert shown.status == 200
    assert (shown.json["node"], shown.json["next_offset"]) == ("warren@2", 3)
    assert http.get(path("api", "streams", vhost, name("none"))).status == 404


@pytest.mark.slow
def test_a_node_cut_off_from_the_others_answers_alone_and_refuses_unconfirmed_reads(tmp_path):
    cluster = up(tmp_path / "cluster", 3)
    try:
        connection = amqp(cluster, 1)
        queue = name("q")
        connection.channel().queue_declare(queue, durable=True)
        http = api(cluster, 1)
        assert http.get(path("api", "queues", "/", queue)).status == 200
        for node in (2, 3):
            cluster.signal(node, signal.SIGSTOP)

        overview = http.get("/api/overview")
        assert overview.status == 200
        assert overview.headers[MISSING_NODES_HEADER.lower()] == "warren@2,warren@3"
        assert http.get("/api/health/checks/alarms").status == 200
        assert http.get("/api/nodes").status == 200
        assert http.get("/api/connections").status == 200
        assert http.get("/api/dlq/redrives").status == 200

        read = http.get(path("api", "queues", "/", queue))
        assert read.status == 503
        assert read.json["error"] == "service_unavailable"
        assert "metadata" in read.json["reason"]

        with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
            connection.channel().queue_declare(queue, passive=True)
        assert closed.value.reply_code == 541
        assert "timed out" in closed.value.reply_text
    finally:
        for node in (2, 3):
            cluster.signal(node, signal.SIGCONT)
        down(cluster)

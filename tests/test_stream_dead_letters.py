"""A stream as a dead-letter target: dead letters land in it, the DLQ tools list and browse
it, and a stream never dead-letters itself."""

from __future__ import annotations

import json
import time
import urllib.request

import pika
from brokers import ThreadBroker


def test_dead_letters_go_into_a_stream_that_the_dlq_tools_list_and_browse(tmp_path):
    broker = ThreadBroker(tmp_path / "data").start()
    try:
        connection = broker.connect()
        channel = connection.channel()
        channel.queue_declare("dead", durable=True, arguments={"x-queue-type": "stream"})
        channel.queue_declare(
            "work",
            durable=True,
            arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead"},
        )
        channel.confirm_delivery()
        for i in range(3):
            channel.basic_publish("", "work", str(i).encode())
        for _ in range(3):
            method, _, _ = channel.basic_get("work")
            channel.basic_reject(method.delivery_tag, requeue=False)
        deadline = time.monotonic() + 5
        while channel.queue_declare("dead", passive=True).method.message_count < 3:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        connection.close()
        request = urllib.request.Request(broker.management_url + "/api/dlq/%2F")
        request.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
        listed = json.load(urllib.request.urlopen(request))
        assert [(q["name"], q["messages"], q["dead_letter_sources"]) for q in listed] == [
            ("dead", 3, ["work"])
        ]
        request = urllib.request.Request(broker.management_url + "/api/dlq/%2F/dead/messages")
        request.add_header("Authorization", "Basic Z3Vlc3Q6Z3Vlc3Q=")
        browsed = json.load(urllib.request.urlopen(request))
        assert [(m["offset"], m["x_death"][0]["reason"]) for m in browsed] == [
            (0, "rejected"),
            (1, "rejected"),
            (2, "rejected"),
        ]
        # Consumed from the stream, they stay there.
        connection = broker.connect()
        channel = connection.channel()
        channel.basic_qos(prefetch_count=10)
        got = []
        channel.basic_consume(
            "dead",
            lambda ch, method, properties, body: got.append(body),
            arguments={"x-stream-offset": "first"},
        )
        while len(got) < 3:
            connection.process_data_events(time_limit=0.1)
        assert got == [b"0", b"1", b"2"]
        connection.close()
    finally:
        broker.stop()


def test_publishing_into_a_stream_with_pika_properties(tmp_path):
    broker = ThreadBroker(tmp_path / "data").start()
    try:
        connection = broker.connect()
        channel = connection.channel()
        channel.queue_declare("s", durable=True, arguments={"x-queue-type": "stream"})
        channel.confirm_delivery()
        channel.basic_publish("", "s", b"x", pika.BasicProperties(priority=3, expiration="10"))
        assert channel.queue_declare("s", passive=True).method.message_count == 1
        connection.close()
    finally:
        broker.stop()

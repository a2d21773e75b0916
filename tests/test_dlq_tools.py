"""The DLQ tools end to end: `warren dlq peek|export|import|purge` against an in-process
broker's management API, on dead letters a pika consumer made."""

from __future__ import annotations

import io
import json
import time

import pika
import pytest
from brokers import ThreadBroker

from warrenmq.server import cli


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    running = ThreadBroker(tmp_path_factory.mktemp("broker"))
    running.start()
    yield running
    running.stop()


def warren(broker, capsys, *argv: str, stdin: bytes = b"") -> tuple[int, str, str]:
    import sys

    old = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin))
    try:
        status = cli.main(["dlq", *argv, "--url", broker.management_url])
    finally:
        sys.stdin = old
    out = capsys.readouterr()
    return status, out.out, out.err


def dead_letters(broker, source: str, target: str, bodies: list[bytes]) -> None:
    connection = broker.connect()
    channel = connection.channel()
    channel.queue_declare(target, durable=True)
    channel.queue_declare(
        source,
        durable=True,
        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": target},
    )
    channel.confirm_delivery()
    for body in bodies:
        channel.basic_publish("", source, body, pika.BasicProperties(headers={"h": 1}))
    for _ in bodies:
        method, _, _ = channel.basic_get(source)
        channel.basic_reject(method.delivery_tag, requeue=False)
    deadline = time.monotonic() + 5
    while channel.queue_declare(target, passive=True).method.message_count < len(bodies):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    connection.close()


def test_peek_shows_dead_letters_without_consuming_them(broker, capsys):
    dead_letters(broker, "peek-src", "peek-dlq", [b"a", b"b", b"c"])
    status, out, _ = warren(broker, capsys, "peek", "peek-dlq", "-n", "2", "--json")
    assert status == 0
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["body_preview"] for line in lines] == ["a", "b"]
    assert lines[0]["x_death"][0]["reason"] == "rejected"
    assert lines[0]["x_death"][0]["queue"] == "peek-src"
    status, out, _ = warren(broker, capsys, "peek", "peek-dlq", "--from", str(lines[1]["offset"]))
    assert status == 0 and "rejected in peek-src" in out and "'b'" in out and "'c'" in out
    # Nothing was consumed.
    channel = broker.connect().channel()
    assert channel.queue_declare("peek-dlq", passive=True).method.message_count == 3


def test_export_import_round_trips_the_exact_messages_and_purge_empties(broker, capsys):
    dead_letters(broker, "rt-src", "rt-dlq", [b"one", b"\xff\x00two"])
    status, exported, _ = warren(broker, capsys, "export", "rt-dlq")
    assert status == 0 and len(exported.splitlines()) == 2
    status, out, _ = warren(broker, capsys, "import", "rt-src", stdin=exported.encode())
    assert status == 0 and out.strip() == "imported 2, refused 0"
    status, again, _ = warren(broker, capsys, "export", "rt-src")
    before = [json.loads(line) for line in exported.splitlines()]
    after = [json.loads(line) for line in again.splitlines()]
    keys = ("raw_properties", "raw_body")
    assert [{k: x[k] for k in keys} for x in after] == [{k: x[k] for k in keys} for x in before]
    assert warren(broker, capsys, "purge", "rt-dlq")[0] == 0
    assert warren(broker, capsys, "peek", "rt-dlq", "--json")[1] == ""


def test_bad_input_is_an_error_message_not_a_traceback(broker, capsys):
    status, _, err = warren(broker, capsys, "peek", "no-such-queue")
    assert status == 1 and err.strip() == "Error: 404: Not Found"
    dead_letters(broker, "bad-src", "bad-dlq", [b"x"])
    status, _, err = warren(broker, capsys, "import", "bad-src", stdin=b"not json\n")
    assert status == 1 and "JSON lines" in err
    forged = {"routing_key": "q", "raw_properties": "AAE=", "raw_body": ""}
    status, _, err = warren(broker, capsys, "import", "bad-src", stdin=json.dumps(forged).encode())
    assert status == 1 and "JSON lines" in err

"""Redrives end to end: `warren dlq list|redrive|redrives|cancel|resume|watch` against an
in-process broker's management API, on dead letters pika publishers made (rejected and
expired, from two source queues), read back by pika consumers."""

from __future__ import annotations

import json
import time

import pika
import pytest
from brokers import ThreadBroker
from http_api import HttpApi, path

from warrenmq.dlq.redrive import RedriveSpec, last_death
from warrenmq.server import cli


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    running = ThreadBroker(tmp_path_factory.mktemp("broker"))
    running.start()
    yield running
    running.stop()


@pytest.fixture
def names(request):
    prefix = request.node.name.replace("_", "")[:40]
    return lambda name: f"{prefix}-{name}"


def warren(broker, capsys, *argv: str) -> tuple[int, str, str]:
    status = cli.main(["dlq", *argv, "--url", broker.management_url])
    out = capsys.readouterr()
    return status, out.out, out.err


def bodies_in(channel, queue: str) -> list[bytes]:
    got = []
    while True:
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return got
        got.append(body)


def count(channel, queue: str) -> int:
    return channel.queue_declare(queue, passive=True).method.message_count


def wait_count(channel, queue: str, wanted: int) -> None:
    deadline = time.monotonic() + 10
    while count(channel, queue) != wanted:
        assert time.monotonic() < deadline, f"{queue}: {count(channel, queue)} != {wanted}"
        time.sleep(0.02)


def setup_dead_letters(channel, names, rejected_a: int, expired_b: int) -> tuple[str, str, str]:
    """Queues a and b dead-letter into dlq: `rejected_a` rejected from a, then `expired_b`
    expired in b (bodies a0…, b0…)."""
    dlq, a, b = names("dlq"), names("a"), names("b")
    channel.queue_declare(dlq, durable=True)
    for source in (a, b):
        channel.queue_declare(
            source,
            durable=True,
            arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq},
        )
    persistent = pika.BasicProperties(delivery_mode=2)
    for index in range(rejected_a):
        channel.basic_publish("", a, f"a{index}".encode(), persistent)
    for _ in range(rejected_a):
        method, _, _ = channel.basic_get(a)
        channel.basic_reject(method.delivery_tag, requeue=False)
    expiring = pika.BasicProperties(delivery_mode=2, expiration="0")
    for index in range(expired_b):
        channel.basic_publish("", b, f"b{index}".encode(), expiring)
    wait_count(channel, dlq, rejected_a + expired_b)
    return dlq, a, b


def test_list_shows_dead_letter_queues_with_counts_by_reason_and_source(broker, capsys, names):
    connection = broker.connect()
    channel = connection.channel()
    dlq, a, b = setup_dead_letters(channel, names, 3, 2)
    status, out, _ = warren(broker, capsys, "list", "--json")
    assert status == 0
    listed = {queue["name"]: queue for queue in json.loads(out)}
    assert listed[dlq]["messages"] == 5
    assert listed[dlq]["by_reason"] == {"rejected": 3, "expired": 2}
    assert listed[dlq]["by_source"] == {a: 3, b: 2}
    assert listed[dlq]["dead_letter_sources"] == [a, b]
    # The sources themselves receive no dead letters.
    assert a not in listed and b not in listed
    status, out, _ = warren(broker, capsys, "list")
    assert status == 0 and dlq in out
    connection.close()


def test_redrive_returns_each_dead_letter_to_its_source_as_it_was_delivered(broker, capsys, names):
    connection = broker.connect()
    channel = connection.channel()
    dlq, a, b = setup_dead_letters(channel, names, 3, 2)
    # Each source gets its dead letters back in the dead-letter queue's order.
    status, out, _ = warren(broker, capsys, "peek", dlq, "--json")
    assert status == 0
    order = [json.loads(line)["body_preview"].encode() for line in out.splitlines()]
    assert sorted(order) == [b"a0", b"a1", b"a2", b"b0", b"b1"]
    status, out, err = warren(broker, capsys, "redrive", dlq)
    assert status == 0, err
    assert "done; moved 5" in out
    assert count(channel, dlq) == 0
    from_a = [body for body in order if body.startswith(b"a")]
    method, properties, body = channel.basic_get(a, auto_ack=True)
    # Delivered as it was published (the default exchange, its own key), x-death kept.
    assert (method.exchange, method.routing_key, body) == ("", a, from_a[0])
    assert properties.delivery_mode == 2
    assert properties.headers["x-death"][0]["reason"] == "rejected"
    assert bodies_in(channel, a) == from_a[1:]
    assert bodies_in(channel, b) == [body for body in order if body.startswith(b"b")]
    connection.close()


def test_redrive_by_reason_or_source_keeps_the_others_in_order(broker, capsys, names):
    connection = broker.connect()
    channel = connection.channel()
    dlq, a, b = setup_dead_letters(channel, names, 2, 2)
    status, out, _ = warren(broker, capsys, "redrive", dlq, "--reason", "expired")
    assert status == 0 and "moved 2, kept 2" in out
    assert bodies_in(channel, b) == [b"b0", b"b1"]
    assert count(channel, a) == 0
    status, out, _ = warren(broker, capsys, "redrive", dlq, "--source", a, "--json")
    assert status == 0
    task = json.loads(out)
    assert (task["state"], task["moved"], task["kept"]) == ("done", 2, 0)
    assert bodies_in(channel, a) == [b"a0", b"a1"]
    assert count(channel, dlq) == 0
    connection.close()


def test_limit_and_dry_run(broker, capsys, names):
    connection = broker.connect()
    channel = connection.channel()
    dlq, a, _ = setup_dead_letters(channel, names, 5, 0)
    status, out, _ = warren(broker, capsys, "redrive", dlq, "--dry-run", "--json")
    assert status == 0
    task = json.loads(out)
    assert (task["state"], task["dry_run"], task["moved"]) == ("done", True, 5)
    assert count(channel, dlq) == 5 and count(channel, a) == 0
    status, out, _ = warren(broker, capsys, "redrive", dlq, "--limit", "2")
    assert status == 0 and "moved 2" in out
    assert bodies_in(channel, a) == [b"a0", b"a1"]
    assert count(channel, dlq) == 3
    connection.close()


def test_redrive_to_an_exchange_with_a_routing_key(broker, capsys, names):
    connection = broker.connect()
    channel = connection.channel()
    dlq, _, _ = setup_dead_letters(channel, names, 2, 0)
    exchange, target = names("x"), names("target")
    channel.exchange_declare(exchange, "direct")
    channel.queue_declare(target)
    channel.queue_bind(target, exchange, "again")
    status, out, _ = warren(
        broker, capsys, "redrive", dlq, "--exchange", exchange, "--routing-key", "again"
    )
    assert status == 0 and "moved 2" in out
    method, _, body = channel.basic_get(target, auto_ack=True)
    assert (method.exchange, method.routing_key, body) == (exchange, "again", b"a0")
    connection.close()


def test_a_dead_letter_whose_source_is_gone_stays(broker, capsys, names):
    connection = broker.connect()
    channel = connection.channel()
    dlq, a, b = setup_dead_letters(channel, names, 1, 1)
    channel.queue_delete(a)
    status, out, _ = warren(broker, capsys, "redrive", dlq)
    assert status == 0 and "moved 1" in out and "skipped 1" in out
    assert bodies_in(channel, b) == [b"b0"]
    assert bodies_in(channel, dlq) == [b"a0"]
    connection.close()


def test_cancel_then_resume_moves_every_message_once(broker, capsys, names):
    connection = broker.connect()
    channel = connection.channel()
    dlq, a, _ = setup_dead_letters(channel, names, 0, 0)
    expiring = pika.BasicProperties(delivery_mode=2, expiration="0")
    for index in range(300):
        channel.basic_publish("", a, f"m{index}".encode(), expiring)
    wait_count(channel, dlq, 300)
    status, out, _ = warren(broker, capsys, "redrive", dlq, "--rate", "200/s", "--detach", "--json")
    assert status == 0
    task = json.loads(out)
    assert task["state"] == "running"
    time.sleep(0.4)
    status, out, _ = warren(broker, capsys, "cancel", task["id"], "--json")
    cancelled = json.loads(out)
    assert cancelled["state"] == "cancelled"
    assert 0 < cancelled["moved"] < 300
    assert count(channel, dlq) == 300 - cancelled["moved"]
    status, out, _ = warren(broker, capsys, "redrives", "--json")
    assert any(t["id"] == task["id"] and t["state"] == "cancelled" for t in json.loads(out))
    status, out, _ = warren(broker, capsys, "resume", task["id"])
    assert status == 0 and "done; moved 300" in out
    assert bodies_in(channel, a) == [f"m{index}".encode() for index in range(300)]
    assert count(channel, dlq) == 0
    # A finished task does not run again.
    status, _, err = warren(broker, capsys, "resume", task["id"])
    assert status == 1 and "the task is done" in err
    connection.close()


def test_bad_requests_are_errors_not_tracebacks(broker, capsys, names):
    status, _, err = warren(broker, capsys, "redrive", names("missing"))
    assert status == 1 and "404" in err
    status, _, err = warren(broker, capsys, "redrive", "q", "--routing-key", "k")
    assert status == 1 and "--routing-key needs --exchange" in err
    status, _, err = warren(broker, capsys, "watch", "0123456789ab")
    assert status == 1 and "404" in err
    connection = broker.connect()
    connection.channel().queue_declare(names("dlq"))
    connection.close()
    api = HttpApi(broker.management_url)
    path = f"/api/dlq/%2F/{names('dlq')}/redrive"
    for body, reason in (
        ({"rate": 0}, "rate must be a whole number"),
        ({"reason": "bored"}, "reason must be one of"),
        ({"to_source": True, "exchange": "x"}, "exclude each other"),
        ({"colour": "red"}, "unknown field(s): colour"),
        ({"exchange": "no-such-exchange"}, None),
    ):
        response = api.request("POST", path, body)
        if reason is None:
            assert response.status == 404
        else:
            assert response.status == 400 and reason in response.json["reason"], response
    assert api.request("POST", "/api/dlq/redrives/nope/resume").status == 404


def test_spec_selection_and_last_death():
    from warrenmq.amqp import properties as p

    death = p.table(
        [
            ("count", p.long(1)),
            ("exchange", p.longstr("ex")),
            ("queue", p.longstr("orders")),
            ("reason", p.longstr("expired")),
            ("routing-keys", p.array([p.longstr("k1"), p.longstr("k2")])),
        ]
    )
    properties = p.with_headers(b"\x00\x00", [("x-death", p.array([death]))])
    found = last_death(properties)
    assert found == ("orders", "expired", "ex", "k1")
    assert last_death(b"\x00\x00") is None
    assert RedriveSpec().selects(found) and not RedriveSpec().selects(None)
    assert RedriveSpec(exchange="x").selects(None)
    assert RedriveSpec(reason="expired", source="orders").selects(found)
    assert not RedriveSpec(reason="rejected").selects(found)
    assert not RedriveSpec(source="other").selects(found)


def test_a_batch_its_targets_stored_before_a_crash_is_not_moved_twice(tmp_path, capsys):
    """The crash window, set up exactly: the task's journal names the DLQ's first 3 dead
    letters and where the source's log stood, the source holds those 3 (byte for byte, as
    the redrive stages them), and the DLQ never acknowledged them. Resumed, the task
    acknowledges them instead of moving them again."""
    from warrenmq.server import durable_files
    from warrenmq.server.redrive import RedriveTask

    first = ThreadBroker(tmp_path / "data")
    first.start()
    connection = first.connect()
    channel = connection.channel()
    dlq, _, source = setup_dead_letters(channel, lambda name: name, 0, 5)
    connection.close()
    status, out, _ = warren(first, capsys, "peek", dlq, "--json")
    lines = [json.loads(line) for line in out.splitlines()]
    position = first.call(_source_position(first, source))
    # What the redrive would have staged on the source: the same record (its exchange, key,
    # property bytes and body), here through the import, which stores exactly that.
    exported = "".join(json.dumps(dict(line, routing_key=source)) + "\n" for line in lines[:3])
    api = HttpApi(first.management_url)
    imported = api.post(path("api", "dlq", "/", source, "import"), raw=exported.encode())
    assert imported.status == 200 and imported.json["imported"] == 3
    task = RedriveTask("c0ffee000001", "/", dlq, RedriveSpec(), created_ms=1)
    task.total = 5
    task.pending = {
        "offsets": [line["offset"] for line in lines[:3]],
        "positions": {source: [position]},
    }
    first.stop()
    durable_files.replace(
        tmp_path / "data" / "redrives" / f"{task.id}.json",
        json.dumps(dict(task.to_json(), pending=task.pending)),
    )

    second = ThreadBroker(tmp_path / "data")
    second.start()
    try:
        status, out, _ = warren(second, capsys, "watch", task.id)
        assert status == 0 and "done; moved 5" in out
        connection = second.connect()
        channel = connection.channel()
        assert bodies_in(channel, source) == [b"b0", b"b1", b"b2", b"b3", b"b4"]
        assert count(channel, dlq) == 0
        connection.close()
    finally:
        second.stop()


async def _source_position(broker, source: str) -> int:
    return broker.broker.vhosts["/"].queues[source].engine.append_position(b"")


def test_a_kept_dead_letter_keeps_its_bcc_keys_and_a_moved_one_does_not(broker, capsys, names):
    """A redrive publishes what it moves anew, without the BCC keys (server/redrive.py); what
    it keeps stays as it was, BCC keys included."""
    connection = broker.connect()
    channel = connection.channel()
    dlq, a, b, by_bcc = names("dlq"), names("a"), names("b"), names("by-bcc")
    sources_dlx, dlq_dlx = names("sources-dlx"), names("dlq-dlx")
    for exchange in (sources_dlx, dlq_dlx):
        channel.exchange_declare(exchange, "direct")
    channel.queue_declare(by_bcc)
    channel.queue_bind(by_bcc, sources_dlx, "bcc")
    channel.queue_bind(by_bcc, dlq_dlx, "bcc")
    channel.queue_declare(dlq, durable=True, arguments={"x-dead-letter-exchange": dlq_dlx})
    for source in (a, b):
        channel.queue_declare(
            source, durable=True, arguments={"x-dead-letter-exchange": sources_dlx}
        )
        channel.queue_bind(dlq, sources_dlx, source)
        channel.basic_publish(
            "", source, source.encode(), pika.BasicProperties(headers={"BCC": ["bcc"]})
        )
        method, _, _ = channel.basic_get(source)
        channel.basic_reject(method.delivery_tag, requeue=False)
    # Each went to the DLQ by its key and to by-bcc by its BCC key.
    wait_count(channel, dlq, 2)
    wait_count(channel, by_bcc, 2)
    channel.queue_purge(by_bcc)
    status, out, _ = warren(broker, capsys, "redrive", dlq, "--source", b)
    assert status == 0 and "moved 1, kept 1" in out
    # Dying again: the kept one (from the DLQ) goes to its BCC key, the moved one (from b)
    # to its routing key only.
    for queue in (dlq, b):
        method, properties, _ = channel.basic_get(queue)
        assert "BCC" not in properties.headers
        channel.basic_reject(method.delivery_tag, requeue=False)
    wait_count(channel, dlq, 1)
    wait_count(channel, by_bcc, 1)
    assert bodies_in(channel, dlq) == [b.encode()]
    assert bodies_in(channel, by_bcc) == [a.encode()]
    connection.close()

"""`warren status|queues|exchanges|bindings|connections|definitions` and `warren users|vhosts|
policies` (without --data-dir) against a running broker's management API: the real `warren`
entry point as a subprocess, an in-process broker on free ports, pika on the AMQP side."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pika
import pika.exceptions
import pytest
from brokers import ThreadBroker
from ports import free_port

WARREN = str(Path(sys.executable).with_name("warren"))


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    running = ThreadBroker(tmp_path_factory.mktemp("broker")).start()
    yield running
    running.stop()


def warren(broker, *argv: str, stdin: str | None = None, url: str | None = None):
    """`warren ARGV --url ...`: (exit status, stdout, stderr); never a traceback."""
    done = subprocess.run(
        [WARREN, *argv, "--url", url or broker.management_url],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.stdout, done.stderr


def ok(broker, *argv: str, stdin: str | None = None) -> str:
    status, out, err = warren(broker, *argv, stdin=stdin)
    assert status == 0, err
    return out


def rows(table: str) -> list[list[str]]:
    """A table's lines split on runs of 2+ spaces, the rule under the heading left out."""
    return [
        re.split(r"\s{2,}", line.strip())
        for line in table.splitlines()
        if line.strip() and not line.strip().startswith("─")
    ]


def test_status_shows_the_overview(broker):
    out = ok(broker, "status")
    fields = {row[0]: row[1] if len(row) > 1 else "" for row in rows(out)}
    assert fields["product"].startswith("Warren ")
    assert fields["RabbitMQ API"] == "3.10.8"
    assert f"amqp {broker.port}" in fields["listeners"]
    overview = json.loads(ok(broker, "status", "--json"))
    assert overview["product_name"] == "Warren"
    assert "object_totals" in overview


def test_queues_declare_list_show_purge_and_delete(broker):
    assert ok(
        broker, "queues", "declare", "cli-q", "--durable", "--arguments", '{"x-max-length": 9}'
    ) == ('Declared queue "cli-q" in vhost "/".\n')
    connection = broker.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    for _ in range(2):
        channel.basic_publish("", "cli-q", b"x")
    listed = rows(ok(broker, "queues"))
    assert listed[0] == [
        "vhost", "name", "type", "durable", "messages", "ready", "unacked", "consumers", "state"
    ]  # fmt: skip
    assert ["/", "cli-q", "classic", "yes", "2", "2", "0", "0", "running"] in listed
    assert rows(ok(broker, "queues", "list", "--vhost", "/")) == listed
    as_json = json.loads(ok(broker, "queues", "list", "--json"))
    [queue] = [q for q in as_json if q["name"] == "cli-q"]
    assert queue["arguments"] == {"x-max-length": 9} and queue["messages_ready"] == 2
    shown = dict(row for row in rows(ok(broker, "queues", "show", "cli-q")) if len(row) == 2)
    assert shown["arguments"] == '{"x-max-length":9}' and shown["ready"] == "2"
    assert json.loads(ok(broker, "queues", "show", "cli-q", "--json"))["durable"] is True
    assert ok(broker, "queues", "purge", "cli-q") == 'Purged queue "cli-q" in vhost "/".\n'
    assert channel.queue_declare("cli-q", passive=True).method.message_count == 0
    assert ok(broker, "queues", "delete", "cli-q") == 'Deleted queue "cli-q" in vhost "/".\n'
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        channel.queue_declare("cli-q", passive=True)
    connection.close()


@pytest.mark.parametrize("action", ["show", "delete", "purge"])
def test_an_unknown_queue_is_a_message_and_exit_1(broker, action):
    status, out, err = warren(broker, "queues", action, "no-such-queue")
    assert (status, out, err) == (1, "", "Error: no queue 'no-such-queue' in vhost '/'\n")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("queues", "declare", "q", "--arguments", "{nope"), "Error: --arguments is not JSON"),
        (("queues", "declare", "q", "--arguments", "[1]"), "Error: --arguments must be a JSON"),
        (
            ("queues", "declare", "q", "--arguments", '{"x-max-length": "x"}'),
            "Error: 400: invalid arg 'x-max-length' for queue 'q' in vhost '/'",
        ),
        (("queues", "list", "--vhost", "no-such-vhost"), "Error: 404: Not Found"),
        (("exchanges", "delete", "no-such-exchange"), "Error: no exchange 'no-such-exchange'"),
        (("exchanges", "declare", "x", "no-such-type"), "Error: 400: "),
        (("connections", "close", "no such connection"), "Error: no connection"),
        (("definitions", "import", "/nonexistent/defs.json"), "Error: cannot read"),
    ],
)
def test_bad_input_is_one_line_and_exit_1(broker, argv, message):
    status, out, err = warren(broker, *argv)
    assert status == 1 and out == ""
    assert err.startswith(message) and err.count("\n") == 1, err


def test_a_broker_that_is_down_is_a_message_and_exit_1(broker):
    url = f"http://127.0.0.1:{free_port()}"
    for argv in (("status",), ("queues",), ("users", "list")):
        status, out, err = warren(broker, *argv, url=url)
        assert status == 1 and out == ""
        assert err.startswith(f"Error: cannot reach {url}: ") and err.count("\n") == 1, err


def test_a_wrong_password_is_a_message_and_exit_1(broker):
    status, _, err = warren(broker, "status", "--password", "wrong")
    assert (status, err) == (1, "Error: 401: Login failed\n")


def test_exchanges_and_bindings(broker):
    assert ok(broker, "exchanges", "declare", "cli-x", "topic", "--durable") == (
        'Declared exchange "cli-x" in vhost "/".\n'
    )
    ok(broker, "queues", "declare", "cli-bound")
    assert ok(broker, "bindings", "declare", "cli-x", "cli-bound", "--routing-key", "a.*") == (
        'Bound queue "cli-bound" to exchange "cli-x".\n'
    )
    assert ["/", "cli-x", "topic", "yes", "no", "no", "{}"] in rows(ok(broker, "exchanges"))
    assert ["/", "cli-x", "cli-bound", "queue", "a.*", "{}"] in rows(ok(broker, "bindings"))
    bindings = json.loads(ok(broker, "bindings", "--json"))
    assert {"source": "cli-x", "destination": "cli-bound", "routing_key": "a.*"}.items() <= next(
        b for b in bindings if b["source"] == "cli-x"
    ).items()
    connection = broker.connect()
    channel = connection.channel()
    channel.basic_publish("cli-x", "a.b", b"routed")
    assert channel.basic_get("cli-bound", auto_ack=True)[2] == b"routed"
    connection.close()
    assert ok(broker, "exchanges", "delete", "cli-x") == 'Deleted exchange "cli-x" in vhost "/".\n'
    assert "cli-x" not in ok(broker, "exchanges")
    ok(broker, "queues", "delete", "cli-bound")


def test_connections_are_listed_and_closed(broker):
    connection = broker.connect(client_properties={"connection_name": "cli-test"})
    [listed] = [c for c in json.loads(ok(broker, "connections", "--json")) if c["user"] == "guest"]
    table = rows(ok(broker, "connections"))
    assert [listed["name"], "guest", "/"] == table[1][:3]
    assert "Pika" in table[1][3]
    assert ok(broker, "connections", "close", listed["name"], "--reason", "bye") == (
        f'Closed connection "{listed["name"]}".\n'
    )
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        connection.process_data_events(5)
        connection.channel()
    assert closed.value.reply_code == 320 and "bye" in closed.value.reply_text


def test_definitions_export_and_import_move_a_topology(broker, tmp_path):
    ok(broker, "queues", "declare", "cli-moved", "--durable")
    exported = tmp_path / "definitions.json"
    ok(broker, "definitions", "export", str(exported))
    document = json.loads(exported.read_text())
    assert "cli-moved" in [q["name"] for q in document["queues"]]
    assert json.loads(ok(broker, "definitions", "export"))["queues"] == document["queues"]
    ok(broker, "queues", "delete", "cli-moved")
    assert ok(broker, "definitions", "import", str(exported)) == (
        f"Imported definitions from {exported}.\n"
    )
    assert json.loads(ok(broker, "queues", "show", "cli-moved", "--json"))["durable"] is True
    status, _, err = warren(broker, "definitions", "import", "-", stdin="not json")
    assert status == 1 and err == "Error: 400: failed_to_parse_json\n"
    ok(broker, "queues", "delete", "cli-moved")


# -- users, vhosts and policies through the API -------------------------------------------------


def test_users_vhosts_and_permissions_through_the_api(broker):
    assert ok(broker, "users", "add", "cli-bob", "pw1", "--tags", "management") == (
        'Added user "cli-bob".\n'
    )
    assert ok(broker, "vhosts", "add", "cli-v", "--description", "made by the cli") == (
        'Added vhost "cli-v".\n'
    )
    ok(broker, "users", "set-permissions", "cli-bob", ".*", ".*", ".*", "--vhost", "cli-v")
    assert {"name": "cli-bob", "tags": ["management"]} in json.loads(
        ok(broker, "users", "list", "--json")
    )
    assert "cli-bob\t[management]" in ok(broker, "users", "list").splitlines()
    assert {"name": "cli-v", "description": "made by the cli", "tags": []} in json.loads(
        ok(broker, "vhosts", "list", "--json")
    )
    # As RabbitMQ's API does, the vhost's creator was given full permissions on it.
    everything = {"vhost": "cli-v", "configure": ".*", "write": ".*", "read": ".*"}
    assert json.loads(ok(broker, "users", "list-permissions", "--vhost", "cli-v", "--json")) == [
        {"user": "cli-bob", **everything},
        {"user": "guest", **everything},
    ]
    # The broker itself authenticates the new user with the password the CLI gave.
    params = dict(virtual_host="cli-v", credentials=pika.PlainCredentials("cli-bob", "pw1"))
    broker.connect(**params).close()
    ok(broker, "users", "change-password", "cli-bob", stdin="pw2\n")
    ok(broker, "users", "set-tags", "cli-bob", "monitoring")
    params["credentials"] = pika.PlainCredentials("cli-bob", "pw2")
    broker.connect(**params).close()
    assert {"name": "cli-bob", "tags": ["monitoring"]} in json.loads(
        ok(broker, "users", "list", "--json")
    )
    ok(broker, "users", "clear-permissions", "cli-bob", "--vhost", "cli-v")
    assert ok(broker, "users", "list-permissions", "--vhost", "cli-v").splitlines() == [
        "user\tvhost\tconfigure\twrite\tread",
        "guest\tcli-v\t.*\t.*\t.*",
    ]
    assert ok(broker, "vhosts", "delete", "cli-v") == 'Deleted vhost "cli-v".\n'
    assert ok(broker, "users", "delete", "cli-bob") == 'Deleted user "cli-bob".\n'
    assert "cli-bob" not in ok(broker, "users", "list")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("users", "add", "guest", "pw"), "Error: user 'guest' already exists\n"),
        (("users", "add", "cli-nobody", ""), "Error: a blank password is not allowed\n"),
        (("users", "delete", "cli-nobody"), "Error: no user 'cli-nobody'\n"),
        (("users", "set-tags", "cli-nobody", "x"), "Error: no user 'cli-nobody'\n"),
        (("vhosts", "add", "/"), "Error: vhost '/' already exists\n"),
        (("vhosts", "delete", "cli-nope"), "Error: no vhost 'cli-nope'\n"),
        (("vhosts", "delete", "/"), "Error: cannot delete the default vhost '/'\n"),
        (("users", "list-permissions", "--vhost", "cli-nope"), "Error: no vhost 'cli-nope'\n"),
        (("policies", "clear", "cli-nope"), "Error: Parameter does not exist\n"),
        (("policies", "list", "--vhost", "cli-nope"), "Error: no vhost 'cli-nope'\n"),
        (
            ("policies", "set", "p", ".*", '{"max-length": "abc"}'),
            'Error: Validation failed\n\n<<"abc">> is not a valid maximum length\n',
        ),
        (
            ("policies", "set", "p", ".*", "{not json"),
            "Error: Could not parse JSON document: Expecting property name enclosed in double "
            "quotes: line 1 column 2 (char 1)\n",
        ),
    ],
)
def test_admin_refusals_through_the_api_read_as_from_the_data_dir(broker, argv, message):
    assert warren(broker, *argv) == (1, "", message)


def test_policies_through_the_api_reach_a_running_queue(broker):
    connection = broker.connect()
    channel = connection.channel()
    channel.queue_declare("cli-limited")
    assert ok(broker, "policies", "set", "cli-limit", "^cli-limited$", '{"max-length": 1}') == (
        'Set policy "cli-limit" in vhost "/".\n'
    )
    assert json.loads(ok(broker, "policies", "list", "--json")) == [
        {
            "vhost": "/",
            "name": "cli-limit",
            "pattern": "^cli-limited$",
            "apply-to": "all",
            "definition": {"max-length": 1},
            "priority": 0,
        }
    ]
    channel.confirm_delivery()
    for body in (b"1", b"2"):
        channel.basic_publish("", "cli-limited", body)
    assert channel.queue_declare("cli-limited", passive=True).method.message_count == 1
    assert (
        ok(broker, "policies", "clear", "cli-limit") == 'Cleared policy "cli-limit" in vhost "/".\n'
    )
    assert (
        ok(broker, "policies", "list") == "vhost\tname\tpattern\tapply-to\tdefinition\tpriority\n"
    )
    channel.queue_delete("cli-limited")
    connection.close()


def test_data_dir_and_url_together_are_a_usage_error(broker, tmp_path):
    status, _, err = warren(broker, "users", "list", "--data-dir", str(tmp_path))
    assert status == 2 and "not allowed with argument" in err

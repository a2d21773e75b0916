"""The real `rabbitmqadmin` (Debian's rabbitmq-server package), unchanged, against `warren
serve`: list, show, declare, delete, purge, close, publish, get, export and import."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pika
import pytest
from brokers import WarrenProcess

RABBITMQADMIN_PATHS = (
    "/usr/bin/rabbitmqadmin",
    "/usr/sbin/rabbitmqadmin",
    "/usr/lib/rabbitmq/lib/rabbitmq_server-3.10.8/plugins/rabbitmq_management-3.10.8/priv/www/cli/rabbitmqadmin",
)


def _rabbitmqadmin() -> str | None:
    found = shutil.which("rabbitmqadmin")
    if found:
        return found
    return next((path for path in RABBITMQADMIN_PATHS if Path(path).exists()), None)


@pytest.fixture(scope="module")
def admin_command():
    command = _rabbitmqadmin()
    if command is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true needs rabbitmqadmin (Debian's rabbitmq-server package)")
        pytest.skip("rabbitmqadmin is not installed (Debian's rabbitmq-server package)")
    return command


@pytest.fixture(scope="module")
def warren(tmp_path_factory):
    process = WarrenProcess(tmp_path_factory.mktemp("warren") / "data")
    process.start()
    yield process
    process.kill()


@pytest.fixture
def admin(admin_command, warren):
    def run(*args: str, port: int | None = None, check: bool = True) -> str:
        management = port or warren.http_ports["management"]
        done = subprocess.run(
            [admin_command, "-H", "127.0.0.1", "-P", str(management), "-u", "guest", "-p", "guest"]
            + list(args),
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check:
            assert done.returncode == 0, (
                f"rabbitmqadmin {' '.join(args)}: {done.stdout}{done.stderr}"
            )
        return done.stdout + done.stderr

    return run


def test_list_and_show_everything(admin):
    for listed in (
        "connections",
        "channels",
        "consumers",
        "exchanges",
        "queues",
        "bindings",
        "users",
        "vhosts",
        "permissions",
        "nodes",
    ):
        admin("list", listed)
    shown = admin("-f", "raw_json", "show", "overview")
    assert json.loads(shown)[0]["rabbitmq_version"]
    assert "guest" in admin("list", "users", "name", "tags")


def test_declare_bind_publish_get_delete(admin):
    admin("declare", "exchange", "name=orders", "type=topic")
    admin("declare", "queue", "name=orders.eu", "durable=true", 'arguments={"x-max-length": 10}')
    admin("declare", "binding", "source=orders", "destination=orders.eu", "routing_key=eu.#")
    assert "Message published" in admin(
        "publish", "exchange=orders", "routing_key=eu.paris", "payload=hello"
    )
    assert "NOT routed" in admin("publish", "exchange=orders", "routing_key=us.x", "payload=x")
    listed = admin("-f", "tsv", "list", "queues", "name", "messages")
    assert "orders.eu\t1" in listed.splitlines()
    got = json.loads(admin("-f", "raw_json", "get", "queue=orders.eu", "ackmode=ack_requeue_false"))
    assert [(m["payload"], m["routing_key"]) for m in got] == [("hello", "eu.paris")]
    bindings = json.loads(admin("-f", "raw_json", "list", "bindings"))
    [binding] = [b for b in bindings if b["source"] == "orders"]
    admin(
        "delete",
        "binding",
        "source=orders",
        "destination_type=queue",
        "destination=orders.eu",
        f"properties_key={binding['properties_key']}",
    )
    assert not [
        b
        for b in json.loads(admin("-f", "raw_json", "list", "bindings"))
        if b["source"] == "orders"
    ]
    admin("delete", "queue", "name=orders.eu")
    admin("delete", "exchange", "name=orders")
    assert "orders" not in admin("list", "exchanges", "name")


def test_purge_and_close(admin, warren):
    admin("declare", "queue", "name=purged")
    admin("publish", "routing_key=purged", "payload=x")
    admin("purge", "queue", "name=purged")
    assert "purged\t0" in admin("-f", "tsv", "list", "queues", "name", "messages").splitlines()
    connection = warren.connect()
    [name] = [
        line
        for line in admin("-f", "tsv", "-q", "list", "connections", "name").splitlines()
        if line
    ]
    admin("close", "connection", f"name={name}")
    with pytest.raises(pika.exceptions.AMQPConnectionError):
        connection.process_data_events(2)
        connection.channel()


def test_users_vhosts_permissions(admin):
    admin("declare", "vhost", "name=tenant")
    admin("declare", "user", "name=alice", "password=secret", "tags=management")
    admin(
        "declare", "permission", "vhost=tenant", "user=alice", "configure=.*", "write=.*", "read=.*"
    )
    permissions = json.loads(admin("-f", "raw_json", "list", "permissions"))
    assert {
        "user": "alice",
        "vhost": "tenant",
        "configure": ".*",
        "write": ".*",
        "read": ".*",
    } in permissions
    admin("-V", "tenant", "declare", "queue", "name=in-tenant")
    assert "in-tenant" in admin("-V", "tenant", "list", "queues", "name")
    admin("delete", "permission", "vhost=tenant", "user=alice")
    admin("delete", "user", "name=alice")
    admin("delete", "vhost", "name=tenant")
    assert "tenant" not in admin("list", "vhosts", "name")


def test_export_then_import_into_another_broker(admin, tmp_path):
    admin("declare", "exchange", "name=moved", "type=fanout")
    admin("declare", "queue", "name=moved.q")
    admin("declare", "binding", "source=moved", "destination=moved.q")
    exported = tmp_path / "definitions.json"
    assert "Exported definitions" in admin("export", str(exported))
    document = json.loads(exported.read_text())
    assert {"name": "moved.q", "vhost": "/"}.items() <= next(
        q for q in document["queues"] if q["name"] == "moved.q"
    ).items()
    other = WarrenProcess(tmp_path / "other")
    other.start()
    try:
        port = other.http_ports["management"]
        assert "Uploaded definitions" in admin("import", str(exported), port=port)
        listed = admin("-f", "tsv", "list", "bindings", "source", "destination", port=port)
        assert "moved\tmoved.q" in listed.splitlines()
    finally:
        other.kill()


def test_errors_are_reported_as_rabbitmqadmin_reports_rabbitmqs(admin):
    refused = admin("declare", "queue", "name=amq.nope", check=False)
    assert "401" in refused or "Access refused" in refused
    missing = admin("delete", "queue", "name=does-not-exist", check=False)
    assert "Not found: /api/queues/%2F/does-not-exist" in missing

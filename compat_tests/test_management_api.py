"""The management HTTP API, as RabbitMQ 3.10's management plugin answers it: paths, verbs, JSON
fields, status codes and refusals. Every test runs against Warren and the reference.

RabbitMQ samples queue depths and rates every `collect_statistics_interval` (0.5 s on the
reference node), so what follows AMQP traffic is polled for (`eventually`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pika
import pika.exceptions
import pytest
from management_client import path

SETTLE_S_MAX = 15.0
REALM = 'Basic realm="RabbitMQ Management"'
OBJECT_NOT_FOUND = {"error": "Object Not Found", "reason": "Not Found"}


def eventually(probe: Callable[[], Any], check: Callable[[Any], bool]) -> Any:
    """`probe()` until `check` holds on its value (the last value is returned either way)."""
    deadline = time.monotonic() + SETTLE_S_MAX
    value = probe()
    while not check(value) and time.monotonic() < deadline:
        time.sleep(0.1)
        value = probe()
    return value


def publish(connection, queue: str, bodies: list[bytes]) -> None:
    channel = connection.channel()
    channel.confirm_delivery()
    for body in bodies:
        channel.basic_publish("", queue, body)
    channel.close()


@pytest.fixture
def queue(management, uid):
    """A fresh queue name in "/", deleted after the test."""
    name = f"{uid}-q"
    yield name
    management.delete(path("api", "queues", "/", name))


@pytest.fixture
def management_user(management, uid):
    """A user tagged "management" with all permissions on the seed vhost and none on "/"."""
    from compat_harness import SEED_VHOST

    name = f"{uid}-user"
    assert (
        management.put(path("api", "users", name), {"password": "pw", "tags": "management"}).status
        == 201
    )
    granted = {"configure": ".*", "write": ".*", "read": ".*"}
    assert management.put(path("api", "permissions", SEED_VHOST, name), granted).status == 201
    yield management.as_user(name, "pw")
    management.delete(path("api", "users", name))


# -- logins ---------------------------------------------------------------------------------------


def test_no_credentials_is_401_asking_for_basic_auth(management):
    reply = management.get("/api/overview", auth=False)
    assert reply.status == 401
    assert reply.headers["www-authenticate"] == REALM


def test_a_wrong_password_is_401_login_failed(management):
    reply = management.as_user("guest", "not-the-password").get("/api/whoami")
    assert reply.status == 401
    assert reply.headers["www-authenticate"] == REALM
    assert reply.json == {"error": "not_authorized", "reason": "Login failed"}


def test_a_user_without_tags_is_not_a_management_user(seeded, management):
    from compat_harness import NOPERM_USER

    reply = management.as_user(*NOPERM_USER).get("/api/whoami")
    assert reply.status == 401
    assert "www-authenticate" not in reply.headers
    assert reply.json == {"error": "not_authorised", "reason": "Not management user"}


def test_whoami(management):
    assert management.get("/api/whoami").json == {"name": "guest", "tags": ["administrator"]}


def test_a_management_user_is_not_an_administrator(seeded, management_user):
    reply = management_user.get("/api/users")
    assert reply.status == 401
    assert reply.json == {"error": "not_authorised", "reason": "Not administrator user"}
    assert management_user.get("/api/nodes").json["reason"] == "Not monitor user"


def test_a_user_sees_and_touches_only_vhosts_it_has_permissions_on(
    seeded, management, management_user, uid
):
    from compat_harness import SEED_VHOST

    for vhost in ("/", SEED_VHOST):
        assert management.put(path("api", "queues", vhost, f"{uid}-seen")).status == 201
    try:
        listed = management_user.get("/api/queues").json
        assert {q["vhost"] for q in listed if q["name"] == f"{uid}-seen"} == {SEED_VHOST}
        assert "/" not in [v["name"] for v in management_user.get("/api/vhosts").json]
        for reply in (
            management_user.get(path("api", "queues", "/", f"{uid}-seen")),
            management_user.delete(path("api", "queues", "/", f"{uid}-seen")),
            management_user.get(path("api", "queues", "/")),
            management_user.get(path("api", "exchanges", "/")),
        ):
            assert reply.status == 401
            assert reply.json == {
                "error": "not_authorised",
                "reason": "User not authorised to access virtual host",
            }
        assert management.get(path("api", "queues", "/", f"{uid}-seen")).status == 200
    finally:
        for vhost in ("/", SEED_VHOST):
            management.delete(path("api", "queues", vhost, f"{uid}-seen"))


# -- queues ---------------------------------------------------------------------------------------


def test_queue_put_get_delete(management, queue):
    target = path("api", "queues", "/", queue)
    declared = {"durable": True, "auto_delete": False, "arguments": {"x-max-length": 10}}
    assert management.put(target, declared).status == 201
    assert management.put(target, declared).status == 204
    shown = eventually(lambda: management.get(target).json, lambda q: "state" in q)
    assert {
        key: shown[key] for key in ("name", "vhost", "durable", "auto_delete", "exclusive")
    } == {
        "name": queue,
        "vhost": "/",
        "durable": True,
        "auto_delete": False,
        "exclusive": False,
    }
    assert shown["arguments"] == {"x-max-length": 10}
    assert (shown["type"], shown["state"]) == ("classic", "running")
    assert management.delete(target).status == 204
    missing = management.get(target)
    assert (missing.status, missing.json) == (404, OBJECT_NOT_FOUND)
    assert management.delete(target).status == 404


def test_queue_put_defaults_are_not_durable(management, queue):
    assert management.put(path("api", "queues", "/", queue)).status == 201
    shown = management.get(path("api", "queues", "/", queue)).json
    assert (shown["durable"], shown["auto_delete"], shown["arguments"]) == (False, False, {})


def test_queue_redeclare_inequivalent_is_400(management, queue):
    target = path("api", "queues", "/", queue)
    management.put(target, {"durable": True})
    reply = management.put(target, {"durable": False})
    assert reply.status == 400
    assert reply.json == {
        "error": "bad_request",
        "reason": f"inequivalent arg 'durable' for queue '{queue}' in vhost '/': "
        "received 'false' but current is 'true'",
    }


def test_queue_argument_of_the_wrong_type_is_400(management, queue):
    reply = management.put(path("api", "queues", "/", queue), {"arguments": {"x-max-length": "x"}})
    assert reply.status == 400
    assert reply.json == {
        "error": "bad_request",
        "reason": f"invalid arg 'x-max-length' for queue '{queue}' in vhost '/': "
        '"expected integer, got longstr"',
    }


def test_a_dead_letter_exchange_needs_read_on_the_queue_and_write_on_it(management, uid):
    # As over AMQP (rabbit_channel's check of a new queue): a 403 there is 401 here.
    user = f"{uid}-dlx-user"
    created = management.put(path("api", "users", user), {"password": "pw", "tags": "management"})
    assert created.status == 201
    permissions = {"configure": f"^{uid}-", "write": f"^{uid}-w", "read": f"^{uid}-r"}
    assert management.put(path("api", "permissions", "/", user), permissions).status == 201
    as_user = management.as_user(user, "pw")
    refused = {"error": "not_authorised", "reason": "Access refused."}
    try:
        for queue, exchange in ((f"{uid}-q", f"{uid}-w"), (f"{uid}-r1", f"{uid}-x")):
            reply = as_user.put(
                path("api", "queues", "/", queue),
                {"arguments": {"x-dead-letter-exchange": exchange}},
            )
            assert (reply.status, reply.json) == (401, refused), queue
            assert management.get(path("api", "queues", "/", queue)).status == 404
        reply = as_user.put(
            path("api", "queues", "/", f"{uid}-r2"), {"arguments": {"x-dead-letter-exchange": True}}
        )
        assert (reply.status, reply.json) == (
            400,
            {
                "error": "bad_request",
                "reason": f"invalid type 'bool' for arg 'x-dead-letter-exchange' in queue "
                f"'{uid}-r2' in vhost '/'",
            },
        )
        declared = as_user.put(
            path("api", "queues", "/", f"{uid}-r3"),
            {"arguments": {"x-dead-letter-exchange": f"{uid}-w"}},
        )
        assert declared.status == 201
        # Only a new queue's dead-letter exchange is checked: redeclaring one is allowed.
        elsewhere = {"arguments": {"x-dead-letter-exchange": f"{uid}-x"}}
        assert management.put(path("api", "queues", "/", f"{uid}-r4"), elsewhere).status == 201
        assert as_user.put(path("api", "queues", "/", f"{uid}-r4"), elsewhere).status == 204
    finally:
        for queue in (f"{uid}-r3", f"{uid}-r4"):
            management.delete(path("api", "queues", "/", queue))
        management.delete(path("api", "users", user))


def test_reserved_queue_names_are_access_refused(management):
    reply = management.put(path("api", "queues", "/", "amq.compat-reserved"))
    assert reply.status == 401
    assert reply.json == {"error": "not_authorised", "reason": "Access refused."}


def test_queue_name_longer_than_255_bytes_is_400(management):
    reply = management.put(path("api", "queues", "/", "n" * 256))
    assert reply.status == 400
    assert reply.json["reason"].startswith("queue should be less than 255 bytes, actually was 256")


def test_queue_depth_and_message_stats_follow_amqp(management, connection, queue):
    management.put(path("api", "queues", "/", queue))
    publish(connection, queue, [b"a", b"b", b"c"])
    target = path("api", "queues", "/", queue)
    shown = eventually(
        lambda: management.get(target).json,
        # RabbitMQ's queue stats (consumers among them) arrive apart from its message counts.
        lambda q: (
            q.get("messages") == 3
            and q.get("message_stats", {}).get("publish") == 3
            and "consumers" in q
        ),
    )
    assert (shown["messages"], shown["messages_ready"], shown["messages_unacknowledged"]) == (
        3,
        3,
        0,
    )
    assert shown["message_stats"]["publish"] == 3
    assert isinstance(shown["message_stats"]["publish_details"]["rate"], float)
    assert isinstance(shown["messages_details"]["rate"], float)
    assert shown["consumers"] == 0


def test_queue_delete_if_empty_and_purge(management, connection, queue):
    target = path("api", "queues", "/", queue)
    management.put(target)
    publish(connection, queue, [b"x"])
    refused = management.delete(target + "?if-empty=true")
    assert refused.status == 400
    assert refused.json == {
        "error": "bad_request",
        "reason": f"queue '{queue}' in vhost '/' not empty",
    }
    assert management.delete(target + "/contents").status == 204
    assert connection.channel().queue_declare(queue, passive=True).method.message_count == 0
    assert management.delete(target + "?if-empty=true").status == 204


def test_queue_delete_if_unused(management, connection, queue):
    target = path("api", "queues", "/", queue)
    management.put(target)
    channel = connection.channel()
    channel.basic_consume(queue, lambda *args: None)
    refused = management.delete(target + "?if-unused=true")
    assert refused.status == 400
    assert refused.json == {
        "error": "bad_request",
        "reason": f"queue '{queue}' in vhost '/' in use",
    }


def test_get_messages(management, connection, queue):
    target = path("api", "queues", "/", queue)
    management.put(target)
    channel = connection.channel()
    channel.confirm_delivery()
    channel.basic_publish(
        "",
        queue,
        b"hello",
        pika.BasicProperties(content_type="text/plain", headers={"k": "v"}, delivery_mode=2),
    )
    channel.basic_publish("", queue, b"\xff\x00")
    get = {"count": 5, "ackmode": "ack_requeue_true", "encoding": "auto", "truncate": 4}
    first, second = management.post(target + "/get", get).json
    assert first == {
        "payload_bytes": 5,
        "redelivered": False,
        "exchange": "",
        "routing_key": queue,
        "message_count": 1,
        "properties": {"content_type": "text/plain", "headers": {"k": "v"}, "delivery_mode": 2},
        "payload": "hell",
        "payload_encoding": "string",
    }
    assert (second["payload"], second["payload_encoding"], second["message_count"]) == (
        "/wA=",
        "base64",
        0,
    )
    again = management.post(target + "/get", {**get, "ackmode": "ack_requeue_false"}).json
    assert [m["redelivered"] for m in again] == [True, True]
    assert management.post(target + "/get", get).json == []


def test_get_without_its_fields_is_400(management, queue):
    management.put(path("api", "queues", "/", queue))
    reply = management.post(path("api", "queues", "/", queue, "get"), {"count": 1})
    assert reply.status == 400
    assert reply.json["error"] == "bad_request"


# -- exchanges, bindings, publish -----------------------------------------------------------------


def test_exchange_put_get_delete(management, uid):
    target = path("api", "exchanges", "/", f"{uid}-x")
    assert management.put(target, {"type": "topic", "durable": True}).status == 201
    assert management.put(target, {"type": "topic", "durable": True}).status == 204
    shown = management.get(target).json
    assert {
        k: shown[k] for k in ("name", "vhost", "type", "durable", "auto_delete", "internal")
    } == {
        "name": f"{uid}-x",
        "vhost": "/",
        "type": "topic",
        "durable": True,
        "auto_delete": False,
        "internal": False,
    }
    assert management.delete(target).status == 204
    assert management.get(target).status == 404


def test_exchange_refusals(management, uid):
    unknown = management.put(path("api", "exchanges", "/", f"{uid}-x"), {"type": "nope"})
    assert (unknown.status, unknown.json) == (
        400,
        {"error": "bad_request", "reason": "unknown exchange type 'nope'"},
    )
    for target in (
        path("api", "exchanges", "/", "amq.default"),
        path("api", "exchanges", "/", "amq.compat-new"),
    ):
        reply = management.put(target, {"type": "direct"})
        assert (reply.status, reply.json["reason"]) == (401, "Access refused.")
    assert management.delete(path("api", "exchanges", "/", "amq.direct")).status == 401
    assert management.get(path("api", "exchanges", "/", "amq.default")).json["name"] == ""


def test_bindings_create_list_and_delete_by_properties_key(management, uid, queue):
    exchange = f"{uid}-x"
    management.put(path("api", "exchanges", "/", exchange), {"type": "topic"})
    management.put(path("api", "queues", "/", queue))
    between = path("api", "bindings", "/", "e", exchange, "q", queue)
    created = management.post(between, {"routing_key": "a.#"})
    assert created.status == 201
    assert created.headers["location"] == f"{queue}/a.%2523"
    [binding] = management.get(between).json
    assert binding == {
        "source": exchange,
        "vhost": "/",
        "destination": queue,
        "destination_type": "queue",
        "routing_key": "a.#",
        "arguments": {},
        "properties_key": "a.%23",
    }
    of_queue = management.get(path("api", "queues", "/", queue, "bindings")).json
    assert [b["source"] for b in of_queue] == ["", exchange]
    one = path("api", "bindings", "/", "e", exchange, "q", queue, "a.%23")
    assert management.get(one).json == binding
    assert management.delete(one).status == 204
    assert management.get(between).json == []
    assert management.get(one).status == 404
    management.delete(path("api", "exchanges", "/", exchange))


def test_binding_to_a_missing_exchange_is_404(management, queue):
    management.put(path("api", "queues", "/", queue))
    reply = management.post(path("api", "bindings", "/", "e", "compat-no-x", "q", queue), {})
    assert reply.status == 404
    assert reply.json == {"error": "not_found", "reason": "no exchange 'compat-no-x' in vhost '/'"}


def test_publish_routes_and_says_so(management, queue):
    management.put(path("api", "queues", "/", queue))
    target = path("api", "exchanges", "/", "amq.default", "publish")
    message = {
        "routing_key": queue,
        "properties": {},
        "payload": "hi",
        "payload_encoding": "string",
    }
    assert management.post(target, message).json == {"routed": True}
    unroutable = {**message, "routing_key": queue + "-nowhere"}
    assert management.post(target, unroutable).json == {"routed": False}
    encoded = {**message, "payload": "aGk=", "payload_encoding": "base64"}
    assert management.post(target, encoded).json == {"routed": True}
    got = management.post(
        path("api", "queues", "/", queue, "get"),
        {"count": 2, "ackmode": "ack_requeue_false", "encoding": "auto"},
    ).json
    assert [m["payload"] for m in got] == ["hi", "hi"]


def test_publish_with_a_bad_expiration_is_the_channel_error(management):
    message = {
        "routing_key": "k",
        "properties": {"expiration": "abc"},
        "payload": "x",
        "payload_encoding": "string",
    }
    reply = management.post(path("api", "exchanges", "/", "amq.direct", "publish"), message)
    assert reply.status == 400
    assert reply.json == {
        "error": "bad_request",
        "reason": "406 PRECONDITION_FAILED - invalid expiration 'abc': no_integer",
    }


# -- connections ----------------------------------------------------------------------------------


def test_connections_are_listed_and_closed_with_the_reason(management, open_connection, uid):
    connection = open_connection(client_properties={"connection_name": uid})

    def mine():
        listed = management.get("/api/connections").json
        return [c for c in listed if c.get("client_properties", {}).get("connection_name") == uid]

    [shown] = eventually(mine, lambda found: len(found) == 1)
    assert (shown["user"], shown["vhost"], shown["protocol"]) == ("guest", "/", "AMQP 0-9-1")
    assert shown["name"].startswith("127.0.0.1:")
    reply = management.delete(path("api", "connections", shown["name"]), headers={"X-Reason": uid})
    assert reply.status == 204
    with pytest.raises(pika.exceptions.ConnectionClosed) as excinfo:
        for _ in range(50):
            connection.process_data_events(0.1)
    assert excinfo.value.args[:2] == (320, f"CONNECTION_FORCED - {uid}")


# -- vhosts, users, permissions -------------------------------------------------------------------


def test_vhost_lifecycle_and_its_creators_permissions(management, uid):
    vhost = f"{uid}-vhost"
    assert management.put(path("api", "vhosts", vhost)).status == 201
    try:
        assert management.get(path("api", "vhosts", vhost)).json["name"] == vhost
        permission = management.get(path("api", "permissions", vhost, "guest")).json
        assert permission == {
            "user": "guest",
            "vhost": vhost,
            "configure": ".*",
            "write": ".*",
            "read": ".*",
        }
    finally:
        assert management.delete(path("api", "vhosts", vhost)).status == 204
    assert management.get(path("api", "vhosts", vhost)).json == OBJECT_NOT_FOUND


def test_user_lifecycle(management, uid):
    user = f"{uid}-u"
    target = path("api", "users", user)
    assert management.put(target, {"password": "x"}).json == {
        "error": "bad_request",
        "reason": "tags_not_present",
    }
    assert management.put(target, {"password": "x", "tags": "monitoring,management"}).status == 201
    shown = management.get(target).json
    assert (shown["name"], sorted(shown["tags"])) == (user, ["management", "monitoring"])
    assert {"password_hash", "hashing_algorithm"} <= set(shown)
    assert management.as_user(user, "x").get("/api/nodes").status == 200
    assert management.put(target, {"password": "y", "tags": ""}).status == 204
    assert management.delete(target).status == 204
    assert management.get(target).status == 404


def test_permissions_for_a_missing_user_are_400(management, uid):
    reply = management.put(
        path("api", "permissions", "/", f"{uid}-nobody"),
        {"configure": ".*", "write": ".*", "read": ".*"},
    )
    assert (reply.status, reply.json) == (
        400,
        {"error": "bad_request", "reason": "vhost_or_user_not_found"},
    )


# -- definitions ----------------------------------------------------------------------------------


def test_definitions_export_and_import(management, uid):
    exchange, queue = f"{uid}-dx", f"{uid}-dq"
    document = {
        "queues": [
            {"name": queue, "vhost": "/", "durable": True, "auto_delete": False, "arguments": {}}
        ],
        "exchanges": [
            {
                "name": exchange,
                "vhost": "/",
                "type": "fanout",
                "durable": True,
                "auto_delete": False,
                "internal": False,
                "arguments": {},
            }
        ],
        "bindings": [
            {
                "source": exchange,
                "vhost": "/",
                "destination": queue,
                "destination_type": "queue",
                "routing_key": "",
                "arguments": {},
            }
        ],
    }
    try:
        assert management.post("/api/definitions", document).status == 204
        exported = management.get("/api/definitions").json
        assert {
            "users",
            "vhosts",
            "permissions",
            "queues",
            "exchanges",
            "bindings",
            "policies",
        } <= set(exported)
        assert document["queues"][0] in exported["queues"]
        assert document["exchanges"][0] in exported["exchanges"]
        assert document["bindings"][0] in exported["bindings"]
        assert not [x for x in exported["exchanges"] if x["name"].startswith("amq.")]
        of_vhost = management.get(path("api", "definitions", "/")).json
        assert {"name": queue, "durable": True, "auto_delete": False, "arguments": {}} in of_vhost[
            "queues"
        ]
    finally:
        management.delete(path("api", "queues", "/", queue))
        management.delete(path("api", "exchanges", "/", exchange))


def test_definitions_that_are_not_json_are_400(management):
    reply = management.post("/api/definitions", raw=b"{not json")
    assert (reply.status, reply.json) == (
        400,
        {"error": "bad_request", "reason": "failed_to_parse_json"},
    )


# -- health and overview --------------------------------------------------------------------------


def test_health_checks(broker, management):
    assert management.get("/api/health/checks/alarms").json == {"status": "ok"}
    assert management.get("/api/health/checks/local-alarms").json == {"status": "ok"}
    assert management.get("/api/health/checks/virtual-hosts").json == {"status": "ok"}
    amqp = management.get(path("api", "health", "checks", "port-listener", str(broker.port)))
    assert amqp.json == {"status": "ok", "port": broker.port}
    missing = management.get("/api/health/checks/port-listener/1")
    assert missing.status == 503
    assert (missing.json["status"], missing.json["reason"], missing.json["missing"]) == (
        "failed",
        "No active listener",
        1,
    )
    assert management.get(path("api", "aliveness-test", "/")).json == {"status": "ok"}


def test_overview(management):
    overview = management.get("/api/overview").json
    assert overview["rabbitmq_version"]
    assert isinstance(overview["object_totals"]["queues"], int)
    assert isinstance(overview["object_totals"]["exchanges"], int)
    assert "queue_totals" in overview and "listeners" in overview


# -- lists and bad input --------------------------------------------------------------------------


def test_pagination(management, uid):
    for index in range(3):
        management.put(path("api", "queues", "/", f"{uid}-page-{index}"))
    try:
        reply = management.get(f"/api/queues/%2F?page=2&page_size=2&name={uid}-page&columns=name")
        page = reply.json
        assert {
            k: page[k] for k in ("filtered_count", "item_count", "page", "page_size", "page_count")
        } == {
            "filtered_count": 3,
            "item_count": 1,
            "page": 2,
            "page_size": 2,
            "page_count": 2,
        }
        assert page["items"] == [{"name": f"{uid}-page-2"}]
        bad = management.get("/api/queues?page=0")
        assert (bad.status, bad.json["error"]) == (400, "invalid_pagination_parameters")
        ordered = management.get("/api/queues?sort=name&sort_reverse=true&columns=name,vhost").json
        mine = [q["name"] for q in ordered if q["name"].startswith(uid)]
        assert mine == [f"{uid}-page-{i}" for i in (2, 1, 0)]
        assert set(ordered[0]) == {"name", "vhost"}
    finally:
        for index in range(3):
            management.delete(path("api", "queues", "/", f"{uid}-page-{index}"))


@pytest.mark.parametrize(
    "raw, reason",
    [
        (b"{not json", "not_json"),
        (b"[1]", "not_json"),
        (
            b'"text"',
            "invalid payload: the request body JSON-decoded to a string. "
            "Is the input doubly-JSON-encoded?",
        ),
        (b'{"durable": "yes"}', ["not_boolean", "yes"]),
    ],
)
def test_bad_bodies_are_400(management, queue, raw, reason):
    reply = management.put(path("api", "queues", "/", queue), raw=raw)
    assert (reply.status, reply.json) == (400, {"error": "bad_request", "reason": reason})


def test_unknown_vhost(management):
    assert management.get(path("api", "queues", "compat-no-vhost")).json == OBJECT_NOT_FOUND
    reply = management.put(path("api", "queues", "compat-no-vhost", "q"), {})
    assert (reply.status, reply.json) == (404, {"error": "not_found", "reason": "vhost_not_found"})


def test_unknown_paths_and_methods(management):
    missing = management.get("/api/compat-no-such-thing")
    assert (missing.status, missing.json) == (404, OBJECT_NOT_FOUND)
    wrong = management.post(path("api", "queues", "/", "compat-q"))
    assert wrong.status == 405
    assert wrong.headers["allow"] == "HEAD, GET, PUT, DELETE, OPTIONS"


# -- policies -------------------------------------------------------------------------------


def test_a_policy_set_over_http_applies_to_an_existing_queue(management, connection, uid):
    queue = f"{uid}-q"
    channel = connection.channel()
    channel.queue_declare(queue)
    target = path("api", "policies", "/", f"{uid}-limit")
    body = {"pattern": f"^{uid}-", "definition": {"max-length": 1}, "apply-to": "queues"}
    try:
        assert management.put(target, body).status == 201
        assert management.put(target, body).status == 204
        shown = management.get(target).json
        assert {k: shown[k] for k in ("vhost", "name", "pattern", "apply-to", "definition")} == {
            "vhost": "/",
            "name": f"{uid}-limit",
            "pattern": f"^{uid}-",
            "apply-to": "queues",
            "definition": {"max-length": 1},
        }
        assert shown["priority"] == 0
        assert f"{uid}-limit" in [p["name"] for p in management.get("/api/policies/%2F").json]
        # The queue names the policy that applies to it (RabbitMQ's figures lag a stats
        # interval behind).
        shown_queue = eventually(
            lambda: management.get(path("api", "queues", "/", queue)).json,
            lambda item: item.get("policy") == f"{uid}-limit",
        )
        assert shown_queue["policy"] == f"{uid}-limit"
        assert shown_queue["effective_policy_definition"] == {"max-length": 1}
        listed = management.get("/api/queues/%2F").json
        assert [q["policy"] for q in listed if q["name"] == queue] == [f"{uid}-limit"]
        publish(connection, queue, [b"1", b"2", b"3"])
        method, _, body_ = channel.basic_get(queue, auto_ack=True)
        assert body_ == b"3"
        assert channel.basic_get(queue, auto_ack=True)[0] is None
        exported = management.get("/api/definitions").json["policies"]
        assert f"{uid}-limit" in [p["name"] for p in exported]
    finally:
        assert management.delete(target).status == 204
        channel.queue_delete(queue)
    assert management.get(target).status == 404


def test_an_invalid_policy_is_400_with_rabbitmqs_reason(management, uid):
    reply = management.put(
        path("api", "policies", "/", f"{uid}-bad"),
        {"pattern": ".*", "definition": {"max-length": "abc"}},
    )
    assert reply.status == 400
    assert reply.json["error"] == "bad_request"
    assert "is not a valid maximum length" in reply.json["reason"]


def test_a_management_user_lists_policies_but_may_not_set_one(seeded, management_user, uid):
    from compat_harness import SEED_VHOST

    listed = management_user.get("/api/policies")
    assert listed.status == 200 and listed.json == []
    body = {"pattern": ".*", "definition": {"max-length": 1}}
    target = path("api", "policies", SEED_VHOST, f"{uid}-p")
    assert management_user.put(target, body).status == 401

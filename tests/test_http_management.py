"""The management API against an in-process broker over real sockets: logins and tags, every
resource's lifecycle through the core, what AMQP clients then see, and RabbitMQ's answers to
bad input. (The same behaviours against RabbitMQ itself are in compat_tests.)"""

from __future__ import annotations

import json
import time

import pika
import pika.exceptions
import pytest
from brokers import ThreadBroker
from http_api import HttpApi, add_user, name, path


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    running = ThreadBroker(tmp_path_factory.mktemp("broker"), http_body_bytes_max=64 * 1024)
    running.start()
    yield running
    running.stop()


@pytest.fixture
def api(broker) -> HttpApi:
    return HttpApi(broker.management_url)


def add_vhost(api: HttpApi) -> str:
    vhost = name("vhost")
    assert api.put(path("api", "vhosts", vhost)).status == 201
    return vhost


def publish_amqp(broker, queue: str, bodies: list[bytes], vhost: str = "/") -> None:
    connection = broker.connect(virtual_host=vhost)
    channel = connection.channel()
    channel.confirm_delivery()
    for body in bodies:
        channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))
    connection.close()


# -- logins and tags ------------------------------------------------------------------------------


def test_no_credentials_asks_for_basic_auth(api):
    reply = api.get("/api/overview", auth=False)
    assert reply.status == 401
    assert reply.headers["www-authenticate"] == 'Basic realm="RabbitMQ Management"'


def test_a_wrong_password_is_refused_with_the_realm(api):
    reply = api.as_user("guest", "wrong").get("/api/overview")
    assert reply.status == 401
    assert reply.headers["www-authenticate"] == 'Basic realm="RabbitMQ Management"'
    assert reply.json == {"error": "not_authorized", "reason": "Login failed"}


def test_a_user_without_a_management_tag_may_not_use_the_api(api):
    plain = add_user(api, "", {"/": (".*", ".*", ".*")})
    reply = plain.get("/api/whoami")
    assert reply.status == 401
    assert "www-authenticate" not in reply.headers
    assert reply.json == {"error": "not_authorised", "reason": "Not management user"}


@pytest.mark.parametrize(
    "tags, admin_only, monitor_only",
    [
        ("administrator", 200, 200),
        ("monitoring", 401, 200),
        ("policymaker", 401, 401),
        ("management", 401, 401),
    ],
)
def test_tags_open_routes_as_in_rabbitmq(api, tags, admin_only, monitor_only):
    user = add_user(api, tags, {"/": (".*", ".*", ".*")})
    assert user.get("/api/whoami").json["tags"] == [tags]
    assert user.get("/api/users").status == admin_only
    assert user.get("/api/nodes").status == monitor_only
    assert user.get("/api/overview").status == 200
    if admin_only == 401:
        assert user.get("/api/users").json["reason"] == "Not administrator user"
    if monitor_only == 401:
        assert user.get("/api/nodes").json["reason"] == "Not monitor user"


def test_guest_is_refused_from_a_non_loopback_address_only_by_the_setting(tmp_path):
    broker = ThreadBroker(tmp_path / "d", loopback_users=()).start()
    try:
        assert HttpApi(broker.management_url).get("/api/whoami").status == 200
    finally:
        broker.stop()


# -- vhost permissions ----------------------------------------------------------------------------


def test_lists_show_only_the_vhosts_a_user_has_permissions_on(api, broker):
    mine, theirs = add_vhost(api), add_vhost(api)
    for vhost in (mine, theirs):
        assert api.put(path("api", "queues", vhost, "shared-name")).status == 201
    user = add_user(api, "management", {mine: (".*", ".*", ".*")})
    assert {q["vhost"] for q in user.get("/api/queues").json} == {mine}
    assert {x["vhost"] for x in user.get("/api/exchanges").json} == {mine}
    assert {b["vhost"] for b in user.get("/api/bindings").json} == {mine}
    assert [v["name"] for v in user.get("/api/vhosts").json] == [mine]
    assert user.get("/api/overview").json["object_totals"]["queues"] == 1
    # A monitor learns of every vhost, but lists only the queues of its own.
    monitor = add_user(api, "monitoring", {mine: (".*", ".*", ".*")})
    assert {theirs, mine} <= {v["name"] for v in monitor.get("/api/vhosts").json}
    assert {q["vhost"] for q in monitor.get("/api/queues").json} == {mine}


def _with_params(pattern: tuple[str, ...], values: dict[str, str]) -> str:
    segments = [values.get(part[1:-1], "x") if part.startswith("{") else part for part in pattern]
    return path(*segments)


def test_no_route_lets_a_user_see_or_change_a_vhost_without_permissions(api):
    from warrenmq.server.http.management import ROUTES

    theirs = add_vhost(api)
    queue, exchange = name(), name("x")
    assert api.put(path("api", "queues", theirs, queue)).status == 201
    assert api.put(path("api", "exchanges", theirs, exchange), {"type": "fanout"}).status == 201
    outsider = add_user(api, "management", {"/": (".*", ".*", ".*")})
    values = {
        "vhost": theirs,
        "queue": queue,
        "destination": queue,
        "exchange": exchange,
        "source": exchange,
        "dtype": "q",
        "props": "~",
        "user": "guest",
    }
    checked = 0
    for route in ROUTES:
        if "{vhost}" not in route.pattern:
            continue
        for method in route.methods:
            reply = outsider.request(method, _with_params(route.pattern, values), {})
            assert reply.status == 401, (method, route.pattern, reply.status, reply.raw)
            checked += 1
    assert checked > 20
    # Nothing changed.
    assert api.get(path("api", "queues", theirs, queue)).status == 200
    assert api.get(path("api", "exchanges", theirs, exchange)).status == 200


def test_resource_permissions_are_checked_as_for_amqp(api):
    vhost = add_vhost(api)
    # May configure and read "ok.*" only, write nothing.
    user = add_user(api, "management", {vhost: ("^ok\\.", "^$", "^ok\\.")})
    assert user.put(path("api", "queues", vhost, "ok.q")).status == 201
    refused = user.put(path("api", "queues", vhost, "no.q"))
    assert (refused.status, refused.json["reason"]) == (401, "Access refused.")
    publish = {
        "routing_key": "ok.q",
        "properties": {},
        "payload": "x",
        "payload_encoding": "string",
    }
    assert (
        user.post(path("api", "exchanges", vhost, "amq.default", "publish"), publish).status == 401
    )
    assert user.delete(path("api", "queues", vhost, "ok.q", "contents")).status == 204
    assert user.delete(path("api", "queues", vhost, "ok.q")).status == 204


def test_declaring_a_super_stream_needs_configure_on_every_partition(api, broker):
    vhost = add_vhost(api)
    api.put(path("api", "users", "sslimited"), {"password": "pw", "tags": "management"})
    granted = {"configure": "^ok\\.s$", "write": "", "read": ""}
    assert api.put(path("api", "permissions", vhost, "sslimited"), granted).status == 201
    user = api.as_user("sslimited", "pw")
    refused = user.put(path("api", "super-streams", vhost, "ok.s"), {"partitions": 2})
    assert (refused.status, refused.json["reason"]) == (401, "Access refused.")
    by_type = {"type": "x-super-stream", "arguments": {"x-super-stream-partitions": 2}}
    refused = user.put(path("api", "exchanges", vhost, "ok.s"), by_type)
    assert (refused.status, refused.json["reason"]) == (401, "Access refused.")
    connection = broker.connect(
        virtual_host=vhost, credentials=pika.PlainCredentials("sslimited", "pw")
    )
    channel = connection.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.exchange_declare(
            "ok.s", "x-super-stream", arguments={"x-super-stream-partitions": 2}
        )
    assert closed.value.reply_code == 403
    assert closed.value.reply_text == (
        f"ACCESS_REFUSED - access to queue 'ok.s-0' in vhost '{vhost}' refused for user 'sslimited'"
    )
    connection.close()
    # Nothing was made of any of the three declares.
    assert api.get(path("api", "super-streams", vhost)).json == []
    assert api.get(path("api", "queues", vhost)).json == []


def test_deleting_a_super_stream_needs_configure_on_it_and_every_partition(api):
    vhost = add_vhost(api)
    created = api.put(path("api", "super-streams", vhost, "ok.s"), {"partitions": 2})
    assert created.status == 201
    exchange_only = add_user(api, "management", {vhost: ("^ok\\.s$", "", "")})
    refused = exchange_only.delete(path("api", "super-streams", vhost, "ok.s"))
    assert (refused.status, refused.json["reason"]) == (401, "Access refused.")
    listed = api.get(path("api", "super-streams", vhost)).json
    assert [s["partitions"] for s in listed] == [["ok.s-0", "ok.s-1"]]
    everything = add_user(api, "management", {vhost: ("^ok\\.", "", "")})
    assert everything.delete(path("api", "super-streams", vhost, "ok.s")).status == 204
    assert api.get(path("api", "super-streams", vhost)).json == []
    assert api.get(path("api", "queues", vhost)).json == []
    missing = api.delete(path("api", "super-streams", vhost, "ok.s"))
    assert missing.status == 404 and "no super stream" in missing.json["reason"]


# -- queues ---------------------------------------------------------------------------------------


def test_queue_declare_redeclare_and_inequivalence(api):
    queue = name()
    target = path("api", "queues", "/", queue)
    declared = {"durable": True, "arguments": {"x-max-length": 10}}
    assert api.put(target, declared).status == 201
    assert api.put(target, declared).status == 204
    refused = api.put(target, {"durable": False, "arguments": {"x-max-length": 10}})
    assert refused.status == 400
    assert refused.json == {
        "error": "bad_request",
        "reason": f"inequivalent arg 'durable' for queue '{queue}' in vhost '/': "
        "received 'false' but current is 'true'",
    }
    shown = api.get(target).json
    assert (shown["durable"], shown["arguments"], shown["state"]) == (
        True,
        {"x-max-length": 10},
        "running",
    )


def test_queue_counts_and_message_stats_follow_amqp(api, broker):
    queue = name()
    assert api.put(path("api", "queues", "/", queue), {"durable": True}).status == 201
    publish_amqp(broker, queue, [b"a", b"b", b"c"])
    connection = broker.connect()
    channel = connection.channel()
    channel.basic_qos(prefetch_count=1)
    channel.basic_consume(queue, lambda *args: None)
    deadline = time.monotonic() + 5
    shown = {}
    while time.monotonic() < deadline:
        connection.process_data_events(0.05)
        shown = api.get(path("api", "queues", "/", queue)).json
        if shown["messages_unacknowledged"] == 1:
            break
    assert (shown["messages"], shown["messages_ready"], shown["messages_unacknowledged"]) == (
        3,
        2,
        1,
    )
    assert shown["consumers"] == 1
    assert shown["message_stats"]["publish"] == 3
    assert shown["message_stats"]["deliver"] == 1
    assert "rate" in shown["message_stats"]["publish_details"]
    [consumer] = shown["consumer_details"]
    assert consumer["ack_required"] and consumer["prefetch_count"] == 1
    assert consumer["queue"] == {"name": queue, "vhost": "/"}
    connection.close()


def test_queue_delete_if_empty_and_if_unused(api, broker):
    queue = name()
    target = path("api", "queues", "/", queue)
    api.put(target)
    publish_amqp(broker, queue, [b"x"])
    refused = api.delete(target + "?if-empty=true")
    assert (refused.status, refused.json["reason"]) == (
        400,
        f"queue '{queue}' in vhost '/' not empty",
    )
    assert api.delete(target + "/contents").status == 204
    assert api.get(target).json["messages"] == 0
    assert api.delete(target + "?if-empty=true").status == 204
    assert api.get(target).status == 404
    assert api.delete(target).status == 404


def test_get_ackmodes(api, broker):
    queue = name()
    target = path("api", "queues", "/", queue)
    api.put(target)
    publish_amqp(broker, queue, [b"one", b"\xff\xfe", b"three"])
    get = {"count": 2, "ackmode": "ack_requeue_true", "encoding": "auto", "truncate": 2}
    first = api.post(target + "/get", get).json
    assert [m["payload"] for m in first] == ["on", "//4="]
    assert [m["payload_encoding"] for m in first] == ["string", "base64"]
    assert [m["message_count"] for m in first] == [2, 1]
    assert first[0]["payload_bytes"] == 3 and first[0]["properties"] == {"delivery_mode": 2}
    again = api.post(target + "/get", {**get, "count": 1, "encoding": "base64"}).json
    assert again[0]["redelivered"] and again[0]["payload"] == "b24="
    taken = api.post(
        target + "/get", {"count": 5, "ackmode": "ack_requeue_false", "encoding": "auto"}
    )
    assert [m["payload"] for m in taken.json] == ["one", "//4=", "three"]
    assert api.get(target).json["messages"] == 0


def test_get_reject_requeue_true_is_a_failed_delivery_and_ack_requeue_true_is_not(api, broker):
    # As RabbitMQ's rabbit_mgmt_wm_queue_get: basic.reject for reject_requeue_true, basic.nack
    # for ack_requeue_true, which RabbitMQ 4.3 does not count toward the delivery limit.
    queue = name()
    target = path("api", "queues", "/", queue)
    api.put(target, {"arguments": {"x-delivery-limit": 1}})
    publish_amqp(broker, queue, [b"x"])
    headers = []
    for ackmode in ("ack_requeue_true", "reject_requeue_true", "ack_requeue_true"):
        got = api.post(target + "/get", {"count": 1, "ackmode": ackmode, "encoding": "auto"})
        headers.append(got.json[0]["properties"].get("headers"))
    assert headers == [
        None,
        {"x-acquired-count": 1},
        {"x-acquired-count": 2, "x-delivery-count": 1},
    ]
    # A second failure exceeds the limit of 1: dropped (no dead-letter exchange).
    api.post(target + "/get", {"count": 1, "ackmode": "reject_requeue_true", "encoding": "auto"})
    assert api.get(target).json["messages"] == 0


def test_get_reject_requeue_false_drops(api, broker):
    queue = name()
    target = path("api", "queues", "/", queue)
    api.put(target)
    publish_amqp(broker, queue, [b"x"])
    got = api.post(
        target + "/get", {"count": 1, "ackmode": "reject_requeue_false", "encoding": "auto"}
    )
    assert [m["payload"] for m in got.json] == ["x"]
    assert api.get(target).json["messages"] == 0


def test_get_reject_requeue_false_dead_letters(api, broker):
    queue, dead = name(), name("dlq")
    api.put(path("api", "queues", "/", dead))
    target = path("api", "queues", "/", queue)
    dlx = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead}
    assert api.put(target, {"arguments": dlx}).status == 201
    publish_amqp(broker, queue, [b"x"])
    reject = {"count": 1, "ackmode": "reject_requeue_false", "encoding": "auto"}
    assert [m["payload"] for m in api.post(target + "/get", reject).json] == ["x"]
    take = {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"}
    deadline = time.monotonic() + 5
    got = []
    while not got and time.monotonic() < deadline:
        got = api.post(path("api", "queues", "/", dead) + "/get", take).json
    assert got[0]["payload"] == "x"
    assert got[0]["properties"]["headers"]["x-death"][0]["reason"] == "rejected"


# -- exchanges, bindings, publish -----------------------------------------------------------------


def test_exchange_binding_publish_round_trip(api):
    exchange, queue = name("x"), name()
    assert (
        api.put(path("api", "exchanges", "/", exchange), {"type": "topic", "durable": True}).status
        == 201
    )
    api.put(path("api", "queues", "/", queue))
    bind = path("api", "bindings", "/", "e", exchange, "q", queue)
    created = api.post(bind, {"routing_key": "a.#", "arguments": {"x-k": "v"}})
    assert created.status == 201
    [binding] = api.get(bind).json
    assert created.headers["location"] == f"{queue}/" + binding["properties_key"].replace(
        "%", "%25"
    )
    assert binding["properties_key"].startswith("a.%23~")
    assert binding["arguments"] == {"x-k": "v"}
    publish = {
        "routing_key": "a.b",
        "properties": {"headers": {"n": 1}},
        "payload": "hi",
        "payload_encoding": "string",
    }
    target = path("api", "exchanges", "/", exchange, "publish")
    assert api.post(target, publish).json == {"routed": True}
    assert api.post(target, {**publish, "routing_key": "b"}).json == {"routed": False}
    [message] = api.post(
        path("api", "queues", "/", queue, "get"),
        {"count": 1, "ackmode": "ack_requeue_false", "encoding": "auto"},
    ).json
    assert (message["exchange"], message["routing_key"], message["payload"]) == (
        exchange,
        "a.b",
        "hi",
    )
    assert message["properties"]["headers"] == {"n": 1}
    one = path("api", "bindings", "/", "e", exchange, "q", queue, binding["properties_key"])
    assert api.get(one).json == binding
    assert api.delete(one).status == 204
    assert api.get(bind).json == []
    assert api.delete(one).status == 404
    assert api.delete(path("api", "exchanges", "/", exchange)).status == 204
    assert api.get(path("api", "exchanges", "/", exchange)).status == 404


def test_default_exchange_bindings_are_listed_and_amq_default_is_the_default_exchange(api):
    queue = name()
    api.put(path("api", "queues", "/", queue))
    listed = api.get(path("api", "queues", "/", queue, "bindings")).json
    assert listed == [
        {
            "source": "",
            "vhost": "/",
            "destination": queue,
            "destination_type": "queue",
            "routing_key": queue,
            "arguments": {},
            "properties_key": queue,
        }
    ]
    assert api.get(path("api", "exchanges", "/", "amq.default")).json["name"] == ""
    publish = {"routing_key": queue, "properties": {}, "payload": "x", "payload_encoding": "string"}
    assert api.post(path("api", "exchanges", "/", "amq.default", "publish"), publish).json == {
        "routed": True
    }


def test_publish_refusals_are_rabbitmqs(api):
    target = path("api", "exchanges", "/", "amq.direct", "publish")
    base = {"routing_key": "k", "properties": {}, "payload": "x", "payload_encoding": "string"}
    expired = api.post(target, {**base, "properties": {"expiration": "-1"}})
    assert (
        expired.json["reason"]
        == "406 PRECONDITION_FAILED - invalid expiration '-1': {value_negative,-1}"
    )
    assert api.post(target, {**base, "payload_encoding": "rot13"}).status == 400
    assert api.post(target, {**base, "payload": 5}).json["reason"] == "payload_not_string"
    assert api.post(target, {"routing_key": "k"}).json["reason"] == (
        "[{key_missing,properties},{key_missing,payload},{key_missing,payload_encoding}]"
    )
    assert api.post(path("api", "exchanges", "/", "nope", "publish"), base).status == 404


# -- connections, channels, consumers -------------------------------------------------------------


def test_connections_channels_consumers_and_close_with_a_reason(api, broker):
    queue = name()
    api.put(path("api", "queues", "/", queue))
    connection = broker.connect(client_properties={"connection_name": "tested"})
    channel = connection.channel()
    channel.confirm_delivery()
    channel.basic_consume(queue, lambda *args: None, consumer_tag="tag-1")
    channel.basic_publish("", queue, b"x")
    [mine] = [
        c
        for c in api.get("/api/connections").json
        if c["client_properties"].get("connection_name") == "tested"
    ]
    assert mine["user"] == "guest" and mine["vhost"] == "/" and mine["channels"] == 1
    assert mine["protocol"] == "AMQP 0-9-1" and mine["name"].endswith(f":{broker.port}")
    channels = api.get(path("api", "connections", mine["name"], "channels")).json
    assert [c["name"] for c in channels] == [mine["name"] + " (1)"]
    assert channels[0]["confirm"] is True and channels[0]["message_stats"]["publish"] == 1
    consumers = [c for c in api.get("/api/consumers").json if c["consumer_tag"] == "tag-1"]
    assert consumers[0]["channel_details"]["connection_name"] == mine["name"]
    closed = api.delete(path("api", "connections", mine["name"]), headers={"X-Reason": "bye now"})
    assert closed.status == 204
    with pytest.raises(pika.exceptions.ConnectionClosed) as excinfo:
        connection.process_data_events(2)
        channel.basic_publish("", queue, b"y")
    assert excinfo.value.args[:2] == (320, "CONNECTION_FORCED - bye now")
    assert api.delete(path("api", "connections", mine["name"])).status == 404


def test_users_see_only_their_own_connections(api, broker):
    user = add_user(api, "management", {"/": (".*", ".*", ".*")})
    connection = broker.connect()
    try:
        assert user.get("/api/connections").json == []
        name_ = api.get("/api/connections").json[0]["name"]
        assert user.get(path("api", "connections", name_)).status == 401
        assert user.delete(path("api", "connections", name_)).status == 401
    finally:
        connection.close()


# -- vhosts, users, permissions -------------------------------------------------------------------


def test_vhost_lifecycle_hosts_it_for_amqp(api, broker):
    vhost = add_vhost(api)
    assert api.put(path("api", "vhosts", vhost)).status == 204
    # Its creator may use it at once, as in RabbitMQ.
    assert api.get(path("api", "permissions", vhost, "guest")).json["configure"] == ".*"
    connection = broker.connect(virtual_host=vhost)
    connection.channel().queue_declare("in-new-vhost")
    assert [q["name"] for q in api.get(path("api", "queues", vhost)).json] == ["in-new-vhost"]
    assert api.delete(path("api", "vhosts", vhost)).status == 204
    assert api.get(path("api", "vhosts", vhost)).status == 404
    assert api.delete(path("api", "vhosts", vhost)).status == 404
    deadline = time.monotonic() + 5
    while connection.is_open and time.monotonic() < deadline:
        try:
            connection.process_data_events(0.1)
        except pika.exceptions.ConnectionClosed:
            break
    assert not connection.is_open


def test_user_lifecycle_and_amqp_login(api, broker):
    user = name("user")
    target = path("api", "users", user)
    assert api.put(target, {"password": "one"}).json == {
        "error": "bad_request",
        "reason": "tags_not_present",
    }
    assert api.put(target, {"password": "one", "tags": "management,monitoring"}).status == 201
    assert api.get(target).json["tags"] == ["management", "monitoring"]
    assert (
        api.put(
            path("api", "permissions", "/", user), {"configure": ".*", "write": ".*", "read": ".*"}
        ).status
        == 201
    )
    broker.connect(credentials=pika.PlainCredentials(user, "one")).close()
    assert api.put(target, {"password": "two", "tags": ["management"]}).status == 204
    with pytest.raises(pika.exceptions.ProbableAuthenticationError):
        broker.connect(credentials=pika.PlainCredentials(user, "one"))
    broker.connect(credentials=pika.PlainCredentials(user, "two")).close()
    assert api.get(path("api", "permissions", "/", user)).json == {
        "user": user,
        "vhost": "/",
        "configure": ".*",
        "write": ".*",
        "read": ".*",
    }
    assert api.delete(path("api", "permissions", "/", user)).status == 204
    assert api.get(path("api", "permissions", "/", user)).status == 404
    assert api.delete(target).status == 204
    assert api.get(target).status == 404


def test_permissions_for_a_missing_user_or_vhost(api):
    grant = {"configure": ".*", "write": ".*", "read": ".*"}
    reply = api.put(path("api", "permissions", "/", "nobody-" + name()), grant)
    assert reply.json == {"error": "bad_request", "reason": "vhost_or_user_not_found"}
    assert api.put(path("api", "permissions", "/", "guest"), {"configure": ".*"}).json[
        "reason"
    ] == ("[{key_missing,write},{key_missing,read}]")
    bad_regex = api.put(path("api", "permissions", "/", "guest"), {**grant, "read": "("}).status
    assert bad_regex == 400


# -- definitions ----------------------------------------------------------------------------------


def test_definitions_round_trip_through_a_fresh_broker(api, broker, tmp_path):
    vhost = add_vhost(api)
    api.put(
        path("api", "permissions", vhost, "guest"), {"configure": ".*", "write": ".*", "read": ".*"}
    )
    api.put(path("api", "users", "moved"), {"password": "pw", "tags": "management"})
    api.put(path("api", "exchanges", vhost, "orders"), {"type": "topic", "durable": True})
    api.put(
        path("api", "queues", vhost, "orders.eu"),
        {"durable": True, "arguments": {"x-max-length": 5}},
    )
    api.post(
        path("api", "bindings", vhost, "e", "orders", "q", "orders.eu"), {"routing_key": "eu.#"}
    )
    exported = api.get("/api/definitions?download=defs.json")
    assert exported.headers["content-disposition"] == "attachment; filename=defs.json"
    document = exported.json
    assert document["policies"] == []
    assert {
        "name": "orders.eu",
        "vhost": vhost,
        "durable": True,
        "auto_delete": False,
        "arguments": {"x-max-length": 5},
    } in document["queues"]
    assert not any(x["name"].startswith("amq.") or not x["name"] for x in document["exchanges"])
    fresh = ThreadBroker(tmp_path / "fresh").start()
    try:
        other = HttpApi(fresh.management_url)
        assert other.post("/api/definitions", document).status == 204
        assert other.get(path("api", "queues", vhost, "orders.eu")).json["arguments"] == {
            "x-max-length": 5
        }
        [binding] = other.get(path("api", "bindings", vhost, "e", "orders", "q", "orders.eu")).json
        assert binding["routing_key"] == "eu.#"
        # The user's password hash came along: the password works there too.
        assert HttpApi(fresh.management_url, "moved", "pw").get("/api/whoami").status == 200
        # Importing again changes nothing and refuses nothing.
        assert other.post("/api/definitions", document).status == 204
    finally:
        fresh.stop()


def test_import_of_rabbitmq_definitions_keeps_rabbitmq_passwords(api, broker):
    user = name("rabbit-user")
    document = {
        "rabbit_version": "3.10.8",
        "users": [
            {
                "name": user,
                # RabbitMQ 3.10's hash of "guest" (rabbit_password_hashing_sha256).
                "password_hash": "3rWMpFLWJKmSDNkbYWv85vxlnDUd49DmNhHDOOdWY+GkqpiF",
                "hashing_algorithm": "rabbit_password_hashing_sha256",
                "tags": ["administrator"],
                "limits": {},
            }
        ],
        "vhosts": [{"name": "/"}],
        "permissions": [
            {"user": user, "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}
        ],
        "policies": [{"vhost": "/", "name": "p", "pattern": ".*", "definition": {"max-length": 1}}],
        "queues": [],
        "exchanges": [],
        "bindings": [],
    }
    assert api.post("/api/definitions", document).status == 204
    assert api.as_user(user, "guest").get("/api/whoami").status == 200
    broker.connect(credentials=pika.PlainCredentials(user, "guest")).close()
    exported = [u for u in api.get("/api/definitions").json["users"] if u["name"] == user]
    assert exported[0]["hashing_algorithm"] == "rabbit_password_hashing_sha256"
    # The module's broker is shared: max-length 1 on every queue of "/" would trim the
    # queues of the tests that follow.
    assert api.delete("/api/policies/%2F/p").status == 204


def test_vhost_definitions(api):
    vhost = add_vhost(api)
    api.put(path("api", "queues", vhost, "kept"), {"durable": True})
    document = api.get(path("api", "definitions", vhost)).json
    assert document["queues"] == [
        {"name": "kept", "durable": True, "auto_delete": False, "arguments": {}}
    ]
    other = add_vhost(api)
    assert api.post(path("api", "definitions", other), document).status == 204
    assert api.get(path("api", "queues", other, "kept")).status == 200
    assert api.post(path("api", "definitions", "no-such-vhost"), document).status == 404


# -- health ---------------------------------------------------------------------------------------


def test_health_checks(api, broker):
    assert api.get("/api/health/checks/alarms").json == {"status": "ok"}
    assert api.get("/api/health/checks/local-alarms").json == {"status": "ok"}
    assert api.get("/api/health/checks/virtual-hosts").json == {"status": "ok"}
    listening = api.get(path("api", "health", "checks", "port-listener", str(broker.port)))
    assert listening.json == {"status": "ok", "port": broker.port}
    missing = api.get("/api/health/checks/port-listener/1")
    assert missing.status == 503 and missing.json["missing"] == 1
    assert broker.port in missing.json["ports"]
    assert api.get("/api/health/checks/port-listener/http").json == {
        "error": "bad_request",
        "reason": "Invalid port",
    }
    assert api.get(path("api", "aliveness-test", "/")).json == {"status": "ok"}
    assert api.get(path("api", "aliveness-test", "nope")).status == 404


# -- lists: sorting, paging, columns --------------------------------------------------------------


def test_pagination_sorting_and_columns(api):
    vhost = add_vhost(api)
    for index in range(5):
        api.put(path("api", "queues", vhost, f"page-{index}"))
    base = path("api", "queues", vhost)
    paged = api.get(base + "?page=2&page_size=2&columns=name").json
    assert {
        key: paged[key]
        for key in ("total_count", "filtered_count", "item_count", "page", "page_count")
    } == {"total_count": 5, "filtered_count": 5, "item_count": 2, "page": 2, "page_count": 3}
    assert paged["items"] == [{"name": "page-2"}, {"name": "page-3"}]
    reverse = api.get(base + "?sort=name&sort_reverse=true&columns=name").json
    assert [q["name"] for q in reverse] == [f"page-{i}" for i in (4, 3, 2, 1, 0)]
    filtered = api.get(base + "?page=1&name=PAGE-[13]&use_regex=true").json
    assert [q["name"] for q in filtered["items"]] == ["page-1", "page-3"]
    assert api.get(base + "?page=0").json["error"] == "invalid_pagination_parameters"
    assert api.get(base + "?page=x").status == 400
    assert api.get(base + "?page=9").json["error"] == "page_out_of_range"
    assert api.get(base + "?page=1&page_size=501").status == 400


# -- bad input ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, reason",
    [
        (b"{not json", "not_json"),
        (b"[1, 2]", "not_json"),
        (
            b'"a string"',
            "invalid payload: the request body JSON-decoded to a string. "
            "Is the input doubly-JSON-encoded?",
        ),
        (b'{"durable": NaN}', "not_json"),
        (b'{"durable": "maybe"}', ["not_boolean", "maybe"]),
        (b'{"arguments": [1]}', "arguments must be an object, got array"),
        (b'{"arguments": {"x-max-length": null}}', "null_not_allowed"),
        (b'{"arguments": {"x-max-length": "ten"}}', None),
        (b"\xff\xfe", "not_json"),
        (b"[" * 20_000 + b"]" * 20_000, "not_json"),
    ],
)
def test_bad_bodies_are_400_with_a_reason_never_500(api, raw, reason):
    reply = api.put(path("api", "queues", "/", name()), raw=raw)
    assert reply.status == 400, reply.raw
    assert reply.json["error"] == "bad_request"
    if reason is not None:
        assert reply.json["reason"] == reason


def test_names_too_long_and_unknown_vhosts(api):
    too_long = "q" * 256
    reply = api.put(path("api", "queues", "/", too_long))
    assert (reply.status, reply.json["reason"]) == (
        400,
        "queue should be less than 255 bytes, actually was 256",
    )
    assert api.put(path("api", "queues", "/", "é" * 128)).status == 400
    assert api.put(path("api", "queues", "/", "q" * 255)).status == 201
    assert api.put(path("api", "exchanges", "/", too_long), {"type": "direct"}).status == 400
    assert api.put(path("api", "vhosts", too_long)).status == 400
    assert api.put(path("api", "users", too_long), {"password": "x", "tags": ""}).status == 400
    assert api.put(path("api", "queues", "no-such-vhost", "q")).json == {
        "error": "not_found",
        "reason": "vhost_not_found",
    }
    assert api.get(path("api", "queues", "no-such-vhost")).json == {
        "error": "Object Not Found",
        "reason": "Not Found",
    }


def test_wrong_types_in_bodies(api):
    assert api.put(path("api", "exchanges", "/", name("x")), {"type": 7}).status == 400
    assert api.put(path("api", "users", name("u")), {"password": "x", "tags": 3}).status == 400
    assert api.put(path("api", "vhosts", name("v")), {"description": ["x"]}).status == 400
    queue = name()
    api.put(path("api", "queues", "/", queue))
    get = {"count": "many", "ackmode": "ack_requeue_true", "encoding": "auto"}
    assert api.post(path("api", "queues", "/", queue, "get"), get).json["reason"] == [
        "not_integer",
        "many",
    ]


def test_a_body_over_the_limit_is_413_json(api):
    reply = api.put(path("api", "queues", "/", name()), raw=b"{" + b" " * (70 * 1024) + b"}")
    assert reply.status == 413
    assert reply.json["error"] == "payload_too_large"


def test_unknown_paths_and_methods(api):
    assert api.get("/api/nope").json == {"error": "Object Not Found", "reason": "Not Found"}
    reply = api.post("/api/overview")
    assert reply.status == 405 and reply.headers["allow"] == "HEAD, GET, OPTIONS"
    assert api.get("/api/queues/%ff").status == 400
    assert api.get("/api/bindings/%2F/e/x/z/q").status == 404


def test_rates_come_from_the_counts_between_requests():
    from warrenmq.server.http.rates import Rates

    now = [100.0]
    rates = Rates(clock=lambda: now[0])

    class Owner:
        pass

    owner = Owner()
    assert rates.of(owner, "messages", (10, 0)) == (0.0, 0.0)
    now[0] += 0.5
    assert rates.of(owner, "messages", (20, 0)) == (0.0, 0.0)
    now[0] += 1.5
    assert rates.of(owner, "messages", (50, 4)) == (20.0, 2.0)
    now[0] += 0.2
    assert rates.of(owner, "messages", (60, 4)) == (20.0, 2.0)
    del owner
    assert len(rates._samples) == 0


def test_json_is_what_rabbitmq_sends(api):
    reply = api.get("/api/whoami")
    assert reply.headers["content-type"].startswith("application/json")
    assert reply.headers["cache-control"] == "no-cache"
    assert json.loads(reply.raw) == {"name": "guest", "tags": ["administrator"]}


def test_message_stats_count_what_amqp_clients_did(api, broker):
    queue = name()
    api.put(path("api", "queues", "/", queue))
    publish_amqp(broker, queue, [b"1", b"2", b"3", b"4"])
    connection = broker.connect()
    channel = connection.channel()
    method, _, _ = channel.basic_get(queue)
    channel.basic_nack(method.delivery_tag, requeue=True)
    method, _, _ = channel.basic_get(queue)
    assert method.redelivered
    channel.basic_ack(method.delivery_tag)
    channel.basic_get(queue, auto_ack=True)
    got = []
    channel.basic_consume(queue, lambda ch, m, p, b: got.append(m.delivery_tag))
    while len(got) < 2:
        connection.process_data_events(0.05)
    channel.basic_ack(got[-1], multiple=True)
    channel.cancel()
    assert channel.basic_get(queue) == (None, None, None)
    queue_stats = api.get(path("api", "queues", "/", queue)).json["message_stats"]
    expected = {
        "publish": 4,
        "get": 2,
        "get_no_ack": 1,
        "get_empty": 1,
        "deliver": 2,
        "deliver_no_ack": 0,
        "deliver_get": 5,
        "ack": 3,
        "redeliver": 1,
    }
    assert {key: queue_stats[key] for key in expected} == expected
    [channel_json] = [
        c for c in api.get("/api/channels").json if c["message_stats"]["get_empty"] == 1
    ]
    channel_stats = channel_json["message_stats"]
    assert {key: channel_stats[key] for key in expected if key != "publish"} == {
        key: value for key, value in expected.items() if key != "publish"
    }
    connection.close()


def test_a_user_exported_without_a_password_imports_without_one(api):
    user = name("no-password")
    document = {"users": [{"name": user, "password_hash": "", "tags": "management"}]}
    assert api.post("/api/definitions", document).status == 204
    assert api.get(path("api", "users", user)).json["tags"] == ["management"]
    assert api.as_user(user, "").get("/api/whoami").status == 401


def test_head_and_options(api):
    head = api.request("HEAD", "/api/overview")
    assert (head.status, head.raw) == (200, b"")
    options = api.request("OPTIONS", path("api", "queues", "/", "q"))
    assert options.headers["allow"] == "HEAD, GET, PUT, DELETE, OPTIONS"


def test_exchange_to_exchange_bindings(api):
    source, destination, queue = name("src"), name("dst"), name()
    api.put(path("api", "exchanges", "/", source), {"type": "direct"})
    api.put(path("api", "exchanges", "/", destination), {"type": "fanout"})
    api.put(path("api", "queues", "/", queue))
    api.post(path("api", "bindings", "/", "e", destination, "q", queue), {})
    between = path("api", "bindings", "/", "e", source, "e", destination)
    assert api.post(between, {"routing_key": "k"}).status == 201
    [binding] = api.get(between).json
    assert binding["destination_type"] == "exchange"
    assert api.get(path("api", "exchanges", "/", destination, "bindings", "destination")).json == [
        binding
    ]
    assert [
        b["destination"]
        for b in api.get(path("api", "exchanges", "/", source, "bindings", "source")).json
    ] == [destination]
    publish = {"routing_key": "k", "properties": {}, "payload": "via", "payload_encoding": "string"}
    assert api.post(path("api", "exchanges", "/", source, "publish"), publish).json == {
        "routed": True
    }
    assert api.get(path("api", "queues", "/", queue)).json["messages"] == 1
    assert (
        api.delete(path("api", "bindings", "/", "e", source, "e", destination, "k")).status == 204
    )
    assert api.get(between).json == []

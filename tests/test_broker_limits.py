"""Vhost and user limits, and consumers per channel, on a running broker: each at the limit and
one past it, with the reply code and text RabbitMQ 3.10.8 sends (rabbit_reader, rabbit_channel),
set through /api/vhost-limits and /api/user-limits as rabbitmqadmin sets them."""

from __future__ import annotations

import pytest
from http_api import HttpApi, add_user, name, path
from pamqp import commands
from raw_amqp import RawClient

from warrenmq.server import admin_cli

CONSUMERS_PER_CHANNEL_MAX = 3


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    from brokers import ThreadBroker

    running = ThreadBroker(
        tmp_path_factory.mktemp("broker"), consumers_per_channel_max=CONSUMERS_PER_CHANNEL_MAX
    ).start()
    yield running
    running.stop()


@pytest.fixture
def api(broker):
    return HttpApi(broker.management_url)


@pytest.fixture
def clients(broker):
    """A factory of raw clients to the broker, all closed after the test."""
    opened: list[RawClient] = []

    def connect() -> RawClient:
        client = RawClient("127.0.0.1", broker.port)
        opened.append(client)
        return client

    yield connect
    for client in opened:
        client.close()


@pytest.fixture
def vhost(api):
    """A fresh vhost guest may use (its creator), deleted after the test."""
    vhost = name("limits")
    assert api.put(path("api", "vhosts", vhost), {}).status == 201
    yield vhost
    api.delete(path("api", "vhosts", vhost))


def refused_open(client: RawClient, **login) -> commands.Connection.Close:
    """The connection.close that answers connection.open."""
    _, answer = client.open_connection(**login)
    assert isinstance(answer, commands.Connection.Close), answer
    return answer


def test_vhost_max_connections_at_the_limit_and_one_past_it(api, clients, vhost):
    assert (
        api.put(path("api", "vhost-limits", vhost, "max-connections"), {"value": 2}).status == 204
    )
    first, second = clients(), clients()
    first.handshake(vhost=vhost)
    second.handshake(vhost=vhost)
    close = refused_open(clients(), vhost=vhost)
    assert close.reply_code == 530
    assert close.reply_text == (
        f"NOT_ALLOWED - access to vhost '{vhost}' refused for user 'guest': "
        "connection limit (2) is reached"
    )
    assert (close.class_id, close.method_id) == (10, 40)
    clients().handshake()  # other vhosts are not limited
    first.send(0, commands.Connection.Close(200, "", 0, 0))
    first.expect(commands.Connection.CloseOk)
    first.close()
    clients().handshake(vhost=vhost)  # a freed place is taken again


def test_vhost_max_connections_zero_refuses_every_connection(api, clients, vhost):
    assert (
        api.put(path("api", "vhost-limits", vhost, "max-connections"), {"value": 0}).status == 204
    )
    assert refused_open(clients(), vhost=vhost).reply_code == 530


def test_user_max_connections_at_the_limit_and_one_past_it(api, clients):
    user_api = add_user(api, "", {"/": (".*", ".*", ".*")})
    user = user_api.user
    assert api.put(path("api", "user-limits", user, "max-connections"), {"value": 1}).status == 204
    clients().handshake(user=user, password="pw")
    close = refused_open(clients(), user=user, password="pw")
    assert close.reply_code == 530
    assert close.reply_text == (
        f"NOT_ALLOWED - connection refused for user '{user}': user connection limit (1) is reached"
    )
    clients().handshake()  # guest is not limited


def test_user_max_channels_count_every_connection_of_the_user(api, clients):
    user_api = add_user(api, "", {"/": (".*", ".*", ".*")})
    user = user_api.user
    assert api.put(path("api", "user-limits", user, "max-channels"), {"value": 2}).status == 204
    first, second = clients(), clients()
    first.handshake(user=user, password="pw")
    second.handshake(user=user, password="pw")
    first.open_channel(1)
    second.open_channel(7)
    first.send(2, commands.Channel.Open())
    # Refused before the channel exists: no open-ok, and ids 0 (rabbit_reader:create_channel).
    _, close = first.expect(commands.Connection.Close)
    assert close.reply_code == 530
    assert close.reply_text == (
        f"NOT_ALLOWED - number of channels opened for user '{user}' has reached the maximum "
        "allowed user limit of (2)"
    )
    assert (close.class_id, close.method_id) == (0, 0)
    # The refused connection's channel is gone: the second connection may open one more.
    second.open_channel(8)


def test_vhost_max_queues_at_the_limit_and_one_past_it(api, clients, vhost):
    assert api.put(path("api", "vhost-limits", vhost, "max-queues"), {"value": 2}).status == 204
    client = clients()
    client.handshake(vhost=vhost)
    client.open_channel(1)
    for queue in ("a", "b", "b"):
        client.send(1, commands.Queue.Declare(queue=queue))
        client.expect(commands.Queue.DeclareOk)
    client.send(1, commands.Queue.Declare(queue="c"))
    close = client.expect_channel_close(1)
    assert close.reply_code == 406
    assert close.reply_text == (
        f"PRECONDITION_FAILED - cannot declare queue 'c': queue limit in vhost '{vhost}' (2) "
        "is reached"
    )
    assert (close.class_id, close.method_id) == (50, 10)


def test_consumers_per_channel_at_the_limit_and_one_past_it(clients):
    client = clients()
    client.handshake()
    client.open_channel(1)
    client.send(1, commands.Queue.Declare(queue="", exclusive=True))
    _, declared = client.expect(commands.Queue.DeclareOk)
    for index in range(CONSUMERS_PER_CHANNEL_MAX):
        client.send(1, commands.Basic.Consume(queue=declared.queue, consumer_tag=f"c{index}"))
        client.expect(commands.Basic.ConsumeOk)
    client.open_channel(2)  # the limit is per channel
    client.send(2, commands.Basic.Consume(queue=declared.queue, consumer_tag="other"))
    client.expect(commands.Basic.ConsumeOk)
    client.send(1, commands.Basic.Consume(queue=declared.queue, consumer_tag="one-more"))
    close = client.expect_connection_close()
    assert close.reply_code == 530
    assert close.reply_text == (
        f"NOT_ALLOWED - reached maximum ({CONSUMERS_PER_CHANNEL_MAX}) of consumers per channel"
    )


def test_limits_api_lists_sets_refuses_and_clears(api, vhost):
    limit = path("api", "vhost-limits", vhost, "max-queues")
    assert api.put(limit, {"value": 5}).status == 204
    assert (
        api.put(path("api", "vhost-limits", vhost, "max-connections"), {"value": 1}).status == 204
    )
    listed = api.get(path("api", "vhost-limits", vhost)).json
    assert listed == [{"vhost": vhost, "value": {"max-connections": 1, "max-queues": 5}}]
    assert {"vhost": vhost, "value": {"max-connections": 1, "max-queues": 5}} in api.get(
        "/api/vhost-limits"
    ).json
    bad = api.put(limit, {"value": "many"})
    assert bad.status == 400
    assert bad.json["reason"] == (
        'Validation failed\n\nmax-queues should be a number, actually was <<"many">>\n'
    )
    assert api.put(path("api", "vhost-limits", vhost, "max-fun"), {"value": 1}).status == 400
    assert api.put(limit, {}).status == 400
    assert api.delete(limit).status == 204
    assert api.delete(limit).status == 404
    assert api.get(path("api", "vhost-limits", vhost)).json == [
        {"vhost": vhost, "value": {"max-connections": 1}}
    ]
    assert (
        api.put(path("api", "vhost-limits", "no-such-vhost", "max-queues"), {"value": 1}).status
        == 404
    )
    user_limit = path("api", "user-limits", "guest", "max-channels")
    assert api.put(user_limit, {"value": 100}).status == 204
    assert api.get("/api/user-limits/guest").json == [
        {"user": "guest", "value": {"max-channels": 100}}
    ]
    assert api.delete(user_limit).status == 204
    assert all(item["user"] != "guest" for item in api.get("/api/user-limits").json)


def test_only_an_administrator_sets_limits(api, vhost):
    monitor = add_user(api, "monitoring", {vhost: (".*", ".*", ".*")})
    assert monitor.put(path("api", "vhost-limits", vhost, "max-queues"), {"value": 1}).status == 401
    assert monitor.get("/api/user-limits").status == 401
    assert monitor.get(path("api", "vhost-limits", vhost)).status == 200


def test_cli_sets_and_clears_limits_through_the_api(broker, api, vhost, capsys):
    url = ["--url", broker.management_url]
    assert admin_cli.run(["vhosts", "set-limits", vhost, '{"max-queues": 4}', *url]) == 0
    assert api.get(path("api", "vhost-limits", vhost)).json == [
        {"vhost": vhost, "value": {"max-queues": 4}}
    ]
    # Replaces every limit, as rabbitmqctl set_vhost_limits does.
    assert admin_cli.run(["vhosts", "set-limits", vhost, '{"max-connections": 9}', *url]) == 0
    assert api.get(path("api", "vhost-limits", vhost)).json == [
        {"vhost": vhost, "value": {"max-connections": 9}}
    ]
    assert admin_cli.run(["vhosts", "clear-limits", vhost, *url]) == 0
    assert api.get(path("api", "vhost-limits", vhost)).json == []
    capsys.readouterr()
    assert admin_cli.run(["users", "set-limits", "guest", '{"max-queues": 1}', *url]) == 1
    assert "Unrecognised terms" in capsys.readouterr().err
    assert admin_cli.run(["vhosts", "set-limits", "no-such", '{"max-queues": 1}', *url]) == 1
    assert capsys.readouterr().err == "Error: no vhost 'no-such'\n"

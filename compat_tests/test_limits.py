"""Vhost limits set over the management API (PUT /api/vhost-limits/{vhost}/{name}), at the
limit and one past it: the refusals' codes and texts are RabbitMQ's."""

from __future__ import annotations

import pytest
from management_client import path
from pamqp import commands
from raw_client import RawClient


@pytest.fixture
def limited_vhost(management, uid):
    """A vhost guest may use (as its creator), deleted after the test."""
    assert management.put(path("api", "vhosts", uid), {}).status in (201, 204)
    granted = {"configure": ".*", "write": ".*", "read": ".*"}
    assert management.put(path("api", "permissions", uid, "guest"), granted).status in (201, 204)
    yield uid
    management.delete(path("api", "vhosts", uid))


def test_vhost_connection_limit(broker, management, limited_vhost):
    limit = path("api", "vhost-limits", limited_vhost, "max-connections")
    assert management.put(limit, {"value": 1}).status == 204
    with (
        RawClient(broker.host, broker.port) as first,
        RawClient(broker.host, broker.port) as second,
    ):
        first.handshake(vhost=limited_vhost)
        _, refused = second.open_connection(vhost=limited_vhost)
        assert isinstance(refused, commands.Connection.Close), refused
        assert refused.reply_code == 530
        assert refused.reply_text == (
            f"NOT_ALLOWED - access to vhost '{limited_vhost}' refused for user 'guest': "
            "connection limit (1) is reached"
        )


def test_vhost_queue_limit(broker, management, limited_vhost):
    limit = path("api", "vhost-limits", limited_vhost, "max-queues")
    assert management.put(limit, {"value": 1}).status == 204
    listed = management.get(path("api", "vhost-limits", limited_vhost)).json
    assert listed == [{"vhost": limited_vhost, "value": {"max-queues": 1}}]
    with RawClient(broker.host, broker.port) as client:
        client.handshake(vhost=limited_vhost)
        client.open_channel(1)
        client.send(1, commands.Queue.Declare(queue="first"))
        client.expect(commands.Queue.DeclareOk)
        client.send(1, commands.Queue.Declare(queue="second"))
        close = client.expect_channel_close(1)
        assert close.reply_code == 406
        assert close.reply_text == (
            f"PRECONDITION_FAILED - cannot declare queue 'second': queue limit in vhost "
            f"'{limited_vhost}' (1) is reached"
        )


@pytest.fixture
def limited_user(management, uid):
    """A user with full permissions on "/", deleted after the test."""
    user = f"{uid}-user"
    assert management.put(path("api", "users", user), {"password": "pw", "tags": ""}).status == 201
    granted = {"configure": ".*", "write": ".*", "read": ".*"}
    assert management.put(path("api", "permissions", "/", user), granted).status in (201, 204)
    yield user
    management.delete(path("api", "users", user))


def test_user_connection_and_channel_limits(broker, management, limited_user):
    limits = path("api", "user-limits", limited_user)
    assert management.put(f"{limits}/max-connections", {"value": 1}).status == 204
    assert management.put(f"{limits}/max-channels", {"value": 1}).status == 204
    login = {"user": limited_user, "password": "pw"}
    with (
        RawClient(broker.host, broker.port) as first,
        RawClient(broker.host, broker.port) as second,
    ):
        first.handshake(**login)
        _, refused = second.open_connection(**login)
        assert isinstance(refused, commands.Connection.Close), refused
        assert refused.reply_code == 530
        assert refused.reply_text == (
            f"NOT_ALLOWED - connection refused for user '{limited_user}': "
            "user connection limit (1) is reached"
        )
        first.open_channel(1)
        first.send(2, commands.Channel.Open())
        # Refused before the channel exists: no open-ok first, and ids 0.
        _, close = first.expect(commands.Connection.Close)
        assert close.reply_code == 530
        assert close.reply_text == (
            f"NOT_ALLOWED - number of channels opened for user '{limited_user}' has reached the "
            "maximum allowed user limit of (1)"
        )
        assert (close.class_id, close.method_id) == (0, 0)

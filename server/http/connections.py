"""/api/connections, /api/channels and /api/consumers: the AMQP clients, read as they are,
every node's (`node_views`: each lists its own clients, with its "node"), and closing one
asks every node to close it where it is.

Names are RabbitMQ's: a connection is "PEER_HOST:PEER_PORT -> HOST:PORT", a channel is its
connection's name and " (N)". Monitoring users see everyone's; other users see their own
only. DELETE /api/connections/NAME closes a connection with 320 CONNECTION_FORCED and the
text of the X-Reason header, or "Closed via management plugin" (administrators, or the
connection's own user).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from warrenmq.amqp import replies
from warrenmq.server.queue.consumer import Consumer

from .api import Call, ManagementApi, no_content
from .errors import not_authorised, object_not_found
from .host import ClientChannel, ClientConnection
from .node_views import ClusterView, cluster_view, node_view
from .stats import CHANNEL_STATS, channel_counts, detailed
from .values import to_json

CLOSED_BY_API = "Closed via management plugin"
DEFAULT_SORT = ("vhost", "name")
NOT_AUTHORISED_FOR_OBJECT = "User not authorised to access object"


def _address(address: Any) -> tuple[str, int]:
    if isinstance(address, tuple) and len(address) >= 2:
        return str(address[0]), int(address[1])
    return "?", 0


def local_address(connection: ClientConnection) -> tuple[str, int]:
    transport = connection.transport
    return _address(transport.get_extra_info("sockname") if transport is not None else None)


def connection_name(connection: ClientConnection) -> str:
    host, port = local_address(connection)
    return f"{connection.peer[0]}:{connection.peer[1]} -> {host}:{port}"


def open_connections(api: ManagementApi) -> list[ClientConnection]:
    """Connections past connection.open (a vhost and a user): those RabbitMQ lists as running."""
    return [c for c in list(api.host.connections) if c.vhost is not None]


def connection_state(api: ManagementApi, connection: ClientConnection) -> str:
    """rabbit_reader's: "blocked" once it published during an alarm, "blocking" while an
    alarm is in effect and it has not published, "flow" while its output is paused."""
    if connection.blocked:
        return "blocked"
    if api.host.resources.alarms:
        return "blocking"
    return "running" if connection.writable else "flow"


def connection_json(api: ManagementApi, connection: ClientConnection) -> dict[str, Any]:
    amqp = connection.amqp
    host, port = local_address(connection)
    item: dict[str, Any] = {
        "name": connection_name(connection),
        "node": api.node,
        "vhost": connection.vhost.name if connection.vhost is not None else None,
        "user": connection.username,
        "user_who_performed_action": connection.username,
        "state": connection_state(api, connection),
        "channels": len(connection.channels),
        "protocol": "AMQP 0-9-1",
        "auth_mechanism": amqp.mechanism,
        "host": host,
        "port": port,
        "peer_host": connection.peer[0],
        "peer_port": connection.peer[1],
        "ssl": connection.transport is not None
        and connection.transport.get_extra_info("ssl_object") is not None,
        "type": "network",
        "timeout": amqp.heartbeat_s,
        "frame_max": amqp.frame_bytes_max,
        "channel_max": amqp.channel_max,
        "client_properties": to_json(amqp.client_properties),
    }
    item.update(
        detailed(
            api.rates,
            connection,
            "bytes",
            ("recv_oct", "send_oct"),
            (connection.received_bytes, connection.sent_bytes),
        )
    )
    return item


def channel_json(
    api: ManagementApi, connection: ClientConnection, channel: ClientChannel
) -> dict[str, Any]:
    name = connection_name(connection)
    wire = channel.wire
    return {
        "name": f"{name} ({channel.number})",
        "number": channel.number,
        "node": api.node,
        "user": connection.username,
        "user_who_performed_action": connection.username,
        "vhost": connection.vhost.name if connection.vhost is not None else None,
        "connection_details": {
            "name": name,
            "peer_host": connection.peer[0],
            "peer_port": connection.peer[1],
        },
        "confirm": wire.confirm_mode,
        "transactional": wire.tx_mode,
        "consumer_count": len(channel.consumers),
        "messages_unacknowledged": len(channel.unacked),
        "messages_unconfirmed": (
            wire.publish_seq - channel.confirmed_through if wire.confirm_mode else 0
        ),
        "messages_uncommitted": len(channel.tx_publishes),
        "acks_uncommitted": sum(len(taken) for taken, _ in channel.tx_settles),
        "prefetch_count": channel.consumer_prefetch,
        "global_prefetch_count": channel.global_prefetch,
        "state": "running" if channel.flow_active else "flow",
        "message_stats": detailed(
            api.rates, channel, "messages", CHANNEL_STATS, channel_counts(channel.counts)
        ),
    }


def consumer_json(api: ManagementApi, vhost: str, queue: str, consumer: Consumer) -> dict:
    channel: Any = consumer.channel
    connection = channel.connection
    name = connection_name(connection)
    single_active = getattr(consumer.queue, "single_active", False)
    active = not single_active or next(iter(consumer.queue.consumers.values())) is consumer
    return {
        "consumer_tag": consumer.tag,
        "queue": {"name": queue, "vhost": vhost},
        "channel_details": {
            "name": f"{name} ({channel.number})",
            "number": channel.number,
            "connection_name": name,
            "peer_host": connection.peer[0],
            "peer_port": connection.peer[1],
            "user": connection.username,
            "node": api.node,
        },
        "ack_required": not consumer.no_ack,
        "exclusive": consumer.exclusive,
        "prefetch_count": consumer.prefetch_count,
        "arguments": {"x-priority": consumer.priority} if consumer.priority else {},
        "active": active,
        "activity_status": "up" if active else "waiting",
    }


def _local(api: ManagementApi, argument: dict[str, Any]) -> list[ClientConnection]:
    """This node's connections in ``argument["vhost"]`` (any, if None) of
    ``argument["user"]`` (anyone's, if None)."""
    vhost, user = argument["vhost"], argument["user"]
    return [
        c
        for c in open_connections(api)
        if (user is None or c.username == user)
        and (vhost is None or (c.vhost is not None and c.vhost.name == vhost))
    ]


@node_view("connections")
def local_connections(api: ManagementApi, argument: dict[str, Any]) -> list[dict[str, Any]]:
    return [connection_json(api, c) for c in _local(api, argument)]


@node_view("channels")
def local_channels(api: ManagementApi, argument: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        channel_json(api, connection, channel)
        for connection in _local(api, argument)
        for channel in list(connection.channels.values())
    ]


@node_view("consumers")
def local_consumers(api: ManagementApi, argument: dict[str, Any]) -> list[dict[str, Any]]:
    """This node's clients' consumers (of ``argument["queue"]`` only, if given): a consumer
    is listed by the node its client is connected to, wherever its queue is."""
    queue = argument.get("queue")
    listed = []
    for connection in _local(api, argument):
        for channel in list(connection.channels.values()):
            for consumer in list(channel.consumers.values()):
                source: Any = consumer.queue
                if queue is None or source.name == queue:
                    listed.append(consumer_json(api, source.vhost, source.name, consumer))
    return listed


async def listed(
    call: Call, view: str, **argument: Any
) -> tuple[list[dict[str, Any]], ClusterView]:
    """Every node's part of `view` (`connections`, `channels`, `consumers`) the caller may
    see: in the path's vhost (404 if it does not exist), everyone's for a monitor."""
    vhost = call.vhost_name()
    if vhost is not None:
        call.vhost()
    user = None if call.caller.is_monitor else call.caller.name
    answered = await cluster_view(call.api, view, {"vhost": vhost, "user": user, **argument})
    return [item for part in answered.parts for item in part], answered


async def list_connections(call: Call) -> web.Response:
    items, view = await listed(call, "connections")
    return view.mark(call.listing(items, DEFAULT_SORT, pageable=True))


async def _named(call: Call, view: str, key: str) -> dict[str, Any]:
    """The connection or channel the path names, on whichever node (404 if none has it, 401
    if the caller may not see it)."""
    name = call.params[key]
    answered = await cluster_view(call.api, view, {"vhost": None, "user": None})
    for item in (item for part in answered.parts for item in part):
        if item["name"] == name:
            if not (call.caller.is_monitor or item["user"] == call.caller.name):
                raise not_authorised(NOT_AUTHORISED_FOR_OBJECT)
            return item
    raise object_not_found()


async def get_connection(call: Call) -> web.Response:
    return call.one(await _named(call, "connections", "connection"))


CLOSED, REFUSED = "closed", "refused"


@node_view("close-connection")
def close_local_connection(api: ManagementApi, argument: dict[str, Any]) -> str | None:
    """Close the connection ``argument["name"]`` if it is this node's: CLOSED, REFUSED when
    ``argument["user"]`` (None: an administrator) may not, None when it is not here."""
    for connection in open_connections(api):
        if connection_name(connection) == argument["name"]:
            if argument["user"] not in (None, connection.username):
                return REFUSED
            connection.close(replies.CONNECTION_FORCED, argument["reason"])
            return CLOSED
    return None


async def close_connection(call: Call) -> web.Response:
    user = None if call.caller.is_admin else call.caller.name
    reason = call.request.headers.get("X-Reason") or CLOSED_BY_API
    argument = {"name": call.params["connection"], "user": user, "reason": reason}
    answered = await cluster_view(call.api, "close-connection", argument)
    if CLOSED in answered.parts:
        return no_content()
    if REFUSED in answered.parts:
        raise not_authorised(NOT_AUTHORISED_FOR_OBJECT)
    raise object_not_found()


async def list_connection_channels(call: Call) -> web.Response:
    connection = await _named(call, "connections", "connection")
    items, view = await listed(call, "channels")
    mine = [item for item in items if item["connection_details"]["name"] == connection["name"]]
    return view.mark(call.listing(mine, DEFAULT_SORT, pageable=True))


async def list_channels(call: Call) -> web.Response:
    items, view = await listed(call, "channels")
    return view.mark(call.listing(items, DEFAULT_SORT, pageable=True))


async def get_channel(call: Call) -> web.Response:
    return call.one(await _named(call, "channels", "channel"))


async def list_consumers(call: Call) -> web.Response:
    items, view = await listed(call, "consumers")
    return view.mark(call.listing(items, ("queue.vhost", "queue.name", "consumer_tag")))

"""/api/vhosts: list (what the caller may see), show, create (PUT) and delete, through the
metadata commands; the broker then hosts (or drops) the vhost as it does for a change made
by ``warren vhosts``. A vhost's description and tags are set when it is created, and its
creator gets full permissions on it, as in RabbitMQ.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from warrenmq.server.metadata import DeclareVhost, DeleteVhost, SetPermissions

from .api import Call, ManagementApi, core, created, no_content
from .errors import bad_request, object_not_found
from .stats import (
    CHANNEL_STATS,
    DEPTHS,
    PUBLISHER_STATS,
    QUEUE_STATS,
    channel_counts,
    detailed,
    queue_counts,
    totals,
)
from .values import json_type

DEFAULT_SORT = ("name",)
# A vhost's message_stats: its channels' publisher counts, then its queues' counts.
VHOST_STATS = (*PUBLISHER_STATS, *QUEUE_STATS[1:])


def vhost_json(api: ManagementApi, name: str) -> dict[str, Any]:
    record = api.state.vhosts[name]
    item: dict[str, Any] = {
        "name": name,
        "description": record.description,
        "tags": list(record.tags),
        "metadata": {"description": record.description, "tags": list(record.tags)},
        "tracing": False,
        "cluster_state": {api.node: "running"},
    }
    vhost = api.host.vhosts.get(name)
    if vhost is None:
        return item
    queues = list(vhost.queues.values())
    ready = sum(queue.engine.ready_count for queue in queues)
    unacked = sum(queue.engine.unacked_count for queue in queues)
    item.update(detailed(api.rates, vhost, "depths", DEPTHS, (ready + unacked, ready, unacked)))
    channels = [
        channel
        for connection in list(api.host.connections)
        if connection.vhost is vhost
        for channel in connection.channels.values()
    ]
    published = totals((channel_counts(c.counts) for c in channels), len(CHANNEL_STATS))
    handled = totals((queue_counts(q.counts) for q in queues), len(QUEUE_STATS))
    values = (*published[: len(PUBLISHER_STATS)], *handled[1:])
    item["message_stats"] = detailed(api.rates, vhost, "messages", VHOST_STATS, values)
    return item


async def list_vhosts(call: Call) -> web.Response:
    items = [vhost_json(call.api, name) for name in call.caller.visible_vhosts(call.state)]
    return call.listing(items, DEFAULT_SORT, pageable=True)


async def get_vhost(call: Call) -> web.Response:
    name = call.params["vhost"]
    if name not in call.state.vhosts:
        raise object_not_found()
    return call.one(vhost_json(call.api, name))


def _tags(value: Any) -> tuple[str, ...]:
    """Tags as a list of strings, or one comma-separated string (rabbit_vhost:put_vhost)."""
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(tag.strip() for tag in value.split(",") if tag.strip())
    if isinstance(value, list) and all(isinstance(tag, str) for tag in value):
        return tuple(tag.strip() for tag in value if tag.strip())
    raise bad_request(f"tags must be a string or a list of strings, got {json_type(value)}")


async def put_vhost(call: Call) -> web.Response:
    name = call.params["vhost"]
    body = await call.body()
    description = body.get("description", "")
    if not isinstance(description, str):
        raise bad_request(f"description must be a string, got {json_type(description)}")
    tags = _tags(body.get("tags"))
    existing = call.state.vhosts.get(name)
    if existing is not None:
        if ("description" in body and description != existing.description) or (
            "tags" in body and tags != existing.tags
        ):
            raise bad_request(f"vhost '{name}' exists: its description and tags are kept")
        return no_content()
    # RabbitMQ grants whoever creates a vhost full permissions on it.
    grant = SetPermissions(call.caller.name, name, ".*", ".*", ".*")
    await core(call.api.store.apply_all([DeclareVhost(name, description, tags), grant]))
    call.api.host.sync_vhosts()
    return created()


async def delete_vhost(call: Call) -> web.Response:
    name = call.params["vhost"]
    if name not in call.state.vhosts:
        raise object_not_found()
    await core(call.api.store.apply(DeleteVhost(name)))
    call.api.host.sync_vhosts()
    return no_content()

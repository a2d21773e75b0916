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
from .connections import open_connections
from .errors import bad_request, object_not_found
from .node_views import ClusterView, cluster_view, node_view
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


def vhost_json(api: ManagementApi, name: str, figures: dict[str, Any] | None) -> dict[str, Any]:
    """A vhost, with its figures summed over the cluster (`cluster_totals`) when given."""
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
    if vhost is None or figures is None:
        return item
    ready, unacked = figures["ready"], figures["unacked"]
    item.update(detailed(api.rates, vhost, "depths", DEPTHS, (ready + unacked, ready, unacked)))
    values = (*figures["published"], *figures["handled"][1:])
    item["message_stats"] = detailed(api.rates, vhost, "messages", VHOST_STATS, values)
    return item


@node_view("vhost_totals")
def local_totals(api: ManagementApi, argument: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """This node's figures of each vhost in ``argument["vhosts"]``: its queues' depths,
    consumers and counters, and its connections (only ``argument["user"]``'s, if given),
    their channels and those channels' publisher counters."""
    user = argument["user"]
    connections = [c for c in open_connections(api) if user is None or c.username == user]
    part = {}
    for name in argument["vhosts"]:
        vhost = api.host.vhosts.get(name)
        if vhost is None:
            continue
        queues = list(vhost.queues.values())
        here = [c for c in connections if c.vhost is vhost]
        channels = [channel for c in here for channel in list(c.channels.values())]
        published = totals((channel_counts(c.counts) for c in channels), len(CHANNEL_STATS))
        part[name] = {
            "ready": sum(queue.engine.ready_count for queue in queues),
            "unacked": sum(queue.engine.unacked_count for queue in queues),
            "consumers": sum(queue.consumer_count for queue in queues),
            "connections": len(here),
            "channels": len(channels),
            "published": list(published[: len(PUBLISHER_STATS)]),
            "handled": list(totals((queue_counts(q.counts) for q in queues), len(QUEUE_STATS))),
        }
    return part


def _added(figures: dict[str, Any], more: dict[str, Any]) -> dict[str, Any]:
    return {
        key: [a + b for a, b in zip(value, more[key], strict=True)]
        if isinstance(value, list)
        else value + more[key]
        for key, value in figures.items()
    }


async def cluster_totals(
    api: ManagementApi, vhosts: list[str], user: str | None
) -> tuple[dict[str, dict[str, Any]], ClusterView]:
    """Each vhost's figures (`local_totals`) summed over the nodes that answered."""
    view = await cluster_view(api, "vhost_totals", {"vhosts": vhosts, "user": user})
    summed: dict[str, dict[str, Any]] = {}
    for part in view.parts:
        for name, figures in part.items():
            summed[name] = _added(summed[name], figures) if name in summed else figures
    return summed, view


async def list_vhosts(call: Call) -> web.Response:
    names = call.caller.visible_vhosts(call.state)
    figures, view = await cluster_totals(call.api, names, None)
    items = [vhost_json(call.api, name, figures.get(name)) for name in names]
    return view.mark(call.listing(items, DEFAULT_SORT, pageable=True))


async def get_vhost(call: Call) -> web.Response:
    name = call.params["vhost"]
    if name not in call.state.vhosts:
        raise object_not_found()
    figures, view = await cluster_totals(call.api, [name], None)
    return view.mark(call.one(vhost_json(call.api, name, figures.get(name))))


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

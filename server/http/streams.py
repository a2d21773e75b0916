"""Streams over HTTP (Warren's; `warren streams …` calls these): the streams of a vhost with
their retained offsets and tracked offsets, the super streams with their partitions, and the
creation of a super stream.

    GET /api/streams[/{vhost}]                  every stream (queue of type stream) of every
                                                node, with the "node" that leads it; paged
                                                and filtered by name as /api/queues is
    GET /api/streams/{vhost}/{name}             one stream, its tracked offsets with their
                                                lag, from the node that leads it
    GET /api/groups[/{vhost}]                   consumer groups: members, assignments,
                                                committed offsets and lag per partition
    GET /api/super-streams[/{vhost}]            every super stream exchange and its partitions
    PUT /api/super-streams/{vhost}/{name}       {"partitions": N}: 201 created, 204 existed
    DELETE /api/super-streams/{vhost}/{name}    the exchange and its partition streams

Creating one needs configure permission on the exchange and on every partition.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from typing import Any

from aiohttp import web

from warrenmq.exchanges.binding import EXCHANGE, QUEUE
from warrenmq.exchanges.super_stream import SUPER_STREAM, SuperStreamExchange
from warrenmq.server.stream.groups import GROUP_TAG_PREFIX, group_tag
from warrenmq.server.stream.stream import Stream
from warrenmq.server.stream.super_stream import (
    PARTITIONS_ARGUMENT,
    PARTITIONS_MAX,
)

from .api import Call, ManagementApi, core, created, no_content, vhost_missing
from .errors import bad_request, not_authorised, object_not_found
from .node_views import cluster_view, node_view
from .stats import QUEUE_STATS, detailed, queue_counts
from .values import to_json

DEFAULT_SORT = ("vhost", "name")


def stream_json(api: ManagementApi, vhost: str, stream: Stream) -> dict[str, Any]:
    """A stream's offsets, storage, consumers and retention. `messages`, `segments`,
    `consumers`, `arguments` and `message_stats` are named as RabbitMQ's /api/queues names
    them for a stream; the retention limits are the effective ones (declared or a policy's)."""
    log = stream.log
    config = log.config
    return {
        "name": stream.name,
        "vhost": vhost,
        "node": api.node,
        "type": stream.queue_type,
        "first_offset": log.start_offset,
        "last_offset": log.end_offset - 1 if log.end_offset > log.start_offset else None,
        "next_offset": log.end_offset,
        "messages": log.end_offset - log.start_offset,
        "bytes": log.size_bytes,
        "segments": log.segment_count,
        "consumers": stream.consumer_count,
        "tracked_offsets": dict(stream.tracked.items()),
        "producers": len(dict(stream.producers.items())),
        "duplicates_dropped": stream.producers.duplicates,
        "arguments": to_json(stream.arguments),
        "max_age_ms": stream.retention_ms,
        "max_length_bytes": config.retention_bytes,
        "max_segment_size_bytes": config.segment_bytes_max,
        "message_stats": detailed(
            api.rates, stream, "messages", QUEUE_STATS, queue_counts(stream.counts)
        ),
    }


def _local_stream(api: ManagementApi, vhost: str, name: str) -> Stream | None:
    served = api.host.vhosts.get(vhost)
    stream = served.queues.get(name) if served is not None else None
    return stream if isinstance(stream, Stream) else None


@node_view("streams")
def local_streams(api: ManagementApi, argument: dict[str, Any]) -> list[dict[str, Any]]:
    """The streams this node leads in ``argument["vhosts"]``."""
    listed = []
    for name in argument["vhosts"]:
        vhost = api.host.vhosts.get(name)
        if vhost is not None:
            listed += [
                stream_json(api, name, queue)
                for queue in list(vhost.queues.values())
                if isinstance(queue, Stream)
            ]
    return listed


@node_view("stream")
def local_stream(api: ManagementApi, argument: dict[str, Any]) -> dict[str, Any] | None:
    """The stream ``argument["name"]`` of ``argument["vhost"]`` with the lag of each tracked
    offset (the messages from it to the end), if this node leads it."""
    stream = _local_stream(api, argument["vhost"], argument["name"])
    if stream is None:
        return None
    item = stream_json(api, argument["vhost"], stream)
    item["tracked_offset_lags"] = {
        tag: stream.lag(offset) for tag, offset in stream.tracked.items()
    }
    return item


async def list_streams(call: Call) -> web.Response:
    answered = await cluster_view(call.api, "streams", {"vhosts": call.vhosts()})
    items = [item for part in answered.parts for item in part]
    return answered.mark(call.listing(items, DEFAULT_SORT, pageable=True))


async def get_stream(call: Call) -> web.Response:
    argument = {"vhost": call.vhost().name, "name": call.params["name"]}
    item = local_stream(call.api, argument)
    if item is not None:
        return call.one(item)
    answered = await cluster_view(call.api, "stream", argument)
    for part in answered.parts:
        if part is not None:
            return answered.mark(call.one(part))
    raise object_not_found()


async def list_super_streams(call: Call) -> web.Response:
    items = []
    for name in call.vhosts():
        for exchange in call.state.router(name).exchanges():
            if isinstance(exchange.table, SuperStreamExchange):
                items.append(
                    {
                        "name": exchange.name,
                        "vhost": name,
                        "partitions": [d.name for d in exchange.table.partitions()],
                    }
                )
    return call.listing(items, DEFAULT_SORT)


def groups_of(
    vhost: Any, name: str, elsewhere: Iterable[dict[str, Any]] = ()
) -> list[dict[str, Any]]:
    """The groups of a vhost: those with members (coordinated here, then `elsewhere`: those
    another node coordinates, as it described them), then those that only have committed
    offsets left (every member gone)."""
    items = [{"vhost": name, **group.describe()} for group in vhost.groups.values()]
    items += [{"vhost": name, **described} for described in elsewhere]
    active = {(item["super_stream"], item["group"]) for item in items}
    for exchange in vhost.router.exchanges():
        if not isinstance(exchange.table, SuperStreamExchange):
            continue
        partitions = [vhost.queues.get(d.name) for d in exchange.table.partitions()]
        streams = [p for p in partitions if isinstance(p, Stream)]
        committed: dict[str, dict[str, int]] = {}
        for stream in streams:
            for tag, offset in stream.tracked.items():
                if tag.startswith(GROUP_TAG_PREFIX):
                    committed.setdefault(tag[len(GROUP_TAG_PREFIX) :], {})[stream.name] = offset
        for group, offsets in sorted(committed.items()):
            if (exchange.name, group) in active:
                continue
            items.append(
                {
                    "vhost": name,
                    "super_stream": exchange.name,
                    "group": group,
                    "members": [],
                    "partitions": [
                        {
                            "partition": stream.name,
                            "member": None,
                            "moving": False,
                            "committed_offset": offsets.get(stream.name),
                            "lag": stream.lag(offsets.get(stream.name)),
                        }
                        for stream in streams
                    ],
                }
            )
    return items


def group_lags(vhost: Any) -> Iterator[tuple[str, str, list[tuple[str, int]]]]:
    """(super stream, group, [(partition, lag)]) of each group of a vhost, the groups and
    lags `groups_of` lists, without building its JSON: the metrics read this at every
    scrape."""
    active: dict[str, set[str]] = {}
    for super_stream, group in vhost.groups:
        active.setdefault(super_stream, set()).add(group)
    for exchange in vhost.router.exchanges():
        if not isinstance(exchange.table, SuperStreamExchange):
            continue
        partitions = [vhost.queues.get(d.name) for d in exchange.table.partitions()]
        streams = [p for p in partitions if isinstance(p, Stream)]
        names = set(active.get(exchange.name, ()))
        for stream in streams:
            names.update(
                tag[len(GROUP_TAG_PREFIX) :]
                for tag, _ in stream.tracked.items()
                if tag.startswith(GROUP_TAG_PREFIX)
            )
        for group in names:
            tag = group_tag(group)
            lags = [(stream.name, stream.lag(stream.tracked.get(tag))) for stream in streams]
            yield exchange.name, group, lags


async def _groups_elsewhere(vhost: Any) -> list[dict[str, Any]]:
    """The groups this node has members of and another node coordinates, as described
    there (one whose coordinator cannot be reached is left out)."""
    keys = [key for key in vhost.members_elsewhere if key not in vhost.groups]
    asked = [vhost.describe_group(super_stream, group) for super_stream, group in keys]
    described = await asyncio.gather(*asked, return_exceptions=True)
    return [d for d in described if isinstance(d, dict)]


async def list_groups(call: Call) -> web.Response:
    items = []
    for name in call.vhosts():
        vhost = call.api.host.vhosts.get(name)
        if vhost is not None:
            items += groups_of(vhost, name, await _groups_elsewhere(vhost))
    return call.listing(items, ("vhost", "super_stream", "group"))


async def put_super_stream(call: Call) -> web.Response:
    if call.params["vhost"] not in call.state.vhosts:
        raise vhost_missing()
    vhost = call.vhost()
    name = call.params["name"]
    partitions = (await call.body()).get("partitions")
    if isinstance(partitions, bool) or not isinstance(partitions, int):
        raise bad_request(f"partitions must be a whole number from 1 to {PARTITIONS_MAX}")
    if name.startswith("amq."):
        raise not_authorised("Access refused.")
    # The core checks the partitions' permissions.
    call.check("configure", EXCHANGE, name)
    existed = call.state.router(vhost.name).get(name) is not None
    await core(
        vhost.declare_exchange(
            name,
            SUPER_STREAM,
            durable=True,
            auto_delete=False,
            internal=False,
            arguments={PARTITIONS_ARGUMENT: partitions},
            user=call.caller.name,
        )
    )
    return no_content() if existed else created()


async def delete_super_stream(call: Call) -> web.Response:
    if call.params["vhost"] not in call.state.vhosts:
        raise vhost_missing()
    vhost = call.vhost()
    name = call.params["name"]
    call.check("configure", EXCHANGE, name)
    exchange = call.state.router(vhost.name).get(name)
    if exchange is not None and isinstance(exchange.table, SuperStreamExchange):
        for partition in exchange.table.partitions():
            call.check("configure", QUEUE, partition.name)
    await core(vhost.delete_super_stream(name))
    return no_content()

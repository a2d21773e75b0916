"""The DLQ tools over HTTP (`warren dlq …` calls these): browse a queue's dead letters
without consuming them, export them as JSON lines, import such lines back. Reading needs read
permission on the queue; importing needs write permission on the default exchange, through
which the core publishes each message again with its exact property bytes.

Purging is the management API's own DELETE /api/queues/{vhost}/{queue}/contents.

A message's BCC keys (kept beside it for its dead letter, `QueueEngine.bcc_keys`) are not
exported: like its BCC header, they are the publisher's, never shown. An import publishes
each message anew, as a redrive moving it does (`server/redrive.py`), so without them.

Listing the queues dead letters reach, and redrive tasks (`server/redrive.py`): started on a
queue, then listed, watched, cancelled and resumed under /api/dlq/redrives.

In a cluster, the tools work on a queue another node leads through the link to it: browsing
there, and its redrive tasks run there (`Redrives.operate`); /api/dlq/redrives shows every
node's tasks, and a task id this node does not know is looked for on the others.
"""

from __future__ import annotations

import asyncio
import binascii
import inspect
import json
from typing import Any

from aiohttp import web

from warrenmq.amqp import fastpath
from warrenmq.amqp.replies import ProtocolError
from warrenmq.dlq.inspect import describe, raw_message
from warrenmq.dlq.redrive import RedriveSpec, last_death
from warrenmq.exchanges.binding import EXCHANGE, QUEUE
from warrenmq.exchanges.errors import RoutingError
from warrenmq.server.forward.entry import RemoteQueue
from warrenmq.server.forward.link import LinkError
from warrenmq.server.vhost import Published

from .api import Call, ManagementApi, core, reply, sync
from .errors import bad_request, object_not_found
from .exchanges import Stored
from .node_views import VIEW_WAIT_S, cluster_view, node_view

BROWSE_COUNT_DEFAULT = 20
BROWSE_COUNT_MAX = 10_000
EXPORT_SLICE = 1000
NO_OWNER: Any = None


def _queue_name(call: Call) -> str:
    vhost = call.vhost()
    record = call.state.queue(vhost.name, call.params["queue"])
    if record is None:
        raise object_not_found()
    call.check("read", QUEUE, record.name)
    return record.name


def _number(call: Call, key: str, default: int, most: int) -> int:
    value = call.query.get(key)
    if value is None:
        return default
    if not value.isdigit() or int(value) > most:
        raise bad_request(f"{key} must be a whole number from 0 to {most}")
    return int(value)


async def _lines(call: Call, name: str, count: int, start: int) -> list[dict[str, Any]]:
    browsed = sync(call.vhost().peek, name, NO_OWNER, count, start)
    if inspect.isawaitable(browsed):
        # Another node leads the queue: browsed there.
        browsed = await core(browsed)
    return [
        describe(
            message.offset,
            message.exchange,
            message.routing_key,
            message.properties,
            message.body,
            in_flight=in_flight,
            redelivered=message.redelivered,
        )
        for message, in_flight in browsed
    ]


async def browse(call: Call) -> web.Response:
    """GET …/messages?count=N&from=OFFSET: up to N messages from that offset on, ready and
    unacked, oldest first; nothing is delivered or counted."""
    name = _queue_name(call)
    count = _number(call, "count", BROWSE_COUNT_DEFAULT, BROWSE_COUNT_MAX)
    start = _number(call, "from", 0, 1 << 62)
    return reply(await _lines(call, name, count, start))


async def export(call: Call) -> web.StreamResponse:
    """GET …/export: every message not yet acknowledged, one JSON object a line."""
    name = _queue_name(call)
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(call.request)
    start = 0
    while True:
        lines = await _lines(call, name, EXPORT_SLICE, start)
        if not lines:
            break
        await response.write("".join(json.dumps(line) + "\n" for line in lines).encode())
        start = lines[-1]["offset"] + 1
    await response.write_eof()
    return response


async def import_lines(call: Call) -> web.Response:
    """POST …/import (JSON lines as `export` writes them): each message published to the queue
    again, through the default exchange, with its exact properties and body; answered once
    they are stored."""
    vhost = call.vhost()
    record = call.state.queue(vhost.name, call.params["queue"])
    if record is None:
        raise object_not_found()
    call.check("write", EXCHANGE, "")
    try:
        lines = [json.loads(line) for line in (await call.request.read()).splitlines() if line]
        messages = [raw_message(line) for line in lines]
        # Checked as a publish's content header is: a hostile file gets 400, not stored.
        scans = [fastpath.scan_properties(properties) for _, properties, _ in messages]
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise bad_request("the body must be JSON lines as the export writes them") from None
    stored = Stored()
    refused = 0
    for (_, properties, body), scan in zip(messages, scans, strict=True):
        persistent, expiring = scan[0] == 2, scan[2] is not None
        outcome = sync(
            vhost.publish, "", record.name, properties, body, persistent, expiring, (stored, 0)
        )
        refused += outcome is not Published.ROUTED
    await call.api.host.after_commit()
    if stored.failed:
        raise bad_request("storing the imported messages failed")
    return reply({"imported": len(messages) - refused, "refused": refused})


async def list_dead_letter_queues(call: Call) -> web.Response:
    """GET /api/dlq[/{vhost}]: the queues dead letters can reach (see
    `VirtualHost.dead_letter_queues`) the caller may read, with their depth and what their
    messages last died of, by reason and by source queue; each as the node leading it
    gives it (`local_dead_letter_queues`)."""
    vhosts = call.vhosts()
    view = await cluster_view(call.api, "dead_letter_queues", {"vhosts": vhosts})
    listed = [
        item
        for part in view.parts
        for item in part
        if call.state.can_access(call.caller.name, item["vhost"], "read", QUEUE, item["name"])
    ]
    listed.sort(key=lambda item: (vhosts.index(item["vhost"]), item["name"]))
    return view.mark(reply(listed))


@node_view("dead_letter_queues")
async def local_dead_letter_queues(api: ManagementApi, argument: dict[str, Any]) -> list[dict]:
    """The queues dead letters can reach that this node leads, in ``argument["vhosts"]``."""
    listed = []
    for vhost_name in argument["vhosts"]:
        vhost = api.host.vhosts.get(vhost_name)
        if vhost is None:
            continue
        for name, sources in vhost.dead_letter_queues().items():
            queue = vhost.queues.get(name)
            if queue is None:
                continue
            by_reason, by_source = await _census(queue)
            listed.append(
                {
                    "vhost": vhost_name,
                    "name": name,
                    "dead_letter_sources": sources,
                    "messages": queue.ready_count + queue.engine.unacked_count,
                    "messages_ready": queue.ready_count,
                    "messages_unacknowledged": queue.engine.unacked_count,
                    "consumers": queue.consumer_count,
                    "by_reason": by_reason,
                    "by_source": by_source,
                }
            )
    return listed


async def _census(queue: Any) -> tuple[dict[str, int], dict[str, int]]:
    """Counts of a queue's messages by the reason and the queue of their last death, read a
    slice at a time so a large queue does not hold up the event loop."""
    by_reason: dict[str, int] = {}
    by_source: dict[str, int] = {}
    start = 0
    while not queue.deleted:
        browsed = queue.engine.browse(start, EXPORT_SLICE)
        if not browsed:
            break
        for message, _ in browsed:
            death = last_death(message.properties)
            reason, source = (death.reason, death.queue) if death else ("none", "none")
            by_reason[reason] = by_reason.get(reason, 0) + 1
            by_source[source] = by_source.get(source, 0) + 1
        start = browsed[-1][0].offset + 1
        await asyncio.sleep(0)
    return by_reason, by_source


def _answered(answer: Any) -> Any:
    """What another node's `Redrives.operate` answered (None: the node could not be
    reached), its refusal as this API's."""
    if answer is None:
        raise object_not_found()
    if isinstance(answer, dict) and "refused" in answer:
        if answer["refused"] == "not_found":
            raise object_not_found()
        raise bad_request(answer["reason"])
    return answer


def _other_nodes(call: Call) -> list[int]:
    return [node for node in call.state.nodes if node != call.api.host.node.node_id]


async def _asked(call: Call, node: int, operation: str, *fields: str) -> Any:
    """A redrive operation on another node; None when it cannot be reached or does not
    answer within VIEW_WAIT_S (stopped, cut off)."""
    asked = call.api.host.forwarding.redrive(node, operation, *fields)
    try:
        return await asyncio.wait_for(asked, VIEW_WAIT_S)
    except (TimeoutError, LinkError, OSError, RoutingError, ProtocolError):
        return None


async def start_redrive(call: Call) -> web.Response:
    """POST /api/dlq/{vhost}/{queue}/redrive: start a redrive task (see `RedriveSpec` for
    the body); 201 with the task. Needs read on the queue and write where it publishes: the
    exchange asked for, or each source queue's exchange (checked as the task meets them
    would be too late: the default exchange's write permission stands for them)."""
    name = _queue_name(call)
    try:
        spec = RedriveSpec.from_json(await call.body())
    except ValueError as error:
        raise bad_request(str(error)) from None
    if spec.exchange is not None:
        if spec.exchange and call.vhost().router.get(spec.exchange) is None:
            raise object_not_found()
        call.check("write", EXCHANGE, spec.exchange)
    else:
        call.check("write", EXCHANGE, "")
    queue = call.vhost().served_queue(name)
    if isinstance(queue, RemoteQueue):
        # The task runs where the queue is.
        fields = (call.vhost().name, name, json.dumps(spec.to_json()))
        answer = await _asked(call, queue.node, "start", *fields)
        return reply(_answered(answer), status=201)
    try:
        task = call.api.host.redrives.start(call.vhost().name, name, spec)
    except LookupError:
        raise object_not_found() from None
    except ValueError as error:
        raise bad_request(str(error)) from None
    return reply(task.to_json(), status=201)


def _visible(call: Call, task: dict[str, Any]) -> bool:
    return call.state.can_access(call.caller.name, task["vhost"], "read", QUEUE, task["queue"])


async def _task(call: Call) -> tuple[int | None, dict[str, Any]]:
    """The task the path names: (None, it) when it runs here, else (its node, it); 404
    when no node has it or the caller may not see it."""
    task_id = call.params["id"]
    task = call.api.host.redrives.tasks.get(task_id)
    found: tuple[int | None, dict[str, Any]] | None = None
    if task is not None:
        found = (None, task.to_json())
    else:
        for node in _other_nodes(call):
            answer = await _asked(call, node, "get", "", "", task_id)
            if answer is not None and "refused" not in answer:
                found = (node, answer)
                break
    if found is None or not _visible(call, found[1]):
        raise object_not_found()
    return found


async def list_redrives(call: Call) -> web.Response:
    """GET /api/dlq/redrives: every node's tasks the caller may see, newest first."""
    tasks = [task.to_json() for task in call.api.host.redrives.tasks.values()]
    for node in _other_nodes(call):
        tasks += await _asked(call, node, "list") or []
    shown = [task for task in tasks if _visible(call, task)]
    shown.sort(key=lambda task: task["created"], reverse=True)
    return reply(shown)


async def get_redrive(call: Call) -> web.Response:
    return reply((await _task(call))[1])


async def cancel_redrive(call: Call) -> web.Response:
    """DELETE /api/dlq/redrives/{id}: stop the task after its current batch."""
    node, task = await _task(call)
    if node is not None:
        return reply(_answered(await _asked(call, node, "cancel", "", "", task["id"])))
    return reply((await call.api.host.redrives.cancel(task["id"])).to_json())


async def resume_redrive(call: Call) -> web.Response:
    """POST /api/dlq/redrives/{id}/resume: run a cancelled or failed task again."""
    node, task = await _task(call)
    if node is not None:
        return reply(_answered(await _asked(call, node, "resume", "", "", task["id"])))
    try:
        resumed = call.api.host.redrives.resume(task["id"])
    except LookupError:
        raise object_not_found() from None
    except ValueError as error:
        raise bad_request(str(error)) from None
    return reply(resumed.to_json())

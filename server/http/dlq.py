"""The DLQ tools over HTTP (`warren dlq …` calls these): browse a queue's dead letters
without consuming them, export them as JSON lines, import such lines back. Reading needs read
permission on the queue; importing needs write permission on the default exchange, through
which the core publishes each message again with its exact property bytes.

Purging is the management API's own DELETE /api/queues/{vhost}/{queue}/contents.
"""

from __future__ import annotations

import binascii
import json
from typing import Any

from aiohttp import web

from warrenmq.amqp import fastpath
from warrenmq.dlq.inspect import describe, raw_message
from warrenmq.exchanges.binding import EXCHANGE, QUEUE
from warrenmq.server.vhost import Published

from .api import Call, reply, sync
from .errors import bad_request, object_not_found
from .exchanges import _Stored

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


def _lines(call: Call, name: str, count: int, start: int) -> list[dict[str, Any]]:
    browsed = sync(call.vhost().peek, name, NO_OWNER, count, start)
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
    return reply(_lines(call, name, count, start))


async def export(call: Call) -> web.StreamResponse:
    """GET …/export: every message not yet acknowledged, one JSON object a line."""
    name = _queue_name(call)
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(call.request)
    start = 0
    while True:
        lines = _lines(call, name, EXPORT_SLICE, start)
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
    stored = _Stored()
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

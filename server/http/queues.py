"""/api/queues: list, show, declare (PUT), delete, purge (DELETE .../contents) and get (POST
.../get), each through the core as the AMQP method would be (rabbit_mgmt_wm_queue*).

A request is no AMQP connection, so it owns no exclusive queue: another connection's
exclusive queue is locked to it (400, RabbitMQ's 405 text), and it declares none.
"""

from __future__ import annotations

import asyncio
import base64
import inspect
from typing import Any

from aiohttp import web

from warrenmq.amqp import frames
from warrenmq.exchanges.binding import QUEUE
from warrenmq.server.forward.entry import RemoteQueue
from warrenmq.server.metadata import QueueRecord
from warrenmq.server.metadata.records import node_name
from warrenmq.server.queue import policy
from warrenmq.server.queue.arguments import queue_type
from warrenmq.server.queue.engine import Message
from warrenmq.server.queue.work_queue import WorkQueue

from .api import Call, ManagementApi, core, created, no_content, sync, vhost_missing
from .errors import bad_request, not_authorised, object_not_found
from .node_views import cluster_view
from .stats import DEPTHS, QUEUE_STATS, detailed, queue_counts
from .values import integer, parse_bool, properties_to_json, to_amqp_table, to_json

DEFAULT_SORT = ("vhost", "name")
NAME_BYTES_MAX = 255
ACK_MODES = ("ack_requeue_true", "ack_requeue_false", "reject_requeue_true", "reject_requeue_false")
ENCODINGS = ("auto", "base64")
# Messages one POST .../get may take: each is held in memory until the reply is written.
MESSAGES_PER_GET_MAX = 10_000
# No owner: a request owns no exclusive queue (see the module docstring).
NO_OWNER: Any = None
STATS_WAIT_S = 5.0
"""How long a listing waits for the nodes leading its queues to give their figures."""


def queue_json(api: ManagementApi, record: QueueRecord, queue: WorkQueue | None) -> dict:
    """A queue as /api/queues lists it: the declaration, the policy that applies to it, and
    the live state if it is hosted."""
    applied = policy.queue_policy(
        record.name, queue_type(record.arguments), api.state.policies(record.vhost).values()
    )
    item: dict[str, Any] = {
        "name": record.name,
        "vhost": record.vhost,
        "durable": record.durable,
        "auto_delete": record.auto_delete,
        "exclusive": record.exclusive,
        "arguments": to_json(dict(record.arguments)),
        "node": node_name(record.node) if record.online else None,
        "type": queue_type(record.arguments),
        **replicas_json(api, record),
        # A queue another node leads runs there (its figures are that node's to give).
        "state": "running"
        if queue is not None or record.node != api.host.node.node_id
        else "crashed",
        "policy": None if applied is None else applied.name,
        "operator_policy": None,
        "effective_policy_definition": {} if applied is None else dict(applied.definition),
    }
    if queue is None:
        return item
    if isinstance(queue, RemoteQueue):
        return _led_elsewhere_json(api, item, queue)
    engine = queue.engine
    ready = engine.ready_count
    unacked = engine.unacked_count
    item.update(detailed(api.rates, queue, "depths", DEPTHS, (ready + unacked, ready, unacked)))
    item["consumers"] = queue.consumer_count
    exclusive = queue.exclusive_consumer()
    item["exclusive_consumer_tag"] = exclusive.tag if exclusive is not None else None
    active = next(iter(queue.consumers.values()), None) if queue.single_active else None
    item["single_active_consumer_tag"] = active.tag if active is not None else None
    item["message_stats"] = detailed(
        api.rates, queue, "messages", QUEUE_STATS, queue_counts(queue.counts)
    )
    return item


def replicas_json(api: ManagementApi, record: QueueRecord) -> dict[str, Any]:
    """The replica set as RabbitMQ shows a quorum queue's (`leader`, `members`, `online`:
    the members running, as this node's metadata connections see them), and Warren's
    partition state (`isr`, `leader_epoch`)."""
    running = api.host.store.reachable_nodes()
    return {
        "leader": node_name(record.node) if record.online else None,
        "members": [node_name(node) for node in record.replicas],
        "online": [node_name(node) for node in record.replicas if node in running],
        "isr": [node_name(node) for node in record.isr],
        "leader_epoch": record.leader_epoch,
    }


def _led_elsewhere_json(api: ManagementApi, item: dict[str, Any], queue: RemoteQueue) -> dict:
    """The figures of a queue another node leads, as that node last gave them
    (`refresh_led_elsewhere`); none when it did not answer."""
    stats = queue.stats
    if stats is None:
        return item
    depths = (stats.messages, stats.ready, stats.unacked)
    item.update(detailed(api.rates, queue, "depths", DEPTHS, depths))
    item["consumers"] = stats.consumers
    item["exclusive_consumer_tag"] = None
    item["single_active_consumer_tag"] = None
    item["message_stats"] = detailed(api.rates, queue, "messages", QUEUE_STATS, queue_counts(stats))
    return item


async def refresh_led_elsewhere(queues: list[RemoteQueue]) -> None:
    """Ask the nodes leading these queues for their figures, all at once; a queue whose
    node does not answer within STATS_WAIT_S (or is down) keeps none."""
    for queue in queues:
        queue.stats = None
    if not queues:
        return
    asked = [asyncio.ensure_future(queue.refresh_counts()) for queue in queues]
    done, pending = await asyncio.wait(asked, timeout=STATS_WAIT_S)
    for task in pending:
        task.cancel()
    for task in done:
        # A node down or the queue gone there: shown without figures.
        task.exception()


def vhost_records(api: ManagementApi, vhost: str) -> list[tuple[QueueRecord, WorkQueue | None]]:
    """A vhost's queues: each declaration, and its live queue if it is hosted or led by
    another node (see `refresh_led_elsewhere` for the latter's figures)."""
    hosted = api.host.vhosts.get(vhost)
    if hosted is None:
        return [(record, None) for record in api.state.queues(vhost).values()]
    return [
        (record, hosted.served_queue(record.name)) for record in api.state.queues(vhost).values()
    ]


def led_elsewhere(entries: list[tuple[QueueRecord, WorkQueue | None]]) -> list[RemoteQueue]:
    return [queue for _, queue in entries if isinstance(queue, RemoteQueue)]


def vhost_queues(api: ManagementApi, vhost: str) -> list[dict]:
    return [queue_json(api, record, queue) for record, queue in vhost_records(api, vhost)]


def _sort_keys(entry: tuple[QueueRecord, WorkQueue | None]) -> dict[str, str]:
    return {"vhost": entry[0].vhost, "name": entry[0].name}


async def list_queues(call: Call) -> web.Response:
    entries = [entry for vhost in call.vhosts() for entry in vhost_records(call.api, vhost)]
    await refresh_led_elsewhere(led_elsewhere(entries))
    return call.listing_built_per_page(
        entries, _sort_keys, lambda entry: queue_json(call.api, *entry), DEFAULT_SORT
    )


def _record(call: Call) -> QueueRecord:
    """The queue the path names (404 when it or its vhost does not exist)."""
    vhost = call.vhost()
    record = call.state.queue(vhost.name, call.params["queue"])
    if record is None:
        raise object_not_found()
    return record


async def get_queue(call: Call) -> web.Response:
    record = _record(call)
    queue = call.vhost().served_queue(record.name)
    if isinstance(queue, RemoteQueue):
        await refresh_led_elsewhere([queue])
    item = queue_json(call.api, record, queue)
    view = None
    if queue is not None:
        # Its consumers are listed by the nodes their clients are connected to.
        argument = {"vhost": record.vhost, "user": None, "queue": record.name}
        view = await cluster_view(call.api, "consumers", argument)
        item["consumer_details"] = [consumer for part in view.parts for consumer in part]
    item["deliveries"] = []
    item["incoming"] = []
    response = call.one(item)
    return view.mark(response) if view is not None else response


async def put_queue(call: Call) -> web.Response:
    """Declare (201), or redeclare an equivalent queue (204; 400 if not equivalent)."""
    name = call.params["queue"]
    size = len(name.encode())
    if size > NAME_BYTES_MAX:
        raise bad_request(f"queue should be less than 255 bytes, actually was {size}")
    if call.params["vhost"] not in call.state.vhosts:
        raise vhost_missing()
    vhost = call.vhost()
    body = await call.body()
    durable = parse_bool(body.get("durable"), False)
    auto_delete = parse_bool(body.get("auto_delete"), False)
    arguments = to_amqp_table(body.get("arguments"))
    if parse_bool(body.get("exclusive"), False):
        # RabbitMQ declares it on the request's own connection, which closes at once.
        raise bad_request("an exclusive queue belongs to a connection; declare it over AMQP")
    if name.startswith("amq."):
        # rabbit_channel refuses the reserved prefix (403) before it looks at permissions.
        raise not_authorised("Access refused.")
    call.check("configure", QUEUE, name)
    existed = call.state.queue(vhost.name, name) is not None
    await core(
        vhost.declare_queue(
            name,
            durable=durable,
            exclusive=False,
            auto_delete=auto_delete,
            arguments=arguments,
            owner=NO_OWNER,
            server_named=False,
            user=call.caller.name,
        )
    )
    return no_content() if existed else created()


async def delete_queue(call: Call) -> web.Response:
    record = _record(call)
    call.check("configure", QUEUE, record.name)
    vhost = call.vhost()
    queue = sync(vhost.get_queue, record.name, NO_OWNER)
    await core(
        vhost.delete_queue(
            queue,
            if_unused=call.query.get("if-unused") == "true",
            if_empty=call.query.get("if-empty") == "true",
        )
    )
    return no_content()


async def purge_queue(call: Call) -> web.Response:
    record = _record(call)
    call.check("read", QUEUE, record.name)
    purged = sync(call.vhost().purge, record.name, NO_OWNER)
    if inspect.isawaitable(purged):
        # Another node leads the queue: purged there.
        await core(purged)
    return no_content()


def _missing_keys(body: dict, keys: tuple[str, ...]) -> None:
    missing = [key for key in keys if body.get(key) is None]
    if missing:
        raise bad_request("[" + ",".join(f"{{key_missing,{key}}}" for key in missing) + "]")


async def get_messages(call: Call) -> web.Response:
    """POST .../get: basic.get up to `count` messages; `ackmode` says what becomes of them."""
    record = _record(call)
    body = await call.body()
    _missing_keys(body, ("ackmode", "count", "encoding"))
    ack_mode = body["ackmode"]
    if ack_mode not in ACK_MODES:
        raise bad_request(f"ackmode must be one of {', '.join(ACK_MODES)}")
    encoding = body["encoding"]
    if encoding not in ENCODINGS:
        raise bad_request("Unsupported encoding. Please use auto or base64.")
    count = integer(body, "count")
    if count > MESSAGES_PER_GET_MAX:
        raise bad_request(f"count must be at most {MESSAGES_PER_GET_MAX}")
    truncate = integer(body, "truncate") if body.get("truncate") is not None else None
    call.check("read", QUEUE, record.name)
    vhost = call.vhost()
    no_ack = ack_mode == "ack_requeue_false"
    taken: list[tuple[Message, int]] = []
    queue: WorkQueue | None = None
    try:
        for _ in range(max(count, 0)):
            queue, message = sync(vhost.get, record.name, NO_OWNER, no_ack=no_ack)
            if message is None and queue.held_until_commit:
                message = await core(vhost.get_after_commit(queue, no_ack=no_ack))
            if message is None:
                break
            taken.append((message, queue.ready_count))
    finally:
        if queue is not None and taken and not no_ack:
            _settle(call, queue, [message.offset for message, _ in taken], ack_mode)
    return call.one([_message_json(m, left, truncate, encoding) for m, left in taken])


def _settle(call: Call, queue: WorkQueue, offsets: list[int], ack_mode: str) -> None:
    """After the gets, as RabbitMQ's rabbit_mgmt_wm_queue_get does: basic.nack with requeue
    (ack_requeue_true, no failed delivery) or basic.reject (a failed delivery, in RabbitMQ
    4.3's counts): requeue, or drop (dead-letter)."""
    if ack_mode == "reject_requeue_false":
        # basic.reject without requeue: dead-lettered where the queue has a DLX.
        queue.reject(offsets)
    else:
        queue.requeue(offsets, failed=ack_mode == "reject_requeue_true")
    call.api.host.want_dispatch(queue)


def _message_json(
    message: Message, message_count: int, truncate: int | None, encoding: str
) -> dict[str, Any]:
    body = message.body
    payload = body if truncate is None else body[: max(truncate, 0)]
    shown_as = "base64"
    if encoding == "auto":
        try:
            shown, shown_as = payload.decode("utf-8"), "string"
        except UnicodeDecodeError:
            pass
    if shown_as == "base64":
        shown = base64.b64encode(payload).decode("ascii")
    return {
        "payload_bytes": len(body),
        "redelivered": message.redelivered,
        "exchange": message.exchange.decode("utf-8", "replace"),
        "routing_key": message.routing_key.decode("utf-8", "replace"),
        "message_count": message_count,
        "properties": properties_to_json(frames.decode_properties(message.properties)),
        "payload": shown,
        "payload_encoding": shown_as,
    }

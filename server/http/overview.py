"""/api/overview, /api/nodes, the health checks and the aliveness test.

The overview's totals are the cluster's (`vhosts.cluster_totals`: every node's queues,
connections and channels). A node's memory and disk alarms (``server/alarms.py``) are its
own, and /api/health/checks/alarms and local-alarms report the same ones; a port check looks
at the listeners this process runs; the health checks never ask another node.
"""

from __future__ import annotations

import os
import platform
import resource
import time
from typing import Any

from aiohttp import web
from pamqp import commands

import warrenmq
from warrenmq.amqp import frames
from warrenmq.exchanges.binding import EXCHANGE, QUEUE
from warrenmq.exchanges.delayed import DELAYED_MESSAGE
from warrenmq.exchanges.router import EXCHANGE_TYPE_NAMES
from warrenmq.server.alarms import (
    DISK,
    MEMORY,
    RESOURCE_NAMES,
    disk_free_bytes,
    resident_memory_bytes,
)
from warrenmq.server.metadata.records import node_name
from warrenmq.server.vhost import Published

from .api import PROTOCOLS, RABBITMQ_VERSION, Call, ManagementApi, core, reply, sync
from .errors import bad_request
from .stats import DEPTHS, PUBLISHER_STATS, QUEUE_STATS, detailed, totals
from .vhosts import cluster_totals

HEALTH_CHECK_FAILURE_STATUS = 503
ALIVENESS_QUEUE = "aliveness-test"
ALIVENESS_MESSAGE = b"test_message"
OVERVIEW_STATS = (*PUBLISHER_STATS, *QUEUE_STATS[1:])
_NO_PROPERTIES = frames.encode_properties(commands.Basic.Properties())


def exchange_types() -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            # The delayed-message plugin's own description.
            "description": "Delayed Message Exchange."
            if name == DELAYED_MESSAGE
            else f"AMQP {name} exchange, as per the AMQP specification",
            "enabled": True,
        }
        for name in sorted(EXCHANGE_TYPE_NAMES)
    ]


def listeners(api: ManagementApi) -> list[dict[str, Any]]:
    bind = api.host.config.bind
    ports = [("amqp", api.host.port)]
    if api.host.tls_port:
        ports.append(("amqp/ssl", api.host.tls_port))
    ports += [(PROTOCOLS[name], port) for name, port in api.listeners.items()]
    return [
        {"node": api.node, "protocol": protocol, "ip_address": bind, "port": port}
        for protocol, port in ports
    ]


async def overview(call: Call) -> web.Response:
    api = call.api
    caller = call.caller
    state = call.state
    vhost_names = list(state.vhosts) if caller.is_monitor else caller.login_vhosts(state)
    hosted = [name for name in vhost_names if name in api.host.vhosts]
    # A monitor sees everyone's connections; another user their own.
    figures, view = await cluster_totals(api, hosted, None if caller.is_monitor else caller.name)
    summed = [figures[name] for name in hosted if name in figures]
    ready = sum(part["ready"] for part in summed)
    unacked = sum(part["unacked"] for part in summed)
    published = totals((part["published"] for part in summed), len(PUBLISHER_STATS))
    handled = totals((part["handled"] for part in summed), len(QUEUE_STATS))
    # Everything a monitor sees is the same; another user's totals are of their own vhosts.
    scope = api if caller.is_monitor else api.scope_of(caller.name)
    item: dict[str, Any] = {
        "management_version": RABBITMQ_VERSION,
        "rates_mode": "basic",
        "sample_retention_policies": {
            "global": [600, 3600, 28800, 86400],
            "basic": [600, 3600],
            "detailed": [600],
        },
        "exchange_types": exchange_types(),
        "product_version": warrenmq.__version__,
        "product_name": "Warren",
        "rabbitmq_version": RABBITMQ_VERSION,
        "cluster_name": cluster_name(api),
        "disable_stats": False,
        "enable_queue_totals": False,
        "message_stats": detailed(
            api.rates,
            scope,
            "messages",
            OVERVIEW_STATS,
            (*published, *handled[1:]),
        ),
        "churn_rates": {},
        "queue_totals": detailed(
            api.rates, scope, "depths", DEPTHS, (ready + unacked, ready, unacked)
        ),
        "object_totals": {
            "channels": sum(part["channels"] for part in summed),
            "connections": sum(part["connections"] for part in summed),
            "consumers": sum(part["consumers"] for part in summed),
            "exchanges": sum(len(state.router(name).exchanges()) for name in hosted),
            "queues": sum(len(state.queues(name)) for name in hosted),
        },
        "statistics_db_event_queue": 0,
    }
    if caller.is_monitor:
        item["node"] = api.node
        item["listeners"] = listeners(api)
        item["contexts"] = []
    return view.mark(reply(item))


def cluster_name(api: ManagementApi) -> str:
    """As RabbitMQ's default cluster name, the name of a node: the lowest id."""
    nodes = api.state.nodes
    return node_name(min(nodes)) if nodes else api.node


def _open_files() -> int:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return 0


def node_json(api: ManagementApi) -> dict[str, Any]:
    resources = api.host.resources
    files_max = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return {
        "name": api.node,
        "type": "disc",
        "running": True,
        "os_pid": str(os.getpid()),
        "uptime": int((time.monotonic() - api.started_at_s) * 1000),
        "processors": os.cpu_count() or 1,
        "mem_used": resident_memory_bytes(),
        "mem_limit": resources.memory_limit_bytes,
        "mem_alarm": MEMORY in resources.alarms,
        "disk_free": disk_free_bytes(api.host.data_dir),
        "disk_free_limit": resources.disk_free_limit_bytes,
        "disk_free_alarm": DISK in resources.alarms,
        "fd_used": _open_files(),
        "fd_total": files_max,
        "sockets_used": len(api.host.connections),
        "sockets_total": api.host.config.connections_max,
        "run_queue": 0,
        "rates_mode": "basic",
        "partitions": [],
        "exchange_types": exchange_types(),
        "applications": [
            {"name": "warren", "description": "Warren", "version": warrenmq.__version__},
            {"name": "python", "description": "Python", "version": platform.python_version()},
        ],
        "enabled_plugins": [],
        "db_dir": str(api.host.data_dir),
    }


async def no_alarms(call: Call) -> web.Response:
    return reply({"status": "ok"})


async def alarms(call: Call) -> web.Response:
    """rabbit_mgmt_wm_health_check_alarms: 503 and the resources in alarm, if any."""
    return _alarms_reply(call, "There are alarms in effect in the cluster")


async def local_alarms(call: Call) -> web.Response:
    return _alarms_reply(call, "There are alarms in effect on the node")


def _alarms_reply(call: Call, reason: str) -> web.Response:
    in_effect = call.api.host.resources.alarms
    if not in_effect:
        return reply({"status": "ok"})
    body = {
        "status": "failed",
        "reason": reason,
        "alarms": [
            {"node": call.api.node, "resource": RESOURCE_NAMES[name]}
            for name in (MEMORY, DISK)
            if name in in_effect
        ],
    }
    return reply(body, HEALTH_CHECK_FAILURE_STATUS)


async def port_listener(call: Call) -> web.Response:
    try:
        port = int(call.params["port"])
    except ValueError:
        raise bad_request("Invalid port") from None
    ports = [listener["port"] for listener in listeners(call.api)]
    if port in ports:
        return reply({"status": "ok", "port": port})
    body = {"status": "failed", "reason": "No active listener", "missing": port, "ports": ports}
    return reply(body, HEALTH_CHECK_FAILURE_STATUS)


async def aliveness(call: Call) -> web.Response:
    """Declare the queue "aliveness-test", publish to it and get the message back, as the
    caller and through the core (rabbit_mgmt_wm_aliveness_test)."""
    vhost = call.vhost()
    call.check("configure", QUEUE, ALIVENESS_QUEUE)
    call.check("write", EXCHANGE, "")
    call.check("read", QUEUE, ALIVENESS_QUEUE)
    await core(
        vhost.declare_queue(
            ALIVENESS_QUEUE,
            durable=False,
            exclusive=False,
            auto_delete=False,
            arguments={},
            owner=None,  # type: ignore[arg-type]
            server_named=False,
            user=call.caller.name,
        )
    )
    outcome = sync(vhost.publish, "", ALIVENESS_QUEUE, _NO_PROPERTIES, ALIVENESS_MESSAGE, False)
    message = None
    if outcome is Published.ROUTED:
        queue, message = sync(vhost.get, ALIVENESS_QUEUE, None, no_ack=True)
        if message is None and queue.held_until_commit:
            message = await core(vhost.get_after_commit(queue, no_ack=True))
    if message is None:
        body = {"status": "failed", "reason": "aliveness-test queue is empty"}
        return reply(body, HEALTH_CHECK_FAILURE_STATUS)
    return reply({"status": "ok"})

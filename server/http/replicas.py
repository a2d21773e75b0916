"""Warren's replica management (RabbitMQ has it in `rabbitmq-queues`, not in its HTTP API;
`warren queues grow|shrink|rebalance` call these), for administrators:

* POST /api/queue-replicas/grow {"node": N, "strategy": "all"|"even", "vhost_pattern",
  "queue_pattern"}: a replica on node N for every replicated queue matching both patterns
  (default ".*") without one there; with "even", only those with an even number of
  replicas. N is a node id or its name ("warren@2") and must be running;
* POST /api/queue-replicas/shrink {"node": N}: the replica on N leaves every queue;
* POST /api/queue-replicas/rebalance {"type": "all"|"classic"|"quorum"|"stream",
  "vhost_pattern", "queue_pattern"}: leaders move to in-sync replicas, spreading them.

Each answers the queues it touched as `rabbitmq-queues` prints them: `vhost`, `name`, `size`
(replicas afterwards) and `result` ("ok", or the error that left the queue as it was, such as
RabbitMQ's "last_node"), with Warren's `leader`.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from warrenmq.server.metadata import commands as c
from warrenmq.server.metadata.records import NO_LEADER, node_name

from .api import Call, core, reply
from .errors import bad_request
from .values import text

NODE_PREFIX = node_name(0)[:-1]


async def grow(call: Call) -> web.Response:
    body = await call.body()
    node = _node(body)
    if node not in call.api.host.store.reachable_nodes():
        raise bad_request(f"node {node_name(node)} is not running")
    command = c.GrowReplicas(
        node,
        text(body, "strategy", "all"),
        text(body, "vhost_pattern", ".*"),
        text(body, "queue_pattern", ".*"),
    )
    return await _applied(call, command)


async def shrink(call: Call) -> web.Response:
    return await _applied(call, c.ShrinkReplicas(_node(await call.body())))


async def rebalance(call: Call) -> web.Response:
    body = await call.body()
    command = c.Rebalance(
        text(body, "type", "all"),
        text(body, "vhost_pattern", ".*"),
        text(body, "queue_pattern", ".*"),
    )
    return await _applied(call, command)


async def _applied(call: Call, command: c.Command) -> web.Response:
    outcome = await core(call.api.host.store.apply(command))
    return reply(
        [
            {
                "vhost": result.queue.vhost,
                "name": result.queue.name,
                "size": len(result.queue.replicas),
                "result": result.error or "ok",
                "leader": None if result.queue.node == NO_LEADER else node_name(result.queue.node),
            }
            for result in outcome.partitions
        ]
    )


def _node(body: dict[str, Any]) -> int:
    """A node id, given as a number or a node's name."""
    value = body.get("node")
    if isinstance(value, str) and value.startswith(NODE_PREFIX):
        value = value[len(NODE_PREFIX) :]
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise bad_request(f"node must be a node id or name, got {value!r}")
    return value

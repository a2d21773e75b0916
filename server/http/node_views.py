"""The cluster's view from whichever node is asked, as RabbitMQ's management API aggregates
its nodes' figures: each node gives its own part (`local_view`), and the node a request came
to asks every other member for theirs at once over the forwarding links (VIEW, answered by
VIEWED), then adds them up or lists them together.

A view is a function of this node's state (`ManagementApi`) and a JSON-able argument, whose
answer is JSON-able too; a resource module names its own with `node_view`. A view may also
act on what this node holds (closing one of its connections), so that a request to any node
reaches the node where the object is. A node that does
not answer within `VIEW_WAIT_S` (down, cut off, stopped) is left out: the answer is partial,
as RabbitMQ's is when a node does not answer (it logs "Management delegate query returned
errors"), and says so in `MISSING_NODES_HEADER`; never an error or a hang.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from warrenmq.server.metadata.records import node_name

from .api import ManagementApi

log = logging.getLogger("warrenmq.server.http")

VIEW_WAIT_S = 5.0
"""How long a request waits for the other nodes' parts (as /api/queues waits for figures)."""
MISSING_NODES_HEADER = "X-Warren-Missing-Nodes"
"""The nodes whose part an answer lacks, comma-separated (absent when none is missing)."""

_VIEWS: dict[str, Callable[[ManagementApi, Any], Any]] = {}


def node_view(name: str) -> Callable[[Callable[[ManagementApi, Any], Any]], Any]:
    """Register `function(api, argument)` (maybe async) as this node's part of view `name`."""

    def register(function: Callable[[ManagementApi, Any], Any]) -> Any:
        assert name not in _VIEWS, name
        _VIEWS[name] = function
        return function

    return register


async def local_view(api: ManagementApi, name: str, argument: Any) -> Any:
    """This node's part of view `name` (KeyError for a view this node does not know)."""
    part = _VIEWS[name](api, argument)
    return await part if inspect.isawaitable(part) else part


@dataclass
class ClusterView:
    parts: list[Any]
    """Each answering node's part, this node's first."""
    missing: list[str] = field(default_factory=list)
    """The names of the nodes that did not answer in time."""

    def mark(self, response: web.StreamResponse) -> web.StreamResponse:
        if self.missing:
            response.headers[MISSING_NODES_HEADER] = ",".join(self.missing)
        return response


async def cluster_view(api: ManagementApi, name: str, argument: Any) -> ClusterView:
    """Every member's part of view `name`: this node's, and the others' asked at once."""
    view = ClusterView([await local_view(api, name, argument)])
    own = api.host.node.node_id
    others = [node for node in sorted(api.state.nodes) if node != own]
    if not others:
        return view
    forwarding = api.host.forwarding
    asked = {node: asyncio.ensure_future(forwarding.view(node, name, argument)) for node in others}
    await asyncio.wait(asked.values(), timeout=VIEW_WAIT_S)
    for node, task in asked.items():
        if task.done() and not task.cancelled() and task.exception() is None:
            view.parts.append(task.result())
            continue
        if task.done() and not task.cancelled():
            log.warning("%s's part of %s failed: %r", node_name(node), name, task.exception())
        else:
            task.cancel()
            waited = f"not given within {VIEW_WAIT_S:.0f} s"
            log.warning("%s's part of %s %s", node_name(node), name, waited)
        view.missing.append(node_name(node))
    return view

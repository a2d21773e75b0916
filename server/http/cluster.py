"""/api/nodes and /api/cluster-name across a cluster, and membership changes.

GET /api/nodes lists every member the metadata knows (`NodeRecord`s), in RabbitMQ's shape
for the fields that exist: this node with all of its own (`overview.node_json`), the others
with `name`, `type` and `running` (whether this node's Raft transport reaches them). Each item
adds Warren's cluster fields: `node_id`, `host`, `amqp_port`, `http_port`, and `raft`
(`role` as this node sees it: "leader", "follower" or "non-voter"; `term`; `applied_index`,
`commit_index` and `snapshot_index` (its log's compacted prefix), known for this node only;
`reachable`).

Membership (administrators; `warren cluster join|leave|remove` calls these):
* PUT /api/cluster/members/{node_id} {"host": H, "port": P}: add the node, its Raft transport
  at H:P, as a voter (the node was started with `--join`);
* DELETE /api/cluster/members/{node_id}: forget its record, then remove it from the group;
  the removed node refuses to serve from then on.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from warrenmq.cluster.raft.core import RaftError
from warrenmq.server.metadata import commands as c
from warrenmq.server.metadata.records import node_name

from .api import Call, ManagementApi, core, no_content, reply
from .errors import bad_request, object_not_found
from .overview import cluster_name, node_json
from .values import integer, text

LEADER = "leader"
FOLLOWER = "follower"
NON_VOTER = "non-voter"


def nodes_json(api: ManagementApi) -> list[dict[str, Any]]:
    host = api.host
    store = host.store
    assert store is not None
    status = store.group.status()
    connected = {member["id"] for member in status["members"] if member["connected"]}
    local = host.node.node_id
    records = dict(api.state.nodes)
    if local not in records:
        records[local] = host.node.record()
    members = set(status["voters"]) | set(records)
    items = []
    for node_id in sorted(members):
        record = records.get(node_id)
        known = node_id == local
        reachable = known or node_id in connected
        item = node_json(api) if known else {"name": node_name(node_id), "type": "disc"}
        item["running"] = reachable
        item.update(
            node_id=node_id,
            host=record.host if record is not None else None,
            amqp_port=record.amqp_port if record is not None else None,
            http_port=record.http_port if record is not None else None,
            raft={
                "role": _role(node_id, status),
                "term": status["term"],
                "applied_index": status["applied"] if known else None,
                "commit_index": status["commit"] if known else None,
                "snapshot_index": status["first_index"] - 1 if known else None,
                "reachable": reachable,
            },
        )
        items.append(item)
    return items


def _role(node_id: int, status: dict[str, Any]) -> str:
    if node_id == status["leader"]:
        return LEADER
    return FOLLOWER if node_id in status["voters"] else NON_VOTER


async def nodes(call: Call) -> web.Response:
    return call.listing(nodes_json(call.api), ("name",))


async def node(call: Call) -> web.Response:
    for item in nodes_json(call.api):
        if item["name"] == call.params["node"]:
            return call.one(item)
    raise object_not_found()


async def get_cluster_name(call: Call) -> web.Response:
    return reply({"name": cluster_name(call.api)})


def _node_id(call: Call) -> int:
    value = call.params["node_id"]
    if not value.isdigit() or int(value) < 1:
        raise bad_request(f"not a node id: {value}")
    return int(value)


async def add_member(call: Call) -> web.Response:
    node_id = _node_id(call)
    body = await call.body()
    host = text(body, "host")
    port = integer(body, "port")
    if not 0 < port <= 65535:
        raise bad_request(f"port must be 1..65535, got {port}")
    await _membership(call.api.host.store.add_member(node_id, host, port))
    return no_content()


async def remove_member(call: Call) -> web.Response:
    node_id = _node_id(call)
    store = call.api.host.store
    # Forgotten first: once removed from the group, a node can no longer propose, and
    # `warren cluster leave` asks the leaving node itself. The node stops serving when it
    # applies its ForgetNode, before it is cut off; both steps are no-ops when done, so a
    # failed removal can be asked again.
    await core(store.apply(c.ForgetNode(node_id)))
    await _membership(store.remove_member(node_id))
    return no_content()


async def _membership(change: Any) -> None:
    try:
        await change
    except RaftError as error:
        raise bad_request(f"membership change refused: {error}") from None

"""Commands of the metadata state machine: small frozen values, applied in order.

A command carries everything its effect depends on (a password arrives already hashed, a
server-named queue already named, an exclusive queue with its owner), so applying the same
sequence on any replica gives the same state: that is what lets Raft replicate them later.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from warrenmq.server.metadata.records import SINGLE_NODE_ID


@dataclass(frozen=True, slots=True)
class DeclareVhost:
    name: str
    description: str = ""
    tags: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DeleteVhost:
    name: str


@dataclass(frozen=True, slots=True)
class AddUser:
    name: str
    password_hash: str = field(repr=False)
    tags: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DeleteUser:
    name: str


@dataclass(frozen=True, slots=True)
class ChangePassword:
    name: str
    password_hash: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class SetUserTags:
    name: str
    tags: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class SetPermissions:
    user: str
    vhost: str
    configure: str
    write: str
    read: str


@dataclass(frozen=True, slots=True)
class ClearPermissions:
    user: str
    vhost: str


@dataclass(frozen=True, slots=True)
class DeclareExchange:
    """exchange.declare (not passive: a passive declare is a read, `MetadataState.router`)."""

    vhost: str
    name: str
    type: str = "direct"
    durable: bool = False
    auto_delete: bool = False
    internal: bool = False
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class DeleteExchange:
    vhost: str
    name: str
    if_unused: bool = False


@dataclass(frozen=True, slots=True)
class DeclareQueue:
    """queue.declare (not passive: see `MetadataState.lookup_queue`).

    `owner` identifies the declaring connection; it becomes the exclusive owner when
    `exclusive`, and is what a redeclaration of an exclusive queue is checked against.
    `server_named` skips the reserved "amq." prefix check for a name the broker generated.
    `node` leads the new queue (placement, chosen by the proposing node); a redeclaration
    keeps the queue where it is. Entries from before placement decode with node 1.
    """

    vhost: str
    name: str
    durable: bool = False
    exclusive: bool = False
    auto_delete: bool = False
    arguments: Mapping[str, Any] = field(default_factory=dict)
    owner: str | None = None
    server_named: bool = False
    node: int = SINGLE_NODE_ID


@dataclass(frozen=True, slots=True)
class DeleteQueue:
    """queue.delete, after the broker checked if-unused/if-empty (it knows consumers and
    depth) and exclusive access (`MetadataState.lookup_queue`)."""

    vhost: str
    name: str


@dataclass(frozen=True, slots=True)
class Bind:
    """queue.bind (destination_kind "queue") or exchange.bind ("exchange")."""

    vhost: str
    source: str
    destination: str
    destination_kind: str = "queue"
    routing_key: str = ""
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Unbind:
    vhost: str
    source: str
    destination: str
    destination_kind: str = "queue"
    routing_key: str = ""
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SetPolicy:
    """Create or replace a policy (rabbitmqctl set_policy, PUT /api/policies/{vhost}/{name}).

    The fields arrive as the client sent them (`definition` a decoded JSON object, `priority` a
    JSON number): the state validates them as RabbitMQ does, with its texts
    (`warrenmq.server.metadata.policies`).
    """

    vhost: str
    name: str
    pattern: str
    definition: Mapping[str, Any]
    priority: int | float = 0
    apply_to: str = "all"


@dataclass(frozen=True, slots=True)
class ClearPolicy:
    vhost: str
    name: str


@dataclass(frozen=True, slots=True)
class SetVhostLimits:
    """Replace a vhost's limits (rabbitmqctl set_vhost_limits); an empty mapping clears them.

    `limits` arrives as the client sent it (decoded JSON): the state validates it
    (`warrenmq.server.metadata.limits`)."""

    vhost: str
    limits: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class SetUserLimits:
    """Replace a user's limits (rabbitmqctl set_user_limits); an empty mapping clears them."""

    user: str
    limits: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ForgetTransient:
    """A restarted broker drops what did not survive it: transient exchanges and queues,
    exclusive queues (their connections are gone) and the bindings that touch them. What is
    left is exactly the durable projection a broker without a replicated log reloaded from
    its rows.

    With `node` (a cluster member restarted), only the transient and exclusive queues that
    node led go, with the bindings to them: other nodes' exclusive queues still have their
    connections, and exchanges are every node's state."""

    node: int | None = None


@dataclass(frozen=True, slots=True)
class RegisterNode:
    """A cluster member's record (`records.NodeRecord`): proposed by each node at start when
    its record is missing or differs."""

    node_id: int
    host: str
    amqp_port: int
    amqps_port: int = 0
    http_port: int = 0


@dataclass(frozen=True, slots=True)
class ForgetNode:
    """A member removed from the cluster."""

    node_id: int


@dataclass(frozen=True, slots=True)
class NodeStarted:
    """A cluster member started (its `boot`, random per start) and found the members in
    `alive_nodes` running, with the boots in `alive_boots`. Transient exchanges live in the
    running nodes' memory, as in RabbitMQ (RAM tables): a node that starts while another
    that holds them runs copies them; one that starts with none running (the whole cluster
    restarted) finds them gone, and so they are forgotten."""

    node_id: int
    boot: int
    alive_nodes: tuple[int, ...] = ()
    alive_boots: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ExpectNew:
    """Refused unless the state is empty (no vhost): first in a seed entry, so that of the
    seeds several new nodes propose only the first applies."""


Command = (
    DeclareVhost
    | DeleteVhost
    | AddUser
    | DeleteUser
    | ChangePassword
    | SetUserTags
    | SetPermissions
    | ClearPermissions
    | DeclareExchange
    | DeleteExchange
    | DeclareQueue
    | DeleteQueue
    | Bind
    | Unbind
    | SetPolicy
    | ClearPolicy
    | SetVhostLimits
    | SetUserLimits
    | ForgetTransient
    | RegisterNode
    | ForgetNode
    | ExpectNew
    | NodeStarted
)

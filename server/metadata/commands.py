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
    `replicas` (the leader first; the proposing node places them too) hold its copies:
    empty, as in entries from before replica sets, it is the leader alone. A new queue's
    ISR is what the proposing node gives: every replica of a queue it replicates (all hold
    the same nothing), else the leader alone (followers that hold no copy must never be
    elected); followers leave and join it by `AlterIsr`. The epochs are given only by a
    snapshot's replay.
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
    replicas: tuple[int, ...] = ()
    isr: tuple[int, ...] = ()
    leader_epoch: int = 0
    partition_epoch: int = 0


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
class AlterIsr:
    """A partition's leader changes its ISR (KIP-497's AlterPartition): it removes a follower
    that lags, or adds one that caught up. Refused as stale (`Outcome.refused`, nothing
    changed) unless `leader` still leads with `leader_epoch` and `partition_epoch` is the
    record's; applied, it bumps `partition_epoch`. The same request applied again (its
    outcome was lost) finds the ISR already `isr` and answers it unchanged."""

    vhost: str
    name: str
    leader: int
    leader_epoch: int
    partition_epoch: int
    isr: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ElectLeaders:
    """The metadata leader judged the nodes in `gone` gone: every partition one of them
    leads, and every partition without a leader, takes the first of its replicas that is in
    its ISR and not gone (`leader_epoch` and `partition_epoch` + 1, the gone leader out of
    the ISR). A partition with no such replica has no leader (NO_LEADER) and keeps its ISR,
    so that the last in-sync replica leads again when it returns: never an unclean
    election. Applied twice, the second changes nothing."""

    gone: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class GrowReplicas:
    """`rabbitmq-queues grow <node> <all|even>`: a replica on `node` for every replicated
    queue matching the patterns that has none there (with `strategy` "even", only those with
    an even number of replicas). The new replica is not in sync: it joins the ISR when it
    has caught up (`AlterIsr`)."""

    node: int
    strategy: str = "all"
    vhost_pattern: str = ".*"
    queue_pattern: str = ".*"


@dataclass(frozen=True, slots=True)
class ShrinkReplicas:
    """`rabbitmq-queues shrink <node>`: the replica on `node` leaves every queue that has
    one. A queue's last replica stays (RabbitMQ's `last_node` error); a leader on `node`
    hands over to another in-sync replica first, and stays when there is none."""

    node: int


@dataclass(frozen=True, slots=True)
class Rebalance:
    """`rabbitmq-queues rebalance <type>`: leaders move, to in-sync replicas only, from nodes
    leading more than their share of the matching queues (RabbitMQ's iterative rebalance)."""

    queue_type: str = "all"
    vhost_pattern: str = ".*"
    queue_pattern: str = ".*"


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
    | AlterIsr
    | ElectLeaders
    | GrowReplicas
    | ShrinkReplicas
    | Rebalance
)

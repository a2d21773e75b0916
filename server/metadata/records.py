"""The entities of the metadata state other than exchanges and bindings (the Router holds those).

Records are frozen: the state replaces a record rather than mutating it, so a record handed to
the broker never changes under it, and snapshots never see a half-applied command.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from warrenmq.exchanges.field_values import arguments_key

DEFAULT_VHOST = "/"
DEFAULT_USER = "guest"
DEFAULT_PASSWORD = "guest"
ADMINISTRATOR = "administrator"


@dataclass(frozen=True, slots=True)
class Vhost:
    name: str
    description: str = ""
    tags: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class User:
    name: str
    password_hash: str = field(repr=False)
    tags: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """A member of the cluster and where its clients reach it (`RegisterNode`)."""

    node_id: int
    host: str
    amqp_port: int
    amqps_port: int = 0
    http_port: int = 0

    @property
    def name(self) -> str:
        return node_name(self.node_id)


def node_name(node_id: int) -> str:
    """The node's name shown to users (HTTP `node` fields, `warren cluster status`)."""
    return f"warren@{node_id}"


# The node a queue belongs to when its declaration predates placement: a data dir from
# before clusters had exactly one node, and it was node 1.
SINGLE_NODE_ID = 1
# A partition's leader when no in-sync replica could take over (`ElectLeaders`): node ids
# start at 1, so no node has this one.
NO_LEADER = 0


@dataclass(frozen=True, slots=True)
class QueueRecord:
    """A queue's declaration and its partition state (the replication design of issue 12).

    `exclusive_owner` names the connection of an exclusive queue; `node` is the node that
    leads the queue (hosts its engine), NO_LEADER when none of its in-sync replicas could
    take over from a leader judged gone. `replicas` are the nodes holding a copy, the
    preferred leader first; `isr` the in-sync replicas, which always hold the leader;
    `leader_epoch` grows on every leader change, `partition_epoch` on any change of leader,
    ISR or replicas (an `AlterIsr` names the one it saw). A record built without them (from
    before replica sets) has the leader as its one replica, in sync, epochs 0."""

    vhost: str
    name: str
    durable: bool
    auto_delete: bool
    arguments: Mapping[str, Any]
    exclusive_owner: str | None = None
    node: int = SINGLE_NODE_ID
    replicas: tuple[int, ...] = ()
    leader_epoch: int = 0
    isr: tuple[int, ...] = ()
    partition_epoch: int = 0

    def __post_init__(self) -> None:
        if not self.replicas:
            object.__setattr__(self, "replicas", (self.node,))
        if not self.isr and self.node != NO_LEADER:
            object.__setattr__(self, "isr", (self.node,))

    @property
    def exclusive(self) -> bool:
        return self.exclusive_owner is not None

    @property
    def min_isr(self) -> int:
        """The commit rule's quorum: a majority of the replicas."""
        return len(self.replicas) // 2 + 1

    @property
    def under_min_isr(self) -> bool:
        """Fewer replicas in sync than the commit rule needs: the partition confirms nothing."""
        return len(self.isr) < self.min_isr

    @property
    def online(self) -> bool:
        return self.node != NO_LEADER

    @property
    def persisted(self) -> bool:
        """Whether the declaration survives a restart: durable and not exclusive."""
        return self.durable and self.exclusive_owner is None


@dataclass(frozen=True, slots=True)
class Policy:
    """A policy: its `definition` (RabbitMQ's keys, without "x-") applies to the queues and
    exchanges of `vhost` whose names `pattern` finds (an unanchored regex search), of the kind
    `apply_to` names; where several match one, the highest `priority` wins (see
    `warrenmq.server.queue.policy`). The state stores the definition with its keys sorted,
    as RabbitMQ's map holds them."""

    vhost: str
    name: str
    pattern: str
    apply_to: str
    priority: int | float
    definition: Mapping[str, Any]


def binding_arguments_digest(arguments: Mapping[str, Any] | None) -> str:
    """A stable text key for a binding's arguments, equal exactly when the Router treats two
    argument tables as the same binding (exchanges.field_values.arguments_key)."""
    return hashlib.sha256(repr(_normalised(arguments_key(arguments))).encode()).hexdigest()


def _normalised(key: Any) -> Any:
    # The Router's identity is tuple equality, under which -0.0 == 0.0 although their reprs
    # differ; map both to one spelling so the text key agrees with the Router.
    if isinstance(key, tuple):
        return tuple(_normalised(item) for item in key)
    if isinstance(key, float) and key == 0.0:
        return 0.0
    return key

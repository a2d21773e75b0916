"""Metadata (vhosts, users, permissions, policies, exchanges, queues, bindings) as a replicated
state machine.

* `state.MetadataState` — the pure state machine: `apply(command) -> Outcome`, the read side
  (`vhosts`, `users`, `permissions`, `policies(vhost)`, `router(vhost)`, `queues(vhost)`,
  `bindings(vhost)`, `lookup_queue`), access checks with RabbitMQ's texts, and
  `snapshot()`/`from_snapshot()`.
* `commands` — the commands (DeclareVhost, AddUser, SetPermissions, SetPolicy, DeclareQueue,
  Bind, ...).
* `replicated.ReplicatedMetadata` — the broker's store: the state replicated by a Raft group
  (`warrenmq.cluster.group`), the SQLite rows kept as its view: `await
  ReplicatedMetadata.open(data_dir)`, `await store.apply(command)`, `await
  store.authenticate(user, password, source)`, `await store.sync_external_changes()`.
* `store.MetadataStore` — the state plus aiosqlite persistence of its rows: what `warren
  users|vhosts|policies --data-dir` edits, and the replicated store's view.
* `passwords` — scrypt hashing; `permissions` — regex checks, refusal texts and the
  loopback_users rule; `policies` — policy validation with RabbitMQ's texts; `limits` — vhost
  and user limits (max-connections, max-queues, max-channels); `errors` — the
  reply-coded refusals (the routing layer's family);
  `encoding` — field tables as JSON.
"""

from warrenmq.server.metadata.commands import (
    AddUser,
    Bind,
    ChangePassword,
    ClearPermissions,
    ClearPolicy,
    Command,
    DeclareExchange,
    DeclareQueue,
    DeclareVhost,
    DeleteExchange,
    DeleteQueue,
    DeleteUser,
    DeleteVhost,
    SetPermissions,
    SetPolicy,
    SetUserLimits,
    SetUserTags,
    SetVhostLimits,
    Unbind,
)
from warrenmq.server.metadata.errors import (
    AccessRefused,
    BadRequest,
    NotAllowed,
    NotFound,
    PreconditionFailed,
    ResourceLocked,
)
from warrenmq.server.metadata.permissions import Permission, is_loopback, loopback_refused
from warrenmq.server.metadata.records import Policy, QueueRecord, User, Vhost
from warrenmq.server.metadata.replicated import MetadataUnavailable, ReplicatedMetadata
from warrenmq.server.metadata.state import Limits, MetadataState, Outcome
from warrenmq.server.metadata.store import METADATA_FILE, MetadataStore, StoreFailed

__all__ = [
    "METADATA_FILE",
    "MetadataUnavailable",
    "AccessRefused",
    "AddUser",
    "BadRequest",
    "Bind",
    "ChangePassword",
    "ClearPermissions",
    "ClearPolicy",
    "Command",
    "DeclareExchange",
    "DeclareQueue",
    "DeclareVhost",
    "DeleteExchange",
    "DeleteQueue",
    "DeleteUser",
    "DeleteVhost",
    "Limits",
    "MetadataState",
    "MetadataStore",
    "ReplicatedMetadata",
    "NotAllowed",
    "NotFound",
    "Outcome",
    "Permission",
    "Policy",
    "PreconditionFailed",
    "QueueRecord",
    "ResourceLocked",
    "SetPermissions",
    "SetPolicy",
    "SetUserLimits",
    "SetUserTags",
    "SetVhostLimits",
    "StoreFailed",
    "Unbind",
    "User",
    "Vhost",
    "is_loopback",
    "loopback_refused",
]

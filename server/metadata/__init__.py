"""Metadata (vhosts, users, permissions, exchanges, queues, bindings) as a replicated state machine.

* `state.MetadataState` — the pure state machine: `apply(command) -> Outcome`, the read side
  (`vhosts`, `users`, `permissions`, `router(vhost)`, `queues(vhost)`, `bindings(vhost)`,
  `lookup_queue`), access checks with RabbitMQ's texts, and `snapshot()`/`from_snapshot()`.
* `commands` — the commands (DeclareVhost, AddUser, SetPermissions, DeclareQueue, Bind, ...).
* `store.MetadataStore` — the state plus aiosqlite persistence: `await MetadataStore.open(path)`,
  `await store.apply(command)`, `await store.authenticate(user, password)`,
  `await store.sync_external_changes()`.
* `passwords` — scrypt hashing; `permissions` — regex checks, refusal texts and the
  loopback_users rule; `errors` — the reply-coded refusals (the routing layer's family);
  `encoding` — field tables as JSON.
"""

from warrenmq.server.metadata.commands import (
    AddUser,
    Bind,
    ChangePassword,
    ClearPermissions,
    Command,
    DeclareExchange,
    DeclareQueue,
    DeclareVhost,
    DeleteExchange,
    DeleteQueue,
    DeleteUser,
    DeleteVhost,
    SetPermissions,
    SetUserTags,
    Unbind,
)
from warrenmq.server.metadata.errors import (
    AccessRefused,
    NotAllowed,
    NotFound,
    PreconditionFailed,
    ResourceLocked,
)
from warrenmq.server.metadata.permissions import Permission, is_loopback, loopback_refused
from warrenmq.server.metadata.records import QueueRecord, User, Vhost
from warrenmq.server.metadata.state import Limits, MetadataState, Outcome
from warrenmq.server.metadata.store import METADATA_FILE, MetadataStore, StoreFailed

__all__ = [
    "METADATA_FILE",
    "AccessRefused",
    "AddUser",
    "Bind",
    "ChangePassword",
    "ClearPermissions",
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
    "NotAllowed",
    "NotFound",
    "Outcome",
    "Permission",
    "PreconditionFailed",
    "QueueRecord",
    "ResourceLocked",
    "SetPermissions",
    "SetUserTags",
    "StoreFailed",
    "Unbind",
    "User",
    "Vhost",
    "is_loopback",
    "loopback_refused",
]

"""The metadata state machine: vhosts, users, permissions, policies, exchanges, queues and
bindings.

Pure and deterministic: `apply(command)` validates the command against the current state,
mutates it, and returns an `Outcome` that says what changed and which rows a store must write
(`Outcome.writes`). No I/O, no clock, no randomness, so every replica that applies the same
commands in the same order holds the same state, and `snapshot()` gives the same bytes.

Exchanges and bindings live in one `warrenmq.exchanges.router.Router` per vhost: its declare,
delete, bind and unbind checks are RabbitMQ's (errors are `exchanges.errors.RoutingError`),
and the broker routes publishes through the same Router (`state.router(vhost)`), so there is
one copy of the routing topology, not two to keep in step. Everything else raises
`exchanges.errors.RoutingError` (as `metadata.errors` re-exports it); both carry `reply_code`,
`reply_text`, `connection_level`.
A command that raises changes nothing.

Policies are validated as RabbitMQ 4.2 validates them (`policies.validate`, 400 with its texts).
A vhost's policies are one mapping that every change replaces rather than mutates, so a holder
of `policies(vhost)` knows by identity whether they changed since it looked; which policy
applies to a queue, and how, is `warrenmq.server.queue.policy`.

Queue declaration follows RabbitMQ 3.10 (rabbit_channel, rabbit_amqqueue, rabbit_misc):
* a client-chosen name starting "amq." is refused (403) before anything else;
* an exclusive queue is never durable, whatever the declare says;
* redeclaring checks exclusive ownership strictly (405), then `durable`, then `auto_delete`,
  then each declarable argument in `QUEUE_DECLARABLE_ARGUMENTS` order (406): two present values
  are equal when their types are in the same class (all ints, all floats) and Erlang's `==`
  holds; a missing `x-queue-type` is equivalent to "classic" (rabbitmq-common#341);
* other operations on an exclusive queue check ownership laxly (`lookup_queue`): the owner or,
  for a queue with no owner, anyone.

Durability as RabbitMQ has it: transient exchanges and queues and exclusive queues are never
written; a binding is written only when both its ends are; deleting an entity deletes its row
whatever its durability was (the store's deletes cascade to bindings).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

from warrenmq.exchanges.binding import EXCHANGE, QUEUE, Binding, Destination
from warrenmq.exchanges.field_values import ABSENT, amqp_type_name, argument_mismatch
from warrenmq.exchanges.router import PREDECLARED, Exchange, Router
from warrenmq.server.metadata import commands as c
from warrenmq.server.metadata import encoding, partitions, passwords, permissions, policies
from warrenmq.server.metadata.errors import (
    AccessRefused,
    BadRequest,
    NotFound,
    PreconditionFailed,
    ResourceLocked,
)
from warrenmq.server.metadata.limits import (
    MAX_QUEUES,
    USER_LIMITS,
    VHOST_LIMITS,
    limit_reached,
    validate_limits,
)
from warrenmq.server.metadata.partitions import PartitionResult
from warrenmq.server.metadata.permissions import Access, Permission
from warrenmq.server.metadata.records import (
    DEFAULT_VHOST,
    NO_LEADER,
    SINGLE_NODE_ID,
    NodeRecord,
    Policy,
    QueueRecord,
    User,
    Vhost,
    binding_arguments_digest,
)

# rabbit_amqqueue:declare_args/0 in 3.10: only these arguments take part in equivalence.
QUEUE_DECLARABLE_ARGUMENTS = (
    "x-expires",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-in-memory-length",
    "x-max-in-memory-bytes",
    "x-max-priority",
    "x-overflow",
    "x-queue-mode",
    "x-single-active-consumer",
    "x-queue-type",
    "x-quorum-initial-group-size",
    "x-max-age",
    "x-stream-max-segment-size-bytes",
    "x-initial-cluster-size",
    "x-queue-leader-locator",
)
SNAPSHOT_FORMAT = 5
# Format 3 predates placement and nodes: its queues belong to node 1. Format 4 predates
# replica sets: each queue is its leader alone, in sync, epochs 0.
SNAPSHOT_FORMATS_READ = (3, 4, SNAPSHOT_FORMAT)
NAME_CHARS_MAX = 255  # a shortstr: queue, exchange and vhost names travel as one
_PREDECLARED_NAMES = frozenset(name for name, _, _ in PREDECLARED)

# A row to write: ("put_vhost", Vhost), ("delete_vhost", name), ("put_user", User),
# ("delete_user", name), ("put_permission", Permission), ("delete_permission", user, vhost),
# ("put_exchange", vhost, Exchange), ("delete_exchange", vhost, name), ("put_queue", QueueRecord),
# ("delete_queue", vhost, name), ("put_binding", vhost, source, Binding),
# ("delete_binding", vhost, source, Binding), ("put_policy", Policy),
# ("delete_policy", vhost, name), ("put_limits", "vhost" or "user", name, limits),
# ("delete_limits", "vhost" or "user", name).
Write = tuple


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a command did.

    `created` is True when a declare made a new entity; `deleted_exchanges` lists every exchange
    removed (the named one first, then auto-deletes it caused); `deleted_queues` the queues a
    vhost deletion removed, whose storage the broker must drop. `partitions` lists the queues
    a replica command (`ElectLeaders`, `GrowReplicas`, `ShrinkReplicas`, `Rebalance`,
    `AlterIsr`) touched, with their records afterwards; `refused` says why an `AlterIsr` was
    stale (`partitions.STALE_PARTITION_EPOCH`, `partitions.NOT_LEADER`; nothing changed).
    """

    changed: bool
    created: bool = False
    queue: QueueRecord | None = None
    exchange: Exchange | None = None
    deleted_exchanges: tuple[str, ...] = ()
    deleted_queues: tuple[str, ...] = ()
    writes: tuple[Write, ...] = ()
    partitions: tuple[PartitionResult, ...] = ()
    refused: str = ""


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on the state's size; a declare beyond one is refused with 406."""

    vhosts_max: int = 10_000
    users_max: int = 100_000
    queues_per_vhost_max: int = 1_000_000
    exchanges_per_vhost_max: int = 100_000
    # All vhosts together, as RabbitMQ's runtime_parameters limit counts them.
    policies_max: int = 10_000


class MetadataState:
    """The replicated metadata: apply commands, read entities, check access."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self.vhosts: dict[str, Vhost] = {}
        self.users: dict[str, User] = {}
        self.permissions: dict[tuple[str, str], Permission] = {}
        self._policies: dict[str, dict[str, Policy]] = {}
        self._policy_count = 0
        # set_vhost_limits and set_user_limits: absent when none are set.
        self.vhost_limits: dict[str, Mapping[str, int]] = {}
        self.user_limits: dict[str, Mapping[str, int]] = {}
        self._routers: dict[str, Router] = {}
        self._queues: dict[str, dict[str, QueueRecord]] = {}
        # Exclusive queues by owning connection, so a closing connection finds its own without
        # a scan of every queue.
        self._owned: dict[str, dict[tuple[str, str], QueueRecord]] = {}
        # Names of each vhost's durable user-declared exchanges, to know after a cascade which
        # deleted exchanges had rows, and how many exchanges each vhost has.
        self._durable_exchanges: dict[str, set[str]] = {}
        self._exchange_counts: dict[str, int] = {}
        self.nodes: dict[int, NodeRecord] = {}
        """The cluster's members by id (`RegisterNode`); empty until a node registers."""
        self.transient_holders: dict[int, int] = {}
        """The boot of each member holding the transient exchanges (`NodeStarted`)."""
        # How many queues each node leads, and holds a replica of, for balanced placement.
        self._led: dict[int, int] = {}
        self._held: dict[int, int] = {}
        self._handlers: dict[type, Callable[[Any], Outcome]] = {
            c.DeclareVhost: self._declare_vhost,
            c.DeleteVhost: self._delete_vhost,
            c.AddUser: self._add_user,
            c.DeleteUser: self._delete_user,
            c.ChangePassword: self._change_password,
            c.SetUserTags: self._set_user_tags,
            c.SetPermissions: self._set_permissions,
            c.ClearPermissions: self._clear_permissions,
            c.DeclareExchange: self._declare_exchange,
            c.DeleteExchange: self._delete_exchange,
            c.DeclareQueue: self._declare_queue,
            c.DeleteQueue: self._delete_queue,
            c.Bind: self._bind,
            c.Unbind: self._unbind,
            c.SetPolicy: self._set_policy,
            c.ClearPolicy: self._clear_policy,
            c.SetVhostLimits: self._set_vhost_limits,
            c.SetUserLimits: self._set_user_limits,
            c.ForgetTransient: self._forget_transient,
            c.RegisterNode: self._register_node,
            c.ForgetNode: self._forget_node,
            c.ExpectNew: self._expect_new,
            c.NodeStarted: self._node_started,
            c.AlterIsr: self._alter_isr,
            c.ElectLeaders: self._elect_leaders,
            c.GrowReplicas: self._grow_replicas,
            c.ShrinkReplicas: self._shrink_replicas,
            c.Rebalance: self._rebalance,
        }

    # --- the state machine -----------------------------------------------------------------

    def apply(self, command: c.Command) -> Outcome:
        """Apply one command; raises RoutingError (state unchanged) if refused."""
        handler = self._handlers.get(type(command))
        if handler is None:
            raise TypeError(f"not a metadata command: {command!r}")
        return handler(command)

    # --- read side -------------------------------------------------------------------------

    def router(self, vhost: str) -> Router:
        """The vhost's exchanges and bindings, for routing and passive exchange declares."""
        router = self._routers.get(vhost)
        if router is None:
            raise NotFound(f"no vhost '{vhost}'")
        return router

    def exchanges(self, vhost: str) -> list[Exchange]:
        return self.router(vhost).exchanges()

    def queues(self, vhost: str) -> Mapping[str, QueueRecord]:
        queues = self._queues.get(vhost)
        if queues is None:
            raise NotFound(f"no vhost '{vhost}'")
        return queues

    def queue(self, vhost: str, name: str) -> QueueRecord | None:
        return self._queues.get(vhost, {}).get(name)

    def bindings(self, vhost: str) -> list[tuple[str, Binding]]:
        """(source exchange, binding) for every binding in the vhost."""
        router = self.router(vhost)
        return [
            (exchange.name, binding)
            for exchange in router.exchanges()
            for binding in exchange.table.bindings()
        ]

    def policies(self, vhost: str) -> Mapping[str, Policy]:
        """The vhost's policies by name; a new mapping after every change (see above)."""
        policies = self._policies.get(vhost)
        if policies is None:
            raise NotFound(f"no vhost '{vhost}'")
        return policies

    def lookup_queue(self, vhost: str, name: str, owner: str | None) -> QueueRecord:
        """A queue for passive declare, consume, get, bind, purge or delete by connection `owner`:
        404 if missing, 405 if exclusive to another connection (rabbit's lax check)."""
        name = strip_cr_lf(name)
        record = self._queues.get(vhost, {}).get(name)
        if record is None:
            raise NotFound(f"no queue '{name}' in vhost '{vhost}'")
        if record.exclusive_owner is not None and record.exclusive_owner != owner:
            raise _locked(record)
        return record

    def balanced_node(
        self, default: int, besides: int = 0, among: Collection[int] | None = None
    ) -> int:
        """The member leading the fewest queues, ties to the lowest id (RabbitMQ's
        `balanced` queue leader locator), other than `besides` and, when given, one of
        `among` (the nodes running, as RabbitMQ picks only among those); `default` when no
        such node has registered."""
        led = self._led
        candidates = [
            node for node in self.nodes if node != besides and (among is None or node in among)
        ]
        return min(candidates, key=lambda node: (led.get(node, 0), node), default=default)

    def queues_led(self, node: int) -> int:
        return self._led.get(node, 0)

    def replicas_held(self, node: int) -> int:
        return self._held.get(node, 0)

    def place_replicas(
        self, leader: int, count: int, among: Collection[int] | None = None
    ) -> tuple[int, ...]:
        """A new queue's replicas: `leader`, then followers on the registered members
        holding the fewest replicas, those in `among` (running) first
        (`partitions.place_replicas`)."""
        return partitions.place_replicas(leader, count, self.nodes, self._held, among)

    def all_queues(self) -> list[QueueRecord]:
        """Every queue of every vhost, in (vhost, name) order: deterministic, for the
        commands that touch many."""
        return [
            self._queues[vhost][name]
            for vhost in sorted(self._queues)
            for name in sorted(self._queues[vhost])
        ]

    def elections_needed(self, gone: Collection[int]) -> bool:
        """Whether `ElectLeaders(gone)` would change anything (the controller asks before
        proposing it)."""
        return any(partitions.elect(record, gone) is not None for record in self.all_queues())

    def queues_owned_by(self, owner: str) -> list[QueueRecord]:
        """The exclusive queues of a connection, to delete when it closes."""
        return list(self._owned.get(owner, {}).values())

    # --- access control --------------------------------------------------------------------

    def permission(self, user: str, vhost: str) -> Permission | None:
        return self.permissions.get((user, vhost))

    def check_vhost_access(self, user: str, vhost: str) -> None:
        """connection.open: raise NotAllowed (530) unless the vhost exists and the user has a
        permission entry on it."""
        if vhost not in self.vhosts:
            raise permissions.vhost_not_found(vhost)
        if (user, vhost) not in self.permissions:
            raise permissions.vhost_refused(vhost, user)

    def can_access(self, user: str, vhost: str, access: Access, kind: str, name: str) -> bool:
        return permissions.allows(self.permissions.get((user, vhost)), access, kind, name)

    def check_resource_access(
        self, user: str, vhost: str, access: Access, kind: str, name: str
    ) -> None:
        """Raise AccessRefused (403) with RabbitMQ's text unless `user` may `access` the
        `kind` ("queue" or "exchange") called `name` in `vhost`."""
        if not self.can_access(user, vhost, access, kind, name):
            raise permissions.resource_refused(access, kind, name, vhost, user)

    # --- snapshots -------------------------------------------------------------------------

    def snapshot(self) -> bytes:
        """Every entity, transient ones included, as deterministic bytes (for Raft)."""
        return encoding.dumps(self._document()).encode("utf-8")

    def has_transient(self, node: int | None = None) -> bool:
        """Whether any exchange or queue is transient (exclusive queues are); with `node`,
        any transient queue that node leads (what `ForgetTransient(node)` would drop)."""
        if node is not None:
            return any(
                not record.durable and _led_by(record, node)
                for queues in self._queues.values()
                for record in queues.values()
            )
        if any(
            not exchange.durable
            for router in self._routers.values()
            for exchange in router.exchanges()
        ):
            return True
        return any(
            not record.durable for queues in self._queues.values() for record in queues.values()
        )

    def _document(self) -> dict:
        exchanges = []
        queues = []
        bindings = []
        for vhost in sorted(self._routers):
            router = self._routers[vhost]
            for exchange in sorted(router.exchanges(), key=lambda e: e.name):
                if exchange.name not in _PREDECLARED_NAMES:
                    exchanges.append(
                        [
                            vhost,
                            exchange.name,
                            exchange.type,
                            exchange.durable,
                            exchange.auto_delete,
                            exchange.internal,
                            encoding.encode_table(exchange.arguments),
                        ]
                    )
                rows = [
                    (
                        binding.destination.kind,
                        binding.destination.name,
                        binding.routing_key,
                        binding_arguments_digest(binding.arguments),
                        binding.arguments,
                    )
                    for binding in exchange.table.bindings()
                ]
                for kind, name, key, _, arguments in sorted(rows, key=lambda row: row[:4]):
                    bindings.append(
                        [vhost, exchange.name, kind, name, key, encoding.encode_table(arguments)]
                    )
            for name in sorted(self._queues[vhost]):
                record = self._queues[vhost][name]
                queues.append(
                    [
                        vhost,
                        name,
                        record.durable,
                        record.auto_delete,
                        encoding.encode_table(record.arguments),
                        record.exclusive_owner,
                        record.node,
                        list(record.replicas),
                        record.leader_epoch,
                        list(record.isr),
                        record.partition_epoch,
                    ]
                )
        document = {
            "format": SNAPSHOT_FORMAT,
            "vhosts": [
                [v.name, v.description, list(v.tags)]
                for v in sorted(self.vhosts.values(), key=lambda v: v.name)
            ],
            "users": [
                [u.name, u.password_hash, list(u.tags)]
                for u in sorted(self.users.values(), key=lambda u: u.name)
            ],
            "permissions": [
                [p.user, p.vhost, p.configure, p.write, p.read]
                for _, p in sorted(self.permissions.items())
            ],
            "policies": [
                [p.vhost, p.name, p.pattern, p.apply_to, p.priority, dict(p.definition)]
                for vhost in sorted(self._policies)
                for _, p in sorted(self._policies[vhost].items())
            ],
            "exchanges": exchanges,
            "queues": queues,
            "bindings": bindings,
            "nodes": [
                [n.node_id, n.host, n.amqp_port, n.amqps_port, n.http_port]
                for _, n in sorted(self.nodes.items())
            ],
            "transient_holders": sorted(self.transient_holders.items()),
            "limits": [
                ["vhost", name, dict(value)] for name, value in sorted(self.vhost_limits.items())
            ]
            + [["user", name, dict(value)] for name, value in sorted(self.user_limits.items())],
        }
        return document

    def _forget_transient(self, command: c.ForgetTransient) -> Outcome:
        document = self._document()
        if command.node is None:
            document["exchanges"] = [row for row in document["exchanges"] if row[3]]
            document["queues"] = [row for row in document["queues"] if row[2]]
            document["bindings"] = [
                row
                for row in document["bindings"]
                if self._binding_durable(row[0], row[1], Destination(row[2], row[3]))
            ]
        else:
            forgotten = {
                (record.vhost, record.name)
                for record in self.all_queues()
                if not record.durable and _led_by(record, command.node)
            }
            document["queues"] = [
                row for row in document["queues"] if (row[0], row[1]) not in forgotten
            ]
            document["bindings"] = [
                row
                for row in document["bindings"]
                if row[2] != QUEUE or (row[0], row[3]) not in forgotten
            ]
        self._rebuild(document)
        # Transient entities never had rows, so there is nothing to write.
        return Outcome(True)

    def _rebuild(self, document: dict) -> None:
        """Become the state `document` describes (what is left after a forget)."""
        durable = MetadataState(self.limits)
        for replayed in _snapshot_commands(document):
            durable.apply(replayed)
        handlers = self._handlers
        self.__dict__.update(durable.__dict__)
        # The handlers must stay bound to this object, not to the one rebuilt.
        self._handlers = handlers

    @classmethod
    def from_snapshot(cls, data: bytes, limits: Limits | None = None) -> MetadataState:
        """The state `snapshot()` described; raises ValueError if `data` is not a snapshot."""
        try:
            document = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(f"not a metadata snapshot: {error}") from error
        if not isinstance(document, dict) or document.get("format") not in SNAPSHOT_FORMATS_READ:
            raise ValueError("not a metadata snapshot of a known format")
        state = cls(limits)
        try:
            for command in _snapshot_commands(document):
                state.apply(command)
        except (KeyError, TypeError, IndexError) as error:
            raise ValueError(f"malformed metadata snapshot: {error!r}") from error
        return state

    # --- vhosts ----------------------------------------------------------------------------

    def _declare_vhost(self, command: c.DeclareVhost) -> Outcome:
        name = command.name
        _check_name("vhost", name)
        if name in self.vhosts:
            raise PreconditionFailed(f"vhost '{name}' already exists")
        if len(self.vhosts) >= self.limits.vhosts_max:
            raise PreconditionFailed(f"vhost limit ({self.limits.vhosts_max}) is reached")
        vhost = Vhost(name, command.description, _unique(command.tags))
        queues: dict[str, QueueRecord] = {}
        self.vhosts[name] = vhost
        self._queues[name] = queues
        self._routers[name] = Router(name, queue_exists=queues.__contains__)
        # RabbitMQ's predeclared exchanges are durable: bindings from them can be too.
        self._durable_exchanges[name] = set(_PREDECLARED_NAMES)
        self._exchange_counts[name] = 0
        self._policies[name] = {}
        return Outcome(True, created=True, writes=(("put_vhost", vhost),))

    def _delete_vhost(self, command: c.DeleteVhost) -> Outcome:
        name = command.name
        if name == DEFAULT_VHOST:
            # RabbitMQ allows it, but "/" is where the default user and every client that
            # names no vhost land, and it is seeded only on first start: refuse rather than
            # leave a broker that no default client can use.
            raise PreconditionFailed(f"cannot delete the default vhost '{DEFAULT_VHOST}'")
        if name not in self.vhosts:
            raise NotFound(f"no vhost '{name}'")
        queues = self._queues.pop(name)
        for record in queues.values():
            self._disown(record)
            self._count(record, -1)
        deleted_queues = tuple(sorted(queues))
        router = self._routers.pop(name)
        deleted_exchanges = tuple(
            sorted(e.name for e in router.exchanges() if e.name not in _PREDECLARED_NAMES)
        )
        del self._durable_exchanges[name]
        del self._exchange_counts[name]
        del self.vhosts[name]
        for key in [key for key in self.permissions if key[1] == name]:
            del self.permissions[key]
        self._policy_count -= len(self._policies.pop(name))
        self.vhost_limits.pop(name, None)
        return Outcome(
            True,
            deleted_exchanges=deleted_exchanges,
            deleted_queues=deleted_queues,
            writes=(("delete_vhost", name),),
        )

    # --- users -----------------------------------------------------------------------------

    def _add_user(self, command: c.AddUser) -> Outcome:
        name = command.name
        _check_name("user", name)
        if name in self.users:
            raise PreconditionFailed(f"user '{name}' already exists")
        if len(self.users) >= self.limits.users_max:
            raise PreconditionFailed(f"user limit ({self.limits.users_max}) is reached")
        _check_password_hash(command.password_hash)
        user = User(name, command.password_hash, _unique(command.tags))
        self.users[name] = user
        return Outcome(True, created=True, writes=(("put_user", user),))

    def _delete_user(self, command: c.DeleteUser) -> Outcome:
        self._user_or_die(command.name)
        del self.users[command.name]
        for key in [key for key in self.permissions if key[0] == command.name]:
            del self.permissions[key]
        self.user_limits.pop(command.name, None)
        return Outcome(True, writes=(("delete_user", command.name),))

    def _change_password(self, command: c.ChangePassword) -> Outcome:
        user = self._user_or_die(command.name)
        _check_password_hash(command.password_hash)
        user = User(user.name, command.password_hash, user.tags)
        self.users[user.name] = user
        return Outcome(True, writes=(("put_user", user),))

    def _set_user_tags(self, command: c.SetUserTags) -> Outcome:
        user = self._user_or_die(command.name)
        user = User(user.name, user.password_hash, _unique(command.tags))
        self.users[user.name] = user
        return Outcome(True, writes=(("put_user", user),))

    def _user_or_die(self, name: str) -> User:
        user = self.users.get(name)
        if user is None:
            raise NotFound(f"no user '{name}'")
        return user

    # --- permissions -----------------------------------------------------------------------

    def _set_permissions(self, command: c.SetPermissions) -> Outcome:
        self._user_or_die(command.user)
        if command.vhost not in self.vhosts:
            raise NotFound(f"no vhost '{command.vhost}'")
        for pattern in (command.configure, command.write, command.read):
            permissions.validate_pattern(pattern)
        permission = Permission(
            command.user, command.vhost, command.configure, command.write, command.read
        )
        key = (command.user, command.vhost)
        if self.permissions.get(key) == permission:
            return Outcome(False)
        self.permissions[key] = permission
        return Outcome(True, writes=(("put_permission", permission),))

    def _clear_permissions(self, command: c.ClearPermissions) -> Outcome:
        self._user_or_die(command.user)
        if command.vhost not in self.vhosts:
            raise NotFound(f"no vhost '{command.vhost}'")
        if self.permissions.pop((command.user, command.vhost), None) is None:
            return Outcome(False)
        return Outcome(True, writes=(("delete_permission", command.user, command.vhost),))

    # --- policies --------------------------------------------------------------------------

    def _set_policy(self, command: c.SetPolicy) -> Outcome:
        current = self.policies(command.vhost)
        _check_name("policy", command.name)
        policies.validate(command.pattern, command.definition, command.priority, command.apply_to)
        existing = current.get(command.name)
        if existing is None and self._policy_count >= self.limits.policies_max:
            # rabbit_runtime_parameters:is_within_limit/1's text.
            raise BadRequest(
                f"Validation failed\n\ncomponent policy is limited to {self.limits.policies_max}\n"
            )
        policy = Policy(
            command.vhost,
            command.name,
            command.pattern,
            command.apply_to,
            command.priority,
            policies.sorted_definition(command.definition),
        )
        if policy == existing:
            return Outcome(False)
        self._policies[command.vhost] = {**current, policy.name: policy}
        if existing is None:
            self._policy_count += 1
        return Outcome(True, created=existing is None, writes=(("put_policy", policy),))

    def _clear_policy(self, command: c.ClearPolicy) -> Outcome:
        current = self.policies(command.vhost)
        if command.name not in current:
            # rabbit_runtime_parameters:clear_any/4's text.
            raise NotFound("Parameter does not exist")
        self._policies[command.vhost] = {
            name: policy for name, policy in current.items() if name != command.name
        }
        self._policy_count -= 1
        return Outcome(True, writes=(("delete_policy", command.vhost, command.name),))

    # --- vhost and user limits -------------------------------------------------------------

    def _set_vhost_limits(self, command: c.SetVhostLimits) -> Outcome:
        if command.vhost not in self.vhosts:
            raise NotFound(f"no vhost '{command.vhost}'")
        value = validate_limits(command.limits, VHOST_LIMITS)
        return _replace_limits(self.vhost_limits, "vhost", command.vhost, value)

    def _set_user_limits(self, command: c.SetUserLimits) -> Outcome:
        self._user_or_die(command.user)
        value = validate_limits(command.limits, USER_LIMITS)
        return _replace_limits(self.user_limits, "user", command.user, value)

    # --- exchanges -------------------------------------------------------------------------

    def _declare_exchange(self, command: c.DeclareExchange) -> Outcome:
        vhost = command.vhost
        router = self.router(vhost)
        name = strip_cr_lf(command.name)
        _check_name("exchange", name)
        count = self._exchange_counts[vhost]
        if router.get(name) is None and count >= self.limits.exchanges_per_vhost_max:
            raise PreconditionFailed(
                f"cannot declare exchange '{name}' in vhost '{vhost}': exchange limit "
                f"({self.limits.exchanges_per_vhost_max}) is reached"
            )
        declared = router.declare(
            name,
            command.type,
            durable=command.durable,
            auto_delete=command.auto_delete,
            internal=command.internal,
            arguments=command.arguments,
        )
        exchange = declared.exchange
        if not declared.created:
            return Outcome(False, exchange=exchange)
        self._exchange_counts[vhost] = count + 1
        writes: tuple[Write, ...] = ()
        if exchange.durable:
            self._durable_exchanges[vhost].add(exchange.name)
            writes = (("put_exchange", vhost, exchange),)
        return Outcome(True, created=True, exchange=exchange, writes=writes)

    def _delete_exchange(self, command: c.DeleteExchange) -> Outcome:
        change = self.router(command.vhost).delete(command.name, if_unused=command.if_unused)
        if not change.changed:
            return Outcome(False)
        return Outcome(
            True,
            deleted_exchanges=change.deleted_exchanges,
            writes=self._forget_exchanges(command.vhost, change.deleted_exchanges),
        )

    def _forget_exchanges(self, vhost: str, names: tuple[str, ...]) -> tuple[Write, ...]:
        durable = self._durable_exchanges[vhost]
        self._exchange_counts[vhost] -= len(names)
        writes = []
        for name in names:
            if name in durable:
                durable.discard(name)
                writes.append(("delete_exchange", vhost, name))
        return tuple(writes)

    # --- queues ----------------------------------------------------------------------------

    def _declare_queue(self, command: c.DeclareQueue) -> Outcome:
        vhost = command.vhost
        queues = self.queues(vhost)
        name = strip_cr_lf(command.name)
        if not name:
            raise ValueError("the broker names a server-named queue before declaring it")
        _check_name("queue", name)
        if not command.server_named and name.startswith("amq."):
            raise AccessRefused(f"queue name '{name}' contains reserved prefix 'amq.*'")
        if command.exclusive and command.owner is None:
            raise ValueError("an exclusive queue needs its owning connection")
        owner = command.owner if command.exclusive else None
        # rabbit_channel: `Durable = DurableDeclare andalso not ExclusiveDeclare`; an exclusive
        # queue is never durable, so its redeclaration with either flag is equivalent.
        durable = command.durable and not command.exclusive
        existing = queues.get(name)
        if existing is not None:
            _assert_queue_equivalence(
                existing, durable, command.auto_delete, command.arguments, owner
            )
            return Outcome(False, queue=existing)
        limit = limit_reached(self.vhost_limits.get(vhost), MAX_QUEUES, len(queues))
        if limit is not None:
            raise PreconditionFailed(
                f"cannot declare queue '{name}': queue limit in vhost '{vhost}' ({limit}) "
                "is reached"
            )
        if len(queues) >= self.limits.queues_per_vhost_max:
            raise PreconditionFailed(
                f"cannot declare queue '{name}' in vhost '{vhost}': queue limit in vhost "
                f"'{vhost}' ({self.limits.queues_per_vhost_max}) is reached"
            )
        record = QueueRecord(
            vhost,
            name,
            durable,
            command.auto_delete,
            dict(command.arguments),
            owner,
            command.node,
            command.replicas,
            command.leader_epoch,
            command.isr,
            command.partition_epoch,
        )
        _check_partition(record)
        queues[name] = record
        self._count(record, 1)
        if owner is not None:
            self._owned.setdefault(owner, {})[(vhost, name)] = record
        writes = (("put_queue", record),) if record.persisted else ()
        return Outcome(True, created=True, queue=record, writes=writes)

    def _delete_queue(self, command: c.DeleteQueue) -> Outcome:
        vhost = command.vhost
        queues = self.queues(vhost)
        name = strip_cr_lf(command.name)
        record = queues.pop(name, None)
        if record is None:
            return Outcome(False)
        self._disown(record)
        self._count(record, -1)
        change = self._routers[vhost].queue_deleted(name)
        writes = self._forget_exchanges(vhost, change.deleted_exchanges)
        if record.persisted:
            writes = (("delete_queue", vhost, name), *writes)
        return Outcome(
            True, queue=record, deleted_exchanges=change.deleted_exchanges, writes=writes
        )

    def _count(self, record: QueueRecord, change: int) -> None:
        """Count `record` (change 1) or stop counting it (-1) in `_led` and `_held`."""
        nodes: tuple[tuple[dict[int, int], int], ...] = tuple(
            (self._held, node) for node in record.replicas
        )
        if record.node != NO_LEADER:
            nodes += ((self._led, record.node),)
        for counts, node in nodes:
            count = counts.get(node, 0) + change
            if count:
                counts[node] = count
            else:
                del counts[node]

    def _replace_queues(self, records: list[QueueRecord]) -> None:
        """Put new versions of existing queues' records in place (partition changes)."""
        for record in records:
            queues = self._queues[record.vhost]
            self._count(queues[record.name], -1)
            queues[record.name] = record
            self._count(record, 1)
            if record.exclusive_owner is not None:
                self._owned[record.exclusive_owner][(record.vhost, record.name)] = record

    # --- replica sets ----------------------------------------------------------------------

    def _alter_isr(self, command: c.AlterIsr) -> Outcome:
        queues = self.queues(command.vhost)
        record = queues.get(command.name)
        if record is None:
            raise NotFound(f"no queue '{command.name}' in vhost '{command.vhost}'")
        isr = tuple(command.isr)
        if record.node != command.leader or record.leader_epoch != command.leader_epoch:
            return Outcome(False, queue=record, refused=partitions.NOT_LEADER)
        if record.isr == isr:
            # Applied before (a retry whose outcome was lost), or asking for what is.
            return Outcome(False, queue=record)
        if record.partition_epoch != command.partition_epoch:
            return Outcome(False, queue=record, refused=partitions.STALE_PARTITION_EPOCH)
        altered = partitions.alter_isr(record, isr)
        _check_partition(altered)
        self._replace_queues([altered])
        return Outcome(True, queue=altered, partitions=(PartitionResult(altered),))

    def _elect_leaders(self, command: c.ElectLeaders) -> Outcome:
        elected = [
            record
            for record in (partitions.elect(record, command.gone) for record in self.all_queues())
            if record is not None
        ]
        self._replace_queues(elected)
        return Outcome(bool(elected), partitions=tuple(map(PartitionResult, elected)))

    def _grow_replicas(self, command: c.GrowReplicas) -> Outcome:
        if command.node not in self.nodes:
            raise NotFound(f"no node {command.node} in the cluster")
        if command.strategy not in partitions.STRATEGIES:
            raise BadRequest(f"strategy must be one of {', '.join(partitions.STRATEGIES)}")
        grown = [
            partitions.grow(record, command.node)
            for record in self._matching(command.vhost_pattern, command.queue_pattern)
            if _replicated(record)
            and command.node not in record.replicas
            and (command.strategy == "all" or len(record.replicas) % 2 == 0)
        ]
        self._replace_queues(grown)
        return Outcome(bool(grown), partitions=tuple(map(PartitionResult, grown)))

    def _shrink_replicas(self, command: c.ShrinkReplicas) -> Outcome:
        results = [
            partitions.shrink(record, command.node)
            for record in self.all_queues()
            if command.node in record.replicas
        ]
        self._replace_queues([result.queue for result in results if not result.error])
        return Outcome(any(not result.error for result in results), partitions=tuple(results))

    def _rebalance(self, command: c.Rebalance) -> Outcome:
        if command.queue_type not in partitions.QUEUE_TYPES:
            raise BadRequest(f"queue type must be one of {', '.join(partitions.QUEUE_TYPES)}")
        records = [
            record
            for record in self._matching(command.vhost_pattern, command.queue_pattern)
            if record.node != NO_LEADER
            and len(record.replicas) > 1
            and command.queue_type in ("all", _queue_type(record))
        ]
        moved = partitions.rebalanced(records, sorted(self.nodes) or [SINGLE_NODE_ID])
        self._replace_queues(moved)
        return Outcome(bool(moved), partitions=tuple(map(PartitionResult, moved)))

    def _matching(self, vhost_pattern: str, queue_pattern: str) -> list[QueueRecord]:
        for pattern in (vhost_pattern, queue_pattern):
            try:
                partitions.check_pattern(pattern)
            except ValueError as error:
                raise BadRequest(str(error)) from None
        return [
            record
            for record in self.all_queues()
            if partitions.matches(vhost_pattern, record.vhost)
            and partitions.matches(queue_pattern, record.name)
        ]

    # --- nodes -----------------------------------------------------------------------------

    def _register_node(self, command: c.RegisterNode) -> Outcome:
        record = NodeRecord(
            command.node_id,
            command.host,
            command.amqp_port,
            command.amqps_port,
            command.http_port,
        )
        if record.node_id < 1:
            raise PreconditionFailed(f"node ids start at 1, got {record.node_id}")
        if self.nodes.get(record.node_id) == record:
            return Outcome(False)
        self.nodes[record.node_id] = record
        return Outcome(True)

    def _forget_node(self, command: c.ForgetNode) -> Outcome:
        self.transient_holders.pop(command.node_id, None)
        return Outcome(self.nodes.pop(command.node_id, None) is not None)

    def _node_started(self, command: c.NodeStarted) -> Outcome:
        """The holders of the transient exchanges still running with the boot they held them
        in (the starting node's own boot counts: the command may apply twice); none left, and
        the exchanges are forgotten. The starting node holds them from now on."""
        if len(command.alive_nodes) != len(command.alive_boots):
            raise PreconditionFailed("a boot for each node found running, no more")
        alive = dict(zip(command.alive_nodes, command.alive_boots, strict=True))
        alive[command.node_id] = command.boot
        holders = {
            node: boot for node, boot in self.transient_holders.items() if alive.get(node) == boot
        }
        outcome = Outcome(True)
        if not holders:
            outcome = self._forget_transient_exchanges()
        holders[command.node_id] = command.boot
        self.transient_holders = holders
        # A restarted leader may have lost an unfsynced tail its followers hold: it leads
        # its replicated queues again only in a new leader epoch (`ReplicationNode.recover`).
        bumped = [
            replace(
                record,
                leader_epoch=record.leader_epoch + 1,
                partition_epoch=record.partition_epoch + 1,
            )
            for record in self.all_queues()
            if record.node == command.node_id and len(record.replicas) > 1
        ]
        if bumped:
            self._replace_queues(bumped)
            outcome = replace(outcome, partitions=tuple(map(PartitionResult, bumped)))
        return outcome

    def _forget_transient_exchanges(self) -> Outcome:
        """Drop every transient exchange and the bindings that touch one."""
        forgotten = {
            (vhost, exchange.name)
            for vhost, router in self._routers.items()
            for exchange in router.exchanges()
            if not exchange.durable
        }
        if not forgotten:
            return Outcome(True)
        document = self._document()
        document["exchanges"] = [row for row in document["exchanges"] if row[3]]
        document["bindings"] = [
            row
            for row in document["bindings"]
            if (row[0], row[1]) not in forgotten
            and (row[2] != EXCHANGE or (row[0], row[3]) not in forgotten)
        ]
        self._rebuild(document)
        return Outcome(True, deleted_exchanges=tuple(sorted(name for _, name in forgotten)))

    def _expect_new(self, command: c.ExpectNew) -> Outcome:
        if self.vhosts:
            raise PreconditionFailed("the metadata holds vhosts already: it was seeded")
        return Outcome(False)

    def _disown(self, record: QueueRecord) -> None:
        owner = record.exclusive_owner
        if owner is None:
            return
        owned = self._owned[owner]
        del owned[(record.vhost, record.name)]
        if not owned:
            del self._owned[owner]

    # --- bindings --------------------------------------------------------------------------

    def _bind(self, command: c.Bind) -> Outcome:
        router = self.router(command.vhost)
        destination = Destination(command.destination_kind, strip_cr_lf(command.destination))
        if destination.kind not in (QUEUE, EXCHANGE):
            raise ValueError(f"a binding's destination is a queue or an exchange: {destination}")
        source = strip_cr_lf(command.source)
        arguments = dict(command.arguments)
        if not router.bind(source, destination, command.routing_key, arguments):
            return Outcome(False)
        writes: tuple[Write, ...] = ()
        if self._binding_durable(command.vhost, source, destination):
            binding = Binding(destination, command.routing_key, arguments)
            writes = (("put_binding", command.vhost, source, binding),)
        return Outcome(True, created=True, writes=writes)

    def _unbind(self, command: c.Unbind) -> Outcome:
        vhost = command.vhost
        router = self.router(vhost)
        destination = Destination(command.destination_kind, strip_cr_lf(command.destination))
        if destination.kind not in (QUEUE, EXCHANGE):
            raise ValueError(f"a binding's destination is a queue or an exchange: {destination}")
        source = strip_cr_lf(command.source)
        arguments = dict(command.arguments)
        # Decided before unbinding: the unbind may auto-delete the source.
        durable = self._binding_durable(vhost, source, destination)
        change = router.unbind(source, destination, command.routing_key, arguments)
        if not change.changed:
            return Outcome(False)
        writes = self._forget_exchanges(vhost, change.deleted_exchanges)
        if durable:
            binding = Binding(destination, command.routing_key, arguments)
            writes = (("delete_binding", vhost, source, binding), *writes)
        return Outcome(True, deleted_exchanges=change.deleted_exchanges, writes=writes)

    def _binding_durable(self, vhost: str, source: str, destination: Destination) -> bool:
        """rabbit_binding: a binding is durable when both its ends are."""
        if source not in self._durable_exchanges[vhost]:
            return False
        if destination.kind == EXCHANGE:
            return destination.name in self._durable_exchanges[vhost]
        record = self._queues[vhost].get(destination.name)
        return record is not None and record.persisted


def _assert_queue_equivalence(
    record: QueueRecord,
    durable: bool,
    auto_delete: bool,
    arguments: Mapping[str, Any],
    owner: str | None,
) -> None:
    if record.exclusive_owner != owner:
        raise _locked(record)
    if record.durable != durable:
        raise _inequivalent(record, "durable", _atom(durable), _atom(record.durable))
    if record.auto_delete != auto_delete:
        raise _inequivalent(record, "auto_delete", _atom(auto_delete), _atom(record.auto_delete))
    for key in QUEUE_DECLARABLE_ARGUMENTS:
        current = record.arguments.get(key, ABSENT)
        received = arguments.get(key, ABSENT)
        mismatch = argument_mismatch(current, received)
        if mismatch is None:
            continue
        # A missing x-queue-type means "classic", so the two are equivalent.
        if key == "x-queue-type" and ABSENT in (current, received):
            if _is_classic(received if current is ABSENT else current):
                continue
        raise _inequivalent(record, key, *mismatch)


def _check_partition(record: QueueRecord) -> None:
    """A record's partition state is one the design allows (the proposer's bug otherwise)."""
    replicas, isr = record.replicas, record.isr
    if len(set(replicas)) != len(replicas) or any(node < 1 for node in replicas):
        raise ValueError(f"replicas must be distinct node ids: {replicas}")
    if len(set(isr)) != len(isr) or not set(isr) <= set(replicas):
        raise ValueError(f"the ISR {isr} must be distinct replicas of {replicas}")
    if record.node != NO_LEADER and record.node not in isr:
        raise ValueError(f"the ISR {isr} must hold the leader {record.node}")


def _led_by(record: QueueRecord, node: int) -> bool:
    """Whether `node` leads the queue, or led it last (it has no leader and `node` is its
    one replica)."""
    return record.node == node or (record.node == NO_LEADER and record.replicas == (node,))


def _queue_type(record: QueueRecord) -> str:
    queue_type = record.arguments.get("x-queue-type", "classic")
    return queue_type.decode() if isinstance(queue_type, bytes) else str(queue_type)


def _replicated(record: QueueRecord) -> bool:
    """A queue that can have replicas: not exclusive, not transient (`partitions`)."""
    return record.durable and record.exclusive_owner is None


def _locked(record: QueueRecord) -> ResourceLocked:
    return ResourceLocked(
        f"cannot obtain exclusive access to locked queue '{record.name}' in vhost "
        f"'{record.vhost}'. It could be originally declared on another connection or the "
        "exclusive property value does not match that of the original declaration."
    )


def _inequivalent(record: QueueRecord, key: str, received: str, current: str) -> PreconditionFailed:
    return PreconditionFailed(
        f"inequivalent arg '{key}' for queue '{record.name}' in vhost '{record.vhost}': "
        f"received {received} but current is {current}"
    )


def _atom(value: bool) -> str:
    return "'true'" if value else "'false'"


def _is_classic(value: Any) -> bool:
    return amqp_type_name(value) == "longstr" and value in ("classic", b"classic")


def strip_cr_lf(name: str) -> str:
    # rabbit_channel strips CR and LF from every queue and exchange name a client sends.
    return name.replace("\r", "").replace("\n", "") if ("\r" in name or "\n" in name) else name


def _check_name(kind: str, name: str) -> None:
    if kind in ("vhost", "user") and not name:
        raise PreconditionFailed(f"a {kind} name cannot be empty")
    if len(name.encode("utf-8")) > NAME_CHARS_MAX:
        raise PreconditionFailed(f"{kind} name longer than {NAME_CHARS_MAX} bytes")


def _replace_limits(
    table: dict[str, Mapping[str, int]], scope: str, name: str, value: dict[str, int]
) -> Outcome:
    if table.get(name, {}) == value:
        return Outcome(False)
    if not value:
        del table[name]
        return Outcome(True, writes=(("delete_limits", scope, name),))
    table[name] = value
    return Outcome(True, writes=(("put_limits", scope, name, value),))


def _check_password_hash(password_hash: str) -> None:
    if not passwords.is_password_hash(password_hash):
        raise PreconditionFailed("not a password hash this broker produced")


def _unique(tags: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(tags))


def snapshot_commands(state: MetadataState) -> list[c.Command]:
    """Commands that build `state`'s entities (transient ones too) from an empty state."""
    return _snapshot_commands(state._document())


def _snapshot_commands(document: dict) -> list[c.Command]:
    commands: list[c.Command] = []
    for name, description, tags in document["vhosts"]:
        commands.append(c.DeclareVhost(name, description, tuple(tags)))
    for name, password_hash, tags in document["users"]:
        commands.append(c.AddUser(name, password_hash, tuple(tags)))
    for user, vhost, configure, write, read in document["permissions"]:
        commands.append(c.SetPermissions(user, vhost, configure, write, read))
    for vhost, name, pattern, apply_to, priority, definition in document["policies"]:
        commands.append(c.SetPolicy(vhost, name, pattern, definition, priority, apply_to))
    # Before the exchanges (a first holder finds none to forget), each holder alive to the
    # next: snapshots from before holders existed have none.
    holders: list[list[int]] = document.get("transient_holders", [])
    for index, (node, boot) in enumerate(holders):
        earlier = holders[:index]
        commands.append(
            c.NodeStarted(node, boot, tuple(n for n, _ in earlier), tuple(b for _, b in earlier))
        )
    for vhost, name, type_name, durable, auto_delete, internal, arguments in document["exchanges"]:
        commands.append(
            c.DeclareExchange(
                vhost,
                name,
                type_name,
                durable,
                auto_delete,
                internal,
                encoding.decode_table(arguments),
            )
        )
    for node_row in document.get("nodes", []):
        commands.append(c.RegisterNode(*node_row))
    # Format 3 rows end at the owner, format 4 rows at the leader.
    for vhost, name, durable, auto_delete, arguments, owner, *placed in document["queues"]:
        node, replicas, leader_epoch, isr, partition_epoch = [
            *placed,
            *(SINGLE_NODE_ID, (), 0, (), 0)[len(placed) :],
        ]
        commands.append(
            c.DeclareQueue(
                vhost,
                name,
                durable,
                owner is not None,
                auto_delete,
                encoding.decode_table(arguments),
                owner,
                server_named=True,
                node=node,
                replicas=tuple(replicas),
                isr=tuple(isr),
                leader_epoch=leader_epoch,
                partition_epoch=partition_epoch,
            )
        )
    for vhost, source, kind, destination, routing_key, arguments in document["bindings"]:
        commands.append(
            c.Bind(vhost, source, destination, kind, routing_key, encoding.decode_table(arguments))
        )
    # After the queues: a snapshot may hold more queues than a max-queues set later allows.
    # Snapshots from before limits existed have none.
    for scope, name, value in document.get("limits", []):
        command = c.SetVhostLimits if scope == "vhost" else c.SetUserLimits
        commands.append(command(name, value))
    return commands

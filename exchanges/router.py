"""One virtual host's exchanges and bindings, and the routing of a publish to queue names.

Semantics follow RabbitMQ 3.10 (rabbit_channel.erl, rabbit_exchange.erl, rabbit_binding.erl,
rabbit_misc.erl), texts included:

* declare: the type is checked first (503 "unknown exchange type 'x'", connection-level), then
  the default exchange is refused (403), then an existing exchange must be equivalent in type,
  durable, auto_delete, internal and the `alternate-exchange` argument, in that order (406
  "inequivalent arg ..."); a new name starting "amq." is refused (403). Passive declare skips
  the type check and fails with 404 when the exchange does not exist.
* delete: the default exchange and any "amq." name are refused (403); a missing exchange is not
  an error; `if_unused` refuses (406) while the exchange is the source of a binding. Deleting
  removes the bindings where it is source and those where it is destination.
* bind/unbind: the default exchange can be neither source nor destination (403); bind needs
  both ends (404 "no exchange ..." for the source first, then "no queue ..."/"no exchange ..."
  for the destination) and arguments the type accepts; binding twice and unbinding what does
  not exist change nothing and are not errors (3.10 no longer raises "no binding").
* auto-delete: an auto-delete exchange is deleted when the last binding of which it is the
  source goes, whether by unbind or because the destination was deleted; one that never had a
  binding stays. Deletions cascade (deleting an exchange removes its bindings as destination).
* delayed messages (`delayed.py`): an `x-delayed-message` exchange routes with the table of
  its `x-delayed-type`; one that holds a message (an `x-delay` header) is reported as a
  `DelayedTarget` among the queue names, and routing does not go past it.
* super streams (`super_stream.py`): an `x-super-stream` exchange routes each message to one
  of its partition streams, by a hash of the routing key as RabbitMQ's stream clients do.
* routing: an exchange's own bindings give its destinations; if they give none and it has an
  `alternate-exchange`, the message goes to that exchange instead (RabbitMQ tests the
  exchange's own match, not whether a queue is reached in the end). Destination exchanges and
  alternates are followed with a seen-set, so cycles end; a missing alternate is skipped.
  The default exchange routes to the queue named by the routing key if it exists. Publishing
  to a missing exchange is 404 and to an internal one 403.

Routes are cached per (exchange, routing key) when no headers or delayed exchange was visited
and the default exchange is not the source (its answer depends on which queues exist, which this
module learns only through `queue_exists`). Any change to an exchange or binding clears the
cache and bumps `generation`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from warrenmq.exchanges.binding import EXCHANGE, QUEUE, Binding, BindingTable, Destination
from warrenmq.exchanges.delayed import DELAYED_MESSAGE, DelayedTarget, delay_ms, routing_type
from warrenmq.exchanges.direct import DirectExchange
from warrenmq.exchanges.errors import AccessRefused, CommandInvalid, NotFound, PreconditionFailed
from warrenmq.exchanges.fanout import FanoutExchange
from warrenmq.exchanges.field_values import ABSENT, amqp_type_name, argument_mismatch
from warrenmq.exchanges.headers import HeadersExchange
from warrenmq.exchanges.super_stream import SuperStreamExchange
from warrenmq.exchanges.topic import TopicExchange

DEFAULT_EXCHANGE = ""
ALTERNATE_EXCHANGE = "alternate-exchange"
EXCHANGE_TYPES: dict[str, type[BindingTable]] = {
    table.type_name: table
    for table in (
        DirectExchange,
        FanoutExchange,
        TopicExchange,
        HeadersExchange,
        SuperStreamExchange,
    )
}
# What exchange.declare accepts: the routing tables, and the type that delays for one of them.
EXCHANGE_TYPE_NAMES = frozenset((*EXCHANGE_TYPES, DELAYED_MESSAGE))
# RabbitMQ's rabbit_vhost:do_add: every vhost starts with these, durable and not auto-delete.
PREDECLARED: tuple[tuple[str, str, bool], ...] = (
    (DEFAULT_EXCHANGE, "direct", False),
    ("amq.direct", "direct", False),
    ("amq.topic", "topic", False),
    ("amq.match", "headers", False),
    ("amq.headers", "headers", False),
    ("amq.fanout", "fanout", False),
    ("amq.rabbitmq.trace", "topic", True),
)
ROUTE_CACHE_ENTRIES_MAX_DEFAULT = 65_536

_NO_ARGUMENTS: Mapping[str, Any] = {}
Routed = frozenset[str | DelayedTarget]
"""Where a message goes: queue names, and the delayed exchanges that hold it."""
_NO_QUEUES: Routed = frozenset()


@dataclass(eq=False, slots=True)
class Exchange:
    name: str
    type: str
    durable: bool
    auto_delete: bool
    internal: bool
    arguments: Mapping[str, Any]
    table: BindingTable
    alternate: str | None


class Declared(NamedTuple):
    exchange: Exchange
    created: bool


class Change(NamedTuple):
    changed: bool
    # Exchanges removed by the operation, the named one first, then auto-deletes it caused.
    deleted_exchanges: tuple[str, ...] = ()


class Router:
    """Exchanges, bindings and routing for one virtual host; no I/O, no clock."""

    def __init__(
        self,
        vhost: str = "/",
        *,
        queue_exists: Callable[[str], bool],
        route_cache_entries_max: int = ROUTE_CACHE_ENTRIES_MAX_DEFAULT,
    ) -> None:
        assert route_cache_entries_max > 0
        self.vhost = vhost
        self.generation = 0
        self._queue_exists = queue_exists
        self._route_cache: dict[tuple[str, str], Routed] = {}
        self._route_cache_entries_max = route_cache_entries_max
        self._exchanges: dict[str, Exchange] = {}
        # Reverse index: which exchanges bind to a destination, to drop its bindings on delete.
        self._sources_of: dict[Destination, set[str]] = {}
        for name, type_name, internal in PREDECLARED:
            self._exchanges[name] = Exchange(
                name, type_name, True, False, internal, {}, EXCHANGE_TYPES[type_name](), None
            )

    # --- lookups -------------------------------------------------------------------------

    def get(self, name: str) -> Exchange | None:
        return self._exchanges.get(name)

    def exchanges(self) -> list[Exchange]:
        return list(self._exchanges.values())

    def bindings(self, source: str) -> list[Binding]:
        """Bindings whose source is `source` (the default exchange's are implicit: none)."""
        exchange = self._exchanges.get(source)
        return [] if exchange is None else exchange.table.bindings()

    def sources_of(self, destination: Destination) -> list[str]:
        return sorted(self._sources_of.get(destination, ()))

    def bindings_to(self, destination: Destination) -> list[tuple[str, Binding]]:
        """(source, binding) for every binding whose destination is `destination`."""
        return [
            (source, binding)
            for source in self.sources_of(destination)
            for binding in self._exchanges[source].table.bindings()
            if binding.destination == destination
        ]

    # --- exchange.declare / exchange.delete ------------------------------------------------

    def declare(
        self,
        name: str,
        type_name: str = "direct",
        *,
        passive: bool = False,
        durable: bool = False,
        auto_delete: bool = False,
        internal: bool = False,
        arguments: Mapping[str, Any] | None = None,
    ) -> Declared:
        name = _strip_cr_lf(name)
        if passive:
            self._refuse_default(name)
            return Declared(self._lookup_or_die(name), False)
        if type_name not in EXCHANGE_TYPE_NAMES:
            raise CommandInvalid(f"unknown exchange type '{type_name}'")
        self._refuse_default(name)
        arguments = dict(arguments or _NO_ARGUMENTS)
        existing = self._exchanges.get(name)
        if existing is not None:
            self._assert_equivalence(existing, type_name, durable, auto_delete, internal, arguments)
            return Declared(existing, False)
        if name.startswith("amq."):
            raise AccessRefused(f"exchange name '{name}' contains reserved prefix 'amq.*'")
        # RabbitMQ checks the alternate exchange argument before the type's own arguments.
        alternate = self._alternate_of(name, arguments)
        table_type_name = routing_type(arguments) if type_name == DELAYED_MESSAGE else type_name
        table_type = EXCHANGE_TYPES.get(table_type_name)
        if table_type is None:
            raise CommandInvalid(f"unknown exchange type '{table_type_name}'")
        exchange = Exchange(
            name, type_name, durable, auto_delete, internal, arguments, table_type(), alternate
        )
        self._exchanges[name] = exchange
        self._invalidate()
        return Declared(exchange, True)

    def delete(self, name: str, *, if_unused: bool = False) -> Change:
        name = _strip_cr_lf(name)
        self._refuse_default(name)
        if name.startswith("amq."):
            raise AccessRefused(f"deletion of system {self._rs(EXCHANGE, name)} not allowed")
        exchange = self._exchanges.get(name)
        if exchange is None:
            return Change(False)
        if if_unused and len(exchange.table):
            raise PreconditionFailed(f"{self._rs(EXCHANGE, name)} in use")
        return Change(True, self._delete_cascade([exchange]))

    # --- queue.bind / exchange.bind and their unbinds ------------------------------------

    def bind(
        self,
        source: str,
        destination: Destination,
        routing_key: str = "",
        arguments: Mapping[str, Any] | None = None,
    ) -> bool:
        """Add a binding; False if it already existed."""
        source, destination = self._binding_ends(source, destination)
        exchange = self._exchanges.get(source)
        if exchange is None:
            raise NotFound(f"no {self._rs(EXCHANGE, source)}")
        if not self._exists(destination):
            raise NotFound(f"no {self._rs(destination.kind, destination.name)}")
        arguments = arguments or _NO_ARGUMENTS
        exchange.table.validate_binding(arguments)
        if not exchange.table.bind(destination, routing_key, arguments):
            return False
        self._sources_of.setdefault(destination, set()).add(source)
        self._invalidate()
        return True

    def bind_queue(
        self,
        source: str,
        queue: str,
        routing_key: str = "",
        arguments: Mapping[str, Any] | None = None,
    ) -> bool:
        return self.bind(source, Destination(QUEUE, queue), routing_key, arguments)

    def bind_exchange(
        self,
        source: str,
        destination: str,
        routing_key: str = "",
        arguments: Mapping[str, Any] | None = None,
    ) -> bool:
        return self.bind(source, Destination(EXCHANGE, destination), routing_key, arguments)

    def unbind(
        self,
        source: str,
        destination: Destination,
        routing_key: str = "",
        arguments: Mapping[str, Any] | None = None,
    ) -> Change:
        """Remove a binding; an auto-delete source left without bindings is deleted too."""
        source, destination = self._binding_ends(source, destination)
        exchange = self._exchanges.get(source)
        if exchange is None or not exchange.table.unbind(destination, routing_key, arguments):
            return Change(False)
        if not exchange.table.has_destination(destination):
            self._forget_source(destination, source)
        self._invalidate()
        if exchange.auto_delete and not len(exchange.table):
            return Change(True, self._delete_cascade([exchange]))
        return Change(True)

    def unbind_queue(
        self,
        source: str,
        queue: str,
        routing_key: str = "",
        arguments: Mapping[str, Any] | None = None,
    ) -> Change:
        return self.unbind(source, Destination(QUEUE, queue), routing_key, arguments)

    def unbind_exchange(
        self,
        source: str,
        destination: str,
        routing_key: str = "",
        arguments: Mapping[str, Any] | None = None,
    ) -> Change:
        return self.unbind(source, Destination(EXCHANGE, destination), routing_key, arguments)

    def queue_deleted(self, queue: str) -> Change:
        """Drop the bindings to a deleted queue; auto-delete sources left without any."""
        destination = Destination(QUEUE, queue)
        if destination not in self._sources_of:
            return Change(False)
        self._invalidate()
        return Change(True, self._delete_cascade(self._drop_destination(destination)))

    # --- basic.publish ---------------------------------------------------------------------

    def route(
        self, exchange: str, routing_key: str, headers: Mapping[str, Any] | None = None
    ) -> Routed:
        """The names of the queues a message published to `exchange` reaches, and the
        delayed exchanges that hold it (`DelayedTarget`s)."""
        cached = self._route_cache.get((exchange, routing_key))
        if cached is not None:
            return cached
        return self._route_uncached(exchange, (routing_key,), headers)

    def route_keys(
        self,
        exchange: str,
        routing_keys: Collection[str],
        headers: Mapping[str, Any] | None = None,
        *,
        internal_allowed: bool = False,
    ) -> Routed:
        """Route with several keys at once (the routing key plus CC/BCC), as RabbitMQ does:
        an exchange falls back to its alternate only if no key matched any of its bindings.

        `internal_allowed`: the broker itself publishes (dead-lettering), which RabbitMQ lets
        reach an internal exchange."""
        assert routing_keys
        if len(routing_keys) == 1 and not internal_allowed:
            return self.route(exchange, next(iter(routing_keys)), headers)
        return self._route_uncached(exchange, tuple(routing_keys), headers, internal_allowed)

    def _route_uncached(
        self,
        name: str,
        routing_keys: tuple[str, ...],
        headers: Mapping[str, Any] | None,
        internal_allowed: bool = False,
    ) -> Routed:
        if name == DEFAULT_EXCHANGE:
            queue_exists = self._queue_exists
            if len(routing_keys) == 1:
                return frozenset(routing_keys) if queue_exists(routing_keys[0]) else _NO_QUEUES
            return frozenset([key for key in routing_keys if queue_exists(key)])
        exchange = self._exchanges.get(name)
        if exchange is None:
            raise NotFound(f"no {self._rs(EXCHANGE, name)}")
        if exchange.internal and not internal_allowed:
            raise AccessRefused(f"cannot publish to internal {self._rs(EXCHANGE, name)}")
        if exchange.type == DELAYED_MESSAGE:
            held_ms = delay_ms(headers)
            if held_ms:
                return frozenset((DelayedTarget(name, held_ms),))
        table = exchange.table
        matched = _match(table, routing_keys, headers)
        if matched and not table.exchange_destinations:
            # The common case: the exchange's own bindings reach queues only, nothing to walk.
            routed: Routed = frozenset([queue for _, queue in matched])
            by_key_only = _routes_by_key_only(exchange)
        else:
            queues, by_key_only = self._traverse(exchange, matched, routing_keys, headers)
            routed = frozenset(queues)
        # An internal exchange is never cached: the cache serves clients' publishes unchecked.
        if by_key_only and len(routing_keys) == 1 and not exchange.internal:
            cache = self._route_cache
            if len(cache) >= self._route_cache_entries_max:
                cache.clear()
            cache[(name, routing_keys[0])] = routed
        return routed

    def _traverse(
        self,
        start: Exchange,
        start_matched: Collection[Destination],
        routing_keys: tuple[str, ...],
        headers: Mapping[str, Any] | None,
    ) -> tuple[set[str | DelayedTarget], bool]:
        """Queues (and holding delayed exchanges) reached from `start`, whose own match is
        `start_matched`, and whether the answer depended only on the routing keys."""
        exchanges = self._exchanges
        queues: set[str | DelayedTarget] = set()
        seen = {start.name}
        pending: list[tuple[Exchange, Collection[Destination]]] = [(start, start_matched)]
        by_key_only = _routes_by_key_only(start)

        def enter(name: str) -> None:
            nonlocal by_key_only
            seen.add(name)
            target = exchanges.get(name)
            if target is None:
                return
            by_key_only = by_key_only and _routes_by_key_only(target)
            if target.type == DELAYED_MESSAGE:
                held_ms = delay_ms(headers)
                if held_ms:
                    queues.add(DelayedTarget(name, held_ms))
                    return
            pending.append((target, _match(target.table, routing_keys, headers)))

        # Each exchange enters `pending` at most once (guarded by `seen`), so this ends.
        while pending:
            exchange, matched = pending.pop()
            if not matched:
                alternate = exchange.alternate
                if alternate is not None and alternate not in seen:
                    enter(alternate)
                continue
            for kind, name in matched:
                if kind == QUEUE:
                    queues.add(name)
                elif name not in seen:
                    enter(name)
        return queues, by_key_only

    # --- internals -----------------------------------------------------------------------

    def _invalidate(self) -> None:
        self.generation += 1
        self._route_cache.clear()

    def _rs(self, kind: str, name: str) -> str:
        """rabbit_misc:rs/1, the way RabbitMQ names a resource in every error text."""
        return f"{kind} '{name}' in vhost '{self.vhost}'"

    def _refuse_default(self, name: str) -> None:
        if name == DEFAULT_EXCHANGE:
            raise AccessRefused("operation not permitted on the default exchange")

    def _lookup_or_die(self, name: str) -> Exchange:
        exchange = self._exchanges.get(name)
        if exchange is None:
            raise NotFound(f"no {self._rs(EXCHANGE, name)}")
        return exchange

    def _exists(self, destination: Destination) -> bool:
        if destination.kind == QUEUE:
            return self._queue_exists(destination.name)
        return destination.name in self._exchanges

    def _binding_ends(self, source: str, destination: Destination) -> tuple[str, Destination]:
        # RabbitMQ strips CR/LF from both names, then refuses the default exchange at either
        # end, destination first.
        assert destination.kind in (QUEUE, EXCHANGE), destination
        destination = Destination(destination.kind, _strip_cr_lf(destination.name))
        source = _strip_cr_lf(source)
        if destination.kind == EXCHANGE:
            self._refuse_default(destination.name)
        self._refuse_default(source)
        return source, destination

    def _alternate_of(self, name: str, arguments: Mapping[str, Any]) -> str | None:
        if ALTERNATE_EXCHANGE not in arguments:
            return None
        value = arguments[ALTERNATE_EXCHANGE]
        type_name = amqp_type_name(value)
        if type_name != "longstr":
            raise PreconditionFailed(
                f"invalid type '{type_name}' for arg '{ALTERNATE_EXCHANGE}' in "
                f"{self._rs(EXCHANGE, name)}"
            )
        return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value

    def _assert_equivalence(
        self,
        exchange: Exchange,
        type_name: str,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: Mapping[str, Any],
    ) -> None:
        for field, current, received in (
            ("type", exchange.type, type_name),
            ("durable", exchange.durable, durable),
            ("auto_delete", exchange.auto_delete, auto_delete),
            ("internal", exchange.internal, internal),
        ):
            if current != received:
                self._inequivalent(exchange.name, field, _atom(received), _atom(current))
        # RabbitMQ compares only this argument for exchanges (rabbit_exchange.erl).
        mismatch = argument_mismatch(
            exchange.arguments.get(ALTERNATE_EXCHANGE, ABSENT),
            arguments.get(ALTERNATE_EXCHANGE, ABSENT),
        )
        if mismatch is not None:
            self._inequivalent(exchange.name, ALTERNATE_EXCHANGE, *mismatch)

    def _inequivalent(self, name: str, field: str, received: str, current: str) -> None:
        raise PreconditionFailed(
            f"inequivalent arg '{field}' for {self._rs(EXCHANGE, name)}: "
            f"received {received} but current is {current}"
        )

    def _forget_source(self, destination: Destination, source: str) -> None:
        sources = self._sources_of.get(destination)
        if sources is not None:
            sources.discard(source)
            if not sources:
                del self._sources_of[destination]

    def _drop_destination(self, destination: Destination) -> list[Exchange]:
        """Remove every binding to `destination`; returns auto-delete sources left empty."""
        emptied = []
        for source in self._sources_of.pop(destination, ()):
            exchange = self._exchanges[source]
            exchange.table.unbind_destination(destination)
            if exchange.auto_delete and not len(exchange.table):
                emptied.append(exchange)
        return emptied

    def _delete_cascade(self, doomed: list[Exchange]) -> tuple[str, ...]:
        """Delete exchanges, and the auto-delete exchanges that lose their last binding."""
        deleted: list[str] = []
        pending = list(reversed(doomed))
        # Every exchange is removed from the registry at most once, so this ends.
        while pending:
            exchange = pending.pop()
            if self._exchanges.get(exchange.name) is not exchange:
                continue
            del self._exchanges[exchange.name]
            deleted.append(exchange.name)
            for destination in exchange.table.destinations():
                self._forget_source(destination, exchange.name)
            pending.extend(self._drop_destination(Destination(EXCHANGE, exchange.name)))
        self._invalidate()
        return tuple(deleted)


def _match(
    table: BindingTable, routing_keys: tuple[str, ...], headers: Mapping[str, Any] | None
) -> Collection[Destination]:
    if len(routing_keys) == 1:
        return table.match(routing_keys[0], headers)
    return {destination for key in routing_keys for destination in table.match(key, headers)}


def _routes_by_key_only(exchange: Exchange) -> bool:
    # A delayed exchange's answer depends on the x-delay header.
    return exchange.table.routes_by_key_only and exchange.type != DELAYED_MESSAGE


def _strip_cr_lf(name: str) -> str:
    return name.replace("\r", "").replace("\n", "") if ("\r" in name or "\n" in name) else name


def _atom(value: bool | str) -> str:
    if isinstance(value, bool):
        return "'true'" if value else "'false'"
    return f"'{value}'"

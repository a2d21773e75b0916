"""Bindings and the table of bindings that every exchange type keeps.

A binding is (destination, routing key, arguments); its identity is the destination, the key
and the arguments compared as RabbitMQ compares a sorted field table (type and value), so the
same queue may be bound twice with different keys or different arguments, and binding the
same triple twice changes nothing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Iterator, Mapping
from typing import Any, ClassVar, NamedTuple

from warrenmq.exchanges.field_values import arguments_key

QUEUE = "queue"
EXCHANGE = "exchange"


class Destination(NamedTuple):
    kind: str  # QUEUE or EXCHANGE: the word RabbitMQ prints in "no queue 'q' in vhost '/'"
    name: str


class Binding(NamedTuple):
    destination: Destination
    routing_key: str
    arguments: Mapping[str, Any]


_NO_ARGUMENTS: Mapping[str, Any] = {}


class BindingTable(ABC):
    """Bindings of one exchange, indexed by each type for its own `match`.

    Subclasses index a binding in `_index` and drop it in `_unindex`; everything else (binding
    identity, the per-destination index used when a queue or exchange is deleted) lives here.
    `match` returns a read-only collection owned by the table: callers must not keep it past
    the next bind or unbind.
    """

    type_name: ClassVar[str] = ""
    # Whether match() ignores headers, so a route through this type may be cached by key.
    routes_by_key_only: ClassVar[bool] = True

    __slots__ = ("_bindings", "_by_destination", "exchange_destinations")

    def __init__(self) -> None:
        self._bindings: dict[tuple, Binding] = {}
        self._by_destination: dict[Destination, set[tuple]] = {}
        # How many distinct exchanges are destinations: with none, a match is final and the
        # router can skip its exchange-to-exchange walk.
        self.exchange_destinations = 0

    def validate_binding(self, arguments: Mapping[str, Any]) -> None:  # noqa: B027 (accepts all)
        """Raise PreconditionFailed if this type refuses the binding's arguments."""

    @abstractmethod
    def match(self, routing_key: str, headers: Mapping[str, Any] | None) -> Collection[Destination]:
        """The destinations of the bindings that match a message."""

    def bind(
        self,
        destination: Destination,
        routing_key: str,
        arguments: Mapping[str, Any] | None = None,
    ) -> bool:
        """Add the binding; False if it already existed."""
        arguments = arguments or _NO_ARGUMENTS
        binding_id = (destination, routing_key, arguments_key(arguments))
        if binding_id in self._bindings:
            return False
        binding = Binding(destination, routing_key, dict(arguments))
        self._bindings[binding_id] = binding
        same_destination = self._by_destination.get(destination)
        if same_destination is None:
            same_destination = self._by_destination[destination] = set()
            self.exchange_destinations += destination.kind == EXCHANGE
        same_destination.add(binding_id)
        self._index(binding_id, binding)
        return True

    def unbind(
        self,
        destination: Destination,
        routing_key: str,
        arguments: Mapping[str, Any] | None = None,
    ) -> bool:
        """Remove the binding; False if there was no such binding."""
        binding_id = (destination, routing_key, arguments_key(arguments or _NO_ARGUMENTS))
        return self._remove(binding_id)

    def unbind_destination(self, destination: Destination) -> int:
        """Remove every binding to `destination` (it was deleted); returns how many."""
        binding_ids = self._by_destination.get(destination)
        if not binding_ids:
            return 0
        removed = 0
        for binding_id in tuple(binding_ids):
            removed += self._remove(binding_id)
        return removed

    def has_destination(self, destination: Destination) -> bool:
        return destination in self._by_destination

    def destinations(self) -> Iterator[Destination]:
        return iter(tuple(self._by_destination))

    def bindings(self) -> list[Binding]:
        return list(self._bindings.values())

    def __len__(self) -> int:
        return len(self._bindings)

    def _remove(self, binding_id: tuple) -> bool:
        binding = self._bindings.pop(binding_id, None)
        if binding is None:
            return False
        same_destination = self._by_destination[binding.destination]
        same_destination.discard(binding_id)
        if not same_destination:
            del self._by_destination[binding.destination]
            self.exchange_destinations -= binding.destination.kind == EXCHANGE
        self._unindex(binding_id, binding)
        return True

    @abstractmethod
    def _index(self, binding_id: tuple, binding: Binding) -> None:
        """Make a new binding visible to `match`."""

    @abstractmethod
    def _unindex(self, binding_id: tuple, binding: Binding) -> None:
        """Make a removed binding invisible to `match`."""


class DestinationCounts:
    """Destinations reached by several bindings (same key, different arguments) counted once.

    `dict` keys are the read-only collection `match` hands out; the counts say when the last
    binding to a destination is gone.
    """

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: dict[Destination, int] = {}

    def add(self, destination: Destination) -> None:
        self.counts[destination] = self.counts.get(destination, 0) + 1

    def remove(self, destination: Destination) -> None:
        remaining = self.counts[destination] - 1
        if remaining:
            self.counts[destination] = remaining
        else:
            del self.counts[destination]

    def __bool__(self) -> bool:
        return bool(self.counts)

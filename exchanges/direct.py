"""The direct exchange: a binding matches when its key equals the routing key."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from warrenmq.exchanges.binding import Binding, BindingTable, Destination, DestinationCounts

_NOTHING: Collection[Destination] = frozenset()


class DirectExchange(BindingTable):
    type_name = "direct"

    __slots__ = ("_by_key",)

    def __init__(self) -> None:
        super().__init__()
        self._by_key: dict[str, DestinationCounts] = {}

    def match(
        self, routing_key: str, headers: Mapping[str, Any] | None = None
    ) -> Collection[Destination]:
        found = self._by_key.get(routing_key)
        return _NOTHING if found is None else found.counts.keys()

    def _index(self, binding_id: tuple, binding: Binding) -> None:
        counts = self._by_key.get(binding.routing_key)
        if counts is None:
            counts = self._by_key[binding.routing_key] = DestinationCounts()
        counts.add(binding.destination)

    def _unindex(self, binding_id: tuple, binding: Binding) -> None:
        counts = self._by_key[binding.routing_key]
        counts.remove(binding.destination)
        if not counts:
            del self._by_key[binding.routing_key]

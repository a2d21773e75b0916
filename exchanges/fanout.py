"""The fanout exchange: every binding matches, whatever the key and headers."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from warrenmq.exchanges.binding import Binding, BindingTable, Destination, DestinationCounts


class FanoutExchange(BindingTable):
    type_name = "fanout"

    __slots__ = ("_all",)

    def __init__(self) -> None:
        super().__init__()
        self._all = DestinationCounts()

    def match(
        self, routing_key: str, headers: Mapping[str, Any] | None = None
    ) -> Collection[Destination]:
        return self._all.counts.keys()

    def _index(self, binding_id: tuple, binding: Binding) -> None:
        self._all.add(binding.destination)

    def _unindex(self, binding_id: tuple, binding: Binding) -> None:
        self._all.remove(binding.destination)

"""The super stream exchange (`x-super-stream`, Warren's): one stream per partition.

A super stream is this exchange and its partition streams, bound with the binding argument
`x-stream-partition-order` (0, 1, … as RabbitMQ's `rabbitmq-streams add_super_stream` binds
them). A message goes to exactly one partition:

* the one its `x-stream-partition` header names (an integer: the partition order), when the
  header is there; none if no partition has that order;
* otherwise the one RabbitMQ's stream clients (Java, .NET, Go) pick for its routing key:
  murmur3 x86_32 of the key's UTF-8 bytes with seed 104729, taken unsigned, modulo the
  number of partitions, over the partitions in their order. A key lands where those clients
  would put it.

A binding without a valid order (a whole number, not a boolean) is refused.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import mmh3

from warrenmq.exchanges.binding import Binding, BindingTable, Destination
from warrenmq.exchanges.errors import PreconditionFailed

SUPER_STREAM = "x-super-stream"
PARTITION_ORDER = "x-stream-partition-order"
PARTITION_HEADER = "x-stream-partition"
# RabbitMQ stream clients' HashUtils.MURMUR3 seed.
HASH_SEED = 104729
_NOTHING: Collection[Destination] = ()


def _order(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def partition_index(routing_key: str, partitions: int) -> int:
    """The partition a stream client routes `routing_key` to, among `partitions`."""
    return mmh3.hash(routing_key.encode("utf-8"), HASH_SEED, signed=False) % partitions


class SuperStreamExchange(BindingTable):
    type_name = SUPER_STREAM
    routes_by_key_only = False  # the partition header overrides the key

    __slots__ = ("_partitions", "_ordered")

    def __init__(self) -> None:
        super().__init__()
        # binding id -> (order, destination); `_ordered` is the destinations by order.
        self._partitions: dict[tuple, tuple[int, Destination]] = {}
        self._ordered: list[tuple[int, Destination]] = []

    def validate_binding(self, arguments: Mapping[str, Any]) -> None:
        if _order(arguments.get(PARTITION_ORDER)) is None:
            raise PreconditionFailed(
                f"a super stream partition needs a whole number '{PARTITION_ORDER}' argument"
            )

    def partitions(self) -> list[Destination]:
        """The partitions in their order."""
        return [destination for _, destination in self._ordered]

    def match(
        self, routing_key: str, headers: Mapping[str, Any] | None = None
    ) -> Collection[Destination]:
        ordered = self._ordered
        if not ordered:
            return _NOTHING
        if headers:
            wanted = _order(headers.get(PARTITION_HEADER))
            if wanted is not None or PARTITION_HEADER in headers:
                return [d for order, d in ordered if order == wanted]
        return (ordered[partition_index(routing_key, len(ordered))][1],)

    def _index(self, binding_id: tuple, binding: Binding) -> None:
        order = _order(binding.arguments.get(PARTITION_ORDER))
        assert order is not None
        self._partitions[binding_id] = (order, binding.destination)
        self._ordered = sorted(self._partitions.values())

    def _unindex(self, binding_id: tuple, binding: Binding) -> None:
        del self._partitions[binding_id]
        self._ordered = sorted(self._partitions.values())

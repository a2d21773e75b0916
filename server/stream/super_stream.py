"""Super streams: an `x-super-stream` exchange (``exchanges/super_stream.py`` routes it) and
N partition streams `NAME-0 … NAME-(N-1)`, bound in that order.

Declaring the exchange with `x-super-stream-partitions: N` (over AMQP, the HTTP API or
`warren streams add-super NAME --partitions N`) creates the partitions as well; declaring it
again with the same count is a no-op, as a queue redeclare is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from warrenmq.exchanges.errors import PreconditionFailed

PARTITIONS_ARGUMENT = "x-super-stream-partitions"
PARTITIONS_MAX = 1024


def partition_names(name: str, partitions: int) -> list[str]:
    return [f"{name}-{order}" for order in range(partitions)]


def partition_count(exchange: str, vhost: str, arguments: Mapping[str, Any]) -> int | None:
    """The partitions a super stream exchange is declared with (None: none to create); 406
    unless a whole number from 1 to `PARTITIONS_MAX`."""
    if PARTITIONS_ARGUMENT not in arguments:
        return None
    value = arguments[PARTITIONS_ARGUMENT]
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= PARTITIONS_MAX:
        raise PreconditionFailed(
            f"invalid arg '{PARTITIONS_ARGUMENT}' for exchange '{exchange}' in vhost '{vhost}': "
            f"expected a whole number from 1 to {PARTITIONS_MAX}, got {value!r}"
        )
    return value

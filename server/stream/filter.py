"""Stream filtering, as RabbitMQ 3.13 names it (Warren's here: the reference 3.10 has none).

A publisher tags a message with `x-stream-filter-value` (a string); a consumer asks with
`x-stream-filter` (a string, or an array of strings) for the messages tagged with one of
them, and with `x-stream-match-unfiltered: true` for untagged messages as well. The broker
filters every message exactly: a consumer never receives one it did not ask for (RabbitMQ's
Bloom filters let some through, for its clients to drop).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from warrenmq.amqp import properties as props
from warrenmq.exchanges.errors import PreconditionFailed

FILTER_VALUE = "x-stream-filter-value"
FILTER = "x-stream-filter"
MATCH_UNFILTERED = "x-stream-match-unfiltered"
_MARKER = FILTER_VALUE.encode()


class StreamFilter(NamedTuple):
    values: frozenset[str]
    match_unfiltered: bool

    def matches(self, properties: bytes) -> bool:
        value = filter_value(properties)
        return self.match_unfiltered if value is None else value in self.values


def filter_value(properties: bytes) -> str | None:
    """The message's x-stream-filter-value, None when it has none."""
    if _MARKER not in properties:
        return None
    return props.text(dict(props.headers(properties)).get(FILTER_VALUE))


def _text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return None


def consume_filter(resource: str, arguments: Mapping[str, Any]) -> StreamFilter | None:
    """The consumer's filter (None: every message); 406 for a value of the wrong type."""
    if FILTER not in arguments:
        return None
    wanted = arguments[FILTER]
    items = wanted if isinstance(wanted, list) else [wanted]
    values = [_text(item) for item in items]
    if not values or None in values:
        raise PreconditionFailed(
            f"invalid arg '{FILTER}' for {resource}: expected a string or an array of strings"
        )
    unfiltered = arguments.get(MATCH_UNFILTERED, False)
    if not isinstance(unfiltered, bool):
        raise PreconditionFailed(
            f"invalid arg '{MATCH_UNFILTERED}' for {resource}: expected a bool"
        )
    return StreamFilter(frozenset(value for value in values if value is not None), unfiltered)

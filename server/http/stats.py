"""RabbitMQ's ``message_stats`` and ``*_details`` objects, from the broker's counters.

A count `x` comes with ``x_details: {"rate": per second}``; the rates come from `Rates`
(sampled at requests). Queue stats are the queue's own counters, channel stats the
channel's; a vhost's and the overview's add up their queues' and channels'.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from warrenmq.server.queue.message_counts import MessageCounts
from warrenmq.server.queue.queue_stats import QueueStats

from .rates import Rates

QUEUE_STATS = (
    "publish",
    "deliver",
    "deliver_no_ack",
    "get",
    "get_no_ack",
    "get_empty",
    "ack",
    "redeliver",
    "deliver_get",
)
PUBLISHER_STATS = ("publish", "confirm", "return_unroutable", "drop_unroutable")
CHANNEL_STATS = (
    *PUBLISHER_STATS,
    "deliver",
    "deliver_no_ack",
    "get",
    "get_no_ack",
    "get_empty",
    "ack",
    "redeliver",
    "deliver_get",
)
DEPTHS = ("messages", "messages_ready", "messages_unacknowledged")


def _deliver_get(counts: MessageCounts | QueueStats) -> int:
    return counts.delivered + counts.delivered_no_ack + counts.got + counts.got_no_ack


def queue_counts(counts: MessageCounts | QueueStats) -> tuple[int, ...]:
    """A queue's counters (its own, or the figures the node leading it gave), in
    QUEUE_STATS order."""
    return (
        counts.published,
        counts.delivered,
        counts.delivered_no_ack,
        counts.got,
        counts.got_no_ack,
        counts.got_empty,
        counts.consumer_acks,
        counts.redelivered,
        _deliver_get(counts),
    )


def channel_counts(counts: MessageCounts) -> tuple[int, ...]:
    """A channel's counters, in CHANNEL_STATS order."""
    return (
        counts.publishes,
        counts.confirmed,
        counts.returned_unroutable,
        counts.dropped_unroutable,
        counts.delivered,
        counts.delivered_no_ack,
        counts.got,
        counts.got_no_ack,
        counts.got_empty,
        counts.acked,
        counts.redelivered,
        _deliver_get(counts),
    )


def totals(rows: Iterable[Sequence[int]], width: int) -> tuple[int, ...]:
    summed = [0] * width
    for row in rows:
        for index, value in enumerate(row):
            summed[index] += value
    return tuple(summed)


def detailed(
    rates: Rates, owner: object, kind: str, names: Sequence[str], values: Sequence[int]
) -> dict[str, Any]:
    """{name: value, name_details: {"rate": r}} for each counter."""
    shown: dict[str, Any] = {}
    for name, value, rate in zip(names, values, rates.of(owner, kind, values), strict=True):
        shown[name] = value
        shown[_DETAILS.get(name) or _details(name)] = {"rate": rate}
    return shown


_DETAILS: dict[str, str] = {}


def _details(name: str) -> str:
    """`name` + "_details", made once per name (a list shows thousands of them)."""
    _DETAILS[name] = detail = name + "_details"
    return detail

"""What a redrive moves, and where: the request (`RedriveSpec`, as `warren dlq redrive` and
POST /api/dlq/{vhost}/{queue}/redrive send it) and, for one dead letter, its last death and
the place it goes back to. Pure functions over stored property bytes; the task that moves
messages runs in the broker (`server/redrive.py`).

A dead letter's last death is its newest `x-death` entry: the queue it died in, why, and the
exchange and routing keys it had been published with. "Back to its source" means that queue,
as it was delivered there: the record keeps that exchange and first routing key, and every
header (`x-death` included, so its history survives another death). Its delivery count starts
again, as for any new message in a queue.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from warrenmq.amqp import properties as p

from .dead_letter import REASONS, deaths

RATE_MAX = 1_000_000


class Death(NamedTuple):
    """The newest x-death entry of a message."""

    queue: str
    reason: str
    exchange: str
    routing_key: str
    """The first of the entry's `routing-keys` (the key it was published with)."""


def last_death(properties: bytes) -> Death | None:
    entries = deaths(properties)
    if not entries:
        return None
    fields = dict(entries[0])
    keys = fields.get("routing-keys")
    first_key = None
    if keys is not None and keys[:1] == b"A":
        items = p.array_items(keys)
        first_key = p.text(items[0]) if items else None
    queue = p.text(fields.get("queue"))
    if queue is None:
        return None
    return Death(
        queue,
        p.text(fields.get("reason")) or "",
        p.text(fields.get("exchange")) or "",
        first_key if first_key is not None else "",
    )


@dataclass(frozen=True)
class RedriveSpec:
    """Where a redrive sends messages and which it takes.

    `exchange` None: each goes back to its source queue; else it is published to `exchange`
    with `routing_key` (None: the key of its last death). `reason`/`source` keep only dead
    letters whose last death was for that reason / in that queue; `rate` caps messages a
    second, `limit` how many move; `dry_run` only counts what would move.
    """

    exchange: str | None = None
    routing_key: str | None = None
    reason: str | None = None
    source: str | None = None
    rate: int | None = None
    limit: int | None = None
    dry_run: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, body: Any) -> RedriveSpec:
        """The spec a request asks for; ValueError saying what is wrong otherwise."""
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object")
        unknown = set(body) - {*cls.__dataclass_fields__, "to_source"}
        if unknown:
            raise ValueError(f"unknown field(s): {', '.join(sorted(unknown))}")
        to_source = body.get("to_source")
        if to_source is not None and not isinstance(to_source, bool):
            raise ValueError("to_source must be true or false")
        exchange = _text(body, "exchange")
        if to_source and exchange is not None:
            raise ValueError("to_source and exchange exclude each other")
        routing_key = _text(body, "routing_key")
        if routing_key is not None and exchange is None:
            raise ValueError("routing_key needs an exchange")
        reason = _text(body, "reason")
        if reason is not None and reason not in REASONS:
            raise ValueError(f"reason must be one of {', '.join(REASONS)}")
        dry_run = body.get("dry_run", False)
        if not isinstance(dry_run, bool):
            raise ValueError("dry_run must be true or false")
        return cls(
            exchange,
            routing_key,
            reason,
            _text(body, "source"),
            _count(body, "rate", 1, RATE_MAX),
            _count(body, "limit", 1, 1 << 62),
            dry_run,
        )

    def selects(self, death: Death | None) -> bool:
        """Whether a dead letter whose last death is `death` is one to move."""
        if self.reason is None and self.source is None:
            return death is not None or self.exchange is not None
        if death is None:
            return False
        return (self.reason is None or death.reason == self.reason) and (
            self.source is None or death.queue == self.source
        )


def _text(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is not None and not isinstance(value, str):
        raise ValueError(f"{key} must be a string")
    if value is not None and len(value.encode()) > 255:
        raise ValueError(f"{key} is longer than 255 bytes")
    return value


def _count(body: dict[str, Any], key: str, least: int, most: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise ValueError(f"{key} must be a whole number from {least} to {most}")
    return value

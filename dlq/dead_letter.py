"""Dead-lettering as RabbitMQ defines it: the headers a dead letter carries, where it is
routed, and which targets would make it cycle. Pure functions over stored property bytes.

RabbitMQ's rules (rabbit_dead_letter.erl, 3.10; the 4.x documentation on dead-letter
exchanges):

* The dead letter goes to the dead-letter exchange with the queue's dead-letter routing key
  when it has one (and its CC header removed, so it is not routed by CC again), else with
  every key the message was routed with (its `#basic_message.routing_keys`): its routing
  key, its CC keys and its BCC keys. The BCC header never reaches storage (the core strips
  it at publish); its keys are kept beside the message (the queue's ack log) and passed in.
  The dead letter keeps them in turn (RabbitMQ sets its routing keys to those it was routed
  by), so it is routed by them again if it dies again.
* ``x-death`` is an array of tables, newest first, one per (queue, reason). A death for a
  (queue, reason) already listed increments that entry's ``count`` and moves it to the front,
  keeping its other fields (so ``time`` is the first such death); a new one is prepended with
  ``count`` 1, ``reason``, ``queue``, ``time`` (a timestamp, seconds), ``exchange`` (the
  exchange the message was last published to), ``routing-keys`` (its routing key and CC keys,
  never BCC ones: RabbitMQ reads them from the headers, which hold no BCC any more)
  and, when the message had a per-message TTL, ``original-expiration``. Each entry's fields
  are in key order, as RabbitMQ sorts them.
* ``x-first-death-reason``, ``-queue`` and ``-exchange`` are written on the first death only;
  ``x-last-death-*`` (RabbitMQ 3.13 and 4.x) on every death. The whole headers table is left
  sorted by key, as RabbitMQ's ``set_table_value`` leaves it.
* The ``expiration`` property is removed: a dead letter does not expire again by its old TTL.
* Cycles: a dead letter is not delivered to a queue it already died in unless a ``rejected``
  death lies on the way back to that queue (a fully automatic cycle would loop forever).
  Rejections are never cycle-checked.
"""

from __future__ import annotations

from collections.abc import Sequence

from warrenmq.amqp import properties as p

REJECTED = "rejected"
EXPIRED = "expired"
MAXLEN = "maxlen"
DELIVERY_LIMIT = "delivery_limit"
REASONS = (REJECTED, EXPIRED, MAXLEN, DELIVERY_LIMIT)

X_DEATH = "x-death"
_CC = "CC"
_BCC = "BCC"


def header_routes(entries: list[tuple[str, bytes]]) -> list[str]:
    """The CC and BCC keys of a headers table (arrays of long strings; others ignored)."""
    keys: list[str] = []
    for key, value in entries:
        if key in (_CC, _BCC) and value[:1] == b"A":
            keys += [k for k in map(p.text, p.array_items(value)) if k is not None]
    return keys


def _field(entries: list[tuple[str, bytes]], key: str) -> bytes | None:
    for name, value in entries:
        if name == key:
            return value
    return None


def _sorted(entries: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    return sorted(entries, key=lambda entry: entry[0].encode("utf-8"))


def deaths(properties: bytes) -> list[list[tuple[str, bytes]]]:
    """The x-death entries of stored properties, newest first (empty when none)."""
    value = _field(p.headers(properties), X_DEATH)
    if value is None or value[:1] != b"A":
        return []
    return [entries for entries in map(p.table_value, p.array_items(value)) if entries is not None]


def dead_letter(
    properties: bytes,
    *,
    queue: str,
    reason: str,
    exchange: str,
    routing_key: str,
    dead_letter_routing_key: str | None,
    now_s: int,
    bcc: Sequence[str] = (),
) -> tuple[bytes, list[str]]:
    """The dead letter of a message (stored `properties`, last published to `exchange` with
    `routing_key` and BCC keys `bcc`) dying in `queue` for `reason`: its properties, and the
    routing keys it goes to the dead-letter exchange with."""
    assert reason in REASONS, reason
    headers = p.headers(properties)
    death_keys = [routing_key, *header_routes(headers)]
    info = [
        ("reason", p.longstr(reason)),
        ("queue", p.longstr(queue)),
        ("time", p.timestamp(now_s)),
        ("exchange", p.longstr(exchange)),
        ("routing-keys", p.array([p.longstr(key) for key in death_keys])),
    ]
    expiration = p.shortstr_field(properties, p.EXPIRATION_FLAG)
    if expiration is not None:
        info.append(("original-expiration", p.longstr(expiration)))
    previous = _field(headers, X_DEATH)
    updated = dict(headers)
    if previous is None or previous[:1] != b"A":
        death = [("count", p.long(1)), *info]
        others: list[bytes] = []
        updated["x-first-death-reason"] = p.longstr(reason)
        updated["x-first-death-queue"] = p.longstr(queue)
        updated["x-first-death-exchange"] = p.longstr(exchange)
    else:
        death = [("count", p.long(1)), *info]
        others = []
        for item in p.array_items(previous):
            entries = p.table_value(item)
            if (
                entries is not None
                and p.text(_field(entries, "queue")) == queue
                and p.text(_field(entries, "reason")) == reason
            ):
                count = p.integer(_field(entries, "count")) or 0
                death = [(k, v) for k, v in entries if k != "count"]
                death.append(("count", p.long(count + 1)))
            else:
                others.append(item)
    updated[X_DEATH] = p.array([p.table(_sorted(death)), *others])
    updated["x-last-death-reason"] = p.longstr(reason)
    updated["x-last-death-queue"] = p.longstr(queue)
    updated["x-last-death-exchange"] = p.longstr(exchange)
    if dead_letter_routing_key is not None:
        updated.pop(_CC, None)
        keys = [dead_letter_routing_key]
    else:
        keys = [routing_key]
        for key in (*header_routes(headers), *bcc):
            if key not in keys:
                keys.append(key)
    edited = p.with_headers(properties, _sorted(list(updated.items())))
    return p.without(edited, p.EXPIRATION_FLAG), keys


def cycling(reason: str, dead_properties: bytes, target: str) -> bool:
    """Whether delivering a dead letter (its properties as `dead_letter` made them) to the
    queue `target` would close a cycle with no rejection in it (RabbitMQ drops it there)."""
    if reason == REJECTED:
        return False
    path = []
    for entries in deaths(dead_properties):
        path.append(entries)
        if p.text(_field(entries, "queue")) == target:
            return all(p.text(_field(step, "reason")) != REJECTED for step in path)
    return False

"""AMQP field values (exchange, queue and binding arguments) as tagged JSON, losslessly.

Arguments arrive decoded the way pamqp decodes them (see `warrenmq.exchanges.field_values`):
`str`, `bytes`, `bytearray`, `bool`, `int`, `float`, `Decimal`, `datetime`, `dict`, `list`,
`None`. Plain JSON would merge `str` with `bytes`, `int` with `bool`, lose `Decimal` digits and
`datetime`, and reorder nothing but cannot tell a table from an array of pairs; RabbitMQ's
equivalence checks and binding identities depend on every one of those distinctions. So each
value is stored as `[tag, payload]`, tables as lists of `[key, value]` in their original order.

The encoding is deterministic (same value, same bytes), which the snapshot needs: two replicas
that applied the same commands must produce identical snapshots.

A Raft log entry of the metadata is a list of commands (`encode_commands`): applied in order,
stopping at the first one refused, as `MetadataStore.apply_all` applies them. Each command is
`[class name, field values...]`, every field value tagged as above, so a command decodes to
one equal to the one encoded (tuples of tags excepted: arrays decode as lists, which the
command classes turn back into tuples).
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import math
import typing
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, fields
from typing import Any

from warrenmq.server.metadata import commands as c

# Nesting bound for decoding stored data: an AMQP table nested deeper than this cannot come
# from a client (the amqp layer bounds header depth lower), so deeper input is corruption.
DEPTH_MAX = 64


def encode_value(value: Any) -> list:
    """`value` as a JSON-ready `[tag, payload]` list."""
    return _encode(value, 0)


def decode_value(encoded: Any) -> Any:
    """The inverse of `encode_value`; raises ValueError on anything it did not produce."""
    return _decode(encoded, 0)


def encode_table(table: Mapping[str, Any] | None) -> list:
    return [[key, _encode(item, 1)] for key, item in (table or {}).items()]


def decode_table(encoded: Any) -> dict[str, Any]:
    return _decode_pairs(encoded, 1)


def dumps(document: Any) -> str:
    """Compact, deterministic JSON of an already-encoded document."""
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def table_to_json(table: Mapping[str, Any] | None) -> str:
    return dumps(encode_table(table))


def table_from_json(text: str) -> dict[str, Any]:
    return decode_table(json.loads(text))


def _encode(value: Any, depth: int) -> list:
    if depth > DEPTH_MAX:
        raise ValueError(f"field value nested deeper than {DEPTH_MAX}")
    # bool before int: bool is a subclass of int, and the wire tells them apart.
    if isinstance(value, bool):
        return ["bool", value]
    if isinstance(value, int):
        return ["int", value]
    if isinstance(value, float):
        # JSON has no NaN or infinities; repr round-trips every float exactly.
        return ["float", value if math.isfinite(value) else repr(value)]
    if isinstance(value, str):
        return ["str", value]
    if isinstance(value, bytearray):
        return ["bytearray", base64.b64encode(bytes(value)).decode("ascii")]
    if isinstance(value, bytes):
        return ["bytes", base64.b64encode(value).decode("ascii")]
    if isinstance(value, decimal.Decimal):
        return ["decimal", str(value)]
    if isinstance(value, datetime.datetime):
        return ["timestamp", value.isoformat()]
    if isinstance(value, Mapping):
        return ["table", [[key, _encode(item, depth + 1)] for key, item in value.items()]]
    if isinstance(value, (list, tuple)):
        return ["array", [_encode(item, depth + 1) for item in value]]
    if value is None:
        return ["void", None]
    raise TypeError(f"not an AMQP field value: {type(value).__name__}")


def _decode(encoded: Any, depth: int) -> Any:
    if depth > DEPTH_MAX:
        raise ValueError(f"field value nested deeper than {DEPTH_MAX}")
    if not isinstance(encoded, list) or len(encoded) != 2 or not isinstance(encoded[0], str):
        raise ValueError(f"not an encoded field value: {encoded!r}")
    tag, payload = encoded
    if tag == "bool" and isinstance(payload, bool):
        return payload
    if tag == "int" and isinstance(payload, int) and not isinstance(payload, bool):
        return payload
    if tag == "float":
        if isinstance(payload, str):
            return float(payload)
        if isinstance(payload, (int, float)) and not isinstance(payload, bool):
            return float(payload)
    if tag == "str" and isinstance(payload, str):
        return payload
    if tag == "bytes" and isinstance(payload, str):
        return base64.b64decode(payload, validate=True)
    if tag == "bytearray" and isinstance(payload, str):
        return bytearray(base64.b64decode(payload, validate=True))
    if tag == "decimal" and isinstance(payload, str):
        return decimal.Decimal(payload)
    if tag == "timestamp" and isinstance(payload, str):
        return datetime.datetime.fromisoformat(payload)
    if tag == "table":
        return _decode_pairs(payload, depth + 1)
    if tag == "array" and isinstance(payload, list):
        return [_decode(item, depth + 1) for item in payload]
    if tag == "void" and payload is None:
        return None
    raise ValueError(f"not an encoded field value: {encoded!r}")


def _decode_pairs(encoded: Any, depth: int) -> dict[str, Any]:
    if not isinstance(encoded, list):
        raise ValueError(f"not an encoded field table: {encoded!r}")
    table: dict[str, Any] = {}
    for pair in encoded:
        if not isinstance(pair, list) or len(pair) != 2 or not isinstance(pair[0], str):
            raise ValueError(f"not an encoded table entry: {pair!r}")
        table[pair[0]] = _decode(pair[1], depth)
    return table


_COMMAND_CLASSES: dict[str, type] = {cls.__name__: cls for cls in typing.get_args(c.Command)}
_COMMAND_FIELDS = {
    name: tuple(f.name for f in fields(cls)) for name, cls in _COMMAND_CLASSES.items()
}
# Fields a command needs in an entry; those after them have defaults and may be missing from
# entries written before they existed.
_COMMAND_FIELDS_REQUIRED = {
    name: sum(1 for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING)
    for name, cls in _COMMAND_CLASSES.items()
}
# Fields that are tuples in the command classes (their equality and hashing depend on it).
_TUPLE_FIELDS = frozenset({"tags", "alive_nodes", "alive_boots", "replicas", "isr", "gone"})


def encode_commands(commands: Sequence[c.Command]) -> bytes:
    """Commands as one log entry's bytes."""
    document = []
    for command in commands:
        name = type(command).__name__
        document.append(
            [name, *(_encode(getattr(command, field), 0) for field in _COMMAND_FIELDS[name])]
        )
    return dumps(document).encode("utf-8")


def decode_commands(data: bytes) -> list[c.Command]:
    """The inverse of `encode_commands`; raises ValueError on anything it did not produce."""
    try:
        document = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"not encoded metadata commands: {error}") from error
    if not isinstance(document, list):
        raise ValueError("not a list of encoded metadata commands")
    commands: list[c.Command] = []
    for item in document:
        if not isinstance(item, list) or not item or item[0] not in _COMMAND_CLASSES:
            raise ValueError(f"not an encoded metadata command: {item!r}")
        name = item[0]
        names = _COMMAND_FIELDS[name]
        if not _COMMAND_FIELDS_REQUIRED[name] <= len(item) - 1 <= len(names):
            raise ValueError(f"{name} needs {len(names)} fields, got {len(item) - 1}")
        values = {}
        for field, encoded in zip(names, item[1:], strict=False):
            value = _decode(encoded, 0)
            values[field] = tuple(value) if field in _TUPLE_FIELDS else value
        commands.append(_COMMAND_CLASSES[name](**values))
    return commands

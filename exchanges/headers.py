"""The headers exchange: bindings match on message headers, not on the routing key.

Semantics are RabbitMQ 3.10's (rabbit_exchange_type_headers.erl, `headers_match/5`):

* `x-match` is "all" (the default when absent), "any", "all-with-x" or "any-with-x"; any other
  long string, or a value of another type, is refused at bind time with 406 and RabbitMQ's text
  ("Invalid x-match field value ...", "Invalid x-match field type ...");
* the `x-match` entry itself never takes part in matching; other binding keys that start with
  "x-" are ignored by "all"/"any" and count like any key for "all-with-x"/"any-with-x";
* a binding entry whose value is void (None) matches when the header is present, whatever its
  value; any other entry matches when the header is present with an equal value;
* "all" matches when every remaining entry matches (so a binding with no entry left matches
  every message), "any" when at least one does (so with none left it matches nothing);
* equality is Erlang's `==` on the values as 3.10 compares them (`PV == DV`, the type tag not
  included): 1 equals 1.0, a timestamp equals its integer seconds, a byte array equals the long
  string with the same bytes, `true` is not 1; tables and arrays compare element by element
  with their type tags (see field_values.erlang_key);
* a message with no headers has no entry present.

RabbitMQ merges two key-sorted lists for every binding; here bindings are indexed by their
entries (see HeadersExchange) and a candidate's entries are looked up in a dict of the message
headers, which gives the same answer because header keys are unique once decoded.
Newer RabbitMQ (3.13+) switched to `=:=`, under which 1 and 1.0 differ; 3.10 is matched here.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, NamedTuple

from warrenmq.exchanges.binding import Binding, BindingTable, Destination
from warrenmq.exchanges.errors import PreconditionFailed
from warrenmq.exchanges.field_values import amqp_type_name, erlang_key, erlang_repr

X_MATCH = "x-match"
_X_MATCH_KINDS = {
    "all": (True, False),
    "any": (False, False),
    "all-with-x": (True, True),
    "any-with-x": (False, True),
}
_PRESENT = None  # entry value meaning "header present, any value"


class _Spec(NamedTuple):
    destination: Destination
    match_all: bool
    # (header key, erlang_key of the wanted value, or _PRESENT for a void binding value)
    entries: tuple[tuple[str, tuple | None], ...]


def validate_x_match(arguments: Mapping[str, Any]) -> None:
    """RabbitMQ's `validate_binding`: x-match absent or one of the four long strings."""
    if X_MATCH not in arguments:
        return
    value = arguments[X_MATCH]
    if amqp_type_name(value) == "longstr":
        text = value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value
        if text in _X_MATCH_KINDS:
            return
        raise PreconditionFailed(
            f"Invalid x-match field value {erlang_repr(value)}; "
            "expected all, any, all-with-x, or any-with-x"
        )
    raise PreconditionFailed(
        f"Invalid x-match field type {amqp_type_name(value)} "
        f"(value {erlang_repr(value)}); expected longstr"
    )


def compile_spec(destination: Destination, arguments: Mapping[str, Any]) -> _Spec:
    x_match = arguments.get(X_MATCH, "all")
    if isinstance(x_match, bytes):
        x_match = x_match.decode("utf-8", "surrogateescape")
    # RabbitMQ's parse_x_match: anything unrecognised (only reachable for legacy bindings) is "all".
    match_all, with_x = _X_MATCH_KINDS.get(x_match, (True, False))
    entries = tuple(
        (key, _PRESENT if value is None else erlang_key(value))
        for key, value in arguments.items()
        if key != X_MATCH and (with_x or not key.startswith("x-"))
    )
    return _Spec(destination, match_all, entries)


def spec_matches(spec: _Spec, headers: Mapping[str, tuple]) -> bool:
    """Whether a compiled binding matches headers already mapped through `erlang_key`."""
    if spec.match_all:
        for key, wanted in spec.entries:
            if key not in headers:
                return False
            if wanted is not _PRESENT and headers[key] != wanted:
                return False
        return True
    for key, wanted in spec.entries:
        if key in headers and (wanted is _PRESENT or headers[key] == wanted):
            return True
    return False


class HeadersExchange(BindingTable):
    """Bindings indexed so a message looks at few of them, not all.

    * an "any" binding is filed under each of its entries — (key, value) or, for a void
      value, the key alone — and matches as soon as one of them is found in the message;
    * an "all" binding is filed under one anchor entry, which any matching message must have,
      and is checked in full only when the anchor is found; the anchor is the entry whose
      bucket is smallest when the binding is added, so a shared entry ("kind": "order") does
      not pull every binding in;
    * an "all" binding with no entry left matches every message, an "any" one none.
    """

    type_name = "headers"
    routes_by_key_only = False

    __slots__ = ("_always", "_any", "_anchored", "_anchors")

    def __init__(self) -> None:
        super().__init__()
        # Buckets are keyed by (header key, erlang_key(value)), or by (header key, _PRESENT).
        self._any: dict[tuple, dict[tuple, Destination]] = {}
        self._anchored: dict[tuple, dict[tuple, _Spec]] = {}
        self._anchors: dict[tuple, tuple] = {}
        self._always: dict[tuple, Destination] = {}

    def validate_binding(self, arguments: Mapping[str, Any]) -> None:
        validate_x_match(arguments)

    def match(self, routing_key: str, headers: Mapping[str, Any] | None) -> Collection[Destination]:
        found = set(self._always.values())
        if not headers or not (self._any or self._anchored):
            return found
        values = {key: erlang_key(value) for key, value in headers.items()}
        any_buckets, anchored_buckets = self._any, self._anchored
        for entry in (*values.items(), *((key, _PRESENT) for key in values)):
            bucket = any_buckets.get(entry)
            if bucket is not None:
                found.update(bucket.values())
            candidates = anchored_buckets.get(entry)
            if candidates is not None:
                found.update(
                    spec.destination
                    for spec in candidates.values()
                    if spec.destination not in found and spec_matches(spec, values)
                )
        return found

    def _index(self, binding_id: tuple, binding: Binding) -> None:
        spec = compile_spec(binding.destination, binding.arguments)
        if not spec.match_all:
            for entry in set(spec.entries):
                self._any.setdefault(entry, {})[binding_id] = spec.destination
        elif not spec.entries:
            self._always[binding_id] = spec.destination
        else:
            anchor = min(spec.entries, key=lambda entry: len(self._anchored.get(entry, ())))
            self._anchors[binding_id] = anchor
            self._anchored.setdefault(anchor, {})[binding_id] = spec

    def _unindex(self, binding_id: tuple, binding: Binding) -> None:
        if self._always.pop(binding_id, None) is not None:
            return
        anchor = self._anchors.pop(binding_id, None)
        if anchor is not None:
            _drop(self._anchored, anchor, binding_id)
            return
        spec = compile_spec(binding.destination, binding.arguments)
        for entry in set(spec.entries):
            _drop(self._any, entry, binding_id)


def _drop(buckets: dict[tuple, dict], entry: tuple, binding_id: tuple) -> None:
    bucket = buckets[entry]
    del bucket[binding_id]
    if not bucket:
        del buckets[entry]

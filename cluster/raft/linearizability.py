"""A linearizability checker for client histories (Wing & Gong's search with Lowe's state
cache, in the form Porcupine uses).

A history is a list of `Operation`s, each with the times its call was issued and its result
received. An operation whose result never came back (a timed-out write) has `ret=None`: it
may have taken effect at any moment after its call, or never, and its output is unknown.
A history is linearizable if every operation can be given a point between its call and its
return such that applying them in that order to the sequential model reproduces every
observed output.

The search: walk the time-ordered list of call and return events; a call may be linearized
next if the model accepts it from the current state; on reaching the return of an
operation not yet linearized, undo the last choice. The cache of (set of linearized
operations, model state) pairs visited prunes the search to polynomial time on the histories
the simulator produces. Histories are first split into independent parts (per key for a
key-value store), which is sound for models whose operations on different keys commute
(Herlihy & Wing's locality).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

UNKNOWN = object()  # the output of an operation whose result never arrived


@dataclass(frozen=True, slots=True)
class Operation:
    client: int
    input: Any
    call: int
    output: Any
    ret: int | None  # None: never returned; may or may not have taken effect


class Model(Protocol):
    def partition(self, history: Sequence[Operation]) -> list[list[Operation]]: ...

    def init(self) -> Hashable: ...

    def step(self, state: Hashable, input: Any, output: Any) -> tuple[bool, Hashable]: ...


@dataclass(frozen=True, slots=True)
class CheckResult:
    ok: bool | None  # None: the search hit steps_max before deciding
    failing_part: list[Operation] | None = None
    steps: int = 0


class KvModel:
    """A register per key. Inputs: ("put", key, value) -> output None; ("get", key) -> the
    value, or None if never written."""

    def partition(self, history: Sequence[Operation]) -> list[list[Operation]]:
        # A write whose outcome is unknown and whose value no read returned can be dropped:
        # "it never took effect" is always a valid choice for it, and no other choice can
        # make a history linearizable that is not without it (any read after it, before the
        # next write, would have returned its value). It keeps a long run of lost writes
        # from making the search exponential.
        observed = {(op.input[1], op.output) for op in history if op.input[0] == "get"}
        by_key: dict[Any, list[Operation]] = {}
        for op in history:
            key = op.input[1]
            if op.ret is None and op.input[0] == "put" and (key, op.input[2]) not in observed:
                continue
            by_key.setdefault(key, []).append(op)
        return list(by_key.values())

    def init(self) -> Hashable:
        return None

    def step(self, state: Hashable, input: Any, output: Any) -> tuple[bool, Hashable]:
        if input[0] == "put":
            return True, input[2]
        return (output is UNKNOWN or output == state), state


class _Node:
    __slots__ = ("is_call", "match", "next", "op_id", "prev")

    def __init__(self, op_id: int, is_call: bool) -> None:
        self.op_id = op_id
        self.is_call = is_call
        self.match: _Node | None = None
        self.prev: _Node | None = None
        self.next: _Node | None = None


def _check_part(
    ops: Sequence[Operation], step: Callable, init: Hashable, steps_max: int
) -> tuple[bool | None, int]:
    events = []
    infinity = float("inf")
    for i, op in enumerate(ops):
        # At equal times, calls sort before returns: two operations that touch the same
        # instant are treated as concurrent, the permissive reading.
        events.append((op.call, 0, i))
        events.append((infinity if op.ret is None else op.ret, 1, i))
    events.sort()
    head = _Node(-1, False)
    tail = head
    calls: dict[int, _Node] = {}
    for _, kind, i in events:
        node = _Node(i, kind == 0)
        if kind == 0:
            calls[i] = node
        else:
            calls[i].match = node
        node.prev = tail
        tail.next = node
        tail = node

    def lift(call: _Node) -> None:
        call.prev.next = call.next
        if call.next is not None:
            call.next.prev = call.prev
        ret = call.match
        ret.prev.next = ret.next
        if ret.next is not None:
            ret.next.prev = ret.prev

    def unlift(call: _Node) -> None:
        ret = call.match
        ret.prev.next = ret
        if ret.next is not None:
            ret.next.prev = ret
        call.prev.next = call
        if call.next is not None:
            call.next.prev = call

    state = init
    linearized = 0
    cache: set[tuple[int, Hashable]] = set()
    stack: list[tuple[_Node, Hashable]] = []
    entry = head.next
    steps = 0
    while head.next is not None:
        steps += 1
        if steps > steps_max:
            return None, steps
        if entry.is_call:
            op = ops[entry.op_id]
            ok, new_state = step(state, op.input, op.output)
            if ok:
                new_linearized = linearized | (1 << entry.op_id)
                key = (new_linearized, new_state)
                if key not in cache:
                    cache.add(key)
                    stack.append((entry, state))
                    state = new_state
                    linearized = new_linearized
                    lift(entry)
                    entry = head.next
                    continue
            entry = entry.next
        else:
            if not stack:
                return False, steps
            entry, state = stack.pop()
            linearized &= ~(1 << entry.op_id)
            unlift(entry)
            entry = entry.next
    return True, steps


def check(history: Sequence[Operation], model: Model, steps_max: int = 2_000_000) -> CheckResult:
    """Is `history` linearizable with respect to `model`? `steps_max` bounds the search."""
    total = 0
    undecided = False
    for part in model.partition(history):
        ok, steps = _check_part(part, model.step, model.init(), steps_max)
        total += steps
        if ok is False:
            return CheckResult(False, list(part), total)
        if ok is None:
            undecided = True
    return CheckResult(None if undecided else True, None, total)

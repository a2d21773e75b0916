"""The routed log: what a delayed-message log has routed (done) and is routing (intents).

It is a second partition log beside the messages, like a queue's ack log (`queue/ack_log.py`),
and it reuses that log's records for what is done: a DELTA (every offset below `floor`, and
the ranges, are done; `mark` unused) and a CLIP (forget everything at or above a limit). It
adds one record kind (little-endian):

    kind      u8     INTENT (4)
    queues    u32    queue names that follow, each u8 length + UTF-8
    messages  u32    messages that follow, each:
        offset    u64    the held message
        targets   u16    queues it is being staged on, each:
            queue     u32    index into the names above
            position  i64    the queue engine's `append_position` before the staging

An INTENT is made durable before its messages are staged on their queues, so after a crash a
message with an intent and no DELTA covering it may be in some of those queues: recovery
looks for it at or after each position (see `exchanges.DelayedExchanges.recover`). A later
INTENT for the same offset replaces the earlier one (a retry names only the queues that
failed). A snapshot is a DELTA with every range plus the INTENTs still open; once it is
durable, every record before it may go.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from warrenmq.log import PartitionLog, RawRecord

from ..queue import ack_log
from ..queue.errors import QueueError

INTENT = 4
_COUNT = struct.Struct("<I")
_MESSAGE = struct.Struct("<QH")
_TARGET = struct.Struct("<Iq")
# An INTENT record is closed once it holds this many bytes (a message with thousands of
# queues may make one larger).
INTENT_RECORD_BYTES = 64 << 10

Target = tuple[str, int]
"""A queue a message is being staged on, and that queue's position before the staging."""


def encode_intents(intents: Iterable[tuple[int, Sequence[Target]]]) -> list[RawRecord]:
    """INTENT records for (offset, targets) pairs, each of about INTENT_RECORD_BYTES at most."""
    records: list[RawRecord] = []
    names: dict[str, int] = {}
    messages: list[bytes] = []
    size = 0
    for offset, targets in intents:
        entry = [_MESSAGE.pack(offset, len(targets))]
        for name, position in targets:
            index = names.setdefault(name, len(names))
            entry.append(_TARGET.pack(index, position))
            size += _TARGET.size + len(name) + 1
        messages.append(b"".join(entry))
        size += _MESSAGE.size
        if size >= INTENT_RECORD_BYTES:
            records.append(_intent_record(names, messages))
            names, messages, size = {}, [], 0
    if messages:
        records.append(_intent_record(names, messages))
    return records


def _intent_record(names: dict[str, int], messages: list[bytes]) -> RawRecord:
    encoded = [name.encode("utf-8") for name in names]
    body = b"".join(
        [
            bytes((INTENT,)),
            _COUNT.pack(len(encoded)),
            *(bytes((len(name),)) + name for name in encoded),
            _COUNT.pack(len(messages)),
            *messages,
        ]
    )
    return (b"", b"", b"", body)


def decode_intents(body: bytes) -> list[tuple[int, tuple[Target, ...]]]:
    if body[0] != INTENT:
        raise QueueError(f"routed log record of kind {body[0]} is not an INTENT")
    position = 1
    (name_count,) = _COUNT.unpack_from(body, position)
    position += _COUNT.size
    names = []
    for _ in range(name_count):
        length = body[position]
        names.append(body[position + 1 : position + 1 + length].decode("utf-8"))
        position += 1 + length
    (message_count,) = _COUNT.unpack_from(body, position)
    position += _COUNT.size
    intents = []
    for _ in range(message_count):
        offset, target_count = _MESSAGE.unpack_from(body, position)
        position += _MESSAGE.size
        targets = []
        for _ in range(target_count):
            index, queue_position = _TARGET.unpack_from(body, position)
            targets.append((names[index], queue_position))
            position += _TARGET.size
        intents.append((offset, tuple(targets)))
    if position != len(body):
        raise QueueError(f"INTENT record of {len(body)} bytes has {len(body) - position} left")
    return intents


@dataclass
class RoutedState:
    """What replay rebuilds: the done offsets, and the intents of messages not done."""

    done: ack_log.AckState = field(default_factory=ack_log.AckState)
    intents: dict[int, tuple[Target, ...]] = field(default_factory=dict)

    def apply(self, body: bytes) -> None:
        if body and body[0] == INTENT:
            self.intents.update(decode_intents(body))
            return
        self.done.apply(body)
        if body and body[0] == ack_log.CLIP:
            limit = ack_log.HEAD.unpack_from(body)[1]
            self.intents = {o: t for o, t in self.intents.items() if o < limit}

    def normalise(self) -> None:
        """Merge the done ranges and forget the intents of done messages."""
        done = self.done
        done.normalise()
        if not self.intents:
            return
        starts = [start for start, _ in done.ranges]

        def is_done(offset: int) -> bool:
            at = bisect.bisect_right(starts, offset) - 1
            return offset < done.floor or (at >= 0 and offset < done.ranges[at][1])

        self.intents = {o: t for o, t in self.intents.items() if not is_done(o)}


def replay(log: PartitionLog) -> RoutedState:
    """Apply every record of the routed log, oldest first."""
    state = RoutedState()
    offset = log.start_offset
    while offset < log.end_offset:
        records = log.read(offset, max_records=100_000, max_bytes=ack_log.REPLAY_READ_BYTES)
        for record in records:
            state.apply(record.body)
        offset = records[-1].offset + 1
        if len(state.done.ranges) > 4 * ack_log.RANGES_PER_RECORD_MAX:
            state.done.normalise()
    state.normalise()
    return state

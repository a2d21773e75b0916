"""The store of one delayed exchange: held messages in a partition log, routed in due order.

On disk, in `directory`:

* `messages/`: a partition log of the held messages, in arrival order. A record is the
  message as the core stages it (exchange, routing key, property bytes, body), its property
  bytes prefixed with the delay (u32 big-endian, ms). The batch timestamp is when it was
  stored, so a message is due at timestamp + delay; nothing else needs to be written for it.
* `routed/`: the routed log (`routed_log.py`): which offsets are done, and the intents of
  the hand-offs under way.

In memory, per held message, only a (due, offset) pair in a `DueIndex` (8 bytes), and one
bit per offset above the floor of done offsets (`AckedOffsets`); bodies stay on disk until
they are due. `warren bench delayed`: a broker holding a million messages for an hour grows
by ~32 MB, ~12 MB once restarted (the rest is heap the publish path left free).

The log is an engine in the sense of `queue/engine.py` as far as `WorkQueue` uses one to
stage, write and commit (`append`, `commit`, `needs_commit`, `batch_bytes_max`,
`ready_count`, `held`, `shutdown`, `close`, `delete`); what it hands out instead of deliveries are
due messages (`take_due`), whose hand-off (`exchanges.py`) is recorded (`begin_hand_off`)
and then reported done (`routed`).

Durability, as a queue's: `commit()` fsyncs both logs in parallel; a message is durable once
a commit after its append returned; a done mark is durable once a commit after `routed`
returned. Done marks at or above the recovered end of the messages (which a hand-off never
makes: it commits the messages first) would be clipped durably on open, as a queue does.
Disk space is freed a whole segment at a time below the lowest offset not yet routed, so one
message held for weeks keeps everything stored after it.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import dataclasses
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from warrenmq.log import DescriptorPool, LogConfig, PartitionLog, RawRecord, Record
from warrenmq.log.batch import HEADER_BYTES

from ..queue import ack_log
from ..queue.errors import QueueError
from ..queue.log_queue import remove_directory
from ..queue.ranges import coalesce
from .acked import AckedOffsets
from .due_index import DueIndex
from .routed_log import RoutedState, Target, encode_intents, replay

MESSAGES_DIR = "messages"
ROUTED_DIR = "routed"
DELAY = struct.Struct(">I")
"""The prefix of a held record's property bytes: its delay in ms (at most 2^32 - 1)."""
# Due messages, and at recovery every held message, are read in slices of this size.
_READ_RECORDS = 4096
_READ_BYTES = 1 << 20


def _default_routed_log() -> LogConfig:
    # As a queue's ack log: never read back except on open, small segments for compaction.
    return LogConfig(segment_bytes_max=1 << 20, tail_cache_bytes_max=0)


@dataclass(frozen=True, slots=True)
class DelayedLogConfig:
    message_log: LogConfig = field(default_factory=LogConfig)
    routed_log: LogConfig = field(default_factory=_default_routed_log)
    snapshot_bytes: int = 1 << 20
    """A snapshot replaces the routed log's records once this many bytes (and at least four
    times the previous snapshot) have been written since the last one."""

    @classmethod
    def holding(cls, message_log: LogConfig) -> DelayedLogConfig:
        """A store for whatever a queue with `message_log` holds: a held record is
        `DELAY.size` bytes longer."""
        record_bytes_max = message_log.record_bytes_max + DELAY.size
        return cls(
            message_log=dataclasses.replace(
                message_log,
                record_bytes_max=record_bytes_max,
                batch_bytes_max=max(message_log.batch_bytes_max, record_bytes_max + HEADER_BYTES),
            )
        )


class Held(NamedTuple):
    """A held message read back: what the core routes when it is due."""

    offset: int
    due_ms: int
    delay_ms: int
    exchange: bytes
    routing_key: bytes
    properties: bytes
    """As the core staged it (the delay prefix removed)."""
    body: bytes


def _held(record: Record) -> Held:
    (delay,) = DELAY.unpack_from(record.properties)
    return Held(
        record.offset,
        record.timestamp_ms + delay,
        delay,
        record.exchange,
        record.routing_key,
        record.properties[DELAY.size :],
        record.body,
    )


class _Flush(NamedTuple):
    """What a routed log write vouches for once it is fsynced."""

    floor: int
    snapshot_offset: int | None


class DelayedMessageLog:
    """Single-threaded: call it from the event loop."""

    def __init__(
        self,
        directory: Path,
        config: DelayedLogConfig,
        messages: PartitionLog,
        routed: PartitionLog,
        state: RoutedState,
    ) -> None:
        self.directory = directory
        self.config = config
        self._messages = messages
        self._routed = routed
        self._closed = False
        end = messages.end_offset
        done = state.done
        stale = done.floor > end or bool(done.ranges and done.ranges[-1][1] > end)
        if stale:
            done.clip(end)
            done.normalise()
        floor = max(done.floor, messages.start_offset)
        self._acked = AckedOffsets.from_ranges(floor, done.ranges)
        self._floor_written = self._durable_floor = self._acked.floor
        # Intents of hand-offs under way (or, after a crash, left unfinished), by offset.
        self._intents: dict[int, tuple[Target, ...]] = {
            offset: targets for offset, targets in state.intents.items() if offset < end
        }
        self._pending_done: list[int] = []
        self._unsynced: collections.deque[tuple[int, _Flush]] = collections.deque()
        self._bytes_since_snapshot = routed.size_bytes
        self._snapshot_bytes = 0
        self._index = DueIndex()
        self._ranges_per_record = ack_log.ranges_per_record(config.routed_log)
        if stale:
            routed.append([ack_log.encode_clip(end)])
            routed.sync()
        self._index_held(end)
        messages.delete_before(self._durable_floor)

    @classmethod
    def open(
        cls,
        directory: Path,
        config: DelayedLogConfig | None = None,
        *,
        descriptors: DescriptorPool | None = None,
    ) -> DelayedMessageLog:
        """Open or create the store in `directory`, recovering it after any crash."""
        config = config or DelayedLogConfig()
        messages = PartitionLog.open(
            directory / MESSAGES_DIR, config.message_log, descriptors=descriptors
        )
        try:
            routed = PartitionLog.open(
                directory / ROUTED_DIR, config.routed_log, descriptors=descriptors
            )
        except BaseException:
            messages.close()
            raise
        try:
            return cls(directory, config, messages, routed, replay(routed))
        except BaseException:
            messages.close()
            routed.close()
            raise

    def _index_held(self, end: int) -> None:
        """Index every stored message neither done nor being handed off."""
        acked = self._acked
        intents = self._intents
        push = self._index.push
        offset = acked.floor
        while offset < end:
            # Bodies are read too (a record is read whole), a slice at a time, and dropped.
            records = self._messages.read(offset, _READ_RECORDS, _READ_BYTES)
            for record in records:
                if record.offset not in acked and record.offset not in intents:
                    push(
                        record.timestamp_ms + DELAY.unpack_from(record.properties)[0], record.offset
                    )
            offset = records[-1].offset + 1

    # -- counts ----------------------------------------------------------------------------

    @property
    def ready_count(self) -> int:
        """Messages held, not yet due or not yet taken."""
        return len(self._index)

    @property
    def handing_off(self) -> int:
        """Messages taken and not yet routed."""
        return len(self._intents)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def batch_bytes_max(self) -> int:
        return self.config.message_log.batch_bytes_max

    @property
    def run_count(self) -> int:
        return self._index.run_count

    def next_due_ms(self) -> int | None:
        return self._index.next_due_ms()

    def recovered_intents(self) -> dict[int, tuple[Target, ...]]:
        """Hand-offs that a crash interrupted, by offset (before any new one begins)."""
        return dict(self._intents)

    def held(self) -> list[tuple[int, int]]:
        """None of its messages waits out a requeue delay: none is ever delivered."""
        return []

    # -- holding ---------------------------------------------------------------------------

    def append(self, records: Sequence[RawRecord], timestamp_ms: int | None = None) -> int:
        """Store one batch of held records (properties prefixed with `DELAY`); returns the
        first offset."""
        self._check_open()
        first = self._messages.append(records, timestamp_ms)
        # The log may have moved the timestamp on (it never goes back): that is what a
        # recovery will read, so that is what the due times count from.
        stored_ms = self._messages.last_timestamp_ms
        push = self._index.push
        for offset, record in enumerate(records, first):
            push(stored_ms + DELAY.unpack_from(record[2])[0], offset)
        return first

    def take_due(self, now_ms: int, count_max: int) -> list[Held]:
        """Up to `count_max` messages due by `now_ms`, earliest first, read back. They are
        no longer indexed: the caller hands them off (until a restart, retries are its own)."""
        self._check_open()
        return self.read_many(self._index.pop_due(now_ms, count_max))

    def read_many(self, offsets: Sequence[int]) -> list[Held]:
        """The stored messages at `offsets`, in that order.

        The log decodes a whole batch to read one record of it: offsets are read in
        ascending order, a slice at a time, and every wanted record of a slice is kept.
        """
        wanted = sorted(offsets)
        read: dict[int, Held] = {}
        at = 0
        while at < len(wanted):
            first = wanted[at]
            # As far as the wanted offsets within one slice reach, and no further.
            span = wanted[bisect.bisect_left(wanted, first + _READ_RECORDS) - 1] - first + 1
            for record in self._messages.read(first, span, _READ_BYTES):
                if record.offset == wanted[at]:
                    read[record.offset] = _held(record)
                    at += 1
                    if at == len(wanted):
                        break
        return [read[offset] for offset in offsets]

    # -- handing off -----------------------------------------------------------------------

    def begin_hand_off(self, intents: Sequence[tuple[int, tuple[Target, ...]]]) -> None:
        """Record where taken messages are about to be staged; `commit()` makes it durable,
        and must have returned before they are staged."""
        self._check_open()
        records = encode_intents(intents)
        for record in records:
            self._routed.append([record])
        self._bytes_since_snapshot += sum(len(record[3]) for record in records)
        self._intents.update(intents)

    def routed(self, offsets: Iterable[int]) -> None:
        """Messages every target now holds: done."""
        for offset in offsets:
            if self._intents.pop(offset, None) is not None:
                self._acked.add(offset)
                self._pending_done.append(offset)

    # -- durability ------------------------------------------------------------------------

    @property
    def needs_commit(self) -> bool:
        return (
            self._messages.durable_offset < self._messages.end_offset
            or self._routed.durable_offset < self._routed.end_offset
            or bool(self._pending_done)
        )

    async def commit(self) -> None:
        """Make appends, intents and done marks durable."""
        self._check_open()
        self._flush_done()
        await asyncio.gather(self._messages.commit(), self._routed.commit())
        if not self._closed:
            self._apply_synced_flushes()

    def _flush_done(self) -> None:
        """Append a DELTA for the offsets done since the last one, or a snapshot."""
        floor = self._acked.floor
        snapshot = self._bytes_since_snapshot >= max(
            self.config.snapshot_bytes, 4 * self._snapshot_bytes
        )
        if snapshot:
            records = ack_log.encode_delta(
                floor, 0, list(self._acked.ranges()), self._ranges_per_record
            )
            records += encode_intents(self._intents.items())
        elif self._pending_done or floor != self._floor_written:
            done = [(offset, offset + 1) for offset in self._pending_done if offset >= floor]
            records = ack_log.encode_delta(floor, 0, coalesce(done), self._ranges_per_record)
        else:
            return
        first = self._routed.end_offset
        for record in records:
            self._routed.append([record])
        self._pending_done = []
        self._floor_written = floor
        size = sum(len(record[3]) for record in records)
        if snapshot:
            self._bytes_since_snapshot = 0
            self._snapshot_bytes = size
        else:
            self._bytes_since_snapshot += size
        self._unsynced.append((self._routed.end_offset, _Flush(floor, first if snapshot else None)))

    def _apply_synced_flushes(self) -> None:
        """For each routed log write now fsynced: free the messages below its floor, and the
        routed records before its snapshot."""
        unsynced = self._unsynced
        durable = self._routed.durable_offset
        while unsynced and unsynced[0][0] <= durable:
            flushed = unsynced.popleft()[1]
            if flushed.floor > self._durable_floor:
                self._durable_floor = flushed.floor
                self._messages.delete_before(flushed.floor)
            if flushed.snapshot_offset is not None:
                self._routed.delete_before(flushed.snapshot_offset)

    # -- closing ---------------------------------------------------------------------------

    async def shutdown(self) -> None:
        """Make everything durable and close."""
        await self.commit()
        self.close()

    def close(self) -> None:
        """Close the files without syncing: what `commit()` has not covered may be lost."""
        if self._closed:
            return
        self._closed = True
        self._messages.close()
        self._routed.close()

    def delete(self) -> None:
        """Close the store and remove its directory (its held messages go with it)."""
        self.close()
        remove_directory(self.directory)

    def _check_open(self) -> None:
        if self._closed:
            raise QueueError(f"delayed-message log {self.directory} is closed")

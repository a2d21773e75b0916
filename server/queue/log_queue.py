"""A durable queue: one partition log of messages plus an ack log of what was acknowledged.

In memory the queue keeps only what the log cannot tell it (ARCHITECTURE.md, "Queues on a
log"):

* `floor` and the acked ranges above it (`AckedRanges`): every offset below the floor is
  acknowledged; the ranges are the acks that arrived out of order;
* `next`: the next offset never delivered; ready messages at or above it are read from the log;
* the redelivery set: offsets below `next` that came back (requeued, or in flight at a crash),
  delivered before new ones and in offset order, as RabbitMQ returns messages to their
  original position;
* the in-flight set (delivered, not yet acknowledged), the delivery counts of offsets that
  have been delivered more than once and the failure counts of those with failed deliveries
  (`ack_log.py` says which returns fail).

None of these grows with queue depth: a million ready messages are two integers.

Durability. `commit()` fsyncs the message log and, in parallel, writes and fsyncs an ack log
record with the acknowledgements made since the last one (see `ack_log.py`). The two fsyncs
are independent, so after a crash the ack log may name offsets whose messages were lost; on
open the queue forgets every acknowledgement and delivery at or above the recovered end of
the message log, durably (a CLIP record), before a new message can take such an offset.
The ack log also carries the *delivered mark*: every offset the queue hands out lies below a
mark that was durable before the handout, so a message in flight at a crash comes back with
`redelivered=True`. The mark is written `delivered_mark_lead` offsets ahead, which costs one
small ack log write per half-lead of deliveries instead of one per delivery; the price is that
after a crash up to that many never-delivered messages are also flagged redelivered, which
RabbitMQ's "may have been delivered before" allows. A clean `shutdown()` writes the exact
mark, so a clean restart flags nothing it did not deliver.

Opening writes nothing unless the ack log names offsets at or above the recovered end (the
CLIP case above). Otherwise the first lead is granted when the first new message is about to
be handed out: one ack log write and fsync then, in `take()`, as open used to do for every
queue. So opening (or declaring) 100,000 idle queues costs no fsync, and neither does closing
them: `shutdown()` writes the exact mark only when a mark ahead of `next` was written.

Guarantees after a crash (anything written after the last fsync lost, or any prefix of it kept):
* every message appended before a `commit()` returned is there, exactly once, intact;
* every ack made before a `commit()` began, once that commit has returned, is never undone:
  the message is not delivered again;
* any other ack may be undone and its message delivered again (at least once);
* a message that had been delivered and not durably acknowledged comes back with
  redelivered=True; its delivery count is the last one a commit made durable (redeliveries
  and returns write theirs to the ack log), or "delivered once before" for a message
  delivered once, and one more failed delivery is counted unless its last durable record
  says it had been returned (its consumer's connection went with the crash).

Extension points for what this issue leaves out: message TTL and length limits act at the
head of the ready sequence (`take()` and `append()` would ack expired or overflowing offsets
the way `purge()` does); priorities are one ready sequence (`next` plus redelivery set) per
level over the same log; dead-lettering reads the message before the broker acks it.
"""

from __future__ import annotations

import asyncio
import collections
import heapq
import itertools
import operator
import os
import shutil
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from warrenmq.log import DescriptorPool, LogConfig, PartitionLog, RawRecord, Record

from . import ack_log
from .engine import Kept, Message
from .errors import QueueError
from .ranges import AckedRanges, coalesce

MESSAGES_DIR = "messages"
ACKS_DIR = "acks"
# Out-of-order acks waiting for the next commit are merged into ranges beyond this many, so a
# broker that commits rarely still holds them compactly.
PENDING_RANGES_MAX = 65_536


# Removes the directories of deleted queues, one at a time; nobody waits for it.
_REMOVE_EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="warren-rmtree")
REMOVED_SUFFIX = ".deleted-"


def remove_directory(directory: Path) -> None:
    """Take `directory` away now and delete its files in a worker thread.

    Deleting a queue's segments on the event loop stalled every connection for 20-90 ms. The
    rename is immediate, so a queue declared again under the same name starts empty; a
    renamed directory that a crash left behind is deleted when the broker recovers its vhost
    (it is no queue's directory).
    """
    removed = directory.with_name(directory.name + REMOVED_SUFFIX + os.urandom(6).hex())
    try:
        directory.rename(removed)
    except FileNotFoundError:
        return
    _REMOVE_EXECUTOR.submit(shutil.rmtree, removed, ignore_errors=True)


def _message(record: Record, redelivered: bool, delivery_count: int, failed_count: int) -> Message:
    return Message(
        record.offset,
        record.timestamp_ms,
        record.exchange,
        record.routing_key,
        record.properties,
        record.body,
        redelivered,
        delivery_count,
        failed_count,
    )


def _default_message_log() -> LogConfig:
    # Smaller segments than a stream's: a queue frees disk a whole segment at a time once its
    # messages are acknowledged. A modest tail cache serves consumers that keep up.
    return LogConfig(segment_bytes_max=16 << 20, tail_cache_bytes_max=2 << 20)


def _default_ack_log() -> LogConfig:
    # Ack records are never read back except on open, so there is no tail cache; small
    # segments let compaction delete old records soon after each snapshot.
    return LogConfig(segment_bytes_max=1 << 20, tail_cache_bytes_max=0)


@dataclass(frozen=True, slots=True)
class QueueConfig:
    message_log: LogConfig = field(default_factory=_default_message_log)
    ack_log: LogConfig = field(default_factory=_default_ack_log)
    delivered_mark_lead: int = 4096
    """Offsets the durable delivered mark is written ahead of the next new delivery."""
    ack_log_compact_bytes: int = 1 << 20
    """A snapshot replaces the ack log's records once this many bytes (and at least four
    times the previous snapshot) have been written since the last one."""
    read_ahead_records_max: int = 512
    read_ahead_bytes_max: int = 256 << 10
    """New messages are read from the log in slices of at most this size."""
    deliver_uncommitted: bool = True
    """Deliver messages before they are fsynced, as a RabbitMQ classic queue does; False
    delivers only durable messages, as a quorum queue does (consumers then never see a
    message that a crash could take back)."""

    def __post_init__(self) -> None:
        if ack_log.ranges_per_record(self.ack_log) < 1:
            raise QueueError(
                "ack log segments of "
                f"{self.ack_log.segment_bytes_max} bytes cannot hold an ack record"
            )
        if self.delivered_mark_lead < 2:
            raise QueueError(
                f"delivered_mark_lead must be at least 2, got {self.delivered_mark_lead}"
            )
        for name in ("ack_log_compact_bytes", "read_ahead_records_max", "read_ahead_bytes_max"):
            if getattr(self, name) <= 0:
                raise QueueError(f"{name} must be positive, got {getattr(self, name)}")


class _Flush(NamedTuple):
    """What an ack log write vouches for once it is fsynced."""

    mark: int
    floor: int
    snapshot_offset: int | None


class LogQueue:
    """A queue stored in `directory`: `messages/` (the partition log) and `acks/` (the ack log).

    Single-threaded: call it from the event loop. `append`, `take`, `ack`, `requeue` and
    `purge` are synchronous and do no fsync; `commit()` makes their effects durable.
    """

    def __init__(
        self,
        directory: Path,
        config: QueueConfig,
        log: PartitionLog,
        acks: PartitionLog,
        state: ack_log.AckState,
    ) -> None:
        self.directory = directory
        self.config = config
        self._log = log
        self._acks = acks
        end = log.end_offset
        # Acks or a delivered mark at or above the recovered end name messages that a crash
        # took back; they must be forgotten durably before new messages take those offsets.
        stale = (
            state.floor > end
            or state.mark > end
            or bool(state.ranges and state.ranges[-1][1] > end)
            or any(offset >= end for offset in state.bcc)
        )
        state.clip(end)
        state.normalise()
        floor = max(state.floor, log.start_offset)
        self._acked = AckedRanges.from_ranges(floor, state.ranges)
        floor = self._acked.floor
        highest_acked = max((end_ for _, end_ in self._acked), default=floor)
        self._next = max(floor, state.mark, highest_acked)
        # Everything below `next` was delivered at least once; what is neither acked nor (now,
        # after the restart) in flight comes back as a redelivery. Sorted, so already a heap.
        self._redeliver: list[int] = list(self._acked.gaps(self._next))
        self._in_flight: set[int] = set()
        self._counts: dict[int, int] = state.counts
        self._failures: dict[int, int] = state.failures
        # Count records not yet in the ack log, in order: (TAKEN, RETURNED or HELD, offset,
        # deliveries, failures, due epoch ms if HELD).
        self._pending_counts: list[tuple[int, int, int, int, int]] = []
        # The BCC keys of messages not yet acknowledged (ack_log.py, "BCC"), by offset, and
        # those not yet in the ack log. Forgotten as each message is acknowledged; the ack
        # log forgets them at its next snapshot (a restart, at once).
        self._bcc: dict[int, tuple[str, ...]] = state.bcc
        self._pending_bcc: list[tuple[int, tuple[str, ...]]] = []
        for offset in self._redeliver:
            if offset not in state.returned:
                # It was (or may have been) with a consumer when the queue went down without
                # returning it: a failed delivery, recorded so that another crash before it
                # is delivered again does not count it twice.
                self._failures[offset] = self._failures.get(offset, 0) + 1
                self._pend_counts(ack_log.RETURNED, offset)
        # Messages not yet delivered that carry failed deliveries from another queue (`Kept`).
        self._carried: set[int] = {o for o in self._failures if o >= self._next}
        # Messages waiting out a requeue delay (`hold`) when the queue went down, by offset:
        # when each is due (epoch ms). Neither ready nor with a consumer.
        self._held: dict[int, int] = {}
        if state.held:
            waiting = set(self._redeliver)
            self._held = {o: due for o, due in state.held.items() if o in waiting}
            self._redeliver = [o for o in self._redeliver if o not in self._held]
        self._run_start = self._run_end = -1
        self._pending: list[tuple[int, int]] = []
        self._ahead: list[Record] = []
        self._ahead_position = 0
        self._closed = False
        self._ranges_per_record = ack_log.ranges_per_record(config.ack_log)
        self._floor_written = self._durable_floor = floor
        # Ack log writes not yet known to be fsynced, oldest first, each with the ack log end
        # offset that covers it: whichever commit sees that offset durable applies them.
        self._unsynced: collections.deque[tuple[int, _Flush]] = collections.deque()
        self._bytes_since_snapshot = acks.size_bytes
        self._snapshot_bytes = 0
        # What the ack log says: no new offset may be handed out before a lead is granted.
        self._mark_written = self._mark_durable = state.mark
        self._lead_granted = False
        if stale:
            # The CLIP makes the exact mark durable before the new lead is granted.
            self._grant_lead(clip=True)
        log.delete_before(self._durable_floor)

    # -- opening and closing ---------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: str | Path,
        config: QueueConfig | None = None,
        *,
        executor: Executor | None = None,
        descriptors: DescriptorPool | None = None,
        open_log: Callable[[Path, LogConfig], PartitionLog] | None = None,
    ) -> LogQueue:
        """Open or create the queue in `directory`, recovering its state after any crash.

        Both logs open their files through `descriptors` (see `PartitionLog.open`), or by
        `open_log` (a replicated queue's: `server/replication.py`).
        """
        config = config or QueueConfig()
        # Path(a_path) parses every component again (Python 3.11): 200,000 times at start.
        path = directory if isinstance(directory, Path) else Path(directory)
        if open_log is None:

            def open_log(log_directory: Path, log_config: LogConfig) -> PartitionLog:
                return PartitionLog.open(
                    log_directory, log_config, executor=executor, descriptors=descriptors
                )

        log = open_log(path / MESSAGES_DIR, config.message_log)
        try:
            acks = open_log(path / ACKS_DIR, config.ack_log)
        except BaseException:
            log.close()
            raise
        try:
            return cls(path, config, log, acks, ack_log.replay(acks))
        except BaseException:
            log.close()
            acks.close()
            raise

    def close(self) -> None:
        """Close the files without syncing: what `commit()` has not covered may be lost."""
        if self._closed:
            return
        self._closed = True
        self._log.close()
        self._acks.close()

    async def shutdown(self) -> None:
        """Make everything durable, record the exact delivered mark, and close.

        The broker requeues (or acks) what is in flight first; a clean restart then marks as
        redelivered only what was really delivered.
        """
        self._check_open()
        await self._log.commit()
        self._flush_acks()
        if self._mark_written > self._next:
            self._append_acks(self._clip(self._next))
        await self._acks.commit()
        self.close()

    def delete(self) -> None:
        """Close the queue and remove its directory."""
        self.close()
        remove_directory(self.directory)

    def _check_open(self) -> None:
        if self._closed:
            raise QueueError(f"queue {self.directory} is closed")

    # -- counts ----------------------------------------------------------------------------

    @property
    def ready_count(self) -> int:
        """Messages waiting for delivery (queue.declare-ok and basic.get-ok message_count)."""
        return len(self._redeliver) + self._log.end_offset - self._next

    @property
    def unacked_count(self) -> int:
        return len(self._in_flight) + len(self._held)

    @property
    def message_log_bytes(self) -> int:
        return self._log.size_bytes

    @property
    def message_log_segments(self) -> int:
        return self._log.segment_count

    @property
    def batch_bytes_max(self) -> int:
        """The largest batch `append` takes."""
        return self.config.message_log.batch_bytes_max

    @property
    def end_offset(self) -> int:
        """The offset the next appended message will get."""
        return self._log.end_offset

    @property
    def durable_offset(self) -> int:
        """Every message below this offset is fsynced (on a quorum, replicated: publisher
        confirms wait for it)."""
        return self._log.committed_offset

    @property
    def floor(self) -> int:
        """Every offset below this is acknowledged."""
        return self._acked.floor

    @property
    def acked_range_count(self) -> int:
        """Acked ranges above the floor: the holes that cost memory."""
        return len(self._acked)

    @property
    def needs_commit(self) -> bool:
        """True while appends or acks wait for an fsync, or deliveries near the durable mark.

        The broker calls `commit()` whenever this is true after a tick; `take()` may return
        None with messages ready until it has (see `held_until_commit`).
        """
        return (
            self._log.committed_offset < self._log.end_offset
            or self._run_end >= 0
            or bool(self._pending)
            or bool(self._pending_counts)
            or bool(self._pending_bcc)
            or (
                self._lead_granted
                and self._next + self.config.delivered_mark_lead // 2 >= self._mark_written
            )
        )

    @property
    def held_until_commit(self) -> bool:
        """True while messages are ready but `take()` hands out none until a `commit()`: the
        next new message lies at the durable delivered mark or, with deliver_uncommitted=False,
        is not fsynced yet. One `commit()` begun now lets it through (unless other takes reach
        the new mark first)."""
        if self._redeliver:
            return False
        offset = self._next
        log = self._log
        if offset >= log.end_offset:
            return False
        # Before the first lead is granted, take() grants it itself: nothing to wait for.
        return (self._lead_granted and offset >= self._mark_durable) or (
            not (self.config.deliver_uncommitted and not log.replicated)
            and offset >= log.committed_offset
        )

    # -- publishing ------------------------------------------------------------------------

    def append(
        self,
        records: Sequence[RawRecord],
        timestamp_ms: int | None = None,
        kept: Sequence[Kept] = (),
    ) -> int:
        """Append one batch of (exchange, routing_key, properties, body); returns the first
        offset. `kept`: BCC keys (kept until the record is acknowledged, `bcc_keys`) and
        carried failed deliveries of some of the records.
        """
        self._check_open()
        first = self._log.append(records, timestamp_ms)
        for index, keys, failures in kept:
            offset = first + index
            if keys:
                self._bcc[offset] = keys
                self._pending_bcc.append((offset, keys))
            if failures:
                self._failures[offset] = failures
                self._carried.add(offset)
                self._pend_counts(ack_log.RETURNED, offset)
        return first

    def bcc_keys(self, offset: int) -> tuple[str, ...]:
        """The BCC keys the message at `offset` was published with (none: empty)."""
        return self._bcc.get(offset, ())

    def append_position(self, properties: bytes) -> int:
        """The offset the next append starts at."""
        return self._log.end_offset

    def stored_from(self, positions: Collection[int]) -> Iterator[tuple[int, RawRecord]]:
        """Every record still in the log from the lowest of the offsets `positions`, with its
        offset."""
        self._check_open()
        log = self._log
        offset = max(min(positions), log.start_offset)
        while offset < log.end_offset:
            records = log.read(
                offset, self.config.read_ahead_records_max, self.config.read_ahead_bytes_max
            )
            for record in records:
                # (exchange, routing key, properties, body), as appended.
                yield record.offset, record[3:]
            offset = records[-1].offset + 1

    # -- delivering ------------------------------------------------------------------------

    def take(self) -> Message | None:
        """The next message to deliver, now in flight (`take_many(1)`), or None."""
        taken = self.take_many(1)
        return taken[0] if taken else None

    def _take_redelivery(self) -> Message:
        offset = heapq.heappop(self._redeliver)
        self._counts[offset] = self._counts.get(offset, 1) + 1
        self._pend_counts(ack_log.TAKEN, offset)
        self._in_flight.add(offset)
        record = self._log.read(offset, 1)[0]
        assert record.offset == offset, (record.offset, offset)
        return _message(record, True, self._counts[offset], self._failures.get(offset, 0))

    def _pend_counts(self, kind: int, offset: int, due_ms: int = 0) -> None:
        self._pending_counts.append(
            (kind, offset, self._counts.get(offset, 1), self._failures.get(offset, 0), due_ms)
        )

    def take_many(self, count_max: int) -> list[Message]:
        """Up to `count_max` messages to deliver, now in flight: redeliveries first, then new
        ones, a read-ahead slice at a time. Fewer (or none) when no more are ready, or when
        the next new message lies beyond what may be delivered until the next `commit()`
        (see `needs_commit`)."""
        if self._closed:
            raise QueueError(f"queue {self.directory} is closed")
        taken: list[Message] = []
        while self._redeliver and len(taken) < count_max:
            taken.append(self._take_redelivery())
        if len(taken) == count_max:
            return taken
        log = self._log
        # A replicated queue delivers only what a quorum holds: a new leader may not have more.
        if self.config.deliver_uncommitted and not log.replicated:
            end = log.end_offset
        else:
            end = log.committed_offset
        offset = self._next
        if offset < end and not self._lead_granted:
            self._grant_lead(clip=False)
        limit = min(end, self._mark_durable, offset + count_max - len(taken))
        if offset >= limit:
            return taken
        new = tuple.__new__
        append = taken.append
        while offset < limit:
            ahead = self._ahead
            position = self._ahead_position
            if position >= len(ahead):
                ahead = self._ahead = log.read(
                    offset, self.config.read_ahead_records_max, self.config.read_ahead_bytes_max
                )
                position = 0
            chunk = ahead[position : position + limit - offset]
            assert chunk[0].offset == offset, (chunk[0].offset, offset)
            for record in chunk:
                append(
                    new(
                        Message,
                        (
                            record.offset,
                            record.timestamp_ms,
                            record.exchange,
                            record.routing_key,
                            record.properties,
                            record.body,
                            False,
                            1,
                            0,
                        ),
                    )
                )
            self._ahead_position = position + len(chunk)
            offset += len(chunk)
        if self._carried:
            self._count_carried(taken, self._next, offset)
        self._in_flight.update(range(self._next, offset))
        self._next = offset
        return taken

    def _count_carried(self, taken: list[Message], start: int, end: int) -> None:
        """Give the new messages in [start, end), the last ones of `taken`, the failed
        deliveries they carry."""
        first = len(taken) - (end - start)
        for offset in [o for o in self._carried if start <= o < end]:
            self._carried.discard(offset)
            index = first + offset - start
            taken[index] = taken[index]._replace(failed_count=self._failures[offset])

    # -- settling --------------------------------------------------------------------------

    def ack(self, offset: int) -> bool:
        """Acknowledge an in-flight message; False (and no effect) when it is not in flight."""
        return self.ack_many((offset,)) == 1

    def ack_many(self, offsets: Iterable[int]) -> int:
        """Acknowledge each in-flight offset; returns how many were. Consecutive offsets (a
        multiple ack's usual shape) are marked acked a run at a time."""
        in_flight = self._in_flight
        counts = self._counts
        bcc = self._bcc
        failures = self._failures
        acked = 0
        run_start = run_end = -1
        for offset in offsets:
            try:
                in_flight.remove(offset)
            except KeyError:
                continue
            if counts:
                counts.pop(offset, None)
            if bcc:
                bcc.pop(offset, None)
            if failures:
                failures.pop(offset, None)
            acked += 1
            if offset == run_end:
                run_end += 1
            else:
                if run_end >= 0:
                    self._acked_run(run_start, run_end)
                run_start = offset
                run_end = offset + 1
        if run_end >= 0:
            self._acked_run(run_start, run_end)
        return acked

    def _acked_run(self, start: int, end: int) -> None:
        """Mark [start, end), all just taken out of flight, acked; a run continuing the
        pending one extends it, anything else starts a new one."""
        self._acked.add_range(start, end)
        if start == self._run_end:
            self._run_end = end
        else:
            if self._run_end >= 0:
                self._pend(self._run_start, self._run_end)
            self._run_start = start
            self._run_end = end

    def requeue(self, offsets: Iterable[int], failed: bool = False) -> int:
        """Return in-flight messages to the queue, ahead of new ones, counting a failed
        delivery for each if `failed`; returns how many were in flight."""
        returned = 0
        failures = self._failures
        for offset in offsets:
            if offset in self._in_flight:
                self._in_flight.remove(offset)
                heapq.heappush(self._redeliver, offset)
                if failed:
                    failures[offset] = failures.get(offset, 0) + 1
                self._pend_counts(ack_log.RETURNED, offset)
                returned += 1
        return returned

    def hold(self, offsets: Iterable[int], due_ms: int, failed: bool = False) -> int:
        """Take in-flight messages back to wait until `due_ms` (epoch ms) before `release`
        makes them ready, durably (a HELD count record), counting a failed delivery for each
        if `failed`; returns how many were in flight."""
        held = 0
        failures = self._failures
        for offset in offsets:
            if offset in self._in_flight:
                self._in_flight.remove(offset)
                self._held[offset] = due_ms
                if failed:
                    failures[offset] = failures.get(offset, 0) + 1
                self._pend_counts(ack_log.HELD, offset, due_ms)
                held += 1
        return held

    def release(self, offsets: Iterable[int]) -> int:
        """Make held messages ready, ahead of new ones; returns how many were held."""
        released = 0
        for offset in offsets:
            if self._held.pop(offset, None) is not None:
                heapq.heappush(self._redeliver, offset)
                released += 1
        return released

    def held(self) -> list[tuple[int, int]]:
        """(offset, due epoch ms) of every held message."""
        return list(self._held.items())

    def settle_redeliveries(self, offsets: Iterable[int]) -> int:
        """Acknowledge messages waiting to be delivered again (after a restart, the ones
        that may have been delivered before) without delivering them; returns how many."""
        wanted = set(offsets)
        waiting = self._redeliver
        kept = [offset for offset in waiting if offset not in wanted]
        if len(kept) == len(waiting):
            return 0
        for offset in wanted.intersection(waiting):
            self._forget_counts(offset)
            self._bcc.pop(offset, None)
            self._acked.add(offset)
            self._pend(offset, offset + 1)
        settled = len(waiting) - len(kept)
        heapq.heapify(kept)
        self._redeliver = kept
        return settled

    def browse(self, start: int, count_max: int) -> list[tuple[Message, bool]]:
        """Up to `count_max` messages not yet acknowledged, at or after offset `start`, in
        offset order, each with whether it is in flight; nothing is delivered or counted."""
        self._check_open()
        log = self._log
        start = max(start, log.start_offset)
        wanted = []
        for offset in self._acked.gaps(log.end_offset):
            if offset >= start:
                wanted.append(offset)
                if len(wanted) >= count_max:
                    break
        browsed: list[tuple[Message, bool]] = []
        position = 0
        while position < len(wanted):
            first = wanted[position]
            records = log.read(first, wanted[-1] - first + 1, self.config.read_ahead_bytes_max)
            for record in records:
                if position < len(wanted) and record.offset == wanted[position]:
                    offset = record.offset
                    delivered = offset < self._next
                    count = self._counts.get(offset, 1) if delivered else 0
                    failures = self._failures.get(offset, 0)
                    browsed.append(
                        (
                            _message(record, delivered, count, failures),
                            offset in self._in_flight or offset in self._held,
                        )
                    )
                    position += 1
        return browsed

    def deliveries(self, offset: int) -> int:
        """How many times the in-flight message at `offset` has been delivered."""
        return self._counts.get(offset, 1)

    def failures(self, offset: int) -> int:
        """How many deliveries of the message at `offset` failed (before the current one)."""
        return self._failures.get(offset, 0)

    def in_flight(self, offsets: Iterable[int]) -> list[Message]:
        """The messages at those offsets that are in flight, read back; they stay in flight."""
        messages = []
        for offset in offsets:
            if offset in self._in_flight:
                record = self._log.read(offset, 1)[0]
                messages.append(
                    _message(
                        record, True, self._counts.get(offset, 1), self._failures.get(offset, 0)
                    )
                )
        return messages

    def purge(self) -> int:
        """Acknowledge every ready message; returns how many. In-flight ones stay, as in
        RabbitMQ.
        """
        self._check_open()
        redeliver = self._redeliver
        purged = len(redeliver)
        for offset in sorted(redeliver):
            self._forget_counts(offset)
            self._bcc.pop(offset, None)
            self._acked.add(offset)
            self._pend(offset, offset + 1)
        redeliver.clear()
        end = self._log.end_offset
        if end > self._next:
            purged += end - self._next
            if self._bcc:
                self._forget_bcc(self._next, end)
            if self._carried:
                self._forget_carried(self._next, end)
            self._acked.add_range(self._next, end)
            self._pend(self._next, end)
            self._next = end
            self._ahead = []
            self._ahead_position = 0
        return purged

    def peek(self) -> Message | None:
        """The message `take()` would return next, left ready; None when none is ready.

        Unlike `take()` it ignores the delivered mark and the fsync: nothing is delivered.
        Message TTL looks at the head with it and drops what expired with `drop_head()`.
        """
        self._check_open()
        if self._redeliver:
            offset = self._redeliver[0]
            record = self._log.read(offset, 1)[0]
            return _message(
                record, True, self._counts.get(offset, 1) + 1, self._failures.get(offset, 0)
            )
        offset = self._next
        if offset >= self._log.end_offset:
            return None
        if self._ahead_position >= len(self._ahead):
            self._ahead = self._log.read(
                offset, self.config.read_ahead_records_max, self.config.read_ahead_bytes_max
            )
            self._ahead_position = 0
        record = self._ahead[self._ahead_position]
        assert record.offset == offset, (record.offset, offset)
        return _message(record, False, 1, self._failures.get(offset, 0))

    def drop_head(self, count_max: int) -> int:
        """Acknowledge up to `count_max` ready messages from the head without delivering them
        (x-max-length drop-head, expired messages); returns how many went."""
        self._check_open()
        dropped = 0
        redeliver = self._redeliver
        while redeliver and dropped < count_max:
            offset = heapq.heappop(redeliver)
            self._forget_counts(offset)
            self._bcc.pop(offset, None)
            self._acked.add(offset)
            self._pend(offset, offset + 1)
            dropped += 1
        start = self._next
        end = min(self._log.end_offset, start + count_max - dropped)
        if end > start:
            if self._bcc:
                self._forget_bcc(start, end)
            if self._carried:
                self._forget_carried(start, end)
            self._acked.add_range(start, end)
            self._pend(start, end)
            self._next = end
            # The read-ahead slice, if it holds the dropped records, skips them.
            self._ahead_position += end - start
            dropped += end - start
        return dropped

    def _forget_bcc(self, start: int, end: int) -> None:
        """Forget the BCC keys of the messages in [start, end), acknowledged together."""
        bcc = self._bcc
        if end - start <= len(bcc):
            for offset in range(start, end):
                bcc.pop(offset, None)
        else:
            for offset in [offset for offset in bcc if start <= offset < end]:
                del bcc[offset]

    def _forget_carried(self, start: int, end: int) -> None:
        """Forget the carried failures of the new messages in [start, end), acknowledged
        together without being delivered."""
        for offset in [o for o in self._carried if start <= o < end]:
            self._carried.discard(offset)
            self._failures.pop(offset, None)

    def _forget_counts(self, offset: int) -> None:
        self._counts.pop(offset, None)
        self._failures.pop(offset, None)

    def _pend(self, start: int, end: int) -> None:
        pending = self._pending
        pending.append((start, end))
        if len(pending) > PENDING_RANGES_MAX:
            self._pending = coalesce(pending)

    # -- durability ------------------------------------------------------------------------

    async def commit(self) -> int:
        """Make every append and ack made so far durable; returns the durable message offset.

        The message log and the ack log are fsynced in parallel, each by group commit, so
        concurrent callers share fsyncs.
        """
        self._check_open()
        self._flush_acks()
        if self._acks.durable_offset >= self._acks.end_offset:
            durable = await self._log.commit()
        else:
            durable, _ = await asyncio.gather(self._log.commit(), self._acks.commit())
        # Also the writes of a concurrent commit whose fsync this one shared or found done:
        # once any commit returns, the marks written before it began allow delivery.
        if not self._closed:
            self._apply_synced_flushes()
        return durable

    def _flush_acks(self) -> None:
        """Append an ack log record for what changed since the last one, if anything did."""
        if self._run_end >= 0:
            self._pending.append((self._run_start, self._run_end))
            self._run_start = self._run_end = -1
        floor = self._acked.floor
        pending = coalesce(self._pending)
        writable = [(max(start, floor), end) for start, end in pending if end > floor]
        self._pending = []
        mark = self._mark_written
        if self._lead_granted and self._next + self.config.delivered_mark_lead // 2 >= mark:
            mark = self._next + self.config.delivered_mark_lead
        snapshot = self._bytes_since_snapshot >= max(
            self.config.ack_log_compact_bytes, 4 * self._snapshot_bytes
        )
        counts, self._pending_counts = self._pending_counts, []
        pending_bcc, self._pending_bcc = self._pending_bcc, []
        bcc = pending_bcc
        if snapshot:
            records = ack_log.encode_delta(floor, mark, list(self._acked), self._ranges_per_record)
            counts = self._all_counts()
            bcc = list(self._bcc.items())
        elif writable or mark != self._mark_written or floor != self._floor_written:
            records = ack_log.encode_delta(floor, mark, writable, self._ranges_per_record)
        elif counts or bcc:
            records = []
        else:
            return
        for kind, run in itertools.groupby(counts, key=operator.itemgetter(0)):
            entries = [entry[1:] if kind == ack_log.HELD else entry[1:4] for entry in run]
            records += ack_log.encode_counts(kind, entries, self._ranges_per_record)
        if bcc:
            records += ack_log.encode_bcc(bcc, self._ranges_per_record * ack_log.RANGE_BYTES)
        size = sum(len(record[3]) for record in records)
        try:
            first = self._append_acks(records)
        except Exception:
            # Not written (a full disk): the acks stay pending for the next commit.
            self._pending = pending
            self._pending_counts = counts + self._pending_counts
            self._pending_bcc = pending_bcc + self._pending_bcc
            raise
        self._mark_written = mark
        self._floor_written = floor
        if snapshot:
            self._bytes_since_snapshot = 0
            self._snapshot_bytes = size
        else:
            self._bytes_since_snapshot += size
        self._unsynced.append(
            (self._acks.end_offset, _Flush(mark, floor, first if snapshot else None))
        )

    def _all_counts(self) -> list[tuple[int, int, int, int, int]]:
        """Count records for a snapshot: every message waiting to be delivered again
        (RETURNED, whatever its counts), every held one (HELD), every new one carrying
        failures (RETURNED), and every one in flight with counts to keep."""
        counts, failures = self._counts, self._failures
        pend = [
            (ack_log.RETURNED, offset, counts.get(offset, 1), failures.get(offset, 0), 0)
            for offset in sorted(self._redeliver)
        ]
        pend += [
            (ack_log.HELD, offset, counts.get(offset, 1), failures.get(offset, 0), due_ms)
            for offset, due_ms in sorted(self._held.items())
        ]
        pend += [
            (ack_log.RETURNED, offset, 1, failures[offset], 0) for offset in sorted(self._carried)
        ]
        for offset in sorted(counts.keys() | failures.keys()):
            if offset in self._in_flight:
                pend.append(
                    (ack_log.TAKEN, offset, counts.get(offset, 1), failures.get(offset, 0), 0)
                )
        return pend

    def _grant_lead(self, clip: bool) -> None:
        """Write a delivered mark `delivered_mark_lead` ahead of `next` and fsync it, here.

        With `clip`, a CLIP at `next` goes first, forgetting what a crash left above it.
        Later leads are extended by `commit()`, which shares its fsync with other work.
        """
        mark = self._next + self.config.delivered_mark_lead
        records = ack_log.encode_delta(self._floor_written, mark, [])
        if clip:
            records = self._clip(self._next) + records
        self._append_acks(records)
        self._acks.sync()
        self._bytes_since_snapshot += sum(len(record[3]) for record in records)
        self._mark_written = self._mark_durable = mark
        self._lead_granted = True

    def _clip(self, limit: int) -> list[RawRecord]:
        """A CLIP at `limit`, then what the queue keeps about its stored messages at or above
        it (BCC keys, carried failures: `Kept`), which the CLIP forgets with the delivery
        state it is there to forget."""
        records = [ack_log.encode_clip(limit)]
        bcc = sorted((offset, keys) for offset, keys in self._bcc.items() if offset >= limit)
        if bcc:
            records += ack_log.encode_bcc(bcc, self._ranges_per_record * ack_log.RANGE_BYTES)
        carried = [(o, 1, self._failures[o]) for o in sorted(self._carried) if o >= limit]
        if carried:
            records += ack_log.encode_counts(ack_log.RETURNED, carried, self._ranges_per_record)
        return records

    def _append_acks(self, records: list[RawRecord]) -> int:
        # Many ranges span several records; one batch each keeps every batch inside the ack
        # log's segment size.
        if len(records) == 1:
            return self._acks.append(records)
        first = self._acks.end_offset
        for record in records:
            self._acks.append([record])
        return first

    def _apply_synced_flushes(self) -> None:
        """For each ack log write now fsynced: deliver up to its mark, delete what it covers."""
        unsynced = self._unsynced
        durable = self._acks.committed_offset
        while unsynced and unsynced[0][0] <= durable:
            flushed = unsynced.popleft()[1]
            self._mark_durable = max(self._mark_durable, flushed.mark)
            if flushed.floor > self._durable_floor:
                self._durable_floor = flushed.floor
                self._log.delete_before(flushed.floor)
            if flushed.snapshot_offset is not None:
                self._acks.delete_before(flushed.snapshot_offset)

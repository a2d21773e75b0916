"""A stream as the broker hosts it: a retained partition log, its publishes and its cursors.

The core's one `publish` stages a routed record here as it does on a work queue (`stage`),
and the tick writes each tick's records as one batch (`flush`): a batch is a chunk, what
`x-stream-offset: last` starts from. A stream is always durable: every write is fsynced
before it is confirmed and before any cursor reads it. Retention (`x-max-age`,
`x-max-length-bytes`) deletes whole segments, never the active one: when a segment rolls, and
on a timer while there is an age limit.

Nothing is removed by consuming: each consumer reads through its own `Cursor`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Iterator, Mapping
from pathlib import Path
from typing import Any

from warrenmq.exchanges.errors import NotFound
from warrenmq.log import LogConfig, PartitionLog, RawRecord, Record
from warrenmq.log.batch import staged_batch_bounds
from warrenmq.server.queue.consumer import ROTATING, Consumer, ConsumerChannel
from warrenmq.server.queue.engine import Message
from warrenmq.server.queue.log_queue import remove_directory
from warrenmq.server.queue.message_counts import MessageCounts
from warrenmq.server.queue.work_queue import QueueDeposed

from . import arguments as stream_arguments
from . import offset_spec
from .cursor import DISPATCH_DELIVERIES_MAX, Cursor
from .filter import StreamFilter, consume_filter
from .producers import ProducerSequences, producer_of
from .tracked_offsets import LOG_CONFIG as OFFSETS_LOG_CONFIG
from .tracked_offsets import OFFSETS_DIR, TrackedOffsets, is_tracked

log = logging.getLogger("warrenmq.server")

# An age limit is checked at least this often (and on every segment roll).
RETENTION_CHECK_MS_MAX = 60_000
# Readers waiting for records to be appended (`readable`), per stream.
READERS_MAX = 10_000


class StreamLog:
    """A stream's storage as the broker and the HTTP API see a queue's engine."""

    def __init__(self, directory: Path, partition: PartitionLog, offsets: PartitionLog) -> None:
        self.directory = directory
        self.log = partition
        self.offsets_log = offsets
        """The tracked offsets' log (`TrackedOffsets`)."""

    @classmethod
    def open(
        cls,
        directory: Path,
        base: LogConfig,
        arguments: Mapping[str, Any],
        open_log: Callable[[Path, LogConfig], PartitionLog] | None = None,
        **kwargs: Any,
    ):
        """`open_log` opens the log instead of `PartitionLog.open` (a replicated stream's:
        `server/replication.py`)."""
        config = stream_arguments.log_config(base, arguments)
        if open_log is None:

            def open_log(log_directory: Path, log_config: LogConfig) -> PartitionLog:
                return PartitionLog.open(log_directory, log_config, **kwargs)

        partition = open_log(directory, config)
        try:
            offsets = open_log(directory / OFFSETS_DIR, OFFSETS_LOG_CONFIG)
        except BaseException:
            partition.close()
            raise
        return cls(directory, partition, offsets)

    @property
    def ready_count(self) -> int:
        """The messages retained."""
        return self.log.end_offset - self.log.start_offset

    unacked_count = 0
    held_until_commit = False

    @property
    def message_log_bytes(self) -> int:
        return self.log.size_bytes

    @property
    def message_log_segments(self) -> int:
        return self.log.segment_count

    @property
    def batch_bytes_max(self) -> int:
        return self.log.config.batch_bytes_max

    @property
    def needs_commit(self) -> bool:
        return self.log.durable_offset < self.log.end_offset

    async def commit(self) -> None:
        await self.log.commit()

    def append_position(self, properties: bytes) -> int:
        """Where the next record goes (dead-lettering into a stream journals it)."""
        return self.log.end_offset

    def stored_from(self, positions: Collection[int]) -> Iterator[tuple[int, RawRecord]]:
        """(offset, record) of every record from the lowest of `positions` still retained."""
        for record in self.log.records_from(min(positions)):
            yield record.offset, record[3:]

    def browse(self, start: int, count_max: int) -> list[tuple[Message, bool]]:
        """Up to `count_max` retained messages from offset `start` on (none is in flight:
        a stream hands out copies)."""
        messages: list[tuple[Message, bool]] = []
        if count_max <= 0:
            return messages
        for record in self.log.records_from(start, count_max):
            messages.append(
                (Message(record.offset, record.timestamp_ms, *record[3:], False, 0, 0), False)
            )
            if len(messages) >= count_max:
                break
        return messages

    async def shutdown(self) -> None:
        await asyncio.gather(self.log.commit(), self.offsets_log.commit())
        self.close()

    def close(self) -> None:
        self.log.close()
        self.offsets_log.close()

    def delete(self) -> None:
        self.close()
        remove_directory(self.directory)


class Stream:
    """One stream of a vhost: its log, per-tick publish buffer and consumers' cursors."""

    queue_type = "stream"
    durable = True
    auto_delete = False
    exclusive_owner = None
    held_until_commit = False
    single_active = False
    # A stream dead-letters nothing (the DLQ tools ask every queue).
    dead_letter_exchange = None
    dead_letter_routing_key = None
    # No visibility timeout gives a stream's deliveries back, so no ack comes stale (the
    # metrics ask every queue).
    stale_settles = 0

    def __init__(
        self,
        vhost: str,
        name: str,
        engine: StreamLog,
        *,
        arguments: Mapping[str, Any],
        effective_arguments: Mapping[str, Any],
        batch_records_max: int,
    ) -> None:
        assert batch_records_max > 0
        self.vhost = vhost
        self.name = name
        self.engine = engine
        self.log = engine.log
        self.arguments = dict(arguments)
        self._base_config = self.log.config
        self._batch_records_max = batch_records_max
        self.deleted = False
        self.deposed = False
        """Led elsewhere now (a replicated stream's failover): its commits fail."""
        self.committing = False
        self.dead_letters: list = []
        """Never any: a stream dead-letters nothing (the tick asks every queue)."""
        self.consumers: dict[tuple[int, str], Consumer] = {}
        self.tracked = TrackedOffsets(engine.offsets_log, engine.directory)
        self.producers = ProducerSequences(engine.directory, self.log)
        self.counts = MessageCounts()
        self._staged: list[RawRecord] = []
        self._staged_publishers: list[Any] = []
        self._staged_bytes = 0
        self.written_publishers: list[Any] = []
        self.failed_publishers: list[Any] = []
        self.commit_wanted = False
        self._last_chunk: int | None = None
        """The first offset of the newest batch, once known (found in the log after a start)."""
        self._readers: list[tuple[int, asyncio.Future[None]]] = []
        """(offset, future) of the readers waiting for a record at or after offset."""
        self.apply_arguments(effective_arguments)

    def apply_arguments(self, effective: Mapping[str, Any]) -> None:
        """Take the retention and segment size of the effective arguments (declared, or a
        policy's): new segments take the new size, the next retention pass the new limits."""
        self.effective_arguments = effective
        config = stream_arguments.log_config(self._base_config, effective)
        self.log.config = config
        self.retention_ms = config.retention_ms

    def lag(self, offset: int | None) -> int:
        """Messages from `offset` (a tracked or committed offset; None: the first retained)
        to the end. Messages retention already deleted are not counted: nobody can consume
        them any more."""
        log = self.log
        start = log.start_offset if offset is None else max(offset, log.start_offset)
        return max(0, log.end_offset - start)

    # -- publishing -----------------------------------------------------------------------

    def stage(
        self, record: RawRecord, persistent: bool, expiring: bool = False, publisher: Any = None
    ) -> bool:
        """Buffer a record for this tick's batch; a stream refuses nothing. A duplicate of an
        idempotent producer's message (`producers`) is dropped here, and confirmed all the
        same once the stream's commit covers its original."""
        found = producer_of(record[2])
        if found is not None and not self.producers.accept(len(self._staged), *found):
            if publisher is not None:
                # Confirmed once what holds the original is committed: its own publish may
                # have been nacked (no quorum), and a failover may yet take it back.
                self.written_publishers.append(publisher)
                self.commit_wanted = True
            return True
        self._staged.append(record)
        self._staged_publishers.append(publisher)
        self._staged_bytes += len(record[2]) + len(record[3])
        return True

    @property
    def staged_end(self) -> int:
        """The offset the next staged record will be written at: `flush` writes the staged
        records in order, from the log's end (a duplicate `stage` drops is not staged)."""
        return self.log.end_offset + len(self._staged)

    def stage_kept(
        self,
        record: RawRecord,
        persistent: bool,
        expiring: bool = False,
        publisher: Any = None,
        *,
        bcc: tuple[str, ...] = (),
        failures: int = 0,
    ) -> bool:
        """`stage`: a queue keeps a message's BCC keys and carried failed deliveries for its
        dead letter and delivery limit; a stream has neither, so it has no use for them."""
        return self.stage(record, persistent, expiring, publisher)

    def flush(self, now_ms: int) -> None:
        """Write what was staged, one batch per tick within the log's bounds; a failed write
        refuses its publishes and every later one of the tick."""
        staged = self._staged
        if not staged:
            return
        publishers = self._staged_publishers
        self._staged = []
        self._staged_publishers = []
        staged_bytes, self._staged_bytes = self._staged_bytes, 0
        segments = self.log.segment_count
        written = 0
        failed_from = None
        bounds = staged_batch_bounds(
            staged, staged_bytes, self._batch_records_max, self.log.config.batch_bytes_max
        )
        for start, end in bounds:
            try:
                self._last_chunk = self.log.append(staged[start:end], now_ms)
            except Exception as error:
                failed_from = start
                self.failed_publishers += publishers[start:]
                log.error(
                    "stream '%s' in vhost '%s': storing %d message(s) failed, their "
                    "publishes are refused: %r",
                    self.name,
                    self.vhost,
                    len(staged) - start,
                    error,
                )
                break
            written = end
        self.producers.written(failed_from)
        self.counts.published += written
        if written:
            self.written_publishers += publishers[:written]
            self.commit_wanted = True
        if self.log.segment_count > segments:
            self.enforce_length(now_ms)

    def drop_staged(self) -> list[Any]:
        """Forget what is staged and not yet written; returns its publishers (None
        included), which must be refused: the stream stops being served here."""
        publishers = self._staged_publishers
        self.producers.written(0)
        self._staged, self._staged_publishers, self._staged_bytes = [], [], 0
        return publishers

    def take_written(self) -> tuple[list[Any], list[Any], bool]:
        written, self.written_publishers = self.written_publishers, []
        failed, self.failed_publishers = self.failed_publishers, []
        wanted, self.commit_wanted = self.commit_wanted, False
        return written, failed, wanted

    async def commit(self) -> None:
        if self.deposed:
            raise QueueDeposed(f"stream '{self.name}' in vhost '{self.vhost}' is led elsewhere")
        if self.deleted:
            return
        self.committing = True
        try:
            await self.engine.commit()
            log = self.log
            # A snapshot of the producers' sequences holds only what is committed (fsynced;
            # on the quorum, when replicated: a failover never takes it back): taken when
            # nothing newer is written or staged.
            if (
                not self._staged
                and log.end_offset == log.committed_offset
                and self.producers.snapshot_due(log.committed_offset)
            ):
                await self.producers.snapshot(log.committed_offset)
        except Exception:
            if not self.deleted or self.deposed:
                raise
        finally:
            self.committing = False

    @property
    def needs_commit(self) -> bool:
        return not self.deleted and self.engine.needs_commit

    # -- retention --------------------------------------------------------------------------

    def enforce_length(self, now_ms: int | None = None) -> int:
        """Apply retention now; returns how many segments went."""
        if self.deleted or (self.retention_ms is None and self.log.config.retention_bytes is None):
            return 0
        if now_ms is None:
            now_ms = self.log.last_timestamp_ms
        return self.log.apply_retention(now_ms)

    @property
    def has_timers(self) -> bool:
        return not self.deleted and self.retention_ms is not None

    def run_timers(self, now_ms: int) -> int | None:
        """Age retention; returns when to look again."""
        if not self.has_timers:
            return None
        assert self.retention_ms is not None
        self.enforce_length(now_ms)
        return now_ms + min(self.retention_ms, RETENTION_CHECK_MS_MAX)

    def touch(self, now_ms: int) -> None:
        """A stream has no x-expires."""

    def unused_expired(self, now_ms: int) -> bool:
        return False

    # -- consumers --------------------------------------------------------------------------

    @property
    def ready_count(self) -> int:
        return self.engine.ready_count

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    def exclusive_consumer(self) -> Consumer | None:
        """None: a stream takes exclusive consumers side by side, as RabbitMQ's do."""
        return None

    def last_chunk(self) -> int:
        """The first offset of the newest batch (the end when the stream is empty)."""
        end = self.log.end_offset
        if end == self.log.start_offset:
            return end
        if self._last_chunk is None:
            self._last_chunk = self.log.batch_start(end - 1)
        return self._last_chunk

    def start_offset(self, spec: offset_spec.OffsetSpec) -> int:
        log = self.log
        retained = offset_spec.Retained(log.start_offset, log.end_offset, self.last_chunk())
        return offset_spec.resolve(spec, retained, log.offset_for_timestamp)

    def add_consumer(
        self,
        tag: str,
        channel: ConsumerChannel,
        spec: offset_spec.OffsetSpec,
        arguments: Mapping[str, Any],
        *,
        exclusive: bool,
        prefetch_count: int,
    ) -> Consumer:
        """A consumer from `spec`; a tracked one without x-stream-offset resumes where its
        tag's acks left off."""
        stream_filter = consume_filter(f"queue '{self.name}' in vhost '{self.vhost}'", arguments)
        tracked_tag = tag if is_tracked(tag, arguments) else None
        resume = None if tracked_tag is None else self.tracked.get(tracked_tag)
        if resume is not None and stream_arguments.OFFSET_ARGUMENT not in arguments:
            start = max(resume, self.log.start_offset)
        else:
            start = self.start_offset(spec)
        return self.attach(
            tag,
            channel,
            start,
            tracked_tag=tracked_tag,
            stream_filter=stream_filter,
            exclusive=exclusive,
            prefetch_count=prefetch_count,
        )

    def attach(
        self,
        tag: str,
        channel: ConsumerChannel,
        start: int,
        *,
        tracked_tag: str | None,
        stream_filter: StreamFilter | None,
        exclusive: bool,
        prefetch_count: int,
    ) -> Consumer:
        """A consumer reading from offset `start` (a group member's partition, or
        `add_consumer`'s)."""
        cursor = Cursor(self, start, tracked_tag, stream_filter)
        consumer = Consumer(tag, channel, cursor, False, exclusive, 0, prefetch_count)
        cursor.consumer = consumer
        key = (id(channel), tag)
        assert key not in self.consumers
        self.consumers[key] = consumer
        return consumer

    def remove_consumer(self, consumer: Consumer) -> bool:
        """Forget a consumer; a stream is never auto-deleted."""
        if self.consumers.pop((id(consumer.channel), consumer.tag), None) is not None:
            consumer.channel.forget_blocked(consumer)
            assert isinstance(consumer.queue, Cursor)
            consumer.queue.consumer = None
        return False

    def dispatch(self, now_ms: int) -> bool:
        """Hand what was fsynced to every cursor behind it with credit, and wake the readers
        it reached; True if stopped by the bound (the tick calls again)."""
        if self._readers:
            self._wake_readers()
        if self.deleted:
            return False
        budget = DISPATCH_DELIVERIES_MAX
        end = self.log.committed_offset
        for consumer in list(self.consumers.values()):
            cursor = consumer.queue
            assert isinstance(cursor, Cursor)
            if consumer.state is ROTATING and cursor.next_offset < end:
                before = cursor.next_offset
                if cursor.dispatch(now_ms, budget):
                    return True
                budget -= max(0, cursor.next_offset - before)
                if budget <= 0:
                    return True
        return False

    # -- readers (the HTTP topic API) ---------------------------------------------------------

    def read(self, offset: int, count_max: int, bytes_max: int) -> list[Record]:
        """Fsynced records from `offset` (the first retained, when retention passed it): at
        most `count_max`, about `bytes_max` of them, at least one when there is one. A cursor
        reads so: nobody sees a record a crash could take back."""
        log = self.log
        start = max(offset, log.start_offset)
        end = log.committed_offset
        if start >= end or count_max <= 0:
            return []
        return log.read(start, min(count_max, end - start), bytes_max)

    def readable(self, offset: int) -> asyncio.Future[None] | None:
        """A future resolved once a record at or after `offset` is fsynced (or the stream is
        deleted); cancelling it is giving up. None when `READERS_MAX` readers wait already."""
        readers = self._readers
        if len(readers) >= READERS_MAX:
            readers[:] = [reader for reader in readers if not reader[1].done()]
            if len(readers) >= READERS_MAX:
                return None
        future = asyncio.get_running_loop().create_future()
        if self.deleted or self.log.committed_offset > max(offset, self.log.start_offset):
            future.set_result(None)
        else:
            readers.append((offset, future))
        return future

    async def read_waiting(
        self, offset: int | None, count_max: int, bytes_max: int, timeout_ms: int
    ) -> tuple[list[Record], int] | None:
        """The topic API's read: `read` from `offset` (None: the first retained), waiting up
        to `timeout_ms` for the tick to wake it once a record is fsynced when there is none
        yet; with the offset to read next. None when `READERS_MAX` readers wait already;
        NotFound once the stream is deleted."""
        if offset is None:
            offset = self.log.start_offset
        records = self.read(offset, count_max, bytes_max)
        if not records and timeout_ms:
            readable = self.readable(offset)
            if readable is None:
                return None
            try:
                await asyncio.wait_for(readable, timeout_ms / 1000)
            except TimeoutError:
                pass
            if self.deleted:
                raise NotFound(f"no queue '{self.name}' in vhost '{self.vhost}'")
            records = self.read(offset, count_max, bytes_max)
        next_offset = records[-1].offset + 1 if records else max(offset, self.log.start_offset)
        return records, next_offset

    def _wake_readers(self) -> None:
        end = self.log.committed_offset
        deleted = self.deleted
        waiting = []
        for offset, future in self._readers:
            if future.done():
                continue
            if deleted or end > offset:
                future.set_result(None)
            else:
                waiting.append((offset, future))
        self._readers = waiting

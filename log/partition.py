"""A partition log: an ordered run of segments with dense offsets, a tail cache and group commit."""

from __future__ import annotations

import asyncio
import os
import struct
import time
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from itertools import chain, repeat
from pathlib import Path

from crc32c import crc32c

from . import batch as batch_codec
from .batch import HEADER_BYTES, RECORD_HEADER_BYTES, RawRecord, Record
from .config import LogConfig
from .descriptors import DescriptorPool, default_pool
from .errors import CorruptBatchError, LogError, OffsetOutOfRangeError
from .latency import LatencyHistogram
from .segment import RETIRED_SUFFIX, Segment

# fsync releases the GIL, so a few threads let several logs flush to disk at once.
_FSYNC_EXECUTOR = ThreadPoolExecutor(max_workers=4, thread_name_prefix="warren-fsync")
FSYNC_LATENCY = LatencyHistogram()
"""How long each group commit's fsync took, every log of the process (for the metrics)."""


CACHED_RECORD_OVERHEAD_BYTES = 144
"""What the tail cache holds per record beyond its encoded bytes, and charges to its bound:
three bytes objects' headers and four list slots (a small message's Python objects cost more
memory than its bytes on disk)."""


class _FilesNotOpened(OSError):
    """The fsync could not open its files (EMFILE, say): nothing was fsynced, and nothing is
    known lost either, so the log stays usable and the next sync tries those files again."""


def _fsync_files(paths: list[str]) -> float:
    """fsync each file through a descriptor opened here, when the fsync runs; returns the
    seconds it took.

    Not the pool's descriptors: the pool may close one (and reuse its number) at any moment,
    and it is not thread-safe. Nor duplicates taken when the commit began: thousands of
    queues committing in one tick would hold thousands of them while they wait for a worker.
    A file deleted meanwhile (a segment retired or truncated away) is skipped: the log no
    longer holds its records, and a truncation keeps this fsync from vouching for anything.
    """
    fds: list[int] = []
    try:
        for path in paths:
            try:
                fds.append(os.open(path, os.O_RDONLY))
            except FileNotFoundError:
                continue
    except OSError as error:
        for fd in fds:
            os.close(fd)
        raise _FilesNotOpened(error.errno, error.strerror, error.filename) from error
    started_s = time.monotonic()
    _fsync_and_close(fds)
    return time.monotonic() - started_s


def _fsync_and_close(fds: list[int]) -> None:
    try:
        for fd in fds:
            os.fsync(fd)
    finally:
        for fd in fds:
            os.close(fd)


# Stored batches handed out whole (`read_batches`) are read here: pread releases the GIL.
_READ_EXECUTOR = ThreadPoolExecutor(max_workers=4, thread_name_prefix="warren-read")

# Deleted segments are unlinked here, off the event loop, one at a time: nobody waits for it.
_UNLINK_EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="warren-unlink")


def _unlink_all(paths: list[Path]) -> None:
    for path in paths:
        path.unlink(missing_ok=True)


def _split_suffix(name: str) -> tuple[str, str, str]:
    """("00000000000000000042", ".", "log") for "00000000000000000042.log"."""
    return name.rpartition(".")


RECOVERY_POINT_FILE = "recovery-point"
_RECOVERY_POINT = struct.Struct("<QI")


def read_recovery_point(directory: Path) -> int:
    """Segments wholly below this offset were fsynced whole; 0 when unknown or damaged."""
    try:
        data = (directory / RECOVERY_POINT_FILE).read_bytes()
    except FileNotFoundError:
        return 0
    if len(data) != _RECOVERY_POINT.size:
        return 0
    offset, crc = _RECOVERY_POINT.unpack(data)
    return offset if crc32c(data[:8]) == crc else 0


def write_recovery_point(directory: Path, offset: int, *, durable: bool) -> None:
    """Replace the checkpoint atomically. A lost update only makes the next open scan more."""
    body = struct.pack("<Q", offset)
    temporary = directory / (RECOVERY_POINT_FILE + ".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, body + struct.pack("<I", crc32c(body)))
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temporary, directory / RECOVERY_POINT_FILE)


class PartitionLog:
    """An append-only log of records with dense offsets, stored as segments in one directory.

    Single-threaded: call it from one thread (the event loop). `commit()` hands the fsync to a
    worker thread and coalesces every caller that arrives while one is in flight (group commit).
    """

    # Slots: a broker holds two logs per queue, hundreds of thousands of them.
    __slots__ = (
        "directory",
        "config",
        "_segments",
        "_bases",
        "_executor",
        "_descriptors",
        "_end_offset",
        "_durable_offset",
        "_last_timestamp_ms",
        "_cache_bases",
        "_cache_terms",
        "_cache_timestamps",
        "_cache_sizes",
        "_cache_fields",
        "_cache_head",
        "_cache_bytes",
        "_dir_dirty",
        "_sync_task",
        "_syncing_paths",
        "_unsynced_paths",
        "_truncations",
        "_recovery_point",
        "_failed",
        "_closed",
        "_last_term",
        "_epoch_terms",
        "_epoch_starts",
    )

    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        segments: list[Segment],
        executor: Executor,
        descriptors: DescriptorPool,
    ) -> None:
        self.directory = directory
        self.config = config
        self._segments = segments
        self._bases = [s.base_offset for s in segments]
        self._executor = executor
        self._descriptors = descriptors
        self._end_offset = segments[-1].end_offset
        self._durable_offset = self._end_offset
        self._last_timestamp_ms = max(
            (s.max_timestamp_ms for s in segments if s.max_timestamp_ms is not None), default=0
        )
        # The tail cache: batch i (for i >= _cache_head) starts at offset _cache_bases[i], and
        # _cache_fields[i] holds its records' bytes fields, 4 per record, in one flat tuple.
        # The collector stops tracking a tuple of bytes alone the first time it sees one, so
        # the cache leaves it nothing to walk per record or per batch: one list of the
        # records' fields was walked whole by each full collection (about 25 ms each with
        # 128 MiB of small messages cached), and a cache of the appended record tuples piled
        # up in the youngest generation (5-20 ms stalls at 10,000 msg/s).
        self._cache_bases: list[int] = []
        self._cache_terms: list[int] = []
        self._cache_timestamps: list[int] = []
        self._cache_sizes: list[int] = []
        self._cache_fields: list[tuple[bytes, ...] | None] = []
        self._cache_head = 0
        self._cache_bytes = 0
        # The directory is fsynced with the first sync, not at open: nothing the log vouches
        # for predates that sync, and opening 100,000 idle queues then costs no fsync.
        self._dir_dirty = True
        self._sync_task: asyncio.Future[None] | None = None
        # The files the running commit's worker fsyncs; a sync() meanwhile fsyncs them too.
        self._syncing_paths: list[str] = []
        # Files a sync took but could not open: the next sync takes them again.
        self._unsynced_paths: list[str] = []
        # Bumped by every truncation, so an fsync that raced one does not vouch for new data.
        self._truncations = 0
        # Segments wholly below this offset are known fsynced: open need not scan them whole.
        self._recovery_point = 0
        self._failed: BaseException | None = None
        self._closed = False
        self._last_term = self._read_last_term()
        # The leader-epoch cache: epoch _epoch_terms[i] starts at offset _epoch_starts[i], both
        # strictly increasing. Built on first use (`_epochs`), not at open: a broker opens
        # 200,000 logs and replicates few of them, and the build reads only the segments where
        # the term changes. Kept up to date by every change to the log after that.
        self._epoch_terms: list[int] | None = None
        self._epoch_starts: list[int] = []

    # -- opening ---------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        directory: str | os.PathLike[str],
        config: LogConfig | None = None,
        *,
        executor: Executor | None = None,
        descriptors: DescriptorPool | None = None,
    ) -> PartitionLog:
        """Open or create the log in `directory`, recovering from a crash.

        The newest segment is scanned batch by batch and cut at the first torn or corrupt batch;
        older segments are sanity-checked. Wherever the offsets stop being dense, the log is cut
        there, so what remains is always a prefix of what was appended.

        The segments' files are opened through `descriptors` (by default the pool shared by
        every log opened without one), which keeps at most its capacity of them open.
        """
        config = config or LogConfig()
        descriptors = descriptors or default_pool()
        # Path(a_path) parses every component again (Python 3.11): 200,000 times at start.
        path = directory if isinstance(directory, Path) else Path(directory)
        # One listing, not a glob per kind of file: a broker opens 200,000 logs at start.
        try:
            names = os.listdir(path)
        except FileNotFoundError:
            path.mkdir(parents=True)
            names = []
        bases = sorted(
            int(stem)
            for stem, _, suffix in map(_split_suffix, names)
            if suffix == "log" and stem.isdigit()
        )
        kept = set(bases)
        indexed = set()
        for name in names:
            stem, dot, suffix = _split_suffix(name)
            if dot and suffix.endswith("index"):
                if stem.isdigit() and int(stem) in kept:
                    indexed.add(int(stem))
                else:
                    (path / name).unlink()
            elif name.endswith(RETIRED_SUFFIX):
                # Files of segments deleted just before a crash, before their unlink ran.
                (path / name).unlink(missing_ok=True)
        recovery_point = read_recovery_point(path) if RECOVERY_POINT_FILE in names else 0
        segments: list[Segment] = []
        for i, base in enumerate(bases):
            last = i == len(bases) - 1
            segment = Segment.recover(
                path,
                base,
                config,
                descriptors,
                full_scan=last or bases[i + 1] > recovery_point,
                index_files=base in indexed,
            )
            segments.append(segment)
            if not last and segment.end_offset != bases[i + 1]:
                cls._delete_from(path, config, descriptors, bases[i + 1 :])
                break
        if not segments:
            segments.append(Segment.create(path, 0, config, descriptors))
        log = cls(path, config, segments, executor or _FSYNC_EXECUTOR, descriptors)
        log._recovery_point = recovery_point
        log._lower_recovery_point(log._bases[-1])
        return log

    @staticmethod
    def _delete_from(
        path: Path, config: LogConfig, descriptors: DescriptorPool, bases: list[int]
    ) -> None:
        for base in bases:
            Segment(path, base, config, descriptors).delete()

    def _read_last_term(self) -> int:
        for segment in reversed(self._segments):
            if segment.end_offset > segment.base_offset:
                return segment.read(segment.end_offset - 1, 1, 0)[0].term
        return 0

    # -- properties ------------------------------------------------------------------------

    @property
    def start_offset(self) -> int:
        """The first offset still retained."""
        return self._bases[0]

    @property
    def end_offset(self) -> int:
        """The offset the next appended record will get."""
        return self._end_offset

    @property
    def durable_offset(self) -> int:
        """Every record below this offset has been fsynced."""
        return self._durable_offset

    replicated = False
    """True while replication vouches for the log (`server/replication.py`): what it
    confirms and delivers waits for `committed_offset`, the quorum's."""

    @property
    def committed_offset(self) -> int:
        """Everything below this is as safe as the log can make it: fsynced here (on a
        quorum of replicas, for a replicated log)."""
        return self._durable_offset

    @property
    def last_term(self) -> int:
        """The term of the newest batch (0 for an empty log)."""
        return self._last_term

    @property
    def last_timestamp_ms(self) -> int:
        return self._last_timestamp_ms

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    @property
    def segment_count(self) -> int:
        return len(self._segments)

    @property
    def segment_bases(self) -> list[int]:
        """The first offset of each segment, oldest first (retention deletes whole ones)."""
        return list(self._bases)

    # -- writing ---------------------------------------------------------------------------

    def append(
        self, records: Sequence[RawRecord], timestamp_ms: int | None = None, term: int = 0
    ) -> int:
        """Append `records` as one batch; returns the offset of the first.

        Every record gets the batch's timestamp, clamped so timestamps never go backwards
        (offset_for_timestamp relies on it). Records must be immutable bytes.
        """
        self._check_usable()
        config = self.config
        count = len(records)
        if count == 0:
            raise LogError("a batch needs at least one record")
        if count > config.batch_records_max:
            raise LogError(
                f"batch of {count} records exceeds batch_records_max {config.batch_records_max}"
            )
        payload = batch_codec.encode_records(records, config.record_bytes_max)
        total = HEADER_BYTES + len(payload)
        if total > config.batch_bytes_max:
            raise LogError(
                f"batch of {total} bytes exceeds batch_bytes_max {config.batch_bytes_max}"
            )
        if timestamp_ms is None:
            timestamp_ms = time.time_ns() // 1_000_000
        timestamp_ms = max(timestamp_ms, self._last_timestamp_ms)
        base = self._end_offset
        header = batch_codec.encode_header(base, term, count, timestamp_ms, payload)
        segment = self._segments[-1]
        if not segment.fits(total, count):
            segment = self._roll()
        try:
            segment.append(header, payload, base, count, timestamp_ms)
        except OSError as exc:
            if segment.write_failed:
                # The partial batch could not be taken back out: the file's tail is unknown.
                self._failed = exc
            raise
        self._end_offset = base + count
        self._last_timestamp_ms = timestamp_ms
        self._last_term = term
        self._note_epoch(term, base)
        self._cache_push(base, term, timestamp_ms, records, total)
        return base

    def append_stored(self, data: bytes | memoryview) -> int:
        """Append stored batches verbatim, as `read_batches` returned them from another
        replica's log (same base offsets, terms, timestamps and CRCs); returns the new end.

        Everything is checked before anything is written: each header, CRC and record
        framing, the bounds of `append`, that the first batch starts at `end_offset` and the
        offsets stay dense, that terms never go down (the leader-epoch cache relies on it),
        and that `data` ends on a batch boundary (a torn tail is refused, not cut). Batches are
        written one by one as `append` writes them, rolling segments the same way; should a
        write fail, the batches before it stay appended.
        """
        self._check_usable()
        config = self.config
        view = memoryview(data)
        batches: list[tuple[int, batch_codec.BatchHeader, list[RawRecord]]] = []
        position = 0
        expected = self._end_offset
        term = self._last_term
        while position < len(view):
            header = batch_codec.read_header(view, position)
            if header is None or position + header.total_bytes > len(view):
                raise CorruptBatchError(f"stored batches end inside a batch at byte {position}")
            if header.base_offset != expected:
                raise LogError(
                    f"stored batch starts at offset {header.base_offset}, expected {expected}"
                )
            if not 0 < header.record_count <= config.batch_records_max:
                raise LogError(f"stored batch of {header.record_count} records is out of bounds")
            if header.total_bytes > config.batch_bytes_max:
                raise LogError(
                    f"stored batch of {header.total_bytes} bytes exceeds batch_bytes_max"
                    f" {config.batch_bytes_max}"
                )
            if header.term < term:
                raise LogError(f"stored batch of term {header.term} follows term {term}")
            batch_codec.verify_crc(view, position, header)
            decoded = batch_codec.decode_records(view, position, header, header.base_offset)
            if max(map(batch_codec.record_size, decoded)) > config.record_bytes_max:
                raise LogError(f"stored batch at offset {expected} holds an oversized record")
            batches.append((position, header, [record[3:] for record in decoded]))
            expected = header.next_offset
            term = header.term
            position += header.total_bytes
        for position, header, raw_records in batches:
            total = header.total_bytes
            segment = self._segments[-1]
            if not segment.fits(total, header.record_count):
                segment = self._roll()
            try:
                segment.append(
                    view[position : position + HEADER_BYTES],
                    view[position + HEADER_BYTES : position + total],
                    header.base_offset,
                    header.record_count,
                    header.max_timestamp_ms,
                )
            except OSError as exc:
                if segment.write_failed:
                    self._failed = exc
                raise
            self._end_offset = header.next_offset
            # A replica keeps the leader's timestamps verbatim; its own appends, should it
            # lead later, are clamped to the newest of them.
            self._last_timestamp_ms = max(self._last_timestamp_ms, header.max_timestamp_ms)
            self._last_term = header.term
            self._note_epoch(header.term, header.base_offset)
            self._cache_push(
                header.base_offset, header.term, header.max_timestamp_ms, raw_records, total
            )
        return self._end_offset

    # -- leader epochs ---------------------------------------------------------------------

    def epoch_end_offset(self, epoch: int) -> tuple[int, int]:
        """(the largest epoch <= `epoch` this log holds, the offset where it ends here): the
        start of the next epoch, or `end_offset` (KIP-101's OffsetForLeaderEpoch, with the
        epoch in the answer as in KIP-279). (-1, start_offset) when no such epoch is held.

        Epochs are batch terms. A term lower than an earlier one (appended by a caller that
        does not replicate) opens no epoch.
        """
        self._check_usable()
        terms, starts = self._epochs()
        i = bisect_right(terms, epoch)
        if i == 0:
            return -1, self.start_offset
        return terms[i - 1], starts[i] if i < len(starts) else self._end_offset

    def _epochs(self) -> tuple[list[int], list[int]]:
        terms = self._epoch_terms
        if terms is None:
            terms = self._epoch_terms = []
            self._epoch_starts = []
            segments = self._segments
            firsts = [segment.first_term() for segment in segments]
            for i, segment in enumerate(segments):
                first = firsts[i]
                if first is None:
                    continue
                following = next((t for t in firsts[i + 1 :] if t is not None), self._last_term)
                if following == first:
                    # Terms never go down, so the whole segment is of this one term.
                    self._note_epoch(first, segment.base_offset)
                else:
                    for term, base in segment.batch_terms():
                        self._note_epoch(term, base)
            self._trim_epochs()
        return terms, self._epoch_starts

    def _note_epoch(self, term: int, base: int) -> None:
        terms = self._epoch_terms
        if terms is not None and (not terms or term > terms[-1]):
            terms.append(term)
            self._epoch_starts.append(base)

    def _trim_epochs(self) -> None:
        """Forget epochs that end at or below the log start; the oldest kept starts there."""
        terms, starts = self._epoch_terms, self._epoch_starts
        if terms is None:
            return
        start = self.start_offset
        gone = bisect_right(starts, start) - 1
        if gone > 0:
            del terms[:gone]
            del starts[:gone]
        if starts and starts[0] < start:
            starts[0] = start

    def _roll(self) -> Segment:
        # The outgoing segment's indexes are final now: the next sync covers them too.
        self._segments[-1].dirty = True
        segment = Segment.create(self.directory, self._end_offset, self.config, self._descriptors)
        self._segments.append(segment)
        self._bases.append(segment.base_offset)
        self._dir_dirty = True
        return segment

    def _cache_push(
        self,
        base: int,
        term: int,
        timestamp_ms: int,
        records: Sequence[RawRecord],
        encoded_bytes: int,
    ) -> None:
        limit = self.config.tail_cache_bytes_max
        charge = encoded_bytes + len(records) * CACHED_RECORD_OVERHEAD_BYTES
        if charge > limit:
            self._cache_clear()
            return
        self._cache_bases.append(base)
        self._cache_terms.append(term)
        self._cache_timestamps.append(timestamp_ms)
        self._cache_sizes.append(charge)
        self._cache_fields.append(tuple(chain.from_iterable(records)))
        self._cache_bytes += charge
        budget = self.config.tail_cache_budget
        if budget is not None:
            budget.cached(self, base, charge)
        # The batch just pushed fits the bound, so this never drops it.
        while self._cache_bytes > limit:
            self._cache_drop_head()

    def _cache_drop_head(self) -> None:
        """Drop the oldest cached batch."""
        head = self._cache_head
        sizes = self._cache_sizes
        if head + 1 == len(sizes):
            self._cache_clear()
            return
        size = sizes[head]
        self._cache_bytes -= size
        budget = self.config.tail_cache_budget
        if budget is not None:
            budget.dropped(size, 1)
        # Drop the references now: dropped records must not outlive the byte bound.
        fields = self._cache_fields
        fields[head] = None
        head += 1
        self._cache_head = head
        # Compact the dropped prefix now and then, so dropping stays O(1) amortised.
        if head > 64 and head * 2 > len(sizes):
            for column in (
                self._cache_bases,
                self._cache_terms,
                self._cache_timestamps,
                sizes,
                fields,
            ):
                del column[:head]
            self._cache_head = 0

    def _cache_drop_batch(self, base: int) -> None:
        """The budget's eviction: drop the batch at `base` if it is the oldest cached (any
        other batch of the budget's order is gone already)."""
        head = self._cache_head
        bases = self._cache_bases
        if head < len(bases) and bases[head] == base:
            self._cache_drop_head()

    def _cache_holds(self, base: int) -> bool:
        bases = self._cache_bases
        at = bisect_left(bases, base, self._cache_head)
        return at < len(bases) and bases[at] == base

    def _cache_clear(self) -> None:
        budget = self.config.tail_cache_budget
        if budget is not None and self._cache_bytes:
            budget.dropped(self._cache_bytes, len(self._cache_sizes) - self._cache_head)
        for column in (
            self._cache_bases,
            self._cache_terms,
            self._cache_timestamps,
            self._cache_sizes,
            self._cache_fields,
        ):
            column.clear()
        self._cache_head = 0
        self._cache_bytes = 0

    # -- reading ---------------------------------------------------------------------------

    def read(self, offset: int, max_records: int = 1000, max_bytes: int = 1 << 20) -> list[Record]:
        """Records from `offset` on, at most `max_records` and about `max_bytes` of them.

        At least one record is returned whenever `offset` is below the end, so progress is
        guaranteed whatever the budget. Reads of recent data come from memory; older data is
        read with `pread` and CRC-checked, and a corrupt batch raises rather than being returned.
        """
        self._check_usable()
        if offset < self.start_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} is below the log start {self.start_offset}"
            )
        if offset >= self._end_offset or max_records <= 0:
            return []
        bases = self._cache_bases
        if len(bases) > self._cache_head and offset >= bases[self._cache_head]:
            return self._read_cache(offset, max_records, max_bytes)
        records: list[Record] = []
        budget = max_bytes
        for segment in self._segments[bisect_right(self._bases, offset) - 1 :]:
            got, got_bytes = segment.read_counted(offset, max_records - len(records), budget)
            if not got:
                break
            records += got
            budget -= got_bytes
            offset = records[-1].offset + 1
            if offset < segment.end_offset or len(records) >= max_records or budget <= 0:
                break
        return records

    def _read_cache(self, offset: int, max_records: int, max_bytes: int) -> list[Record]:
        bases = self._cache_bases
        first = bisect_right(bases, offset, self._cache_head) - 1
        terms = self._cache_terms
        timestamps = self._cache_timestamps
        sizes = self._cache_sizes
        cached = self._cache_fields
        records: list[Record] = []
        append = records.append
        new = tuple.__new__
        budget = max_bytes
        for i in range(first, len(bases)):
            base = bases[i]
            term = terms[i]
            timestamp_ms = timestamps[i]
            fields = cached[i]
            assert fields is not None
            batch_records = len(fields) >> 2
            if (
                offset <= base
                and batch_records <= max_records - len(records)
                and sizes[i] <= budget
            ):
                # The whole batch fits (its charge bounds its records' sizes): none of them
                # needs sizing, and the loop over them runs in C.
                each = iter(fields)
                records += map(
                    new,
                    repeat(Record),
                    zip(
                        range(base, base + batch_records),
                        repeat(timestamp_ms),
                        repeat(term),
                        each,
                        each,
                        each,
                        each,
                    ),
                )
                budget -= sizes[i]
                continue
            for at in range(4 * max(0, offset - base), len(fields), 4):
                exchange, routing_key, properties, body = fields[at : at + 4]
                size = (
                    RECORD_HEADER_BYTES
                    + len(exchange)
                    + len(routing_key)
                    + len(properties)
                    + len(body)
                )
                if records and (size > budget or len(records) >= max_records):
                    return records
                append(
                    new(
                        Record,
                        (
                            base + (at >> 2),
                            timestamp_ms,
                            term,
                            exchange,
                            routing_key,
                            properties,
                            body,
                        ),
                    )
                )
                budget -= size
        return records

    async def read_batches(self, offset: int, end_offset: int, max_bytes: int) -> bytes:
        """The stored batches (`batch.py`'s format, verbatim) from the one holding `offset`
        up to `end_offset`, a batch boundary such as `durable_offset`: about `max_bytes`, at
        least one batch when `offset` is below `end_offset`. The first batch may start before
        `offset`; the reader skips what it did not ask for and checks the CRCs.

        Each segment's part is read in a worker thread (`Segment.batches_reader`): a fetch is
        megabytes, and the event loop serves every other client meanwhile. Retention deleting
        the segments still to read, or the log closing, ends the read with what it has."""
        self._check_usable()
        if offset < self.start_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} is below the log start {self.start_offset}"
            )
        parts: list[bytes] = []
        budget = max_bytes
        loop = asyncio.get_running_loop()
        while budget > 0 and not self._closed and offset >= self.start_offset:
            end = min(end_offset, self._end_offset)
            if offset >= end:
                break
            segment = self._segments[bisect_right(self._bases, offset) - 1]
            read = segment.batches_reader(offset, end, budget)
            data, offset = await loop.run_in_executor(_READ_EXECUTOR, read)
            if not data:
                break
            parts.append(data)
            budget -= len(data)
            if offset < segment.end_offset:
                break
        return b"".join(parts)

    def records_from(self, offset: int, batch_records: int = 1000) -> Iterator[Record]:
        """Every record from `offset` (or the log start, if later) to the end, read
        `batch_records` at a time."""
        assert batch_records > 0
        offset = max(offset, self.start_offset)
        while offset < self._end_offset:
            records = self.read(offset, batch_records)
            yield from records
            offset = records[-1].offset + 1

    def batch_start(self, offset: int) -> int:
        """The offset of the first record of the batch (a stream's chunk) that holds `offset`."""
        self._check_usable()
        if not self.start_offset <= offset < self._end_offset:
            raise OffsetOutOfRangeError(
                f"offset {offset} is outside the log [{self.start_offset}, {self._end_offset})"
            )
        bases = self._cache_bases
        if len(bases) > self._cache_head and offset >= bases[self._cache_head]:
            return bases[bisect_right(bases, offset, self._cache_head) - 1]
        return self._segments[bisect_right(self._bases, offset) - 1].batch_start(offset)

    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        """The first offset whose timestamp is >= timestamp_ms, or None when every record is
        older.
        """
        self._check_usable()
        for segment in self._segments:
            found = segment.offset_for_timestamp(timestamp_ms)
            if found is not None:
                return found
        return None

    # -- durability ------------------------------------------------------------------------

    def _take_sync_paths(self) -> list[str]:
        paths: list[str] = []
        active = self._segments[-1]
        for segment in self._segments:
            if segment.dirty:
                paths += segment.sync_paths(include_indexes=segment is not active)
                segment.dirty = False
        if self._dir_dirty:
            paths.append(os.fspath(self.directory))
            self._dir_dirty = False
        if self._unsynced_paths:
            paths = list(dict.fromkeys(self._unsynced_paths + paths))
            self._unsynced_paths = []
        return paths

    def _synced(self, end: int, truncations: int, active_base: int) -> None:
        """After an fsync of everything dirty: advance the durable offset and recovery point."""
        if truncations != self._truncations or self._closed:
            # Truncated meanwhile, or closed: another log may own the directory now.
            return
        self._durable_offset = max(self._durable_offset, end)
        if active_base > self._recovery_point:
            self._recovery_point = active_base
            write_recovery_point(self.directory, active_base, durable=False)

    def sync(self) -> int:
        """fsync everything appended so far, in this thread; returns the durable end offset."""
        self._check_usable()
        end, truncations, active_base = self._end_offset, self._truncations, self._bases[-1]
        # A running commit took some dirty files and may not have fsynced them yet; the
        # offset returned here vouches for them too.
        taken = self._take_sync_paths()
        try:
            _fsync_files(taken + self._syncing_paths)
        except _FilesNotOpened:
            self._unsynced_paths += taken
            raise
        except OSError as exc:
            self._failed = exc
            raise
        self._synced(end, truncations, active_base)
        return self._durable_offset

    async def commit(self) -> int:
        """Wait until everything appended before the call is fsynced; returns the durable offset.

        One fsync runs at a time in a worker thread; callers arriving meanwhile share the next
        one, so N concurrent committers cost about two fsyncs, not N.
        """
        target = self._end_offset
        while self._durable_offset < min(target, self._end_offset):
            self._check_usable()
            if self._sync_task is None:
                self._sync_task = asyncio.ensure_future(self._sync_in_worker())
            await asyncio.shield(self._sync_task)
        return self._durable_offset

    async def _sync_in_worker(self) -> None:
        try:
            end, truncations, active_base = self._end_offset, self._truncations, self._bases[-1]
            paths = self._syncing_paths = self._take_sync_paths()
            try:
                took_s = await asyncio.get_running_loop().run_in_executor(
                    self._executor, _fsync_files, paths
                )
            except _FilesNotOpened:
                self._unsynced_paths += paths
                raise
            except OSError as exc:
                # After a failed fsync the page cache may have dropped the data: stop trusting it.
                self._failed = exc
                raise
            FSYNC_LATENCY.observe(took_s)
            self._synced(end, truncations, active_base)
        finally:
            self._sync_task = None
            self._syncing_paths = []

    def _lower_recovery_point(self, offset: int) -> None:
        if offset < self._recovery_point:
            self._recovery_point = offset
            write_recovery_point(self.directory, offset, durable=True)

    def _fsync_directory(self) -> None:
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- removing --------------------------------------------------------------------------

    def truncate(self, offset: int) -> None:
        """Remove `offset` and everything after it (a replica discarding a divergent tail)."""
        self._check_usable()
        if offset >= self._end_offset:
            return
        if offset <= self.start_offset:
            self.reset(offset)
            return
        self._truncations += 1
        self._lower_recovery_point(offset)
        while self._segments[-1].base_offset >= offset:
            self._segments.pop().delete()
            self._bases.pop()
            self._dir_dirty = True
        segment = self._segments[-1]
        remainder = segment.truncate(offset)
        self._end_offset = segment.end_offset
        self._durable_offset = min(self._durable_offset, self._end_offset)
        self._last_timestamp_ms = max(
            (s.max_timestamp_ms for s in self._segments if s.max_timestamp_ms is not None),
            default=0,
        )
        self._cache_clear()
        self._last_term = self._read_last_term()
        if self._epoch_terms is not None:
            keep = bisect_left(self._epoch_starts, self._end_offset)
            del self._epoch_terms[keep:]
            del self._epoch_starts[keep:]
        if remainder is not None:
            term, timestamp_ms, records = remainder
            self.append(records, timestamp_ms=timestamp_ms, term=term)

    def reset(self, start_offset: int) -> None:
        """Drop every record and start empty at `start_offset` (a replica installing a snapshot)."""
        self._check_usable()
        self._truncations += 1
        self._lower_recovery_point(0)
        for segment in self._segments:
            segment.delete()
        self._segments = [
            Segment.create(self.directory, start_offset, self.config, self._descriptors)
        ]
        self._bases = [start_offset]
        self._end_offset = self._durable_offset = start_offset
        self._last_term = 0
        self._epoch_terms = []
        self._epoch_starts = []
        self._cache_clear()
        self._fsync_directory()

    def delete_before(self, offset: int) -> int:
        """Delete whole segments whose records are all below `offset`; returns the new start.

        The active segment is never deleted.
        """
        self._check_usable()
        while len(self._segments) > 1 and self._segments[0].end_offset <= offset:
            self._drop_oldest()
        self._trim_epochs()
        return self.start_offset

    def apply_retention(self, now_ms: int) -> int:
        """Delete whole segments past the age or size limit; returns how many went.

        Only segments whose every record is older than the age limit, or whose removal leaves at
        least `retention_bytes`, are deleted, oldest first, never the active segment.
        """
        self._check_usable()
        deleted = 0
        retention_ms = self.config.retention_ms
        if retention_ms is not None:
            while len(self._segments) > 1:
                newest = self._segments[0].max_timestamp_ms
                if newest is not None and newest >= now_ms - retention_ms:
                    break
                self._drop_oldest()
                deleted += 1
        retention_bytes = self.config.retention_bytes
        if retention_bytes is not None:
            total = self.size_bytes
            while len(self._segments) > 1 and total - self._segments[0].size >= retention_bytes:
                total -= self._segments[0].size
                self._drop_oldest()
                deleted += 1
        self._trim_epochs()
        return deleted

    def _drop_oldest(self) -> None:
        # The unlink runs in a worker thread: freeing a whole segment's blocks stalled the
        # event loop for 10-25 ms. Should it fail, the next open deletes the renamed files.
        _UNLINK_EXECUTOR.submit(_unlink_all, self._segments.pop(0).retire())
        self._bases.pop(0)

    # -- lifecycle -------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._closed:
            raise LogError(f"log {self.directory} is closed")
        if self._failed is not None:
            raise LogError(
                f"log {self.directory} failed an fsync and refuses further use"
            ) from self._failed

    def close(self) -> None:
        """Close the files. Unsynced appends are not fsynced: call sync() first to keep them."""
        if self._closed:
            return
        self._closed = True
        for segment in self._segments:
            segment.close()
        self._cache_clear()

    def __enter__(self) -> PartitionLog:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

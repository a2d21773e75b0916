"""One segment of a partition log: `<base>.log` with its sparse `.index` and `.timeindex`.

The `.index` holds (relative offset u32, file position u32) pairs and the `.timeindex`
(timestamp_ms i64, relative offset u32) pairs, one of each written together for the batch that
starts after every `index_interval_bytes` of data, so the two files stay parallel. Both are
rebuilt from the `.log` whenever they are missing or fail a sanity check; the `.log` alone is
the truth. An empty index is no file: the two are created with their first entry, so an idle
log (a queue that never held 4 KiB) has one file, not three.

The files are opened through a `DescriptorPool`, which may close them between uses: every
system call takes its descriptor from `fileno()` right then, never from an earlier call.
"""

from __future__ import annotations

import errno
import os
import struct
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator
from pathlib import Path

from . import batch as batch_codec
from .batch import HEADER_BYTES, BatchHeader, RawRecord, Record
from .config import LogConfig
from .descriptors import DescriptorPool, PooledFile
from .errors import CorruptBatchError

INDEX_ENTRY = struct.Struct("<II")
TIME_ENTRY = struct.Struct("<qI")
# Disk reads fetch at least this much at a time, so small batches cost one pread per chunk.
READ_CHUNK_BYTES = 256 << 10
_REL_OFFSET_MAX = 0xFFFF_FFFF
# A deleted segment's files carry this suffix until a worker thread unlinks them.
RETIRED_SUFFIX = ".deleted"
# Every file is opened read-write for appending; only a first open may create or truncate.
_FLAGS = os.O_RDWR | os.O_APPEND


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


def _batches(
    fileno: Callable[[], int], position: int, end: int, *, verify: bool
) -> Iterator[tuple[int, BatchHeader, bytes, int]]:
    """(file position, header, buffer, position in buffer) of each whole batch in [position,
    end) of the file whose descriptor `fileno()` gives (a pooled file's is taken anew for each
    read).

    Stops silently at a torn tail (a batch that runs past `end`); raises CorruptBatchError
    on a bad header or, with `verify`, a CRC mismatch.
    """
    buf = b""
    buf_start = position
    while position < end:
        at = position - buf_start
        if len(buf) - at < HEADER_BYTES:
            buf = os.pread(fileno(), min(READ_CHUNK_BYTES, end - position), position)
            buf_start, at = position, 0
        header = batch_codec.read_header(buf, at)
        if header is None or position + header.total_bytes > end:
            return
        if at + header.total_bytes > len(buf):
            buf = os.pread(
                fileno(),
                min(max(READ_CHUNK_BYTES, header.total_bytes), end - position),
                position,
            )
            buf_start, at = position, 0
            if len(buf) < header.total_bytes:
                return
        if verify:
            batch_codec.verify_crc(buf, at, header)
        yield position, header, buf, at
        position += header.total_bytes


def _read_batches(
    fileno: Callable[[], int],
    path: str,
    floor: int,
    size: int,
    offset: int,
    end_offset: int,
    max_bytes: int,
) -> tuple[bytes, int]:
    """Segment.batches_reader's read of the file's first `size` bytes, walked from `floor`
    (the start of a batch at or before the one holding `offset`)."""
    start: int | None = None
    stop = 0
    next_offset = offset
    for position, header, _, _ in _batches(fileno, floor, size, verify=False):
        if header.next_offset <= offset:
            continue
        if header.next_offset > end_offset:
            break
        if start is None:
            start = position
        elif position + header.total_bytes - start > max_bytes:
            break
        stop = position + header.total_bytes
        next_offset = header.next_offset
    if start is None:
        return b"", offset
    data = os.pread(fileno(), stop - start, start)
    if len(data) != stop - start:
        raise CorruptBatchError(f"{path} ended inside a batch at position {start}")
    return data, next_offset


class Segment:
    """A segment's files and the in-memory copy of its indexes.

    Not thread-safe: the partition log calls it from one thread. Readers use `pread`, which
    never moves the write position, so reads do not disturb appends.

    A broker holds hundreds of thousands of idle segments, so a segment keeps its paths as the
    one string of its pooled `.log` file (no Path objects) and its attributes in slots.
    """

    __slots__ = (
        "base_offset",
        "config",
        "_descriptors",
        "_log_file",
        "size",
        "end_offset",
        "max_timestamp_ms",
        "_index_rel",
        "_index_pos",
        "_time_ts",
        "_bytes_since_index",
        "_index_file",
        "_time_file",
        "_index_files_exist",
        "dirty",
        "write_failed",
    )

    def __init__(
        self,
        directory: Path,
        base_offset: int,
        config: LogConfig,
        descriptors: DescriptorPool,
        *,
        index_files: bool = False,
    ) -> None:
        self.base_offset = base_offset
        self.config = config
        self._descriptors = descriptors
        log_path = os.path.join(directory, segment_name(base_offset) + ".log")
        self._log_file = descriptors.open(log_path, _FLAGS, first_flags=os.O_CREAT)
        self.size = os.fstat(self._log_file.fileno()).st_size
        self.end_offset = base_offset
        self.max_timestamp_ms: int | None = None
        self._index_rel = array("I")
        self._index_pos = array("I")
        self._time_ts = array("q")
        self._bytes_since_index = 0
        # Opened when the first index entry is written; a segment whose indexes loaded never
        # writes them again.
        self._index_file: PooledFile | None = None
        self._time_file: PooledFile | None = None
        # Whether .index and .timeindex may exist on disk (the log's listing says at open).
        self._index_files_exist = index_files
        # Set when data, or a rolled segment's indexes, await an fsync.
        self.dirty = False
        # Set when a failed append could not be undone: the file holds bytes of unknown state.
        self.write_failed = False

    @property
    def log_path(self) -> Path:
        return Path(self._log_file.path)

    @property
    def index_path(self) -> Path:
        return Path(self._index_paths()[0])

    @property
    def time_index_path(self) -> Path:
        return Path(self._index_paths()[1])

    def _index_paths(self) -> tuple[str, str]:
        stem = self._log_file.path[: -len("log")]
        return stem + "index", stem + "timeindex"

    # -- opening ---------------------------------------------------------------------------

    @classmethod
    def create(
        cls, directory: Path, base_offset: int, config: LogConfig, descriptors: DescriptorPool
    ) -> Segment:
        segment = cls(directory, base_offset, config, descriptors)
        if segment.size:
            raise CorruptBatchError(f"segment {segment.log_path} already exists")
        return segment

    @classmethod
    def recover(
        cls,
        directory: Path,
        base_offset: int,
        config: LogConfig,
        descriptors: DescriptorPool,
        *,
        full_scan: bool,
        index_files: bool,
    ) -> Segment:
        """Open an existing segment, cutting its file back to the last whole, CRC-valid batch.

        `full_scan` verifies every batch (the newest segment, where a crash tears writes);
        otherwise the indexes are sanity-checked and only the batches after the last index
        entry are verified, falling back to a full scan if anything is off. `index_files`
        says whether the directory holds index files of this segment.
        """
        segment = cls(directory, base_offset, config, descriptors, index_files=index_files)
        if full_scan or not segment._load_indexes():
            segment._rebuild()
        else:
            start = segment._index_pos[-1] if segment._index_pos else 0
            if not segment._scan_tail(start):
                segment._rebuild()
        return segment

    def _load_indexes(self) -> bool:
        """Read both index files; False when either is missing or fails a sanity check."""
        if not self._index_files_exist:
            return False
        index_path, time_index_path = self._index_paths()
        try:
            with open(index_path, "rb") as index, open(time_index_path, "rb") as time_index:
                index_bytes, time_bytes = index.read(), time_index.read()
        except FileNotFoundError:
            return False
        if len(index_bytes) % INDEX_ENTRY.size or len(time_bytes) % TIME_ENTRY.size:
            return False
        entries = len(index_bytes) // INDEX_ENTRY.size
        if len(time_bytes) // TIME_ENTRY.size != entries:
            return False
        rels, positions, stamps = array("I"), array("I"), array("q")
        previous_rel = previous_pos = previous_ts = -1
        for i in range(entries):
            rel, pos = INDEX_ENTRY.unpack_from(index_bytes, i * INDEX_ENTRY.size)
            ts, time_rel = TIME_ENTRY.unpack_from(time_bytes, i * TIME_ENTRY.size)
            if rel <= previous_rel or pos <= previous_pos or ts < previous_ts or time_rel != rel:
                return False
            if pos >= self.size:
                return False
            rels.append(rel)
            positions.append(pos)
            stamps.append(ts)
            previous_rel, previous_pos, previous_ts = rel, pos, ts
        self._index_rel, self._index_pos, self._time_ts = rels, positions, stamps
        # Every entry must point at the start of the batch it names.
        for i in range(entries):
            header = self._pread_header(positions[i])
            if header is None or header.base_offset != self.base_offset + rels[i]:
                return False
        return True

    def _scan_tail(self, position: int) -> bool:
        """Verify batches from `position` to the end of file; True if all are whole and valid."""
        expected = self.base_offset + self._index_rel[-1] if self._index_rel else self.base_offset
        last: BatchHeader | None = None
        end = position
        try:
            for pos, header, _, _ in self._batches(position, self.size, verify=True):
                if header.base_offset != expected:
                    return False
                expected = header.next_offset
                end = pos + header.total_bytes
                last = header
        except CorruptBatchError:
            return False
        if end != self.size:
            return False
        self.end_offset = expected
        if last is not None:
            self.max_timestamp_ms = last.max_timestamp_ms
        elif self._time_ts:
            self.max_timestamp_ms = self._time_ts[-1]
        self._bytes_since_index = self.size - position
        return True

    def _rebuild(self) -> None:
        """Scan every batch, rebuilding the indexes; cut the file at a torn or corrupt batch."""
        self._drop_index_entries_from(0)
        expected = self.base_offset
        self.max_timestamp_ms = None
        self._bytes_since_index = 0
        valid_end = 0
        try:
            for pos, header, _, _ in self._batches(0, self.size, verify=True):
                if header.base_offset != expected:
                    break
                self._note_batch(
                    pos, header.base_offset, header.max_timestamp_ms, header.total_bytes
                )
                expected = header.next_offset
                valid_end = pos + header.total_bytes
        except CorruptBatchError:
            pass
        if valid_end != self.size:
            os.ftruncate(self._log_file.fileno(), valid_end)
            self.size = valid_end
            self.dirty = True
        self.end_offset = expected
        self._rewrite_index_files()

    # -- writing ---------------------------------------------------------------------------

    def fits(self, batch_bytes: int, record_count: int) -> bool:
        """Whether a batch may go into this segment without rolling."""
        if self.size == 0:
            return True
        if self.size + batch_bytes > self.config.segment_bytes_max:
            return False
        return self.end_offset + record_count - self.base_offset <= _REL_OFFSET_MAX

    def append(
        self, header: bytes, payload: bytes, base_offset: int, record_count: int, timestamp_ms: int
    ) -> None:
        """Write one batch; on any failure (disk full, a short write) nothing of it remains."""
        assert base_offset == self.end_offset, (base_offset, self.end_offset)
        total = len(header) + len(payload)
        position = self.size
        index_entries = len(self._index_rel)
        bytes_since_index, max_timestamp_ms = self._bytes_since_index, self.max_timestamp_ms
        try:
            written = os.writev(self._log_file.fileno(), (header, payload))
            if written != total:
                raise OSError(
                    errno.ENOSPC, f"short write to {self.log_path}: {written} of {total} bytes"
                )
            self._note_batch(position, base_offset, timestamp_ms, total, write_index=True)
        except OSError:
            self._bytes_since_index, self.max_timestamp_ms = bytes_since_index, max_timestamp_ms
            self._undo_append(position, index_entries)
            raise
        self.size = position + total
        self.end_offset = base_offset + record_count
        self.dirty = True

    def _undo_append(self, position: int, index_entries: int) -> None:
        """Cut the log file back to `position` and the indexes back to `index_entries`."""
        del self._index_rel[index_entries:]
        del self._index_pos[index_entries:]
        del self._time_ts[index_entries:]
        try:
            # Truncation frees blocks, so it works on a full disk too.
            os.ftruncate(self._log_file.fileno(), position)
            if self._index_file is not None and self._time_file is not None:
                os.ftruncate(self._index_file.fileno(), index_entries * INDEX_ENTRY.size)
                os.ftruncate(self._time_file.fileno(), index_entries * TIME_ENTRY.size)
        except OSError:
            self.write_failed = True

    def _note_batch(
        self,
        position: int,
        base_offset: int,
        timestamp_ms: int,
        total: int,
        write_index: bool = False,
    ) -> None:
        if position > 0 and self._bytes_since_index >= self.config.index_interval_bytes:
            rel = base_offset - self.base_offset
            self._index_rel.append(rel)
            self._index_pos.append(position)
            self._time_ts.append(timestamp_ms)
            self._bytes_since_index = 0
            if write_index:
                if self._index_file is None:
                    self._open_index_files()
                assert self._index_file is not None and self._time_file is not None
                os.write(self._index_file.fileno(), INDEX_ENTRY.pack(rel, position))
                os.write(self._time_file.fileno(), TIME_ENTRY.pack(timestamp_ms, rel))
        self._bytes_since_index += total
        self.max_timestamp_ms = timestamp_ms

    def _drop_index_entries_from(self, position: int) -> None:
        keep = bisect_left(self._index_pos, position)
        del self._index_rel[keep:]
        del self._index_pos[keep:]
        del self._time_ts[keep:]

    def _open_index_files(self) -> None:
        """Create (or empty) both index files, to be written from their first entry on."""
        rewrite = os.O_CREAT | os.O_TRUNC
        index_path, time_index_path = self._index_paths()
        self._index_files_exist = True
        index_file = self._descriptors.open(index_path, _FLAGS, first_flags=rewrite)
        try:
            time_file = self._descriptors.open(time_index_path, _FLAGS, first_flags=rewrite)
        except BaseException:
            index_file.close()
            raise
        self._index_file, self._time_file = index_file, time_file

    def _rewrite_index_files(self) -> None:
        for file in (self._index_file, self._time_file):
            if file is not None:
                file.close()
        self._index_file = self._time_file = None
        if not self._index_rel:
            if self._index_files_exist:
                for path in self._index_paths():
                    try:
                        os.unlink(path)
                    except FileNotFoundError:
                        pass
                self._index_files_exist = False
            return
        self._open_index_files()
        assert self._index_file is not None and self._time_file is not None
        os.write(
            self._index_file.fileno(),
            b"".join(
                INDEX_ENTRY.pack(r, p)
                for r, p in zip(self._index_rel, self._index_pos, strict=True)
            ),
        )
        os.write(
            self._time_file.fileno(),
            b"".join(
                TIME_ENTRY.pack(t, r) for t, r in zip(self._time_ts, self._index_rel, strict=True)
            ),
        )

    def truncate(self, offset: int) -> tuple[int, int, list[RawRecord]] | None:
        """Cut the segment so that `offset` is its end.

        When `offset` falls inside a batch, the batch is cut whole and its records below
        `offset` are returned as (term, timestamp_ms, records) for the caller to append again.
        """
        if offset >= self.end_offset:
            return None
        position, header, records = self._locate_batch(offset)
        remainder = None
        if header.base_offset < offset:
            kept = [
                (r.exchange, r.routing_key, r.properties, r.body)
                for r in records
                if r.offset < offset
            ]
            remainder = (header.term, header.max_timestamp_ms, kept)
        os.ftruncate(self._log_file.fileno(), position)
        self.size = position
        self.end_offset = header.base_offset
        self._drop_index_entries_from(position)
        self._rewrite_index_files()
        self.max_timestamp_ms = None
        start = self._index_pos[-1] if self._index_pos else 0
        self._bytes_since_index = 0
        for _, hdr, _, _ in self._batches(start, self.size, verify=False):
            self._bytes_since_index += hdr.total_bytes
            self.max_timestamp_ms = hdr.max_timestamp_ms
        if self.max_timestamp_ms is None and self._time_ts:
            self.max_timestamp_ms = self._time_ts[-1]
        self.dirty = True
        return remainder

    def _locate_batch(self, offset: int) -> tuple[int, BatchHeader, list[Record]]:
        for pos, header, buf, at in self._batches(
            self._floor_position(offset), self.size, verify=True
        ):
            if header.next_offset > offset:
                return pos, header, batch_codec.decode_records(buf, at, header, header.base_offset)
        raise CorruptBatchError(f"offset {offset} not found in segment {self.log_path}")

    def batch_start(self, offset: int) -> int:
        """The offset of the first record of the batch that holds `offset`."""
        return self._locate_batch(offset)[1].base_offset

    # -- reading ---------------------------------------------------------------------------

    def first_term(self) -> int | None:
        """The term of the segment's first batch; None when it holds none."""
        header = self._pread_header(0) if self.size else None
        return None if header is None else header.term

    def batch_terms(self) -> Iterator[tuple[int, int]]:
        """(term, base offset) of each batch, oldest first, from the headers alone."""
        for _, header, _, _ in self._batches(0, self.size, verify=False):
            yield header.term, header.base_offset

    def _floor_position(self, offset: int) -> int:
        i = bisect_right(self._index_rel, offset - self.base_offset)
        return self._index_pos[i - 1] if i else 0

    def _pread_header(self, position: int) -> BatchHeader | None:
        try:
            return batch_codec.read_header(
                os.pread(self._log_file.fileno(), HEADER_BYTES, position), 0
            )
        except CorruptBatchError:
            return None

    def _batches(
        self, position: int, end: int, *, verify: bool
    ) -> Iterator[tuple[int, BatchHeader, bytes, int]]:
        return _batches(self._log_file.fileno, position, end, verify=verify)

    def read(self, offset: int, max_records: int, max_bytes: int) -> list[Record]:
        """Records from `offset` on within this segment, CRC-verified, within the budgets.

        At least one record is returned when any exists, however large, so a reader with a small
        byte budget still makes progress.
        """
        return self.read_counted(offset, max_records, max_bytes)[0]

    def read_counted(
        self, offset: int, max_records: int, max_bytes: int
    ) -> tuple[list[Record], int]:
        """`read`, and the bytes the records take in their batches (counted as they are read,
        so that a caller with a byte budget need not size each record again)."""
        records: list[Record] = []
        budget = max_bytes
        expected: int | None = None
        for _, header, buf, at in self._batches(
            self._floor_position(offset), self.size, verify=True
        ):
            if expected is not None and header.base_offset != expected:
                raise CorruptBatchError(
                    f"offsets in {self.log_path} jump from {expected} to {header.base_offset}"
                )
            expected = header.next_offset
            if header.next_offset <= offset:
                continue
            if header.base_offset > offset:
                raise CorruptBatchError(f"index of {self.log_path} skips offset {offset}")
            decoded = batch_codec.decode_records(buf, at, header, offset)
            whole_bytes = header.total_bytes - HEADER_BYTES
            if (
                header.base_offset == offset
                and whole_bytes <= budget
                and len(records) + len(decoded) <= max_records
            ):
                # The whole batch fits: its records' sizes add up to its payload's.
                records += decoded
                budget -= whole_bytes
            else:
                for record in decoded:
                    size = batch_codec.record_size(record)
                    if records and (size > budget or len(records) >= max_records):
                        return records, max_bytes - budget
                    records.append(record)
                    budget -= size
            offset = header.next_offset
            if len(records) >= max_records or budget <= 0:
                break
        return records, max_bytes - budget

    def batches_reader(
        self, offset: int, end_offset: int, max_bytes: int
    ) -> Callable[[], tuple[bytes, int]]:
        """A function, for a worker thread, that returns the stored bytes of the whole
        batches from the one holding `offset` up to `end_offset` (a batch boundary), about
        `max_bytes` of them and at least one batch when any is there: verbatim, the CRCs left
        for the reader to check (a Kafka fetch's shape); and the offset after the last of them.

        It reads through a duplicate of the file's descriptor, taken now and closed when it is
        done, so that the pool may close or reuse its own meanwhile and retention may unlink
        the file (the duplicate still reads it); and only what the segment holds now.
        """
        fd = os.dup(self._log_file.fileno())
        path = self._log_file.path
        position = self._floor_position(offset)
        size = self.size

        def read() -> tuple[bytes, int]:
            try:
                return _read_batches(
                    lambda: fd, path, position, size, offset, end_offset, max_bytes
                )
            finally:
                os.close(fd)

        return read

    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        """The first offset in this segment whose timestamp is >= timestamp_ms, if any."""
        if self.max_timestamp_ms is None or self.max_timestamp_ms < timestamp_ms:
            return None
        i = bisect_left(self._time_ts, timestamp_ms)
        start = self._index_pos[i - 1] if i else 0
        for _, header, _, _ in self._batches(start, self.size, verify=False):
            if header.max_timestamp_ms >= timestamp_ms:
                return header.base_offset
        return None

    # -- lifecycle -------------------------------------------------------------------------

    def sync_paths(self, include_indexes: bool) -> list[str]:
        """The files an fsync must cover. The fsync opens them itself: an fsync through any
        descriptor of a file writes everything written to it through the pool's."""
        if include_indexes:
            return [self._log_file.path, *self._index_paths()]
        return [self._log_file.path]

    def close(self) -> None:
        for file in (self._log_file, self._index_file, self._time_file):
            if file is not None:
                file.close()

    def delete(self) -> None:
        self.close()
        for path in (self.index_path, self.time_index_path, self.log_path):
            path.unlink(missing_ok=True)

    def retire(self) -> list[Path]:
        """Close the segment and rename its files out of the log; returns the new paths.

        Unlinking a large file frees its blocks before it returns (tens of milliseconds for a
        64 MiB segment), so the caller unlinks the returned paths off the event loop. The
        rename takes the names away at once: a segment created later with the same base never
        meets the old files, and an open after a crash deletes the leftovers.
        """
        self.close()
        retired = []
        for path in (self.index_path, self.time_index_path, self.log_path):
            target = path.with_name(path.name + RETIRED_SUFFIX)
            try:
                path.rename(target)
            except FileNotFoundError:
                continue
            retired.append(target)
        return retired

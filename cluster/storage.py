"""Durable Raft state of one node: hard state, log entries and the latest snapshot.

Layout of a node's data directory:

    hardstate               term, vote, commit; replaced atomically (temp, fsync, rename,
                            fsync the directory), so a crash leaves the old or the new one
    snapshot                the latest snapshot, replaced the same way
    log/                    a `warrenmq.log` PartitionLog of the entries: Raft index = offset

Entries are records of the partition log: the record's properties are the entry kind (one
byte), its body the entry data, and its batch's term the entry term (consecutive entries of
one term share a batch). The log's CRCs and torn-tail recovery give us crash safety of the
entries; `truncate` removes a conflicting suffix; `delete_before` drops whole segments
below a snapshot.

A snapshot received from the leader replaces the whole log (as the core discards its own):
the log is `reset` to start right after it. The snapshot file is written first, so a crash
inside the reset leaves a log that `open` checks against the snapshot and resets again.
The application's own snapshots (`compact`) keep the log after them and drop the whole
segments they cover.

Only term and vote must be durable for safety (Raft §3.8); commit is kept as a hint. So
the hard state file is rewritten, with its three fsyncs, only when term or vote change; a
commit-only change is written on `close` and when a snapshot is taken. A restarted node
then starts from a commit index that may be behind, never ahead, and relearns it from the
leader. Entries are fsynced once per `save` however many were appended.
"""

from __future__ import annotations

import asyncio
import os
import struct
from bisect import bisect_right
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from crc32c import crc32c

from warrenmq.cluster.raft.core import HardState
from warrenmq.cluster.raft.messages import (
    DecodeError,
    Entry,
    EntryKind,
    Snapshot,
    decode_snapshot,
    encode_snapshot,
)
from warrenmq.log import LogConfig, PartitionLog

# Entries are read back only when a node starts (the core keeps what it needs in memory),
# so the log's tail cache would only hold a second copy of them: several times its byte
# bound in Python objects.
DEFAULT_LOG_CONFIG = LogConfig(tail_cache_bytes_max=0)

HARD_STATE_FILE = "hardstate"
SNAPSHOT_FILE = "snapshot"
LOG_DIR = "log"

_FILE_HEAD = struct.Struct("<4sI")  # magic, crc32c of the body
_HARD_STATE_BODY = struct.Struct("<QQQ")  # term, vote (0 = none), commit
_HARD_STATE_MAGIC = b"WRHS"
_SNAPSHOT_MAGIC = b"WRSN"
_EMPTY = b""
_KIND_BYTES = {kind: bytes([kind]) for kind in EntryKind}
_READ_RECORDS_MAX = 10_000
_RECORD_OVERHEAD_BYTES = 16  # the log's record header and the kind byte, rounded up
# Term and vote change at elections only; one thread keeps each node's replacements in order.
_HARD_STATE_EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="warren-hardstate")


class StorageError(Exception):
    """The stored state is inconsistent in a way that recovery must not paper over."""


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_atomically(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so that a crash leaves either the old or the new content."""
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "wb") as file:
        file.write(data)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    _fsync_directory(path.parent)


def _seal(magic: bytes, body: bytes) -> bytes:
    return _FILE_HEAD.pack(magic, crc32c(body)) + body


def _unseal(path: Path, magic: bytes) -> bytes | None:
    """The body of a sealed file, None if absent; a bad seal is an error (renames are atomic)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    if len(raw) < _FILE_HEAD.size:
        raise StorageError(f"{path} is shorter than its header")
    found_magic, crc = _FILE_HEAD.unpack_from(raw)
    body = raw[_FILE_HEAD.size :]
    if found_magic != magic or crc32c(body) != crc:
        raise StorageError(f"{path} fails its checksum")
    return body


def encode_hard_state(state: HardState) -> bytes:
    return _seal(
        _HARD_STATE_MAGIC, _HARD_STATE_BODY.pack(state.term, state.vote or 0, state.commit)
    )


class RaftStorage:
    """What one node persists. Not thread-safe; the host loop owns it."""

    def __init__(self, directory: Path, log_config: LogConfig) -> None:
        self.directory = directory
        self._log_config = log_config
        self.hard_state: HardState | None = None
        self._hard_state_durable: HardState | None = None
        self.snapshot: Snapshot | None = None
        self._log: PartitionLog | None = None
        # (first index, term) of each run of equal terms, for term lookups without I/O.
        self._term_runs: list[tuple[int, int]] = []
        self._last_index = 0

    # -- opening -----------------------------------------------------------------------

    @classmethod
    def open(
        cls, directory: str | os.PathLike[str], log_config: LogConfig | None = None
    ) -> RaftStorage:
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        storage = cls(path, log_config or DEFAULT_LOG_CONFIG)
        storage._recover()
        return storage

    def _recover(self) -> None:
        body = _unseal(self.directory / HARD_STATE_FILE, _HARD_STATE_MAGIC)
        if body is not None:
            term, vote, commit = _HARD_STATE_BODY.unpack(body)
            self.hard_state = HardState(term=term, vote=vote or None, commit=commit)
            self._hard_state_durable = self.hard_state
        body = _unseal(self.directory / SNAPSHOT_FILE, _SNAPSHOT_MAGIC)
        if body is not None:
            try:
                self.snapshot, end = decode_snapshot(body)
            except DecodeError as exc:
                raise StorageError(f"snapshot does not decode: {exc}") from exc
            if end != len(body):
                raise StorageError("trailing bytes after the snapshot")
        for leftover in self.directory.glob("*.tmp"):
            leftover.unlink()

        self._log = PartitionLog.open(self.directory / LOG_DIR, self._log_config)
        _fsync_directory(self.directory)
        snapshot_index = self.snapshot.index if self.snapshot is not None else 0
        if self._log.end_offset == 0:
            # Raft indexes start at 1; the log's offsets are made to equal them.
            self._log.reset(snapshot_index + 1)
        self._rebuild_term_runs()
        if self.snapshot is None:
            if self._log.start_offset != 1:
                raise StorageError(
                    f"log starts at {self._log.start_offset} but there is no snapshot"
                )
        elif not self._matches(self.snapshot.index, self.snapshot.term):
            # A crash interrupted installing this snapshot: the log is not its prefix.
            self._reset_log_after(self.snapshot)
        if self.hard_state is not None and self.hard_state.commit < snapshot_index:
            self.hard_state = HardState(self.hard_state.term, self.hard_state.vote, snapshot_index)

    def _reset_log_after(self, snapshot: Snapshot) -> None:
        assert self._log is not None
        self._log.reset(snapshot.index + 1)
        self._term_runs = []
        self._last_index = snapshot.index

    def _rebuild_term_runs(self) -> None:
        assert self._log is not None
        self._term_runs = []
        offset = self._log.start_offset
        end = self._log.end_offset
        while offset < end:
            records = self._log.read(offset, max_records=_READ_RECORDS_MAX)
            if not records:
                raise StorageError(f"log returned nothing at offset {offset} below its end {end}")
            for record in records:
                self._note_term(record.offset, record.term)
            offset = records[-1].offset + 1
        self._last_index = end - 1

    def _note_term(self, index: int, term: int) -> None:
        if not self._term_runs or self._term_runs[-1][1] != term:
            if self._term_runs and self._term_runs[-1][1] > term:
                raise StorageError(
                    f"term goes down from {self._term_runs[-1][1]} to {term} at index {index}"
                )
            self._term_runs.append((index, term))

    # -- reading -----------------------------------------------------------------------

    @property
    def first_index(self) -> int:
        """Index of the first stored entry (last_index + 1 when there are none)."""
        assert self._log is not None
        return max(self._log.start_offset, self._snapshot_index + 1)

    @property
    def last_index(self) -> int:
        return self._last_index

    @property
    def _snapshot_index(self) -> int:
        return self.snapshot.index if self.snapshot is not None else 0

    def term_at(self, index: int) -> int | None:
        """Term of the entry at `index`, or of the snapshot's last entry; None if unknown."""
        if self.snapshot is not None and index == self.snapshot.index:
            return self.snapshot.term
        if index == 0:
            return 0
        if index < self.first_index or index > self._last_index:
            return None
        position = bisect_right(self._term_runs, (index, float("inf"))) - 1
        return self._term_runs[position][1]

    def _matches(self, index: int, term: int) -> bool:
        assert self._log is not None
        if index == self._log.start_offset - 1 and self._snapshot_index == index:
            return self.snapshot is not None and self.snapshot.term == term
        if index < self._log.start_offset or index > self._last_index:
            return False
        position = bisect_right(self._term_runs, (index, float("inf"))) - 1
        return self._term_runs[position][1] == term

    def entries(self, first: int | None = None, last: int | None = None) -> list[Entry]:
        """Stored entries from `first` (default: after the snapshot) to `last` inclusive."""
        assert self._log is not None
        first = self.first_index if first is None else first
        last = self._last_index if last is None else last
        if first < self.first_index:
            raise StorageError(f"entry {first} is compacted away (first is {self.first_index})")
        out: list[Entry] = []
        offset = first
        end = last + 1
        kinds = EntryKind
        while offset < end:
            records = self._log.read(offset, max_records=min(_READ_RECORDS_MAX, end - offset))
            if not records:
                raise StorageError(f"log returned nothing at offset {offset}")
            for record in records:
                if record.offset >= end:
                    break
                out.append(
                    Entry(record.term, record.offset, kinds(record.properties[0]), record.body)
                )
            offset = records[-1].offset + 1
        return out

    # -- writing -----------------------------------------------------------------------

    def save(
        self,
        hard_state: HardState | None,
        entries: Sequence[Entry],
        snapshot: Snapshot | None,
    ) -> None:
        """Persist one Ready's state durably, in this thread: `write`, then what `flush`
        does in a worker thread."""
        if self.write(hard_state, entries, snapshot):
            if entries:
                self.sync()
            self._write_hard_state_if_changed()

    def write(
        self,
        hard_state: HardState | None,
        entries: Sequence[Entry],
        snapshot: Snapshot | None,
    ) -> bool:
        """The first half of saving a Ready, in the event loop's thread (the log and its
        descriptor pool belong to it): install the snapshot (rare, fsynced here), append the
        entries to the page cache and take the hard state. True if the Ready is not durable
        until `flush` returns: it appended entries, or changed term or vote."""
        if snapshot is not None and snapshot != self.snapshot:
            # (Equal when a Ready is saved again after a full disk refused its entries.)
            self.install_snapshot(snapshot)
        if entries:
            self.append(entries)
        if hard_state is not None:
            self.hard_state = hard_state
        return bool(entries) or not self._term_and_vote_durable()

    async def flush(self) -> None:
        """The second half: fsync what `write` appended, then replace the hard state file if
        term or vote changed, both in worker threads (the event loop carries on meanwhile).
        At most one `flush` at a time, and no `write` while it runs: the host saves one
        Ready at a time."""
        assert self._log is not None
        if self._log.end_offset > self._log.durable_offset:
            durable_end = await self._log.commit()
            assert durable_end == self._last_index + 1, (durable_end, self._last_index)
        if not self._term_and_vote_durable():
            state = self.hard_state
            assert state is not None
            await asyncio.get_running_loop().run_in_executor(
                _HARD_STATE_EXECUTOR,
                write_file_atomically,
                self.directory / HARD_STATE_FILE,
                encode_hard_state(state),
            )
            self._hard_state_durable = state

    def _term_and_vote_durable(self) -> bool:
        state = self.hard_state
        return state is None or self.term_and_vote_durable(state.term, state.vote)

    def _write_hard_state_if_changed(self) -> None:
        if not self._term_and_vote_durable():
            self._write_hard_state()

    def term_and_vote_durable(self, term: int, vote: int | None) -> bool:
        """Whether (term, vote) is what the hard state file already holds."""
        durable = self._hard_state_durable
        return durable is not None and durable.term == term and durable.vote == vote

    def set_hard_state(self, state: HardState) -> None:
        self.hard_state = state
        durable = self._hard_state_durable
        if durable is None or durable.term != state.term or durable.vote != state.vote:
            self._write_hard_state()

    def _write_hard_state(self) -> None:
        assert self.hard_state is not None
        write_file_atomically(self.directory / HARD_STATE_FILE, encode_hard_state(self.hard_state))
        self._hard_state_durable = self.hard_state

    def append(self, entries: Sequence[Entry]) -> None:
        """Append entries, first dropping any stored entries at or after entries[0].index.

        Written but not yet durable; `sync` (or `save`) makes them so.
        """
        assert self._log is not None
        first = entries[0].index
        if first > self._last_index + 1:
            raise StorageError(f"append at {first} leaves a gap after {self._last_index}")
        if first <= self._snapshot_index:
            raise StorageError(
                f"append at {first} overwrites the snapshot ending at {self._snapshot_index}"
            )
        if first <= self._last_index:
            self._log.truncate(first)
            cut = bisect_right(self._term_runs, (first, -1))
            del self._term_runs[cut:]
            self._last_index = first - 1
        runs_before = len(self._term_runs)
        try:
            self._append_from(first, entries)
        except OSError:
            # A full disk may refuse a later batch after earlier ones were written: take
            # those back too, so that saving the same entries again starts from `first`.
            if self._log.end_offset > first:
                self._log.truncate(first)
            del self._term_runs[runs_before:]
            raise
        self._last_index = entries[-1].index

    def _append_from(self, first: int, entries: Sequence[Entry]) -> None:
        assert self._log is not None
        config = self._log_config
        records_max = config.batch_records_max
        # Half the bound leaves room for the batch header and per-record framing.
        bytes_max = min(config.batch_bytes_max, config.segment_bytes_max) // 2
        expected = first
        records: list[tuple[bytes, bytes, bytes, bytes]] = []
        batch_bytes = 0
        batch_term = entries[0].term
        for entry in entries:
            if entry.index != expected:
                raise StorageError(f"entries not contiguous at {entry.index}, expected {expected}")
            if records and (
                entry.term != batch_term
                or len(records) >= records_max
                or batch_bytes + len(entry.data) > bytes_max
            ):
                self._append_batch(records, batch_term, expected - len(records))
                records = []
                batch_bytes = 0
            batch_term = entry.term
            records.append((_EMPTY, _EMPTY, _KIND_BYTES[entry.kind], entry.data))
            batch_bytes += len(entry.data) + _RECORD_OVERHEAD_BYTES
            expected += 1
        self._append_batch(records, batch_term, expected - len(records))

    def _append_batch(
        self, records: list[tuple[bytes, bytes, bytes, bytes]], term: int, first: int
    ) -> None:
        """One log batch of entries of one term, the first at index `first`."""
        assert self._log is not None
        base_offset = self._log.append(records, timestamp_ms=0, term=term)
        assert base_offset == first, (base_offset, first)
        self._note_term(first, term)

    def sync(self) -> None:
        assert self._log is not None
        durable_end = self._log.sync()
        assert durable_end == self._last_index + 1

    def install_snapshot(self, snapshot: Snapshot) -> None:
        """Persist a snapshot received from the leader; it replaces the whole stored log.

        The core discards its log when it installs a snapshot, so the stored log must not
        keep entries the core no longer has (a restart would resurrect them).
        """
        if snapshot.index <= self._snapshot_index:
            raise StorageError(
                f"snapshot at {snapshot.index} is not newer than {self._snapshot_index}"
            )
        write_file_atomically(
            self.directory / SNAPSHOT_FILE, _seal(_SNAPSHOT_MAGIC, encode_snapshot(snapshot))
        )
        self.snapshot = snapshot
        self._reset_log_after(snapshot)
        self._raise_commit_to(snapshot.index)

    def compact(self, snapshot: Snapshot) -> None:
        """Persist the application's own snapshot and drop whole segments it covers."""
        if snapshot.index <= self._snapshot_index:
            return
        if snapshot.index > self._last_index or self.term_at(snapshot.index) != snapshot.term:
            raise StorageError(
                f"snapshot at {snapshot.index} (term {snapshot.term}) is not in the log"
            )
        write_file_atomically(
            self.directory / SNAPSHOT_FILE, _seal(_SNAPSHOT_MAGIC, encode_snapshot(snapshot))
        )
        self.snapshot = snapshot
        self._drop_before_snapshot()
        self._raise_commit_to(snapshot.index)
        if self.hard_state is not None and self.hard_state != self._hard_state_durable:
            self._write_hard_state()

    def _drop_before_snapshot(self) -> None:
        assert self._log is not None and self.snapshot is not None
        self._log.delete_before(self.snapshot.index + 1)
        first = self.first_index
        while len(self._term_runs) > 1 and self._term_runs[1][0] <= first:
            del self._term_runs[0]

    def _raise_commit_to(self, index: int) -> None:
        if self.hard_state is not None and self.hard_state.commit < index:
            self.hard_state = HardState(self.hard_state.term, self.hard_state.vote, index)

    def close(self) -> None:
        if self._log is None:
            return
        try:
            if self.hard_state is not None and self.hard_state != self._hard_state_durable:
                self._write_hard_state()
        finally:
            self._log.close()
            self._log = None

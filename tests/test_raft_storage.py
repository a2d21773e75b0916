"""Durable Raft storage: what is saved comes back after a restart, and crashes cut cleanly."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from warrenmq.cluster.raft.core import HardState
from warrenmq.cluster.raft.messages import Entry, EntryKind, Snapshot, encode_snapshot
from warrenmq.cluster.storage import (
    _SNAPSHOT_MAGIC,
    HARD_STATE_FILE,
    LOG_DIR,
    SNAPSHOT_FILE,
    RaftStorage,
    StorageError,
    _seal,
    write_file_atomically,
)
from warrenmq.log import LogConfig

SMALL_SEGMENTS = LogConfig(segment_bytes_max=512, index_interval_bytes=64)


def entries(first: int, last: int, term: int, kind: EntryKind = EntryKind.NORMAL) -> list[Entry]:
    return [Entry(term, i, kind, b"data-%d-%d" % (term, i)) for i in range(first, last + 1)]


def crash_image(directory: Path, tmp_path: Path, name: str = "image") -> Path:
    """What a process crash leaves on disk: everything written, whether fsynced or not."""
    image = tmp_path / name
    shutil.copytree(directory, image)
    return image


def test_fresh_storage_is_empty(tmp_path):
    storage = RaftStorage.open(tmp_path / "n")
    assert storage.hard_state is None
    assert storage.snapshot is None
    assert (storage.first_index, storage.last_index) == (1, 0)
    assert storage.entries() == []
    storage.close()


def test_entries_and_hard_state_survive_a_crash(tmp_path):
    directory = tmp_path / "n"
    storage = RaftStorage.open(directory)
    written = entries(1, 5, 1) + entries(6, 7, 2)
    written[2] = Entry(1, 3, EntryKind.CONFIG, b"\x01\x02")
    storage.save(HardState(2, 3, 4), written, None)
    image = crash_image(directory, tmp_path)
    storage.close()

    reopened = RaftStorage.open(image)
    assert reopened.hard_state == HardState(2, 3, 4)
    assert reopened.entries() == written
    assert reopened.last_index == 7
    assert [reopened.term_at(i) for i in (0, 1, 5, 6, 7, 8)] == [0, 1, 1, 2, 2, None]
    reopened.close()


def test_conflicting_suffix_is_replaced(tmp_path):
    directory = tmp_path / "n"
    storage = RaftStorage.open(directory)
    storage.save(HardState(1, 1, 0), entries(1, 10, 1), None)
    storage.save(HardState(3, 2, 0), entries(6, 8, 3), None)
    assert storage.entries() == entries(1, 5, 1) + entries(6, 8, 3)
    assert storage.term_at(9) is None
    storage.close()
    reopened = RaftStorage.open(directory)
    assert reopened.entries() == entries(1, 5, 1) + entries(6, 8, 3)
    reopened.close()


def test_a_large_append_is_split_into_batches_the_log_accepts(tmp_path):
    config = LogConfig(segment_bytes_max=4096, index_interval_bytes=256, batch_records_max=7)
    directory = tmp_path / "n"
    storage = RaftStorage.open(directory, config)
    written = [Entry(1, i, EntryKind.NORMAL, bytes([i % 251]) * 100) for i in range(1, 101)]
    written += entries(101, 130, 2)
    storage.save(HardState(2, 1, 0), written, None)
    assert storage.entries() == written
    storage.close()
    assert RaftStorage.open(directory, config).entries() == written


def test_appends_must_be_contiguous(tmp_path):
    storage = RaftStorage.open(tmp_path / "n")
    storage.save(None, entries(1, 3, 1), None)
    with pytest.raises(StorageError):
        storage.append(entries(5, 6, 1))
    storage.close()


def test_commit_only_changes_are_not_fsynced_but_term_and_vote_changes_are(tmp_path):
    directory = tmp_path / "n"
    storage = RaftStorage.open(directory)
    storage.save(HardState(1, 1, 0), entries(1, 3, 1), None)
    on_disk = (directory / HARD_STATE_FILE).read_bytes()
    storage.save(HardState(1, 1, 3), [], None)
    assert (directory / HARD_STATE_FILE).read_bytes() == on_disk, "commit alone is a hint"
    crashed = RaftStorage.open(crash_image(directory, tmp_path, "a"))
    assert crashed.hard_state == HardState(1, 1, 0)
    crashed.close()
    storage.save(HardState(2, None, 3), [], None)
    crashed = RaftStorage.open(crash_image(directory, tmp_path, "b"))
    assert crashed.hard_state == HardState(2, None, 3)
    crashed.close()
    storage.save(HardState(2, None, 3), [], None)
    storage.set_hard_state(HardState(2, None, 3))
    storage.close()
    assert RaftStorage.open(directory).hard_state == HardState(2, None, 3)


def test_commit_written_on_close(tmp_path):
    directory = tmp_path / "n"
    storage = RaftStorage.open(directory)
    storage.save(HardState(1, 1, 0), entries(1, 3, 1), None)
    storage.save(HardState(1, 1, 2), [], None)
    storage.close()
    assert RaftStorage.open(directory).hard_state == HardState(1, 1, 2)


def test_torn_log_tail_is_cut_at_the_last_whole_batch(tmp_path):
    directory = tmp_path / "n"
    storage = RaftStorage.open(directory)
    storage.save(HardState(1, 1, 0), entries(1, 4, 1), None)
    storage.save(None, entries(5, 8, 1), None)
    storage.close()
    segment = max((directory / LOG_DIR).glob("*.log"))
    data = segment.read_bytes()
    # The second batch was half written when the machine died.
    segment.write_bytes(data[: len(data) - 20])
    reopened = RaftStorage.open(directory)
    assert reopened.entries() == entries(1, 4, 1)
    reopened.save(None, entries(5, 6, 2), None)
    assert reopened.entries() == entries(1, 4, 1) + entries(5, 6, 2)
    reopened.close()


def test_leftover_temporary_file_is_ignored_and_removed(tmp_path):
    directory = tmp_path / "n"
    storage = RaftStorage.open(directory)
    storage.save(HardState(4, 2, 0), [], None)
    storage.close()
    (directory / (HARD_STATE_FILE + ".tmp")).write_bytes(b"half a hard st")
    reopened = RaftStorage.open(directory)
    assert reopened.hard_state == HardState(4, 2, 0)
    assert not (directory / (HARD_STATE_FILE + ".tmp")).exists()
    reopened.close()


def test_corrupt_hard_state_is_refused(tmp_path):
    directory = tmp_path / "n"
    storage = RaftStorage.open(directory)
    storage.save(HardState(4, 2, 0), [], None)
    storage.close()
    raw = bytearray((directory / HARD_STATE_FILE).read_bytes())
    raw[-1] ^= 0xFF
    (directory / HARD_STATE_FILE).write_bytes(bytes(raw))
    with pytest.raises(StorageError):
        RaftStorage.open(directory)


def test_installed_snapshot_replaces_the_log(tmp_path):
    directory = tmp_path / "n"
    storage = RaftStorage.open(directory)
    storage.save(HardState(2, 1, 3), entries(1, 3, 1) + entries(4, 5, 2), None)
    snapshot = Snapshot(20, 3, (1, 2, 3), b"state")
    storage.save(HardState(3, None, 20), entries(21, 22, 3), snapshot)
    assert storage.snapshot == snapshot
    assert (storage.first_index, storage.last_index) == (21, 22)
    assert storage.term_at(20) == 3
    assert storage.term_at(5) is None
    image = crash_image(directory, tmp_path)
    storage.close()
    reopened = RaftStorage.open(image)
    assert reopened.snapshot == snapshot
    assert reopened.entries() == entries(21, 22, 3)
    assert reopened.hard_state == HardState(3, None, 20)
    reopened.close()


def test_crash_between_snapshot_file_and_log_reset_is_repaired_on_open(tmp_path):
    directory = tmp_path / "n"
    storage = RaftStorage.open(directory)
    storage.save(HardState(2, 1, 3), entries(1, 5, 1), None)
    storage.close()
    # The snapshot file made it to disk; resetting the log did not.
    snapshot = Snapshot(9, 2, (1, 2, 3), b"state")
    write_file_atomically(
        directory / SNAPSHOT_FILE, _seal(_SNAPSHOT_MAGIC, encode_snapshot(snapshot))
    )
    reopened = RaftStorage.open(directory)
    assert reopened.snapshot == snapshot
    assert (reopened.first_index, reopened.last_index) == (10, 9)
    assert reopened.entries() == []
    assert reopened.hard_state.commit == 9, "a snapshot's entries are committed"
    reopened.save(None, entries(10, 11, 2), None)
    reopened.close()
    assert RaftStorage.open(directory).entries() == entries(10, 11, 2)


def test_matching_snapshot_left_by_a_crash_keeps_the_log(tmp_path):
    directory = tmp_path / "n"
    storage = RaftStorage.open(directory)
    storage.save(HardState(1, 1, 5), entries(1, 8, 1), None)
    storage.close()
    snapshot = Snapshot(5, 1, (1,), b"state")
    write_file_atomically(
        directory / SNAPSHOT_FILE, _seal(_SNAPSHOT_MAGIC, encode_snapshot(snapshot))
    )
    reopened = RaftStorage.open(directory)
    assert reopened.entries() == entries(6, 8, 1)
    reopened.close()


def test_compaction_keeps_later_entries_and_drops_covered_segments(tmp_path):
    directory = tmp_path / "n"
    storage = RaftStorage.open(directory, SMALL_SEGMENTS)
    for first in range(1, 200, 10):
        storage.save(HardState(1, 1, first - 1), entries(first, first + 9, 1), None)
    segments_before = len(list((directory / LOG_DIR).glob("*.log")))
    snapshot = Snapshot(150, 1, (1, 2, 3), b"image")
    storage.compact(snapshot)
    segments_after = len(list((directory / LOG_DIR).glob("*.log")))
    assert segments_after < segments_before
    assert storage.first_index == 151
    assert storage.entries() == entries(151, 200, 1)
    with pytest.raises(StorageError):
        storage.entries(100, 120)
    storage.close()
    reopened = RaftStorage.open(directory, SMALL_SEGMENTS)
    assert reopened.snapshot == snapshot
    assert reopened.entries() == entries(151, 200, 1)
    assert reopened.term_at(150) == 1
    reopened.close()


def test_compaction_refuses_a_snapshot_that_is_not_in_the_log(tmp_path):
    storage = RaftStorage.open(tmp_path / "n")
    storage.save(HardState(1, 1, 0), entries(1, 5, 1), None)
    with pytest.raises(StorageError):
        storage.compact(Snapshot(5, 2, (1,), b""))
    with pytest.raises(StorageError):
        storage.compact(Snapshot(6, 1, (1,), b""))
    storage.close()


operations = st.lists(
    st.one_of(
        # (append, how far back to start, count, term bump)
        st.tuples(st.just("append"), st.integers(0, 6), st.integers(1, 8), st.integers(0, 1)),
        st.tuples(st.just("crash"), st.just(0), st.just(0), st.just(0)),
        st.tuples(st.just("compact"), st.integers(0, 5), st.just(0), st.just(0)),
    ),
    max_size=25,
)


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations)
def test_storage_matches_a_model_across_crashes(tmp_path_factory, ops):
    """Random appends (with conflicts), compactions and crashes against a list model."""
    base = tmp_path_factory.mktemp("model")
    directory = base / "n0"
    storage = RaftStorage.open(directory, SMALL_SEGMENTS)
    model: list[Entry] = []  # every entry after the snapshot
    snapshot_index = 0
    term = 1
    crashes = 0
    for op, back, count, bump in ops:
        if op == "append":
            last = snapshot_index + len(model)
            first = max(snapshot_index + 1, last + 1 - back)
            term += bump
            new = entries(first, first + count - 1, term)
            storage.save(HardState(term, None, 0), new, None)
            del model[first - snapshot_index - 1 :]
            model.extend(new)
        elif op == "compact" and len(model) > back:
            index = snapshot_index + len(model) - back
            storage.compact(Snapshot(index, model[index - snapshot_index - 1].term, (1,), b"s"))
            del model[: index - snapshot_index]
            snapshot_index = index
        elif op == "crash":
            crashes += 1
            image = crash_image(directory, base, f"n{crashes}")
            storage.close()
            directory = image
            storage = RaftStorage.open(directory, SMALL_SEGMENTS)
        assert storage.entries() == model
        assert storage.last_index == snapshot_index + len(model)
        for entry in model:
            assert storage.term_at(entry.index) == entry.term
    storage.close()

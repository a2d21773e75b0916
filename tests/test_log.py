"""Unit tests of the partition log: each operation, its bounds and its on-disk layout."""

import asyncio
import gc
import os
import threading
import tracemalloc
from concurrent.futures import ThreadPoolExecutor

import pytest
from doubles import HeldExecutor
from hypothesis import given, settings
from hypothesis import strategies as st

from warrenmq.log import (
    CorruptBatchError,
    LogConfig,
    LogError,
    OffsetOutOfRangeError,
    PartitionLog,
    partition,
)
from warrenmq.log import batch as batch_codec
from warrenmq.log.segment import READ_CHUNK_BYTES


def records(n, start=0, body_bytes=8):
    return [
        (
            b"amq.direct",
            b"key.%d" % i,
            b"\x80\x00" + bytes([i % 256]),
            bytes([i % 256]) * body_bytes,
        )
        for i in range(start, start + n)
    ]


def all_records(log):
    return log.read(log.start_offset, max_records=10**9, max_bytes=1 << 40)


def raw(rs):
    return [(r.exchange, r.routing_key, r.properties, r.body) for r in rs]


SMALL = LogConfig(segment_bytes_max=4096, index_interval_bytes=256, tail_cache_bytes_max=1024)


def test_append_assigns_dense_offsets_and_reads_back_every_field(tmp_path):
    with PartitionLog.open(tmp_path) as log:
        assert (log.start_offset, log.end_offset) == (0, 0)
        assert log.append(records(3), timestamp_ms=1000, term=7) == 0
        assert log.append(records(2, 3), timestamp_ms=2000, term=8) == 3
        got = all_records(log)
    assert [r.offset for r in got] == [0, 1, 2, 3, 4]
    assert [r.timestamp_ms for r in got] == [1000] * 3 + [2000] * 2
    assert [r.term for r in got] == [7] * 3 + [8] * 2
    assert raw(got) == records(5)


def test_segments_are_named_like_kafka_and_roll_at_the_size_bound(tmp_path):
    with PartitionLog.open(tmp_path, SMALL) as log:
        for i in range(40):
            log.append(records(5, i * 5), timestamp_ms=i)
        assert log.segment_count > 1
        names = sorted(p.name for p in tmp_path.iterdir())
    bases = sorted(int(n.split(".")[0]) for n in names if n.endswith(".log"))
    assert bases[0] == 0
    for base in bases:
        stem = f"{base:020d}"
        assert {f"{stem}.log", f"{stem}.index", f"{stem}.timeindex"} <= set(names)
        assert os.path.getsize(tmp_path / f"{stem}.log") <= SMALL.segment_bytes_max


def test_read_budgets_bound_the_result_but_always_make_progress(tmp_path):
    with PartitionLog.open(tmp_path, SMALL) as log:
        for i in range(60):
            log.append(records(5, i * 5), timestamp_ms=i)
        assert len(log.read(0, max_records=7)) == 7
        one = log.read(3, max_records=100, max_bytes=1)
        assert [r.offset for r in one] == [3]
        some = log.read(10, max_records=100, max_bytes=200)
        assert 1 < len(some) < 100
        assert [r.offset for r in some] == list(range(10, 10 + len(some)))
        assert log.read(log.end_offset) == []
        assert log.delete_before(150) > 0
        with pytest.raises(OffsetOutOfRangeError):
            log.read(log.start_offset - 1)


def stored_batches(data):
    """(header, records) of each batch in `read_batches` bytes, CRC-checked."""
    found = []
    position = 0
    while position < len(data):
        header = batch_codec.read_header(data, position)
        batch_codec.verify_crc(data, position, header)
        found.append(batch_codec.decode_records(data, position, header, header.base_offset))
        position += header.total_bytes
    return found


def read_batches(log, offset, end_offset, max_bytes):
    return asyncio.run(log.read_batches(offset, end_offset, max_bytes))


def test_read_batches_returns_stored_batches_across_segments_within_the_budget(tmp_path):
    with PartitionLog.open(tmp_path, SMALL) as log:
        for i in range(60):
            log.append(records(5, i * 5), timestamp_ms=i)
        assert log.segment_count > 2
        offset, seen = 7, []
        while data := read_batches(log, offset, log.end_offset, 1000):
            batches = stored_batches(data)
            assert len(batches) == 1 or len(data) <= 1000
            seen += [r for batch in batches for r in batch if r.offset >= offset]
            offset = batches[-1][-1].offset + 1
        assert raw(seen) == records(300)[7:]
        # The batch holding the offset, whole; at least one batch whatever the budget.
        (first,) = stored_batches(read_batches(log, 7, log.end_offset, 1))
        assert [r.offset for r in first] == [5, 6, 7, 8, 9]
        # Nothing at or past `end_offset`, a batch boundary such as the durable offset.
        assert read_batches(log, 7, 10, 1 << 20) == read_batches(log, 7, 10, 1)
        assert read_batches(log, 10, 10, 1 << 20) == b""
        assert log.delete_before(150) > 0
        with pytest.raises(OffsetOutOfRangeError):
            read_batches(log, log.start_offset - 1, log.end_offset, 1000)


def test_read_batches_reads_verbatim_in_a_worker_thread_while_retention_runs(tmp_path, monkeypatch):
    with PartitionLog.open(tmp_path, SMALL) as log:
        for i in range(60):
            log.append(records(5, i * 5), timestamp_ms=i)
        stored = b"".join(path.read_bytes() for path in sorted(tmp_path.glob("*.log")))
        assert log.segment_count > 2
        assert read_batches(log, 0, log.end_offset, 1 << 20) == stored

        reading_threads = []
        in_read = threading.Event()
        go_on = threading.Event()
        real_pread = os.pread

        def pread(fd, length, position):
            reading_threads.append(threading.current_thread().name)
            in_read.set()
            assert go_on.wait(10)
            return real_pread(fd, length, position)

        async def scenario():
            reading = asyncio.create_task(log.read_batches(0, log.end_offset, 1 << 20))
            assert await asyncio.to_thread(in_read.wait, 10)
            # The loop is free while the read waits on the disk: retention deletes the segment
            # being read, which the read still reads whole.
            assert log.delete_before(150) > 0
            go_on.set()
            return await reading

        monkeypatch.setattr(os, "pread", pread)
        data = asyncio.run(scenario())
        assert data == stored
        assert reading_threads and all(n.startswith("warren-read") for n in reading_threads)


def test_reads_of_fresh_data_come_from_the_tail_cache(tmp_path, monkeypatch):
    with PartitionLog.open(tmp_path, LogConfig(tail_cache_bytes_max=1 << 20)) as log:
        log.append(records(10))
        monkeypatch.setattr(os, "pread", lambda *a: pytest.fail("read went to disk"))
        assert raw(log.read(4, max_records=3)) == records(3, 4)


def test_the_tail_cache_holds_no_more_than_its_bound(tmp_path):
    """Regression: evicted batches stayed referenced until 1024 of them had piled up."""
    tracemalloc.start()
    try:
        with PartitionLog.open(tmp_path, LogConfig(tail_cache_bytes_max=64 << 10)) as log:
            before, _ = tracemalloc.get_traced_memory()
            for _ in range(2000):
                log.append([(b"", b"", b"", os.urandom(1024)) for _ in range(10)])
            after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert after - before < 2 << 20, f"{(after - before) >> 10} KiB retained for a 64 KiB cache"


def collector_walk():
    """The objects the collector tracks, and the references a full collection follows."""
    tracked = gc.get_objects()
    return len(tracked), sum(len(gc.get_referents(o)) for o in tracked)


def test_the_tail_cache_leaves_the_collector_nothing_to_walk_per_record(tmp_path):
    """Regression: the cache kept every appended record tuple, and those piled up in the
    collector's youngest generation, making each young collection a 5-20 ms stall; then it
    kept every field in one list, which each full collection walked whole (about 25 ms a
    collection with 128 MiB of small messages cached)."""
    batches = 500
    for cache_bytes in (4 << 20, 64 << 10):  # all of it cached; evicting and compacting
        config = LogConfig(tail_cache_bytes_max=cache_bytes)
        with PartitionLog.open(tmp_path / str(cache_bytes), config) as log:
            gc.collect()
            gc.disable()
            try:
                objects_before, walked_before = collector_walk()
                for i in range(batches):
                    log.append(records(10, i * 10))
                gc.collect(generation=0)
                objects_after, walked_after = collector_walk()
            finally:
                gc.enable()
            assert objects_after - objects_before <= 64
            # The cache's columns hold an entry per batch (5 of them), not one per record or
            # field (10 records of 4 fields a batch here).
            assert walked_after - walked_before <= 6 * batches
            assert raw(log.read(0, max_records=batches * 10)) == records(batches * 10)
            assert [r.offset for r in log.read(4321, max_records=3)] == [4321, 4322, 4323]
            assert raw(log.read(4990, max_records=100)) == records(10, 4990)


@settings(max_examples=60)
@given(
    sizes=st.lists(st.integers(1, 12), min_size=1, max_size=160),
    cache_bytes=st.integers(0, 3000),
    reads=st.lists(
        st.tuples(st.integers(0, 500), st.integers(1, 30), st.integers(1, 2000)), max_size=10
    ),
)
def test_reads_through_the_tail_cache_match_what_was_appended(
    tmp_path_factory, sizes, cache_bytes, reads
):
    directory = tmp_path_factory.mktemp("cache")
    appended = []
    with PartitionLog.open(directory, LogConfig(tail_cache_bytes_max=cache_bytes)) as log:
        for size in sizes:
            batch = records(size, len(appended), body_bytes=size)
            log.append(batch)
            appended += batch
            for offset, count_max, bytes_max in reads:
                offset %= len(appended)
                got = log.read(offset, max_records=count_max, max_bytes=bytes_max)
                assert got and len(got) <= count_max
                assert [r.offset for r in got] == list(range(offset, offset + len(got)))
                assert raw(got) == appended[offset : offset + len(got)]


def test_reads_older_than_the_cache_come_from_disk_and_match(tmp_path):
    with PartitionLog.open(tmp_path, SMALL) as log:
        for i in range(50):
            log.append(records(3, i * 3), timestamp_ms=i)
        assert raw(all_records(log)) == records(150)


def test_batches_larger_than_the_read_chunk_survive_reopen(tmp_path):
    config = LogConfig(tail_cache_bytes_max=0)
    big = records(4, body_bytes=READ_CHUNK_BYTES)
    with PartitionLog.open(tmp_path, config) as log:
        log.append(big)
        log.append(big)
        log.sync()
    with PartitionLog.open(tmp_path, config) as log:
        assert log.end_offset == 8
        assert raw(all_records(log)) == big + big


def test_offset_for_timestamp_agrees_with_a_linear_scan(tmp_path):
    with PartitionLog.open(tmp_path, SMALL) as log:
        for i in range(60):
            log.append(records(1 + i % 4, 0), timestamp_ms=1000 + 10 * (i // 2))
        everything = all_records(log)
        for t in range(990, 1320, 3):
            expected = next((r.offset for r in everything if r.timestamp_ms >= t), None)
            assert log.offset_for_timestamp(t) == expected, t


def test_timestamps_never_go_backwards(tmp_path):
    with PartitionLog.open(tmp_path) as log:
        log.append(records(1), timestamp_ms=5000)
        log.append(records(1), timestamp_ms=4000)
        assert [r.timestamp_ms for r in all_records(log)] == [5000, 5000]


def test_bounds_are_enforced(tmp_path):
    config = LogConfig(
        record_bytes_max=100, batch_records_max=3, batch_bytes_max=300, segment_bytes_max=1000
    )
    with PartitionLog.open(tmp_path, config) as log:
        with pytest.raises(LogError, match="record_bytes_max"):
            log.append([(b"", b"", b"", b"x" * 100)])
        with pytest.raises(LogError, match="batch_records_max"):
            log.append(records(4))
        with pytest.raises(LogError, match="batch_bytes_max"):
            log.append([(b"", b"", b"", b"x" * 80)] * 3)
        with pytest.raises(LogError, match="255"):
            log.append([(b"e" * 256, b"", b"", b"")])
        with pytest.raises(LogError, match="at least one"):
            log.append([])
        assert log.end_offset == 0
        assert log.append(records(3)) == 0
    with pytest.raises(LogError):
        LogConfig(segment_bytes_max=0)
    with pytest.raises(LogError):
        LogConfig(segment_bytes_max=1 << 33)


def test_truncate_drops_the_tail_even_inside_a_batch_and_survives_reopen(tmp_path):
    with PartitionLog.open(tmp_path, SMALL) as log:
        for i in range(30):
            log.append(records(4, i * 4), timestamp_ms=100 + i, term=1 + i // 10)
        log.truncate(57)
        assert log.end_offset == 57
        assert log.last_term == 2
        assert raw(all_records(log)) == records(57)
        assert log.append(records(1, 1000), term=9) == 57
        log.sync()
    with PartitionLog.open(tmp_path, SMALL) as log:
        got = all_records(log)
        assert raw(got) == records(57) + records(1, 1000)
        assert log.last_term == 9


def test_truncate_to_the_start_and_reset(tmp_path):
    with PartitionLog.open(tmp_path, SMALL) as log:
        log.append(records(10))
        log.truncate(0)
        assert (log.start_offset, log.end_offset) == (0, 0)
        log.append(records(2))
        log.reset(500)
        assert (log.start_offset, log.end_offset) == (500, 500)
        assert log.append(records(1)) == 500
        log.sync()
    with PartitionLog.open(tmp_path, SMALL) as log:
        assert (log.start_offset, log.end_offset) == (500, 501)


def test_delete_before_removes_only_whole_segments_below_the_offset(tmp_path):
    with PartitionLog.open(tmp_path, SMALL) as log:
        for i in range(60):
            log.append(records(5, i * 5))
        first_segments = log.segment_count
        start = log.delete_before(123)
        assert start <= 123
        assert log.segment_count < first_segments
        assert raw(log.read(start, max_records=10**6, max_bytes=1 << 30)) == records(
            300 - start, start
        )
        log.delete_before(10**9)
        assert log.segment_count == 1, "the active segment is never deleted"
        assert log.end_offset == 300


def test_deleted_segments_are_unlinked_by_the_executor_and_leftovers_at_open(tmp_path, monkeypatch):
    executor = HeldExecutor()
    monkeypatch.setattr(partition, "_UNLINK_EXECUTOR", executor)
    log = PartitionLog.open(tmp_path, SMALL)
    for i in range(60):
        log.append(records(5, i * 5))
    log.sync()
    kept_from = log.delete_before(123)
    assert executor.jobs, "the unlink is handed to the executor"
    retired = sorted(p.name for p in tmp_path.glob("*.deleted"))
    assert retired and all(int(name.split(".")[0]) < kept_from for name in retired)
    assert min(int(p.stem) for p in tmp_path.glob("*.log")) == kept_from
    log.close()
    # A crash before the worker ran: the next open deletes the renamed files.
    with PartitionLog.open(tmp_path, SMALL) as log:
        assert not list(tmp_path.glob("*.deleted"))
        assert log.start_offset == kept_from
        assert raw(all_records(log)) == records(300 - kept_from, kept_from)
    executor.run_all()  # a late unlink of files already gone is harmless


def test_deleted_segment_files_are_gone_once_the_worker_ran(tmp_path, monkeypatch):
    executor = ThreadPoolExecutor(max_workers=1)
    monkeypatch.setattr(partition, "_UNLINK_EXECUTOR", executor)
    try:
        with PartitionLog.open(tmp_path, SMALL) as log:
            for i in range(60):
                log.append(records(5, i * 5))
            log.delete_before(10**9)
            executor.shutdown(wait=True)
            assert [p.name for p in tmp_path.glob("*.log")] == [f"{log.start_offset:020d}.log"]
            assert not list(tmp_path.glob("*.deleted"))
    finally:
        executor.shutdown(wait=True)


def test_retention_by_age_deletes_only_wholly_expired_segments(tmp_path):
    config = LogConfig(segment_bytes_max=4096, retention_ms=1000)
    with PartitionLog.open(tmp_path, config) as log:
        for i in range(100):
            log.append(records(5), timestamp_ms=10_000 + i * 100)
        everything = all_records(log)
        now_ms = 10_000 + 50 * 100 + 1000
        log.apply_retention(now_ms)
        kept = all_records(log)
        deleted = everything[: len(everything) - len(kept)]
        assert deleted, "some segments had expired wholly"
        assert kept == everything[len(deleted) :]
        assert all(r.timestamp_ms < now_ms - 1000 for r in deleted)
        assert kept[0].timestamp_ms < now_ms - 1000, (
            "whole segments only: the first kept one straddles the limit"
        )


def test_retention_by_bytes_keeps_at_least_the_limit(tmp_path):
    config = LogConfig(segment_bytes_max=4096, retention_bytes=10_000)
    with PartitionLog.open(tmp_path, config) as log:
        for i in range(100):
            log.append(records(5, i * 5))
        deleted = log.apply_retention(now_ms=0)
        assert deleted > 0
        assert log.size_bytes >= 10_000
        assert log.size_bytes - 4096 < 10_000
        assert raw(all_records(log)) == records(500 - log.start_offset, log.start_offset)


def test_sync_reports_the_durable_offset(tmp_path):
    with PartitionLog.open(tmp_path) as log:
        log.append(records(3))
        assert log.durable_offset == 0
        assert log.sync() == 3
        assert log.durable_offset == 3


def test_group_commit_coalesces_concurrent_committers(tmp_path, monkeypatch):
    from warrenmq.log import partition

    calls = []
    real = partition._fsync_and_close

    def counting(fds):
        calls.append(threading.current_thread().name)
        real(fds)

    monkeypatch.setattr(partition, "_fsync_and_close", counting)

    async def scenario():
        with PartitionLog.open(tmp_path) as log:
            committers = []
            for i in range(50):
                log.append(records(1, i))
                committers.append(asyncio.ensure_future(log.commit()))
            results = await asyncio.gather(*committers)
            assert all(r == 50 for r in results)
            assert log.durable_offset == 50

    asyncio.run(scenario())
    assert 1 <= len(calls) <= 2, calls
    assert all(name != threading.main_thread().name for name in calls)


def test_a_failed_fsync_poisons_the_log(tmp_path, monkeypatch):
    from warrenmq.log import partition

    def failing(fds):
        for fd in fds:
            os.close(fd)
        raise OSError(5, "Input/output error")

    with PartitionLog.open(tmp_path) as log:
        log.append(records(1))
        monkeypatch.setattr(partition, "_fsync_and_close", failing)
        with pytest.raises(OSError):
            asyncio.run(log.commit())
        with pytest.raises(LogError, match="failed an fsync"):
            log.append(records(1))


def test_corrupted_batch_is_never_returned_by_a_read(tmp_path):
    config = LogConfig(segment_bytes_max=4096, tail_cache_bytes_max=0)
    with PartitionLog.open(tmp_path, config) as log:
        for i in range(30):
            log.append(records(2, i * 2))
        first = tmp_path / f"{0:020d}.log"
        data = bytearray(first.read_bytes())
        data[batch_codec.HEADER_BYTES + 20] ^= 0xFF
        first.write_bytes(bytes(data))
        with pytest.raises(CorruptBatchError):
            log.read(0)


def test_a_closed_log_refuses_work(tmp_path):
    log = PartitionLog.open(tmp_path)
    log.close()
    with pytest.raises(LogError, match="closed"):
        log.append(records(1))


def test_batch_bounds_keep_every_batch_within_count_and_bytes():
    record_bytes = batch_codec.RECORD_HEADER_BYTES + 100
    small = [(b"", b"", b"", b"x" * 100)] * 10
    bytes_max = batch_codec.HEADER_BYTES + 3 * record_bytes
    assert batch_codec.batch_bounds(small, 4, bytes_max) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert batch_codec.batch_bounds(small, 2, 1 << 20) == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10)]
    # A record larger than any batch stands alone, so its refusal takes nothing else with it.
    mixed = [small[0], (b"", b"", b"", b"y" * 5000), small[0]]
    assert batch_codec.batch_bounds(mixed, 100, 1000) == [(0, 1), (1, 2), (2, 3)]
    assert batch_codec.batch_bounds([], 10, 1000) == []


def test_a_batch_larger_than_a_segment_gets_a_segment_of_its_own(tmp_path):
    config = LogConfig(segment_bytes_max=4096, batch_bytes_max=1 << 20, record_bytes_max=1 << 20)
    big = [(b"", b"k", b"", b"b" * 100_000)]
    with PartitionLog.open(tmp_path, config) as log:
        log.append(records(3))
        assert log.append(big) == 3
        log.append(records(2, 3))
        assert log.segment_count == 3
        log.sync()
    with PartitionLog.open(tmp_path, config) as log:
        got = all_records(log)
    assert raw(got) == records(3) + big + records(2, 3)


class _FailingWrites:
    """Makes os.writev / os.write fail (or write short) while armed, as a full disk does."""

    def __init__(self, monkeypatch, short=False, index_only=False):
        self.armed = False
        real_writev, real_write = os.writev, os.write

        def writev(fd, buffers):
            if self.armed and not index_only:
                if short:
                    return real_writev(fd, [bytes(buffers[0])[:7]])
                raise OSError(28, "No space left on device")
            return real_writev(fd, buffers)

        def write(fd, data):
            if self.armed:
                raise OSError(28, "No space left on device")
            return real_write(fd, data)

        monkeypatch.setattr(os, "writev", writev)
        monkeypatch.setattr(os, "write", write)


@pytest.mark.parametrize("mode", ["enospc", "short", "index"])
def test_a_failed_append_leaves_nothing_behind_and_the_log_stays_usable(
    tmp_path, monkeypatch, mode
):
    failing = _FailingWrites(monkeypatch, short=mode == "short", index_only=mode == "index")
    config = LogConfig(segment_bytes_max=1 << 20, index_interval_bytes=64)
    with PartitionLog.open(tmp_path, config) as log:
        log.append(records(5))
        size = log.size_bytes
        failing.armed = True
        with pytest.raises(OSError):
            log.append(records(5, 5))
        failing.armed = False
        assert (log.end_offset, log.size_bytes) == (5, size)
        assert log.append(records(5, 100)) == 5
        log.sync()
        assert raw(all_records(log)) == records(5) + records(5, 100)
    with PartitionLog.open(tmp_path, config) as log:
        assert raw(all_records(log)) == records(5) + records(5, 100)


def test_open_fsyncs_nothing_and_the_first_sync_covers_the_directory(tmp_path, monkeypatch):
    """Opening 100,000 idle queues must not cost 200,000 directory fsyncs; what the log
    vouches for is only ever vouched for by a sync, which fsyncs the directory first time."""
    fsyncs = []
    real_fsync = os.fsync

    def recording(fd):
        fsyncs.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    with PartitionLog.open(tmp_path, SMALL) as log:
        log.append(records(3))
        log.sync()
    monkeypatch.setattr(os, "fsync", recording)
    with PartitionLog.open(tmp_path, SMALL) as log:
        assert fsyncs == []
        log.append(records(1, 3))
        log.sync()
        assert fsyncs == [str(tmp_path / f"{0:020d}.log"), str(tmp_path)]
        log.append(records(1, 4))
        log.sync()
        assert fsyncs[2:] == [str(tmp_path / f"{0:020d}.log")]


def test_index_files_are_created_with_their_first_entry(tmp_path):
    """An idle log (a queue that never held index_interval_bytes) is one file, not three."""
    stem = f"{0:020d}"
    with PartitionLog.open(tmp_path, SMALL) as log:
        assert sorted(p.name for p in tmp_path.glob(stem + "*")) == [f"{stem}.log"]
        log.append(records(1))
        assert not (tmp_path / f"{stem}.index").exists()
        while not (tmp_path / f"{stem}.index").exists():
            log.append(records(1))
        log.sync()
        end = log.end_offset
    with PartitionLog.open(tmp_path, SMALL) as log:
        assert (tmp_path / f"{stem}.index").stat().st_size > 0
        assert log.end_offset == end
        # Cut back below the first entry: the index is empty again, so there is no file.
        log.truncate(1)
        assert not (tmp_path / f"{stem}.index").exists()
        assert not (tmp_path / f"{stem}.timeindex").exists()
        assert raw(all_records(log)) == records(1)


def test_a_segment_read_counts_the_bytes_of_what_it_returns(tmp_path):
    with PartitionLog.open(tmp_path, LogConfig(tail_cache_bytes_max=0)) as log:
        for i in range(10):
            log.append(records(5, i * 5, body_bytes=i * 7))
        segment = log._segments[0]
        for offset in (0, 3, 5, 27):
            for max_records, max_bytes in ((1, 1), (7, 100), (50, 400), (50, 1 << 20)):
                got, got_bytes = segment.read_counted(offset, max_records, max_bytes)
                assert got == segment.read(offset, max_records, max_bytes)
                assert got_bytes == sum(map(batch_codec.record_size, got))
                assert [r.offset for r in got] == list(range(offset, offset + len(got)))

"""The bounded descriptor pool, alone and under partition logs: capacity, LRU eviction, reopen
on demand, and fsyncs that stay correct while the pool closes and reopens the files."""

import asyncio
import errno
import os
import resource
import subprocess
import sys
import textwrap

import pytest
from doubles import HeldExecutor

from warrenmq.log import DescriptorPool, LogConfig, LogError, PartitionLog, descriptors, partition

SMALL = LogConfig(segment_bytes_max=4096, index_interval_bytes=256, tail_cache_bytes_max=0)


def body(i):
    return b"body-%d-" % i + b"." * 100


def records(n, start=0):
    return [(b"x", b"k%d" % i, b"", body(i)) for i in range(start, start + n)]


def bodies(log):
    got = log.read(log.start_offset, max_records=10**9, max_bytes=1 << 40)
    return [r.body for r in got]


def open_under(directory):
    """The files of this process that are open below `directory`."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(directory)):
            found.append(target)
    return found


async def settle():
    """Let a commit start and hand its fsync to the executor."""
    for _ in range(5):
        await asyncio.sleep(0)


def test_the_pool_closes_the_least_recently_used_descriptor(tmp_path):
    pool = DescriptorPool(2)
    a, b, c = (
        pool.open(tmp_path / name, os.O_RDWR | os.O_APPEND, first_flags=os.O_CREAT)
        for name in "abc"
    )
    # Opening c evicted a, the oldest.
    assert (a.fd, pool.open_count, pool.evicted_total) == (-1, 2, 1)
    b.fileno()
    os.write(a.fileno(), b"reopened")  # evicts c: b was used after it
    assert c.fd == -1 and b.fd >= 0 and a.fd >= 0
    assert (tmp_path / "a").read_bytes() == b"reopened"
    assert pool.open_count == 2 and len(open_under(tmp_path)) == 2
    for file in (a, b, c):
        file.close()
    assert pool.open_count == 0 and open_under(tmp_path) == []


def test_a_reopen_neither_creates_nor_truncates(tmp_path):
    pool = DescriptorPool(1)
    first = pool.open(tmp_path / "f", os.O_RDWR | os.O_APPEND, first_flags=os.O_CREAT | os.O_TRUNC)
    os.write(first.fileno(), b"one ")
    pool.open(tmp_path / "g", os.O_RDWR, first_flags=os.O_CREAT)  # evicts f
    os.write(first.fileno(), b"two")
    assert (tmp_path / "f").read_bytes() == b"one two"
    pool.open(tmp_path / "h", os.O_RDWR, first_flags=os.O_CREAT)  # evicts f again
    (tmp_path / "f").unlink()
    with pytest.raises(FileNotFoundError):
        first.fileno()


def test_a_closed_file_is_not_reopened(tmp_path):
    pool = DescriptorPool(4)
    file = pool.open(tmp_path / "f", os.O_RDWR, first_flags=os.O_CREAT)
    file.close()
    file.close()
    with pytest.raises(LogError, match="closed"):
        file.fileno()
    with pytest.raises(LogError):
        DescriptorPool(0)


def test_the_pool_gives_up_its_own_descriptors_when_the_process_runs_out(tmp_path, monkeypatch):
    pool = DescriptorPool(10)
    files = [pool.open(tmp_path / str(i), os.O_RDWR, first_flags=os.O_CREAT) for i in range(3)]
    real_open = os.open
    refusals = [2]

    def emfile_twice(path, flags, mode=0o777):
        if refusals[0]:
            refusals[0] -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", emfile_twice)
    pool.open(tmp_path / "new", os.O_RDWR, first_flags=os.O_CREAT)
    monkeypatch.setattr(os, "open", real_open)
    assert [f.fd for f in files[:2]] == [-1, -1] and files[2].fd >= 0
    assert pool.evicted_total == 2


def test_emfile_with_nothing_to_give_up_is_raised(tmp_path, monkeypatch):
    pool = DescriptorPool(10)

    def emfile(path, flags, mode=0o777):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(os, "open", emfile)
    with pytest.raises(OSError) as excinfo:
        pool.open(tmp_path / "f", os.O_RDWR, first_flags=os.O_CREAT)
    assert excinfo.value.errno == errno.EMFILE


def test_the_default_capacity_is_half_the_open_file_limit():
    code = textwrap.dedent(
        """
        import resource
        resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
        from warrenmq.log.descriptors import default_capacity, default_pool
        print(default_capacity(), default_pool().capacity)
        """
    )
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip("the hard limit is below 4096")
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    assert out.split() == ["2048", "2048"]


def test_many_logs_hold_at_most_the_capacity_and_read_everything_back(tmp_path):
    pool = DescriptorPool(5)
    logs = [PartitionLog.open(tmp_path / f"log{i}", SMALL, descriptors=pool) for i in range(20)]
    for round_ in range(30):
        for log in logs:
            log.append(records(4, round_ * 4))
            assert pool.open_count <= 5
    assert len(open_under(tmp_path)) <= 5
    assert all(log.segment_count > 3 for log in logs), "several segments each"
    for log in logs:
        assert bodies(log) == [body(i) for i in range(120)]
        assert log.sync() == 120
    assert len(open_under(tmp_path)) <= 5
    for log in logs:
        log.close()
    assert pool.open_count == 0
    fresh = DescriptorPool(3)
    for i in range(20):
        with PartitionLog.open(tmp_path / f"log{i}", SMALL, descriptors=fresh) as log:
            assert bodies(log) == [body(i) for i in range(120)]


def test_an_fsync_opens_its_own_descriptors_of_the_right_files(tmp_path, monkeypatch):
    """The worker fsyncs what the commit took even if the pool has since closed those
    descriptors and handed their numbers to other files."""
    synced = []
    real = partition._fsync_and_close

    def recording(fds):
        synced.extend(os.readlink(f"/proc/self/fd/{fd}") for fd in fds)
        real(fds)

    monkeypatch.setattr(partition, "_fsync_and_close", recording)
    pool = DescriptorPool(1)
    executor = HeldExecutor()

    async def scenario():
        log = PartitionLog.open(tmp_path / "a", SMALL, executor=executor, descriptors=pool)
        other = PartitionLog.open(tmp_path / "b", SMALL, executor=executor, descriptors=pool)
        log.append(records(3))
        commit = asyncio.ensure_future(log.commit())
        await settle()
        assert executor.jobs, "the fsync waits for a worker"
        # The log's descriptor is evicted and its number reused for the other log's file.
        other.append(records(1))
        assert pool.open_count == 1
        executor.run_all()
        assert await commit == 3
        other.close()
        log.close()

    asyncio.run(scenario())
    assert synced == [str(tmp_path / "a" / f"{0:020d}.log"), str(tmp_path / "a")]


def test_a_commit_with_its_descriptor_evicted_is_durable_and_reads_back(tmp_path):
    pool = DescriptorPool(2)

    async def scenario():
        logs = [PartitionLog.open(tmp_path / f"log{i}", SMALL, descriptors=pool) for i in range(6)]
        for round_ in range(10):
            for log in logs:
                log.append(records(5, round_ * 5))
            durable = await asyncio.gather(*(log.commit() for log in logs))
            assert durable == [(round_ + 1) * 5] * 6
            assert pool.open_count <= 2
        for log in logs:
            assert bodies(log) == [body(i) for i in range(50)]
            log.close()

    asyncio.run(scenario())
    for i in range(6):
        with PartitionLog.open(tmp_path / f"log{i}", SMALL, descriptors=DescriptorPool(1)) as log:
            assert bodies(log) == [body(i) for i in range(50)]


def test_sync_covers_what_a_running_commit_took(tmp_path, monkeypatch):
    """sync() vouches for every append before it, including files a running commit took but
    whose fsync has not run: without that, a sync could return before they are on disk."""
    synced = []
    real = partition._fsync_and_close

    def recording(fds):
        synced.append(sorted(os.readlink(f"/proc/self/fd/{fd}") for fd in fds))
        real(fds)

    monkeypatch.setattr(partition, "_fsync_and_close", recording)
    executor = HeldExecutor()

    async def scenario():
        log = PartitionLog.open(tmp_path, SMALL, executor=executor, descriptors=DescriptorPool(4))
        while log.segment_count < 2:
            log.append(records(5))
        commit = asyncio.ensure_future(log.commit())
        await settle()
        assert executor.jobs
        log.append(records(1))
        assert log.sync() == log.end_offset
        # The sealed segment and the directory were taken by the commit, not re-dirtied.
        first = str(tmp_path / f"{0:020d}.log")
        assert first in synced[-1] and str(tmp_path) in synced[-1]
        executor.run_all()
        await commit
        log.close()

    asyncio.run(scenario())


def test_closing_a_log_releases_its_descriptors(tmp_path):
    pool = DescriptorPool(8)
    log = PartitionLog.open(tmp_path, SMALL, descriptors=pool)
    for i in range(40):
        log.append(records(5, i * 5))
    assert pool.open_count > 0
    log.close()
    assert pool.open_count == 0 and open_under(tmp_path) == []


def test_reading_a_closed_log_does_not_reopen_its_files(tmp_path):
    pool = DescriptorPool(8)
    log = PartitionLog.open(tmp_path, SMALL, descriptors=pool)
    log.append(records(5))
    log.close()
    with pytest.raises(LogError):
        log.read(0)
    assert pool.open_count == 0


def test_the_shared_default_pool_is_used_without_one(tmp_path):
    pool = descriptors.default_pool()
    before = pool.opened_total
    with PartitionLog.open(tmp_path) as log:
        log.append(records(1))
    assert pool.opened_total > before


def test_a_sync_that_cannot_open_its_files_fails_without_poisoning_the_log(tmp_path, monkeypatch):
    """The fsync worker opens its files: EMFILE there means nothing was fsynced, not that
    data was lost, so the commit fails, the log stays usable and the next sync retries."""
    synced = []
    real = partition._fsync_and_close

    def recording(fds):
        synced.extend(os.readlink(f"/proc/self/fd/{fd}") for fd in fds)
        real(fds)

    monkeypatch.setattr(partition, "_fsync_and_close", recording)
    real_open = os.open
    refusing = [False]

    def open_unless_refusing(path, flags, mode=0o777):
        if refusing[0] and flags == os.O_RDONLY:
            raise OSError(errno.EMFILE, "Too many open files", path)
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", open_unless_refusing)

    async def scenario():
        log = PartitionLog.open(tmp_path, SMALL, descriptors=DescriptorPool(4))
        log.append(records(2))
        refusing[0] = True
        with pytest.raises(OSError) as excinfo:
            await log.commit()
        assert excinfo.value.errno == errno.EMFILE
        with pytest.raises(OSError):
            log.sync()
        assert log.durable_offset == 0 and synced == []
        refusing[0] = False
        log.append(records(1, 2))
        assert await log.commit() == 3
        first = str(tmp_path / f"{0:020d}.log")
        assert synced == [first, str(tmp_path)]
        log.close()

    asyncio.run(scenario())

"""Logs sharing one tail cache budget: its bound holds across them, the batch cached longest ago
goes first whichever log holds it, and reads stay what was appended."""

import dataclasses
import errno
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warrenmq.log import LogConfig, LogError, PartitionLog, TailCacheBudget, partition, tail_cache
from warrenmq.log import batch as batch_codec


def batch(count, start=0, body_bytes=100):
    return [
        (b"", b"q", b"\x10\x00\x02", b"%08d" % i + b"x" * body_bytes)
        for i in range(start, start + count)
    ]


def charged(records):
    """What a log's cache charges a batch to its bounds."""
    return (
        batch_codec.HEADER_BYTES
        + sum(batch_codec.RECORD_HEADER_BYTES + sum(map(len, record)) for record in records)
        + len(records) * partition.CACHED_RECORD_OVERHEAD_BYTES
    )


def raw(records):
    return [(r.exchange, r.routing_key, r.properties, r.body) for r in records]


def shared(budget, log_bytes_max=1 << 20):
    return LogConfig(tail_cache_bytes_max=log_bytes_max, tail_cache_budget=budget)


def cached_bytes(*logs):
    return sum(log._cache_bytes for log in logs)


def test_one_log_may_use_the_whole_budget_and_no_more(tmp_path):
    one = charged(batch(10))
    budget = TailCacheBudget(5 * one)
    with PartitionLog.open(tmp_path, shared(budget)) as log:
        for i in range(12):
            log.append(batch(10, i * 10))
            assert budget.cached_bytes == cached_bytes(log) <= 5 * one
        assert budget.cached_bytes == 5 * one
        assert budget.cached_batches == 5


def test_the_batch_cached_longest_ago_goes_first_whichever_log_holds_it(tmp_path, monkeypatch):
    one = charged(batch(10))
    budget = TailCacheBudget(4 * one)
    with (
        PartitionLog.open(tmp_path / "idle", shared(budget)) as idle,
        PartitionLog.open(tmp_path / "busy", shared(budget)) as busy,
    ):
        idle.append(batch(10))
        busy.append(batch(10))
        busy.append(batch(10, 10))
        idle.append(batch(10, 10))
        # Full: the next batch drops idle's first, then busy's first, in the order cached.
        busy.append(batch(10, 20))
        assert (idle._cache_bytes, busy._cache_bytes) == (one, 3 * one)
        busy.append(batch(10, 30))
        assert (idle._cache_bytes, busy._cache_bytes) == (one, 3 * one)
        assert [r.offset for r in busy.read(0, max_records=40)] == list(range(40))

        reads_from_disk = []
        real_pread = os.pread
        monkeypatch.setattr(os, "pread", lambda *a: reads_from_disk.append(a) or real_pread(*a))
        assert raw(idle.read(10, max_records=10)) == batch(10, 10)
        assert raw(busy.read(10, max_records=30)) == batch(30, 10)
        assert not reads_from_disk
        assert raw(idle.read(0, max_records=10)) == batch(10)
        assert reads_from_disk


def test_a_closed_or_truncated_log_gives_its_share_back(tmp_path):
    budget = TailCacheBudget(1 << 20)
    a = PartitionLog.open(tmp_path / "a", shared(budget))
    with PartitionLog.open(tmp_path / "b", shared(budget)) as b:
        for i in range(5):
            a.append(batch(10, i * 10))
            b.append(batch(10, i * 10))
        # The cut batch's first half is appended again, and cached again.
        b.truncate(25)
        assert budget.cached_bytes == cached_bytes(a, b) == cached_bytes(a) + charged(batch(5, 20))
        assert budget.cached_batches == 6
        a.close()
        assert (budget.cached_bytes, budget.cached_batches) == (cached_bytes(b), 1)
        b.close()
        assert (budget.cached_bytes, budget.cached_batches) == (0, 0)


def test_batches_a_log_dropped_itself_do_not_pile_up_in_the_budget(tmp_path):
    """A log's own bound drops its batches without the budget's order knowing: the order must
    still stay bounded while the budget itself is never full."""
    one = charged(batch(1))
    budget = TailCacheBudget(1 << 30)
    with PartitionLog.open(tmp_path, shared(budget, log_bytes_max=8 * one)) as log:
        for i in range(20_000):
            log.append(batch(1, i))
        assert budget.cached_batches == 8
        assert len(budget._logs) <= 2 * 8 + tail_cache._STALE_ENTRIES_SWEPT_PAST + 1
        assert raw(log.read(19_990, max_records=10)) == batch(10, 19_990)


def test_a_batch_larger_than_the_budget_is_not_cached(tmp_path):
    budget = TailCacheBudget(charged(batch(10)))
    with PartitionLog.open(tmp_path, shared(budget)) as log:
        log.append(batch(5))
        log.append(batch(20, 5))
        assert (budget.cached_bytes, log._cache_bytes) == (0, 0)
        assert raw(log.read(0, max_records=25)) == batch(25)


def test_a_budget_must_not_be_negative():
    with pytest.raises(LogError, match="negative"):
        TailCacheBudget(-1)


def test_configs_derived_from_one_share_its_budget_and_compare_without_it():
    budget = TailCacheBudget(1 << 20)
    config = shared(budget)
    derived = dataclasses.replace(config, retention_ms=1000)
    assert derived.tail_cache_budget is budget
    assert shared(TailCacheBudget(1 << 20)) == config
    assert hash(shared(TailCacheBudget(1))) == hash(config)


@settings(max_examples=40, deadline=None)
@given(
    budget_batches=st.integers(0, 12),
    log_batches=st.lists(st.integers(1, 8), min_size=3, max_size=3),
    steps=st.lists(
        st.tuples(
            st.integers(0, 2),
            st.sampled_from(["append", "append", "append", "read", "truncate", "close"]),
            st.integers(1, 6),
        ),
        max_size=60,
    ),
)
def test_shared_caches_stay_within_the_budget_and_reads_match_what_was_appended(
    tmp_path_factory, budget_batches, log_batches, steps
):
    directory = tmp_path_factory.mktemp("budget")
    one = charged(batch(1))
    budget = TailCacheBudget(budget_batches * one)
    configs = [shared(budget, log_bytes_max=n * one) for n in log_batches]
    logs = [PartitionLog.open(directory / str(i), config) for i, config in enumerate(configs)]
    appended = [[], [], []]
    try:
        for which, action, count in steps:
            log = logs[which]
            if action == "close":
                log.close()
                logs[which] = log = PartitionLog.open(directory / str(which), configs[which])
            elif action == "truncate":
                keep = max(0, len(appended[which]) - count)
                if keep < len(appended[which]):
                    log.truncate(keep)
                    del appended[which][keep:]
            elif action == "append":
                records = batch(count, len(appended[which]))
                log.append(records)
                appended[which] += records
            elif appended[which]:
                offset = count % len(appended[which])
                got = log.read(offset, max_records=count)
                assert raw(got) == appended[which][offset : offset + len(got)]
            assert budget.cached_bytes == cached_bytes(*logs) <= budget.bytes_max
            assert budget.cached_batches == sum(
                len(log._cache_sizes) - log._cache_head for log in logs
            )
        for log, records in zip(logs, appended, strict=True):
            got = log.read(0, max_records=len(records) + 1) if records else []
            assert raw(got) == records
    finally:
        for log in logs:
            log.close()


def test_a_failed_append_charges_nothing_and_leaves_the_other_logs_cached(tmp_path, monkeypatch):
    budget = TailCacheBudget(1 << 20)
    with (
        PartitionLog.open(tmp_path / "full", shared(budget)) as full,
        PartitionLog.open(tmp_path / "other", shared(budget)) as other,
    ):
        full.append(batch(3))
        other.append(batch(3))
        before = (budget.cached_bytes, budget.cached_batches, cached_bytes(full, other))

        def disk_full(fd, buffers):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(os, "writev", disk_full)
        with pytest.raises(OSError):
            full.append(batch(5, 3))
        monkeypatch.undo()
        assert (budget.cached_bytes, budget.cached_batches, cached_bytes(full, other)) == before
        assert raw(other.read(0, max_records=10)) == batch(3)
        full.append(batch(5, 3))
        assert raw(full.read(0, max_records=10)) == batch(8)
        assert budget.cached_bytes == cached_bytes(full, other)


def test_a_thousand_logs_share_a_budget_of_a_few_batches(tmp_path):
    """Thousands of queues: each append drops another log's oldest batch, the bound holds,
    and every log reads back what it was given, the dropped part from its files."""
    one = charged(batch(2))
    budget = TailCacheBudget(50 * one)
    logs = [PartitionLog.open(tmp_path / str(i), shared(budget)) for i in range(1000)]
    try:
        for round_ in range(2):
            for log in logs:
                log.append(batch(2, 2 * round_))
                assert budget.cached_bytes <= budget.bytes_max
        assert budget.cached_batches == 50
        # The 50 batches cached last, the last 50 logs' second ones.
        assert [bool(log._cache_bytes) for log in logs] == [False] * 950 + [True] * 50
        assert budget.cached_bytes == cached_bytes(*logs)
        for log in logs[::97]:
            assert raw(log.read(0, max_records=10)) == batch(4)
        assert len(budget._logs) <= 2 * 50 + tail_cache._STALE_ENTRIES_SWEPT_PAST + 1
    finally:
        for log in logs:
            log.close()
    assert (budget.cached_bytes, budget.cached_batches) == (0, 0)

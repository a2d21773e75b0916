"""A follower's side of the partition log: appending another log's stored batches verbatim
(`append_stored`) and the leader-epoch lookup (`epoch_end_offset`) that replication needs."""

import asyncio
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warrenmq.log import CorruptBatchError, LogConfig, LogError, PartitionLog
from warrenmq.log.batch import CRC_AT, HEADER_BYTES

SMALL = LogConfig(segment_bytes_max=2048, index_interval_bytes=200, tail_cache_bytes_max=700)


def records(n, start=0, body_bytes=20):
    return [
        (b"ex", b"rk.%d" % i, b"\x80\x00", b"%d|" % i * body_bytes) for i in range(start, start + n)
    ]


def stored(log, offset=None, budget=1 << 30):
    offset = log.start_offset if offset is None else offset
    return asyncio.run(log.read_batches(offset, log.end_offset, budget))


@contextmanager
def leader_and_follower():
    """Two fresh logs in their own directories: (leader, follower, their directories)."""
    with tempfile.TemporaryDirectory() as leader_dir, tempfile.TemporaryDirectory() as follower_dir:
        with (
            PartitionLog.open(leader_dir, SMALL) as leader,
            PartitionLog.open(follower_dir, SMALL) as follower,
        ):
            yield leader, follower, (leader_dir, follower_dir)


def copy_all(leader, follower, budget):
    """Feed the follower the leader's batches as a replica fetcher would: `budget` bytes at
    a time from the follower's end."""
    while follower.end_offset < leader.end_offset:
        data = asyncio.run(leader.read_batches(follower.end_offset, leader.end_offset, budget))
        follower.append_stored(data)


def segment_files(directory):
    return {
        name: (Path(directory) / name).read_bytes()
        for name in sorted(os.listdir(directory))
        if name.endswith(".log")
    }


def epoch_model(batches):
    """epoch_end_offset by a linear scan of (term, base, count) batches."""

    def end_of(epoch):
        held = [t for t, _, _ in batches if t <= epoch]
        if not held:
            return -1, None
        found = max(held)
        later = [b for t, b, _ in batches if t > found]
        end = batches[-1][1] + batches[-1][2]
        return found, min(later) if later else end

    return end_of


batch_plans = st.lists(
    st.tuples(st.integers(1, 6), st.integers(0, 2), st.integers(0, 40)), min_size=1, max_size=40
)


def fill(log, plan):
    """Append a batch per (records, term step, body bytes); returns (term, base, count) each."""
    term = 1
    made = []
    for count, step, body_bytes in plan:
        term += step
        base = log.append(records(count, log.end_offset, body_bytes), timestamp_ms=1000, term=term)
        made.append((term, base, count))
    return made


@settings(max_examples=40)
@given(plan=batch_plans, budget=st.integers(1, 3000))
def test_a_follower_fed_the_leaders_batches_is_byte_for_byte_the_leaders_log(plan, budget):
    with leader_and_follower() as (leader, follower, (leader_dir, follower_dir)):
        made = fill(leader, plan)
        copy_all(leader, follower, budget)
        assert stored(follower) == stored(leader)
        assert follower.read(0, 10**6, 1 << 30) == leader.read(0, 10**6, 1 << 30)
        assert (follower.end_offset, follower.last_term) == (
            leader.end_offset,
            leader.last_term,
        )
        end_of = epoch_model(made)
        for epoch in range(0, made[-1][0] + 2):
            assert follower.epoch_end_offset(epoch) == leader.epoch_end_offset(epoch)
            found, end = end_of(epoch)
            assert follower.epoch_end_offset(epoch) == (found, 0 if end is None else end)
        follower.sync()
        leader.sync()
        # Same batches in the same order roll segments at the same offsets: the files match.
        assert segment_files(follower_dir) == segment_files(leader_dir)


@settings(max_examples=40)
@given(plan=batch_plans, cut_at=st.integers(0, 39), budget=st.integers(1, 3000))
def test_truncating_at_a_batch_boundary_and_appending_the_rest_round_trips(plan, cut_at, budget):
    with leader_and_follower() as (leader, follower, _):
        made = fill(leader, plan)
        copy_all(leader, follower, budget)
        cut = made[min(cut_at, len(made) - 1)][1]
        follower.truncate(cut)
        assert follower.end_offset == cut
        # The epoch cache forgot what the truncation removed.
        assert follower.epoch_end_offset(10**6)[1] == cut
        copy_all(leader, follower, budget)
        assert stored(follower) == stored(leader)
        for epoch in range(0, made[-1][0] + 2):
            assert follower.epoch_end_offset(epoch) == leader.epoch_end_offset(epoch)


@settings(max_examples=30)
@given(plan=batch_plans, delete_below=st.integers(0, 200))
def test_the_epoch_cache_built_at_first_use_after_reopen_matches_a_scan(plan, delete_below):
    with tempfile.TemporaryDirectory() as directory:
        with PartitionLog.open(directory, SMALL) as log:
            made = fill(log, plan)
            log.sync()
        with PartitionLog.open(directory, SMALL) as log:
            end_of = epoch_model(made)
            for epoch in range(0, made[-1][0] + 2):
                found, end = end_of(epoch)
                assert log.epoch_end_offset(epoch) == (found, 0 if end is None else end)
            start = log.delete_before(delete_below)
            for epoch in range(0, made[-1][0] + 2):
                found, end = end_of(epoch)
                got = log.epoch_end_offset(epoch)
                if end is not None and end > start:
                    assert got == (found, end)
                else:
                    # Epochs wholly below the log start are forgotten, except the one that
                    # reaches the start; the answer never names an offset below the start.
                    assert got[1] >= start


def test_append_stored_rejects_bad_input_and_writes_nothing_of_it(tmp_path):
    with (
        PartitionLog.open(tmp_path / "l", SMALL) as leader,
        PartitionLog.open(tmp_path / "f", SMALL) as follower,
    ):
        leader.append(records(3), term=2)
        leader.append(records(2, 3), term=3)
        data = stored(leader)
        first_batch = stored(leader, budget=1)
        with pytest.raises(LogError, match="starts at offset 3, expected 0"):
            follower.append_stored(data[len(first_batch) :])
        with pytest.raises(CorruptBatchError, match="inside a batch"):
            follower.append_stored(data[:-1])
        with pytest.raises(CorruptBatchError, match="inside a batch"):
            follower.append_stored(data[: HEADER_BYTES - 1])
        flipped = bytearray(data)
        flipped[-1] ^= 0xFF
        with pytest.raises(CorruptBatchError, match="CRC"):
            follower.append_stored(bytes(flipped))
        bad_crc = bytearray(data)
        bad_crc[CRC_AT] ^= 1
        with pytest.raises(CorruptBatchError, match="CRC"):
            follower.append_stored(bytes(bad_crc))
        with pytest.raises(CorruptBatchError, match="magic"):
            follower.append_stored(b"\x00" * 64)
        assert (follower.end_offset, follower.last_term) == (0, 0)
        follower.append(records(3), term=5)
        with pytest.raises(LogError, match="term 3 follows term 5"):
            follower.append_stored(data[len(first_batch) :])
        assert follower.end_offset == 3
        assert follower.append_stored(b"") == 3


def test_a_follower_log_recovers_a_prefix_of_what_it_stored_after_a_crash(tmp_path):
    with PartitionLog.open(tmp_path / "l", SMALL) as leader:
        for i in range(40):
            leader.append(records(3, 3 * i), timestamp_ms=500 + i, term=1 + i // 7)
        data = stored(leader)
        expected = leader.read(0, 10**6, 1 << 30)
    with PartitionLog.open(tmp_path / "f", SMALL) as follower:
        follower.append_stored(data)
        follower.sync()
    # A torn write: the newest segment loses the last bytes of its last batch.
    newest = max((tmp_path / "f").glob("*.log"))
    newest.write_bytes(newest.read_bytes()[:-5])
    with PartitionLog.open(tmp_path / "f", SMALL) as follower:
        end = follower.end_offset
        assert end < 120
        assert follower.read(0, 10**6, 1 << 30) == expected[:end]
        assert follower.last_term == expected[end - 1].term
        assert follower.epoch_end_offset(6) == (6, end)
        assert follower.epoch_end_offset(3) == (3, 63)
        # The fetcher picks up from the recovered end and the log is whole again.
        follower.append_stored(data[len(asyncio.run(follower.read_batches(0, end, 1 << 30))) :])
        assert follower.read(0, 10**6, 1 << 30) == expected

"""Unit tests of a delayed exchange's store: the due index, the done bits, the routed log's
records, and the delayed-message log (holding, due order, hand-offs, recovery, compaction).
Time is passed in everywhere (batch timestamps and `now_ms`): no sleeps."""

from __future__ import annotations

import asyncio
import random

from hypothesis import given
from hypothesis import strategies as st

from warrenmq.log import LogConfig
from warrenmq.server.delayed import acked as acked_module
from warrenmq.server.delayed.acked import AckedOffsets
from warrenmq.server.delayed.due_index import RUNS_MAX, DueIndex
from warrenmq.server.delayed.message_log import (
    DELAY,
    DelayedLogConfig,
    DelayedMessageLog,
)
from warrenmq.server.delayed.routed_log import (
    INTENT_RECORD_BYTES,
    RoutedState,
    decode_intents,
    encode_intents,
)
from warrenmq.server.queue import ack_log

# -- the due index ----------------------------------------------------------------------------


@given(st.lists(st.integers(0, 50), max_size=300), st.integers(1, 40), st.integers(1, 8))
def test_the_due_index_pops_in_due_then_arrival_order(dues, batch, runs_max):
    # Few runs allowed, so that the spill heap takes part too.
    index = DueIndex(runs_max)
    for offset, due in enumerate(dues):
        index.push(due, offset)
    assert index.run_count <= runs_max
    popped = []
    for now in range(0, 52, 3):
        while taken := index.pop_due(now, batch):
            assert all(dues[offset] <= now for offset in taken)
            popped += taken
        assert index.next_due_ms() is None or index.next_due_ms() > now
    assert popped == sorted(range(len(dues)), key=lambda offset: (dues[offset], offset))
    assert len(index) == 0 and index.run_count == index.spilled == 0


def test_one_delay_is_one_run_and_k_interleaved_delays_are_k_runs():
    one, interleaved = DueIndex(), DueIndex()
    for offset in range(10_000):
        one.push(1_000 + offset, offset)
        interleaved.push(offset + (5_000, 1_000, 30_000)[offset % 3], offset)
    assert one.run_count == 1 and interleaved.run_count == 3


def test_random_delays_make_few_runs():
    index = DueIndex()
    rnd = random.Random(7)
    for offset in range(100_000):
        index.push(offset + rnd.randrange(3_600_000), offset)
    # Patience sorting: about 2·sqrt(n) runs for random order.
    assert index.run_count < 2_000 and index.spilled == 0


def test_due_times_going_back_spill_beyond_the_run_bound():
    index = DueIndex()
    for offset in range(10_000):
        index.push(1_000_000 - offset, offset)
    assert (index.run_count, index.spilled) == (RUNS_MAX, 10_000 - RUNS_MAX)
    assert index.pop_due(10**9, 10_000) == list(range(9_999, -1, -1))


def test_pairs_far_apart_start_new_chunks_and_consumed_chunks_are_dropped():
    index = DueIndex()
    offsets = [0, 1, 2**32 + 5, 2**32 + 6]
    dues = [10, 2**33, 2**33 + 1, 2**33 + 100]
    for due, offset in zip(dues, offsets, strict=True):
        index.push(due, offset)
    (run,) = index._runs
    assert len(run.chunks) == 3
    assert index.pop_due(2**33 + 1, 10) == offsets[:3]
    assert len(run.chunks) == 1
    for offset in range(5, 100_000):
        index.push(2**34 + offset, offset)
    assert len(run.chunks) > 4
    assert index.pop_due(2**35, 200_000) == [offsets[3], *range(5, 100_000)]
    assert index.run_count == 0


# -- the done bits ----------------------------------------------------------------------------


@given(st.data())
def test_done_bits_track_a_set(data):
    count = data.draw(st.integers(0, 400))
    order = data.draw(st.permutations(range(count)))
    done_count = data.draw(st.integers(0, count))
    acked = AckedOffsets(0)
    done = set()
    for offset in order[:done_count]:
        acked.add(offset)
        done.add(offset)
    floor = next(offset for offset in range(count + 1) if offset not in done)
    assert acked.floor == floor
    assert all((offset in acked) == (offset in done) for offset in range(count + 10))
    ranges = list(acked.ranges())
    assert {o for start, end in ranges for o in range(start, end)} == {
        o for o in done if o >= floor
    }
    assert all(end < start for (_, end), (start, _) in zip(ranges, ranges[1:], strict=False))
    again = AckedOffsets.from_ranges(acked.floor, ranges)
    assert all((offset in again) == (offset in done) for offset in range(count + 10))


def test_done_bits_below_the_floor_are_dropped(monkeypatch):
    monkeypatch.setattr(acked_module, "_TRIM_BYTES", 2)
    acked = AckedOffsets(0)
    for offset in range(1, 1000):
        acked.add(offset)
    assert acked.floor == 0 and len(acked._bits) == 125
    acked.add(0)
    assert acked.floor == 1000 and len(acked._bits) < 2
    acked.add(1003)
    assert 1003 in acked and 1001 not in acked and list(acked.ranges()) == [(1003, 1004)]


# -- the routed log's records -----------------------------------------------------------------


def test_intents_round_trip_and_split_into_bounded_records():
    intents = [(offset, ((f"queue-{offset % 7}", offset * 10), ("q", -1))) for offset in range(5)]
    (record,) = encode_intents(intents)
    assert decode_intents(record[3]) == intents
    many = [(offset, tuple((f"q{i}", i) for i in range(100))) for offset in range(1_000)]
    records = encode_intents(many)
    assert len(records) > 1
    assert all(len(record[3]) < 2 * INTENT_RECORD_BYTES for record in records)
    assert [intent for record in records for intent in decode_intents(record[3])] == many


def test_replay_keeps_the_latest_intent_of_what_is_not_done():
    state = RoutedState()
    for record in encode_intents([(1, (("a", 0), ("b", 5))), (2, (("a", 1),)), (3, ())]):
        state.apply(record[3])
    state.apply(encode_intents([(1, (("b", 9),))])[0][3])
    (delta,) = ack_log.encode_delta(0, 0, [(2, 3)])
    state.apply(delta[3])
    state.apply(ack_log.encode_clip(3)[3])
    state.normalise()
    assert state.intents == {1: (("b", 9),)}


# -- the delayed-message log ------------------------------------------------------------------

SMALL = DelayedLogConfig(
    message_log=LogConfig(segment_bytes_max=2048, index_interval_bytes=128),
    routed_log=LogConfig(segment_bytes_max=1024, tail_cache_bytes_max=0),
    snapshot_bytes=512,
)


def held(delay_ms, body, routing_key=b"k"):
    return (b"dx", routing_key, DELAY.pack(delay_ms) + b"\x00\x00", body)


def run(coroutine):
    return asyncio.run(coroutine)


def test_held_messages_come_out_when_due_in_due_order(tmp_path):
    store = DelayedMessageLog.open(tmp_path, SMALL)
    store.append([held(500, b"a"), held(100, b"b"), held(300, b"c")], timestamp_ms=1_000)
    store.append([held(100, b"d")], timestamp_ms=1_050)
    assert (store.ready_count, store.next_due_ms()) == (4, 1_100)
    assert store.take_due(1_099, 10) == []
    (first,) = store.take_due(1_100, 10)
    assert (first.offset, first.due_ms, first.delay_ms, first.body) == (1, 1_100, 100, b"b")
    assert (first.exchange, first.routing_key, first.properties) == (b"dx", b"k", b"\x00\x00")
    assert [m.body for m in store.take_due(2_000, 2)] == [b"d", b"c"]
    assert [m.body for m in store.take_due(2_000, 10)] == [b"a"]
    assert store.ready_count == 0 and store.next_due_ms() is None
    store.close()


def test_many_due_messages_are_read_back_in_due_order(tmp_path):
    store = DelayedMessageLog.open(tmp_path, SMALL)
    rnd = random.Random(5)
    delays = [rnd.randrange(1, 10_000) for _ in range(6_000)]
    for start in range(0, len(delays), 100):
        store.append(
            [held(d, b"%d" % i) for i, d in enumerate(delays[start : start + 100], start)], 0
        )
    bodies = [m.body for m in store.take_due(10_000, 10_000)]
    assert bodies == [b"%d" % i for i in sorted(range(len(delays)), key=lambda i: (delays[i], i))]
    store.close()


def test_due_times_count_from_the_stored_timestamp(tmp_path):
    """The log never moves its timestamps back; recovery reads the stored one."""
    store = DelayedMessageLog.open(tmp_path, SMALL)
    store.append([held(100, b"a")], timestamp_ms=5_000)
    store.append([held(100, b"b")], timestamp_ms=4_000)
    assert [m.due_ms for m in store.take_due(10_000, 10)] == [5_100, 5_100]
    store.close()


def test_a_restart_holds_again_what_was_not_routed(tmp_path):
    store = DelayedMessageLog.open(tmp_path, SMALL)
    store.append([held(delay, b"%d" % delay) for delay in (400, 100, 300, 200)], 1_000)
    taken = store.take_due(1_200, 10)
    store.begin_hand_off([(m.offset, (("q", 0),)) for m in taken])
    store.routed([taken[0].offset])
    run(store.shutdown())
    store = DelayedMessageLog.open(tmp_path, SMALL)
    # 100 is done, 200 was being handed off: only 300 and 400 wait for their time.
    assert store.recovered_intents() == {taken[1].offset: (("q", 0),)}
    assert [m.body for m in store.take_due(10_000, 10)] == [b"300", b"400"]
    store.close()


def test_what_no_commit_covered_may_be_lost_but_nothing_else(tmp_path):
    store = DelayedMessageLog.open(tmp_path, SMALL)
    store.append([held(100, b"kept")], 1_000)
    run(store.commit())
    store.append([held(100, b"maybe")], 1_000)
    store.close()
    store = DelayedMessageLog.open(tmp_path, SMALL)
    assert b"kept" in [m.body for m in store.take_due(2_000, 10)]
    store.close()


def test_done_messages_free_their_segments_and_snapshots_bound_the_routed_log(tmp_path):
    store = DelayedMessageLog.open(tmp_path, SMALL)
    rnd = random.Random(3)
    for batch in range(40):
        store.append([held(rnd.randrange(1, 500), b"x" * 100) for _ in range(10)], batch)
    for now in range(0, 600, 5):
        taken = store.take_due(now, 1_000)
        store.begin_hand_off([(m.offset, (("q", m.offset),)) for m in taken])
        run(store.commit())
        store.routed(m.offset for m in taken)
        run(store.commit())
    assert store.ready_count == store.handing_off == 0
    assert store._messages.segment_count == 1
    assert store._routed.size_bytes < 8 * SMALL.snapshot_bytes
    run(store.shutdown())
    store = DelayedMessageLog.open(tmp_path, SMALL)
    assert store.ready_count == 0 and store.recovered_intents() == {}
    store.append([held(1, b"new")], 1_000)
    assert [m.body for m in store.take_due(1_001, 10)] == [b"new"]
    store.close()


def test_a_snapshot_keeps_the_open_intents(tmp_path):
    store = DelayedMessageLog.open(tmp_path, SMALL)
    store.append([held(1, b"%d" % i) for i in range(200)], 0)
    taken = store.take_due(10, 1_000)
    store.begin_hand_off([(m.offset, (("q", m.offset),)) for m in taken])
    store.routed(m.offset for m in taken[:150])
    run(store.commit())
    # Enough done marks since to write a snapshot, which must repeat the 50 open intents.
    for offset in range(150, 190):
        store.routed([offset])
        run(store.commit())
    assert store._snapshot_bytes
    run(store.shutdown())
    store = DelayedMessageLog.open(tmp_path, SMALL)
    assert sorted(store.recovered_intents()) == list(range(190, 200))
    store.close()


def test_done_marks_beyond_the_stored_messages_are_clipped(tmp_path):
    store = DelayedMessageLog.open(tmp_path, SMALL)
    store.append([held(1, b"a")], 0)
    run(store.shutdown())
    # A routed log that names offsets the message log no longer has (a lost tail).
    store = DelayedMessageLog.open(tmp_path, SMALL)
    (delta,) = ack_log.encode_delta(5, 0, [])
    store._routed.append([delta])
    run(store.shutdown())
    # Offset 0 is done; offset 1, the next message's, is not.
    store = DelayedMessageLog.open(tmp_path, SMALL)
    assert store.ready_count == 0
    store.append([held(1, b"b")], 0)
    assert [m.body for m in store.take_due(10, 10)] == [b"b"]
    store.close()
    store = DelayedMessageLog.open(tmp_path, SMALL)
    assert store.ready_count == 1
    store.close()


def test_delete_removes_the_store(tmp_path):
    directory = tmp_path / "store"
    store = DelayedMessageLog.open(directory, SMALL)
    store.append([held(10, b"a")], 0)
    store.delete()
    assert not directory.exists()

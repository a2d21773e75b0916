"""The acked-offset set of a queue against a plain set of integers, and the ack log codec."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warrenmq.log import LogConfig
from warrenmq.server.queue import QueueError, ack_log
from warrenmq.server.queue.ranges import AckedRanges, coalesce


def check_against(acked, model, until):
    floor = 0
    while floor in model:
        floor += 1
    assert acked.floor == floor
    ranges = list(acked)
    # Maximal: ranges neither touch each other nor the floor.
    for (_, end), (start, _) in zip(ranges, ranges[1:], strict=False):
        assert end < start
    assert all(start > floor for start, _ in ranges)
    covered = set(range(floor)) | {o for start, end in ranges for o in range(start, end)}
    assert covered == model
    assert list(acked.gaps(until)) == [o for o in range(floor, until) if o not in model]
    assert len(acked) == len(ranges)


@settings(max_examples=300)
@given(st.lists(st.tuples(st.integers(0, 120), st.integers(1, 6)), max_size=60))
def test_adding_offsets_and_ranges_matches_a_set(steps):
    acked, model = AckedRanges(), set()
    for start, length in steps:
        wanted = [o for o in range(start, start + length)]
        if length == 1:
            if start in model:
                continue
            acked.add(start)
            model.add(start)
        else:
            # add_range needs a wholly unacked range: take the first unacked run from start.
            run = []
            for o in wanted:
                if o in model:
                    break
                run.append(o)
            if not run:
                continue
            acked.add_range(run[0], run[-1] + 1)
            model |= set(run)
        check_against(acked, model, 140)


@given(st.integers(0, 50), st.lists(st.tuples(st.integers(0, 100), st.integers(0, 100))))
def test_from_ranges_takes_any_ranges(floor, pairs):
    acked = AckedRanges.from_ranges(floor, pairs)
    model = set(range(floor)) | {o for start, end in pairs for o in range(start, end)}
    check_against(acked, model, 110)


def test_in_order_acks_only_move_the_floor():
    acked = AckedRanges(10)
    for offset in range(10, 1000):
        acked.add(offset)
    assert (acked.floor, len(acked)) == (1000, 0)


def test_coalesce_merges_touching_and_overlapping_ranges():
    assert coalesce([(5, 7), (0, 2), (2, 3), (6, 9), (4, 4), (11, 12)]) == [
        (0, 3),
        (5, 9),
        (11, 12),
    ]


@given(
    st.integers(0, 2**63),
    st.integers(0, 2**63),
    st.lists(st.tuples(st.integers(0, 2**40), st.integers(1, 2**20)), max_size=40),
)
def test_delta_records_round_trip(floor, mark, pairs):
    ranges = coalesce((start, start + length) for start, length in pairs)
    state = ack_log.AckState()
    for record in ack_log.encode_delta(floor, mark, ranges):
        assert record[:3] == (b"", b"", b"")
        state.apply(record[3])
    assert (state.floor, state.mark, state.ranges) == (floor, mark, ranges)


def test_a_big_snapshot_spans_several_records_and_replays_the_same():
    ranges = [(10 * i + 1, 10 * i + 5) for i in range(50)]
    records = ack_log.encode_delta(0, 600, ranges, per_record=7)
    assert len(records) == 8
    state = ack_log.AckState()
    for record in records:
        state.apply(record[3])
    state.normalise()
    assert (state.floor, state.mark, state.ranges) == (0, 600, ranges)


def test_records_fit_the_ack_log_segments():
    config = LogConfig(segment_bytes_max=400)
    per_record = ack_log.ranges_per_record(config)
    assert per_record == (400 - ack_log.RECORD_OVERHEAD_BYTES) // ack_log.RANGE_BYTES
    assert ack_log.ranges_per_record(LogConfig()) == ack_log.RANGES_PER_RECORD_MAX


@pytest.mark.parametrize("kind", [ack_log.RETURNED, ack_log.HELD])
def test_count_records_fit_the_ack_log_segments_and_round_trip(kind):
    """A HELD entry (24 bytes, with its due time) is larger than the 16 bytes per entry that
    `ranges_per_record` counts in: its records hold fewer entries, none over the bound."""
    config = LogConfig(segment_bytes_max=400)
    per_record = ack_log.ranges_per_record(config)
    counts = [
        (offset, 2, 1, 1_000 + offset)[: 4 if kind == ack_log.HELD else 3] for offset in range(100)
    ]
    records = ack_log.encode_counts(kind, counts, per_record)
    assert (
        max(len(record[3]) for record in records)
        <= per_record * ack_log.RANGE_BYTES + ack_log.HEAD.size
    )
    state = ack_log.AckState()
    for record in records:
        state.apply(record[3])
    assert state.returned == set(range(100))
    assert state.failures == dict.fromkeys(range(100), 1)
    assert state.held == ({o: 1_000 + o for o in range(100)} if kind == ack_log.HELD else {})


def test_clip_forgets_everything_at_or_above_the_limit():
    state = ack_log.AckState()
    state.apply(ack_log.encode_delta(20, 90, [(30, 40), (50, 60)])[0][3])
    state.apply(ack_log.encode_clip(55)[3])
    state.normalise()
    assert (state.floor, state.mark, state.ranges) == (20, 55, [(30, 40), (50, 55)])
    state.apply(ack_log.encode_clip(10)[3])
    state.normalise()
    assert (state.floor, state.mark, state.ranges) == (10, 10, [])


def test_normalise_lifts_the_floor_over_touching_ranges():
    state = ack_log.AckState(floor=5, ranges=[(7, 9), (2, 6), (5, 7), (12, 13)])
    state.normalise()
    assert (state.floor, state.ranges) == (9, [(12, 13)])


@pytest.mark.parametrize(
    "body",
    [
        b"\x01\x00",
        ack_log.HEAD.pack(ack_log.DELTA, 0, 0, 2) + b"\x00" * 16,
        ack_log.HEAD.pack(9, 0, 0, 0),
    ],
)
def test_damaged_records_are_refused(body):
    with pytest.raises(QueueError):
        ack_log.AckState().apply(body)

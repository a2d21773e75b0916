"""Streams without a socket: offset specs, the stream's log (chunks, retention by whole
segment, reopen) and its cursors' credit, driven as the tick drives them."""

from __future__ import annotations

import asyncio
import datetime
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warrenmq.amqp import properties as props
from warrenmq.exchanges.errors import PreconditionFailed
from warrenmq.log import LogConfig
from warrenmq.server.queue.consumer import BLOCKED_BY_PREFETCH, ROTATING
from warrenmq.server.stream import offset_spec, tracked_offsets
from warrenmq.server.stream.arguments import log_config
from warrenmq.server.stream.cursor import with_offset
from warrenmq.server.stream.offset_spec import OffsetSpec, Retained, Start
from warrenmq.server.stream.stream import Stream, StreamLog
from warrenmq.server.stream.tracked_offsets import TrackedOffsets

NOW_MS = 1_700_000_000_000


class Channel:
    """A consumer's channel with room for everything (the AMQP channel's credit is its own)."""

    def __init__(self) -> None:
        self.delivered = []

    def can_deliver(self):
        return True

    def credit(self):
        return 1_000_000

    def block(self, consumer):
        raise AssertionError("never out of channel credit")

    def forget_blocked(self, consumer):
        pass

    def deliver(self, consumer, messages):
        consumer.unacked_count += len(messages)
        self.delivered += messages

    def cancel(self, consumer, reason):
        pass


def open_stream(tmp_path, **arguments) -> Stream:
    base = LogConfig(tail_cache_bytes_max=1 << 16)
    engine = StreamLog.open(tmp_path / "s", base, arguments)
    return Stream(
        "/", "s", engine, arguments=arguments, effective_arguments=arguments, batch_records_max=64
    )


def publish(stream: Stream, bodies, now_ms=NOW_MS) -> None:
    """One tick: stage, write as one batch, fsync."""
    for body in bodies:
        stream.stage((b"", b"s", b"\x00\x00", body), True)
    stream.flush(now_ms)
    asyncio.run(stream.commit())


def consume(stream, spec, prefetch=1000):
    channel = Channel()
    consumer = stream.add_consumer(
        "amq.ctag-c", channel, spec, {}, exclusive=False, prefetch_count=prefetch
    )
    return consumer, channel


def test_parse_reads_what_rabbitmq_reads():
    parse = offset_spec.parse
    assert parse(None, NOW_MS) == OffsetSpec(Start.NEXT)
    assert parse("first", NOW_MS) == OffsetSpec(Start.FIRST)
    assert parse(bytearray(b"last"), NOW_MS) == OffsetSpec(Start.LAST)
    assert parse(42, NOW_MS) == OffsetSpec(Start.OFFSET, 42)
    assert parse("2h", NOW_MS) == OffsetSpec(Start.TIMESTAMP, NOW_MS - 7_200_000)
    assert parse("1Y", NOW_MS) == OffsetSpec(Start.TIMESTAMP, NOW_MS - 365 * 86_400_000)
    moment = datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    assert parse(moment, NOW_MS) == OffsetSpec(Start.TIMESTAMP, int(moment.timestamp()) * 1000)
    for invalid in ("0s", "5x", "1hh"):
        with pytest.raises(offset_spec.Invalid):
            parse(invalid, NOW_MS)
    for unreadable in ("bad", "", True, 1.5, [1], bytearray(b"5s")):
        with pytest.raises(offset_spec.Unreadable):
            parse(unreadable, NOW_MS)


retained_ranges = st.tuples(
    st.integers(0, 10**6), st.integers(0, 10**6), st.integers(0, 10**6)
).map(lambda t: sorted(t))


@given(retained_ranges, st.integers(-(10**7), 10**7), st.one_of(st.none(), st.integers(0, 10**6)))
def test_resolve_starts_within_the_retained_log_or_at_a_later_offset(bounds, value, found):
    first, last_chunk, end = bounds
    retained = Retained(first, end, last_chunk)
    at = offset_spec.resolve
    assert at(OffsetSpec(Start.FIRST), retained, None) == first
    assert at(OffsetSpec(Start.LAST), retained, None) == last_chunk
    assert at(OffsetSpec(Start.NEXT), retained, None) == end
    assert at(OffsetSpec(Start.OFFSET, value), retained, None) == max(value, first)
    by_time = at(OffsetSpec(Start.TIMESTAMP, value), retained, lambda ms: found)
    assert by_time == (end if found is None else max(found, first))


def test_with_offset_appends_a_long_last_and_replaces_an_old_one():
    bare = with_offset(b"\x00\x00", 7)
    assert props.headers(bare) == [("x-stream-offset", props.long(7))]
    stored = props.with_headers(
        b"\x00\x00", [("x-stream-offset", props.long(1)), ("a", props.longstr("b"))]
    )
    assert props.headers(with_offset(stored, 9)) == [
        ("a", props.longstr("b")),
        ("x-stream-offset", props.long(9)),
    ]


def test_cursors_read_chunks_from_their_start_and_only_what_is_fsynced(tmp_path):
    stream = open_stream(tmp_path)
    publish(stream, [b"a", b"b"])
    publish(stream, [b"c", b"d", b"e"])
    starts = {
        "first": consume(stream, OffsetSpec(Start.FIRST)),
        "last": consume(stream, OffsetSpec(Start.LAST)),
        "offset": consume(stream, OffsetSpec(Start.OFFSET, 3)),
        "next": consume(stream, OffsetSpec(Start.NEXT)),
    }
    stream.dispatch(NOW_MS)
    got = {name: [m.body for m in channel.delivered] for name, (_, channel) in starts.items()}
    assert got == {
        "first": [b"a", b"b", b"c", b"d", b"e"],
        "last": [b"c", b"d", b"e"],
        "offset": [b"d", b"e"],
        "next": [],
    }
    # Written but not fsynced: no cursor reads it.
    stream.stage((b"", b"s", b"\x00\x00", b"f"), True)
    stream.flush(NOW_MS)
    stream.dispatch(NOW_MS)
    assert starts["next"][1].delivered == []
    asyncio.run(stream.commit())
    stream.dispatch(NOW_MS)
    assert [m.offset for m in starts["next"][1].delivered] == [5]
    message = starts["next"][1].delivered[0]
    assert props.headers(message.properties) == [("x-stream-offset", props.long(5))]


def test_acks_are_the_credit_of_a_prefetch(tmp_path):
    stream = open_stream(tmp_path)
    publish(stream, [str(i).encode() for i in range(10)])
    consumer, channel = consume(stream, OffsetSpec(Start.FIRST), prefetch=3)
    stream.dispatch(NOW_MS)
    assert len(channel.delivered) == 3
    assert consumer.state is BLOCKED_BY_PREFETCH
    consumer.unacked_count -= 2
    consumer.queue.ack([0, 1])
    consumer.queue.prefetch_freed(consumer)
    assert consumer.state is ROTATING
    consumer.queue.dispatch(NOW_MS)
    assert [m.offset for m in channel.delivered] == [0, 1, 2, 3, 4]


def test_retention_deletes_whole_segments_and_cursors_skip_to_what_is_kept(tmp_path):
    stream = open_stream(
        tmp_path, **{"x-stream-max-segment-size-bytes": 300, "x-max-length-bytes": 600}
    )
    slow, channel = consume(stream, OffsetSpec(Start.FIRST), prefetch=1)
    stream.dispatch(NOW_MS)
    for i in range(40):
        publish(stream, [b"x" * 50 + str(i).encode()])
    log = stream.log
    assert log.start_offset > 0 and log.size_bytes <= 600 + 300
    assert log.segment_count >= 2
    # The slow consumer had taken offset 0; the next it reads is the first retained.
    slow.unacked_count = 0
    slow.queue.prefetch_freed(slow)
    slow.queue.dispatch(NOW_MS)
    assert [m.offset for m in channel.delivered[-1:]] == [log.start_offset]


def test_age_retention_runs_on_the_timer(tmp_path):
    stream = open_stream(tmp_path, **{"x-stream-max-segment-size-bytes": 100, "x-max-age": "10s"})
    for i in range(5):
        publish(stream, [b"y" * 80], now_ms=NOW_MS + i)
    assert stream.log.segment_count == 5 and stream.has_timers
    assert stream.run_timers(NOW_MS + 5_000) == NOW_MS + 15_000
    assert stream.log.segment_count == 5
    stream.run_timers(NOW_MS + 20_000)
    # Never the active segment.
    assert stream.log.segment_count == 1 and stream.log.start_offset == 4


def test_lag_counts_only_what_retention_kept_from_the_offset_on(tmp_path):
    stream = open_stream(tmp_path, **{"x-stream-max-segment-size-bytes": 100, "x-max-age": "10s"})
    for i in range(5):
        publish(stream, [b"y" * 80], now_ms=NOW_MS + i)
    assert (stream.lag(None), stream.lag(0), stream.lag(3), stream.lag(5)) == (5, 5, 2, 0)
    stream.run_timers(NOW_MS + 20_000)
    assert stream.log.start_offset == 4
    # Offsets 0-3 are gone: an offset behind the first retained lags by what is left.
    assert (stream.lag(None), stream.lag(0), stream.lag(2), stream.lag(4)) == (1, 1, 1, 1)


# One publish: (records, body bytes each, ms since the previous publish, run the age timer).
retention_steps = st.lists(
    st.tuples(st.integers(1, 5), st.integers(0, 300), st.integers(0, 4_000), st.booleans()),
    min_size=1,
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(
    st.integers(100, 2_000),
    st.one_of(st.none(), st.integers(1, 5_000)),
    st.one_of(st.none(), st.integers(1, 20)),
    retention_steps,
)
def test_retention_keeps_a_suffix_of_whole_chunks_within_its_limits(
    tmp_path_factory, segment_bytes, length_bytes, age_s, steps
):
    """Random publishes under random segment, size and age limits: what is retained is
    always the newest published messages, whole segments of whole chunks, never the newest
    chunk; a deletion is justified by the age limit (every message in it older than the
    limit) or by the size limit (what stays is still at least the limit); the log never holds
    much more than the size limit, nor, once the timer ran, a segment wholly past the age.
    A reopened stream keeps exactly the same messages."""
    directory = tmp_path_factory.mktemp("retention")
    arguments = {"x-stream-max-segment-size-bytes": segment_bytes}
    if length_bytes is not None:
        arguments["x-max-length-bytes"] = length_bytes
    if age_s is not None:
        arguments["x-max-age"] = f"{age_s}s"
    stream = open_stream(directory, **arguments)
    published: list[tuple[bytes, int]] = []  # (body, publish time) by offset
    chunk_starts: list[int] = []
    chunk_bytes_max = 5 * (300 + 200)
    now = NOW_MS
    for count, size, advance, run_timer in steps:
        now += advance
        start_before = stream.log.start_offset
        chunk_starts.append(len(published))
        bodies = [f"{len(published) + i}:".encode().ljust(size, b"x") for i in range(count)]
        publish(stream, bodies, now_ms=now)
        published += [(body, now) for body in bodies]
        if run_timer and age_s is not None:
            stream.run_timers(now)
        log = stream.log
        start = log.start_offset
        assert log.end_offset == len(published)
        assert start in chunk_starts and start <= chunk_starts[-1]
        retained = [message.body for message, _ in stream.engine.browse(start, len(published))]
        assert retained == [body for body, _ in published[start:]]
        age_limit_ms = None if age_s is None else now - age_s * 1000
        aged_until = start_before
        if age_limit_ms is not None:
            while aged_until < start and published[aged_until][1] < age_limit_ms:
                aged_until += 1
        if aged_until < start:
            assert length_bytes is not None and log.size_bytes >= length_bytes
        if length_bytes is not None:
            assert log.size_bytes < length_bytes + 2 * (segment_bytes + chunk_bytes_max)
        bases = log.segment_bases
        assert bases[0] == start and set(bases) <= set(chunk_starts)
        if run_timer and age_limit_ms is not None and len(bases) > 1:
            # The oldest segment stays only while it holds a message within the age limit.
            assert any(t >= age_limit_ms for _, t in published[bases[0] : bases[1]])
    kept = stream.log.start_offset
    asyncio.run(stream.engine.shutdown())
    reopened = open_stream(directory, **arguments)
    assert reopened.log.start_offset == kept
    retained = [message.body for message, _ in reopened.engine.browse(kept, len(published))]
    assert retained == [body for body, _ in published[kept:]]
    asyncio.run(reopened.engine.shutdown())


def test_last_is_the_last_chunk_after_a_reopen(tmp_path):
    stream = open_stream(tmp_path)
    publish(stream, [b"a"])
    publish(stream, [b"b", b"c"])
    asyncio.run(stream.engine.shutdown())
    stream = open_stream(tmp_path)
    assert stream.last_chunk() == 1
    _, channel = consume(stream, OffsetSpec(Start.LAST))
    stream.dispatch(NOW_MS)
    assert [m.body for m in channel.delivered] == [b"b", b"c"]


def test_log_config_follows_the_stream_arguments():
    base = LogConfig()
    config = log_config(base, {"x-max-age": "2m", "x-max-length-bytes": 5000})
    assert (config.retention_ms, config.retention_bytes) == (120_000, 5000)
    assert config.segment_bytes_max == 500_000_000
    assert log_config(base, {"x-stream-max-segment-size-bytes": 0}).segment_bytes_max == 1


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 60), st.integers(1, 8), st.randoms(use_true_random=False))
def test_a_tracked_offset_is_the_contiguous_acked_prefix(tmp_path_factory, count, prefetch, random):
    """Deliveries under a prefetch above 1, acked in random order as they arrive: the tracked
    offset is always exactly the first offset not yet acked (never moved by a delivery), and
    it is what a reopened stream holds once committed."""
    stream = open_stream(tmp_path_factory.mktemp("tracked"))
    publish(stream, [str(i).encode() for i in range(count)])
    channel = Channel()
    consumer = stream.add_consumer(
        "mine", channel, OffsetSpec(Start.FIRST), {}, exclusive=False, prefetch_count=prefetch
    )
    cursor = consumer.queue
    acked: set[int] = set()
    stream.dispatch(NOW_MS)
    while len(acked) < count:
        unacked = [m.offset for m in channel.delivered if m.offset not in acked]
        offset = random.choice(unacked)
        consumer.unacked_count -= 1
        cursor.ack([offset])
        acked.add(offset)
        prefix = 0
        while prefix in acked:
            prefix += 1
        assert stream.tracked.get("mine") == prefix
        cursor.prefetch_freed(consumer)
        cursor.dispatch(NOW_MS)
        assert stream.tracked.get("mine") == prefix
    assert cursor.needs_commit
    asyncio.run(cursor.commit())
    assert not cursor.needs_commit
    stream.engine.close()
    reopened = TrackedOffsets.open(stream.engine.directory)
    assert reopened.get("mine") == count
    reopened.close()


def test_a_tracked_tag_resumes_without_an_offset_and_a_generated_one_does_not(tmp_path):
    stream = open_stream(tmp_path)
    publish(stream, [b"a", b"b", b"c", b"d"])
    for tag, arguments in [
        ("mine", {}),
        ("amq.ctag-x", {"x-stream-automatic-offset-tracking": True}),
    ]:
        channel = Channel()
        consumer = stream.add_consumer(
            tag, channel, OffsetSpec(Start.FIRST), arguments, exclusive=False, prefetch_count=9
        )
        stream.dispatch(NOW_MS)
        consumer.queue.ack([0, 1])
        stream.remove_consumer(consumer)
    asyncio.run(stream.tracked.commit())
    stream = open_stream(tmp_path)
    starts = {}
    for tag, arguments in [
        ("mine", {}),
        ("amq.ctag-x", {"x-stream-automatic-offset-tracking": True}),
        ("amq.ctag-y", {}),
        ("mine", {"x-stream-offset": "first"}),
    ]:
        channel = Channel()
        consumer = stream.add_consumer(
            tag,
            channel,
            OffsetSpec(Start.NEXT if "x-stream-offset" not in arguments else Start.FIRST),
            arguments,
            exclusive=False,
            prefetch_count=9,
        )
        starts[(tag, len(arguments))] = consumer.queue.next_offset
        stream.remove_consumer(consumer)
    assert starts == {
        ("mine", 0): 2,
        ("amq.ctag-x", 1): 2,
        ("amq.ctag-y", 0): 4,
        ("mine", 1): 0,
    }


def test_acks_after_the_stream_is_deleted_commit_nothing(tmp_path):
    """A delivery acked once its stream is gone must not write the offsets again (the write
    would make the deleted stream's directory anew)."""
    stream = open_stream(tmp_path)
    publish(stream, [b"a", b"b"])
    channel = Channel()
    consumer = stream.add_consumer(
        "mine", channel, OffsetSpec(Start.FIRST), {}, exclusive=False, prefetch_count=9
    )
    stream.dispatch(NOW_MS)
    stream.remove_consumer(consumer)
    stream.deleted = True
    stream.engine.delete()
    consumer.queue.ack([0, 1])
    assert not consumer.queue.needs_commit
    assert not stream.engine.directory.exists()


def test_tracked_offsets_committed_meanwhile_reopen_as_the_last_set(tmp_path):
    """Every cursor of a stream commits its tracked offsets: a commit made while another
    writes waits for it, and what reopens is the last set."""
    offsets = TrackedOffsets.open(tmp_path)

    async def two_commits():
        offsets.set("a", 1)
        first = asyncio.ensure_future(offsets.commit())
        await asyncio.sleep(0)
        offsets.set("a", 2)
        offsets.set("b", 7)
        await asyncio.gather(first, offsets.commit())

    asyncio.run(two_commits())
    offsets.close()
    reopened = TrackedOffsets.open(tmp_path)
    assert (reopened.get("a"), reopened.get("b")) == (2, 7)
    reopened.close()


def test_tracked_offsets_compact_into_a_record_of_them_all_and_keep_their_order(
    tmp_path, monkeypatch
):
    """Past the bound, a commit writes every tag and the log drops what came before; the
    least recently set tag is still the one forgotten first after a reopen."""
    monkeypatch.setattr(tracked_offsets, "FULL_RECORD_BYTES_MIN", 2_000)
    monkeypatch.setattr(tracked_offsets, "TAGS_MAX", 50)
    monkeypatch.setattr(
        tracked_offsets, "LOG_CONFIG", LogConfig(segment_bytes_max=1_000, tail_cache_bytes_max=0)
    )
    offsets = TrackedOffsets.open(tmp_path)

    async def many_commits():
        for round_ in range(40):
            for tag in range(round_, round_ + 20):
                offsets.set(f"tag-{tag}", round_ * 100 + tag)
            await offsets.commit()

    asyncio.run(many_commits())
    expected = offsets.items()
    order = list(offsets._offsets)
    assert offsets.log.start_offset > 0, "records before a record of every tag are deleted"
    offsets.close()
    reopened = TrackedOffsets.open(tmp_path)
    assert reopened.items() == expected
    assert list(reopened._offsets) == order
    reopened.close()


def test_tracked_offsets_of_a_stream_from_before_their_log_are_taken_into_it(tmp_path):
    (tmp_path / tracked_offsets.LEGACY_FILE).write_text(json.dumps({"old": 41, "older": 3}))
    offsets = TrackedOffsets.open(tmp_path)
    assert (offsets.get("old"), offsets.get("older")) == (41, 3)
    asyncio.run(offsets.commit())
    assert not (tmp_path / tracked_offsets.LEGACY_FILE).exists()
    offsets.close()
    reopened = TrackedOffsets.open(tmp_path)
    assert reopened.items() == [("old", 41), ("older", 3)]
    reopened.close()


@given(
    st.one_of(st.none(), st.text(min_size=1, max_size=5)),
    st.one_of(st.none(), st.text(min_size=1, max_size=5)),
    st.one_of(
        st.none(),
        st.dictionaries(st.text(max_size=6), st.integers(-(2**63), 2**63 - 1), max_size=3),
    ),
    st.one_of(st.none(), st.integers(1, 2)),
    st.integers(0, 2**62),
)
def test_with_offset_edits_as_a_decode_and_encode_would(
    content_type, encoding, headers, delivery_mode, offset
):
    from pamqp import commands

    from warrenmq.amqp import frames

    stored = frames.encode_properties(
        commands.Basic.Properties(
            content_type=content_type,
            content_encoding=encoding,
            headers=headers,
            delivery_mode=delivery_mode,
        )
    )
    edited = with_offset(stored, offset)
    expected = [e for e in props.headers(stored) if e[0] != "x-stream-offset"]
    assert props.headers(edited) == [*expected, ("x-stream-offset", props.long(offset))]
    decoded = frames.decode_properties(edited)
    assert (decoded.content_type, decoded.content_encoding, decoded.delivery_mode) == (
        content_type,
        encoding,
        delivery_mode,
    )


def test_a_filter_delivers_exactly_the_values_asked_for(tmp_path):
    stream = open_stream(tmp_path)

    def tagged(value):
        entries = [] if value is None else [("x-stream-filter-value", props.longstr(value))]
        return (b"", b"s", props.with_headers(b"\x00\x00", entries), (value or "-").encode())

    values = ["a", "b", None, "c", "a", None, "b"] * 300
    for record in map(tagged, values):
        stream.stage(record, True)
    stream.flush(NOW_MS)
    asyncio.run(stream.commit())
    asked = {
        "a": ({"x-stream-filter": "a"}, {"a"}, False),
        "bc+": (
            {"x-stream-filter": ["b", "c"], "x-stream-match-unfiltered": True},
            {"b", "c"},
            True,
        ),
    }
    for name, (arguments, wanted, unfiltered) in asked.items():
        channel = Channel()
        consumer = stream.add_consumer(
            name, channel, OffsetSpec(Start.FIRST), arguments, exclusive=False, prefetch_count=50
        )
        while consumer.queue.next_offset < len(values):
            stream.dispatch(NOW_MS)
            consumer.unacked_count = 0
            consumer.queue.prefetch_freed(consumer)
        expected = [
            offset
            for offset, value in enumerate(values)
            if (value in wanted if value is not None else unfiltered)
        ]
        assert [m.offset for m in channel.delivered] == expected
        # Tracked: passed-over offsets do not hold the tracked offset back.
        consumer.queue.ack(expected)
        assert stream.tracked.get(name) == len(values)
    for refused in (
        {"x-stream-filter": 5},
        {"x-stream-filter": []},
        {"x-stream-filter": ["a", 1]},
        {"x-stream-filter": "a", "x-stream-match-unfiltered": "yes"},
    ):
        with pytest.raises(PreconditionFailed):
            stream.add_consumer(
                "x", Channel(), OffsetSpec(Start.FIRST), refused, exclusive=False, prefetch_count=5
            )


def test_staged_records_are_written_at_staged_end_and_read_once_fsynced(tmp_path):
    stream = open_stream(tmp_path)
    publish(stream, [b"a", b"b"])
    assert stream.staged_end == 2
    stream.stage((b"", b"s", b"\x00\x00", b"c"), True)
    assert stream.staged_end == 3
    stream.flush(NOW_MS)
    # Written, not yet fsynced: no reader sees it.
    assert [r.body for r in stream.read(0, 10, 1 << 20)] == [b"a", b"b"]
    asyncio.run(stream.commit())
    assert [(r.offset, r.body) for r in stream.read(1, 10, 1 << 20)] == [(1, b"b"), (2, b"c")]
    assert [r.body for r in stream.read(0, 1, 1 << 20)] == [b"a"]
    assert stream.read(3, 10, 1 << 20) == []


def test_readers_wake_when_the_tick_dispatches_what_reached_them(tmp_path, monkeypatch):
    stream = open_stream(tmp_path)
    publish(stream, [b"a"])

    async def scenario():
        now = stream.readable(0)
        assert now is not None and now.done()
        later = stream.readable(1)
        further = stream.readable(2)
        gone = stream.readable(1)
        assert not (later.done() or further.done() or gone.done())
        gone.cancel()
        stream.dispatch(NOW_MS)
        assert not later.done()
        stream.stage((b"", b"s", b"\x00\x00", b"b"), True)
        stream.flush(NOW_MS)
        stream.dispatch(NOW_MS)
        assert not later.done()  # written, not fsynced
        await stream.commit()
        stream.dispatch(NOW_MS)
        assert later.done() and not further.done()
        monkeypatch.setattr("warrenmq.server.stream.stream.READERS_MAX", 2)
        assert stream.readable(5) is not None
        assert stream.readable(6) is None
        stream.deleted = True
        stream.dispatch(NOW_MS)
        assert further.done()

    asyncio.run(scenario())

"""Unit tests of the durable queue: each operation, recovery, segment deletion, compaction."""

import asyncio

import pytest
from doubles import HeldExecutor

from warrenmq.log import LogConfig
from warrenmq.server.queue import LogQueue, QueueConfig, QueueError, log_queue
from warrenmq.server.queue.engine import Kept
from warrenmq.server.queue.log_queue import ACKS_DIR, MESSAGES_DIR


def records(start, n):
    return [
        (b"amq.direct", b"key.%d" % i, b"\x90\x00\x02", b"body-%d" % i)
        for i in range(start, start + n)
    ]


def run(coroutine):
    return asyncio.run(coroutine)


def taken(queue, n=10**6):
    return [(m.offset, m.redelivered, m.delivery_count) for m in queue.take_many(n)]


SMALL = QueueConfig(
    message_log=LogConfig(
        segment_bytes_max=1024, index_interval_bytes=128, tail_cache_bytes_max=512
    ),
    ack_log=LogConfig(segment_bytes_max=512, index_interval_bytes=128, tail_cache_bytes_max=0),
    ack_log_compact_bytes=256,
)


def test_messages_come_out_in_order_with_every_field(tmp_path):
    queue = LogQueue.open(tmp_path)
    assert queue.append(records(0, 3), timestamp_ms=1234) == 0
    assert queue.append(records(3, 2), timestamp_ms=1235) == 3
    assert (queue.ready_count, queue.unacked_count) == (5, 0)
    first = queue.take()
    assert first.offset == 0
    assert (first.exchange, first.routing_key, first.properties, first.body) == records(0, 1)[0]
    assert (first.timestamp_ms, first.redelivered, first.delivery_count) == (1234, False, 1)
    assert [m.body for m in queue.take_many(10)] == [r[3] for r in records(1, 4)]
    assert queue.take() is None
    assert (queue.ready_count, queue.unacked_count) == (0, 5)
    queue.close()


def test_in_order_acks_move_the_floor_and_out_of_order_ones_leave_ranges(tmp_path):
    queue = LogQueue.open(tmp_path)
    queue.append(records(0, 10))
    queue.take_many(10)
    assert queue.ack_many([0, 1, 2]) == 3
    assert (queue.floor, queue.acked_range_count) == (3, 0)
    assert queue.ack_many([5, 6, 8]) == 3
    assert (queue.floor, queue.acked_range_count) == (3, 2)
    assert queue.ack(7) and queue.ack(4)
    assert (queue.floor, queue.acked_range_count) == (3, 1)
    assert queue.ack(3)
    assert (queue.floor, queue.acked_range_count) == (9, 0)
    assert queue.unacked_count == 1
    queue.close()


def test_acking_what_is_not_in_flight_is_refused_without_effect(tmp_path):
    queue = LogQueue.open(tmp_path)
    queue.append(records(0, 3))
    assert not queue.ack(0)  # ready, never delivered
    queue.take()
    assert queue.ack(0)
    assert not queue.ack(0)  # twice
    assert not queue.ack(99)  # never existed
    assert queue.requeue([0, 1, 99]) == 0
    assert (queue.floor, queue.ready_count, queue.unacked_count) == (1, 2, 0)
    queue.close()


def test_requeued_messages_come_back_first_in_offset_order_with_counts(tmp_path):
    queue = LogQueue.open(tmp_path)
    queue.append(records(0, 6))
    queue.take_many(4)
    assert queue.requeue([3, 1]) == 2
    assert queue.ready_count == 4
    assert taken(queue, 3) == [(1, True, 2), (3, True, 2), (4, False, 1)]
    queue.requeue([3])
    assert taken(queue) == [(3, True, 3), (5, False, 1)]
    queue.close()


def test_purge_removes_ready_messages_and_keeps_those_in_flight(tmp_path):
    queue = LogQueue.open(tmp_path)
    queue.append(records(0, 8))
    queue.take_many(3)
    queue.requeue([1])
    assert queue.purge() == 6
    assert (queue.ready_count, queue.unacked_count) == (0, 2)
    assert queue.take() is None
    queue.append(records(8, 1))
    assert taken(queue) == [(8, False, 1)]
    queue.requeue([0, 2])
    assert taken(queue) == [(0, True, 2), (2, True, 2)]
    queue.close()


def test_committed_acks_survive_a_crash_and_in_flight_messages_come_back_redelivered(tmp_path):
    async def scenario():
        queue = LogQueue.open(tmp_path)
        queue.append(records(0, 10))
        await queue.commit()
        queue.take_many(6)
        queue.ack_many([0, 1, 4])
        await queue.commit()
        queue.ack(2)  # not committed: may come back
        queue.close()  # the crash: no further fsync
        queue = LogQueue.open(tmp_path)
        assert queue.ready_count == 7
        got = taken(queue)
        queue.close()
        return got

    got = run(scenario())
    offsets = [offset for offset, _, _ in got]
    assert offsets == [2, 3, 5, 6, 7, 8, 9]
    # The ones delivered before the crash are flagged; so may a few after them (the mark's lead).
    assert all(redelivered and count == 2 for offset, redelivered, count in got if offset < 6)


def test_a_clean_shutdown_flags_only_what_was_delivered(tmp_path):
    async def scenario():
        queue = LogQueue.open(tmp_path)
        queue.append(records(0, 10))
        queue.take_many(3)
        queue.ack(0)
        queue.requeue([1, 2])
        await queue.shutdown()
        queue = LogQueue.open(tmp_path)
        got = taken(queue)
        queue.close()
        return got

    assert run(scenario()) == [(1, True, 2), (2, True, 2)] + [(o, False, 1) for o in range(3, 10)]


def test_a_message_is_delivered_only_below_a_durable_delivered_mark(tmp_path):
    async def scenario():
        queue = LogQueue.open(tmp_path, QueueConfig(delivered_mark_lead=4))
        queue.append(records(0, 10))
        assert len(queue.take_many(10)) == 4  # the mark granted at open
        assert queue.needs_commit
        await queue.commit()
        more = queue.take_many(10)
        assert [m.offset for m in more] == [4, 5, 6, 7]
        await queue.commit()
        assert [m.offset for m in queue.take_many(10)] == [8, 9]
        queue.close()

    run(scenario())


def test_a_mark_written_but_not_yet_fsynced_does_not_allow_delivery(tmp_path):
    """Otherwise a crash before that fsync would bring a delivered message back as new."""

    async def scenario():
        queue = LogQueue.open(tmp_path, QueueConfig(delivered_mark_lead=4))
        queue.append(records(0, 10))
        await queue.commit()
        queue.take_many(4)
        commit = asyncio.ensure_future(queue.commit())
        await asyncio.sleep(0)  # the new mark is written, its fsync not finished
        assert queue._mark_written > 4 and queue.take() is None
        await commit
        assert queue.take().offset == 4
        queue.close()

    run(scenario())


def test_quorum_style_delivery_waits_for_the_fsync(tmp_path):
    async def scenario():
        queue = LogQueue.open(tmp_path, QueueConfig(deliver_uncommitted=False))
        queue.append(records(0, 3))
        assert queue.take() is None and queue.ready_count == 3
        await queue.commit()
        assert len(queue.take_many(10)) == 3
        queue.close()

    run(scenario())


def test_held_until_commit_says_when_take_waits_for_a_commit(tmp_path):
    async def scenario():
        classic = LogQueue.open(tmp_path / "classic", QueueConfig(delivered_mark_lead=4))
        assert not classic.held_until_commit  # nothing ready
        classic.append(records(0, 6))
        assert not classic.held_until_commit
        assert len(classic.take_many(10)) == 4
        assert classic.held_until_commit and classic.take() is None
        classic.requeue([3])
        assert not classic.held_until_commit  # a redelivery needs no new mark
        assert classic.take().offset == 3
        await classic.commit()
        assert not classic.held_until_commit and classic.take().offset == 4
        classic.close()

        quorum = LogQueue.open(tmp_path / "quorum", QueueConfig(deliver_uncommitted=False))
        quorum.append(records(0, 2))
        assert quorum.held_until_commit and quorum.take() is None
        await quorum.commit()
        assert not quorum.held_until_commit and len(quorum.take_many(10)) == 2
        assert not quorum.held_until_commit  # empty
        quorum.close()

    run(scenario())


def test_a_commit_lets_through_what_a_concurrent_commit_made_durable(tmp_path):
    """basic.get waits for one commit, then takes: when that commit shares (or finds done) the
    fsync of a concurrent one, the mark that one wrote must allow delivery all the same."""

    async def scenario():
        queue = LogQueue.open(tmp_path, QueueConfig(delivered_mark_lead=4))
        queue.append(records(0, 10))
        await queue.commit()
        queue.take_many(10)
        assert queue.held_until_commit
        first = asyncio.ensure_future(queue.commit())
        await asyncio.sleep(0)  # the first commit wrote the new mark and waits for its fsync
        queue._acks.sync()  # that fsync is done; the first commit has not resumed yet
        await queue.commit()
        assert not queue.held_until_commit and queue.take().offset == 4
        await first
        queue.close()

    run(scenario())


def test_acks_of_messages_lost_in_a_crash_do_not_ack_their_successors(tmp_path):
    """The ack log can be fsynced while the message log is not; the CLIP at open covers that."""

    async def scenario():
        queue = LogQueue.open(tmp_path)
        queue.append(records(0, 2))
        await queue.commit()
        queue.append(records(2, 3))
        queue.take_many(5)
        queue.ack_many(range(5))
        # A commit whose ack log fsync finished and whose message log fsync did not.
        queue._flush_acks()
        queue._acks.sync()
        queue._log.truncate(2)
        queue.close()
        queue = LogQueue.open(tmp_path)
        assert (queue.end_offset, queue.floor, queue.ready_count) == (2, 2, 0)
        queue.append(records(100, 3))  # takes offsets 2, 3, 4
        await queue.commit()
        queue.close()  # crash again
        queue = LogQueue.open(tmp_path)
        got = [m.body for m in queue.take_many(10)]
        queue.close()
        return got

    assert run(scenario()) == [b"body-100", b"body-101", b"body-102"]


def test_acked_segments_are_deleted_and_the_ack_log_stays_small(tmp_path):
    async def scenario():
        queue = LogQueue.open(tmp_path, SMALL)
        for batch in range(200):
            queue.append(records(batch * 5, 5))
            for message in queue.take_many(5):
                # Leave one hole per batch for a while, so snapshots have ranges to carry.
                if message.offset % 5 != 2:
                    queue.ack(message.offset)
            if batch % 10 == 9:
                queue.ack_many(range((batch - 9) * 5 + 2, batch * 5 + 5, 5))
            await queue.commit()
        await queue.commit()
        log_segments = len(list((tmp_path / MESSAGES_DIR).glob("*.log")))
        ack_bytes = sum(p.stat().st_size for p in (tmp_path / ACKS_DIR).glob("*.log"))
        floor = queue.floor
        queue.close()
        queue = LogQueue.open(tmp_path, SMALL)
        state = (queue.floor, queue.ready_count, queue.unacked_count)
        queue.close()
        return log_segments, ack_bytes, floor, state

    log_segments, ack_bytes, floor, state = run(scenario())
    assert floor == 1000
    assert log_segments <= 2
    assert ack_bytes < 4 * SMALL.ack_log.segment_bytes_max
    assert state == (1000, 0, 0)


def test_holes_survive_compaction(tmp_path):
    async def scenario():
        queue = LogQueue.open(tmp_path, SMALL)
        for start in range(0, 300, 5):
            queue.append(records(start, 5))
        queue.take_many(300)
        for offset in range(0, 300, 3):
            queue.requeue([offset])
        for offset in range(300):
            queue.ack(offset)
            if offset % 7 == 0:
                await queue.commit()
        await queue.commit()
        queue.close()
        queue = LogQueue.open(tmp_path, SMALL)
        got = sorted(m.offset for m in queue.take_many(1000))
        queue.close()
        return got

    assert run(scenario()) == list(range(0, 300, 3))


def test_needs_commit_is_false_once_everything_is_durable(tmp_path):
    async def scenario():
        queue = LogQueue.open(tmp_path)
        assert not queue.needs_commit
        queue.append(records(0, 2))
        assert queue.needs_commit
        await queue.commit()
        assert not queue.needs_commit and queue.durable_offset == 2
        queue.take()
        queue.ack(0)
        assert queue.needs_commit
        await queue.commit()
        assert not queue.needs_commit
        queue.close()

    run(scenario())


def test_a_closed_queue_refuses_work_and_delete_removes_it(tmp_path):
    directory = tmp_path / "q"
    queue = LogQueue.open(directory)
    queue.append(records(0, 1))
    queue.close()
    with pytest.raises(QueueError):
        queue.take()
    with pytest.raises(QueueError):
        queue.append(records(1, 1))
    with pytest.raises(QueueError):
        run(queue.commit())
    queue = LogQueue.open(directory)
    assert queue.ready_count == 1
    queue.delete()
    assert not directory.exists()


def test_delete_takes_the_directory_away_at_once_and_removes_it_in_a_worker(tmp_path, monkeypatch):
    executor = HeldExecutor()
    monkeypatch.setattr(log_queue, "_REMOVE_EXECUTOR", executor)
    directory = tmp_path / "q"
    queue = LogQueue.open(directory)
    queue.append(records(0, 3))
    run(queue.commit())
    queue.delete()
    assert not directory.exists()
    (removed,) = list(tmp_path.iterdir())
    assert removed.name.startswith("q" + log_queue.REMOVED_SUFFIX)
    # The same name opens empty while the old files still wait for the worker.
    queue = LogQueue.open(directory)
    assert queue.ready_count == 0
    queue.close()
    executor.run_all()
    assert [p.name for p in tmp_path.iterdir()] == ["q"]


def test_config_bounds_are_checked():
    with pytest.raises(QueueError):
        QueueConfig(delivered_mark_lead=1)
    with pytest.raises(QueueError):
        QueueConfig(read_ahead_records_max=0)


def test_peek_shows_the_head_and_drop_head_removes_it_undelivered(tmp_path):
    async def scenario():
        queue = LogQueue.open(tmp_path)
        queue.append(records(0, 10))
        queue.take_many(3)
        queue.requeue([1])
        head = queue.peek()
        assert (head.offset, head.redelivered, head.delivery_count, head.body) == (
            1,
            True,
            2,
            b"body-1",
        )
        assert queue.peek().offset == 1 and queue.ready_count == 8  # peeking takes nothing
        assert queue.drop_head(3) == 3  # offsets 1, 3 and 4
        assert queue.peek().offset == 5
        assert taken(queue, 2) == [(5, False, 1), (6, False, 1)]
        assert queue.drop_head(100) == 3
        assert queue.peek() is None and queue.drop_head(5) == 0
        assert (queue.ready_count, queue.unacked_count) == (0, 4)
        await queue.commit()
        queue.close()
        queue = LogQueue.open(tmp_path)
        # Dropped messages stay gone; the four in flight come back.
        assert sorted(m.offset for m in queue.take_many(10)) == [0, 2, 5, 6]
        queue.close()

    run(scenario())


class _Fsyncs:
    """Counts os.fsync calls (of both logs, in this thread and the workers')."""

    def __init__(self, monkeypatch):
        self.count = 0
        real = log_queue.os.fsync

        def counting(fd):
            self.count += 1
            real(fd)

        monkeypatch.setattr(log_queue.os, "fsync", counting)


def test_an_idle_queue_is_opened_and_shut_down_without_writing_or_fsyncing(tmp_path, monkeypatch):
    """100,000 idle queues must not cost 100,000 fsyncs at declare, at recovery, at SIGTERM."""
    fsyncs = _Fsyncs(monkeypatch)

    async def scenario():
        for _ in range(3):
            queue = LogQueue.open(tmp_path)
            assert queue._acks.end_offset == 0 and not queue.needs_commit
            await queue.shutdown()

    run(scenario())
    assert fsyncs.count == 0


def test_the_first_delivery_grants_the_lead_durably_then_commits_extend_it(tmp_path, monkeypatch):
    fsyncs = _Fsyncs(monkeypatch)

    async def scenario():
        queue = LogQueue.open(tmp_path, QueueConfig(delivered_mark_lead=4))
        queue.append(records(0, 10))
        assert fsyncs.count == 0
        assert taken(queue) == [(o, False, 1) for o in range(4)]
        assert fsyncs.count > 0 and queue._acks.durable_offset == queue._acks.end_offset > 0
        assert queue.needs_commit
        await queue.commit()
        assert [o for o, _, _ in taken(queue)] == [4, 5, 6, 7]
        queue.close()
        # A crash: the mark on disk lies beyond the messages, so open forgets it durably.
        queue = LogQueue.open(tmp_path, QueueConfig(delivered_mark_lead=4))
        assert queue._acks.durable_offset == queue._acks.end_offset
        assert taken(queue)[:8] == [(o, True, 2) for o in range(8)]
        queue.close()

    run(scenario())


def test_a_clean_shutdown_after_deliveries_keeps_the_exact_mark(tmp_path):
    async def scenario():
        queue = LogQueue.open(tmp_path)
        queue.append(records(0, 5))
        for message in queue.take_many(3):
            queue.ack(message.offset)
        await queue.shutdown()
        queue = LogQueue.open(tmp_path)
        ack_records = queue._acks.end_offset
        # Nothing delivered and not acked: the restart flags nothing, and writes nothing.
        assert taken(queue, 2) == [(3, False, 1), (4, False, 1)]
        assert queue._acks.end_offset == ack_records + 1, "one record: the granted lead"
        queue.close()

    run(scenario())


def test_bcc_keys_stay_with_their_messages_across_requeues_crashes_and_compaction(tmp_path):
    async def scenario():
        queue = LogQueue.open(tmp_path, SMALL)
        queue.append(records(0, 3), kept=[Kept(1, ("b1", "b2"))])
        assert [queue.bcc_keys(offset) for offset in range(3)] == [(), ("b1", "b2"), ()]
        queue.take_many(3)
        queue.requeue([1])
        await queue.commit()
        queue.close()  # a crash: only what the commit made durable
        queue = LogQueue.open(tmp_path, SMALL)
        assert queue.bcc_keys(1) == ("b1", "b2")
        # Enough acked traffic for several snapshots to replace the ack log's records.
        for start in range(3, 403, 5):
            queue.append(records(start, 5), kept=[Kept(4, (f"b{start + 4}",))])
            # A take may wait for a commit (the delivered mark): all are taken in the end.
            for message in queue.take_many(5):
                if message.offset != 1:
                    queue.ack(message.offset)
            await queue.commit()
        while queue.ready_count > 0:
            queue.ack_many(m.offset for m in queue.take_many(1000) if m.offset != 1)
            await queue.commit()
        queue.close()
        queue = LogQueue.open(tmp_path, SMALL)
        kept = queue.bcc_keys(1)
        # Acknowledged: forgotten, in memory as on disk.
        forgotten = [queue.bcc_keys(offset) for offset in range(7, 403, 5)]
        acks_bytes = sum(p.stat().st_size for p in (tmp_path / ACKS_DIR).glob("*.log"))
        queue.close()
        return kept, forgotten, acks_bytes

    kept, forgotten, acks_bytes = run(scenario())
    assert kept == ("b1", "b2")
    assert forgotten == [()] * 80
    assert acks_bytes < 4 * SMALL.ack_log.segment_bytes_max


def test_bcc_keys_of_messages_lost_in_a_crash_do_not_go_to_their_successors(tmp_path):
    async def scenario():
        queue = LogQueue.open(tmp_path)
        queue.append(records(0, 2))
        await queue.commit()
        queue.append(records(2, 2), kept=[Kept(0, ("lost",))])
        # The ack log's fsync finished, the message log's did not.
        queue._flush_acks()
        queue._acks.sync()
        queue._log.truncate(2)
        queue.close()
        queue = LogQueue.open(tmp_path)
        queue.append(records(100, 2))  # takes offsets 2 and 3
        await queue.commit()
        queue.close()
        queue = LogQueue.open(tmp_path)
        keys = [queue.bcc_keys(offset) for offset in range(4)]
        queue.close()
        return keys

    assert run(scenario()) == [(), (), (), ()]


def test_carried_failures_reach_the_first_delivery_across_a_crash_and_compaction(tmp_path):
    """A dead letter's failed deliveries (`Kept.failures`) are its count in its new queue
    from the first delivery on, durably; acknowledged or purged undelivered, forgotten."""
    config = QueueConfig(ack_log_compact_bytes=1)

    def first_failures(queue, count):
        return [(m.body, m.failed_count) for m in queue.take_many(count)]

    async def scenario():
        queue = LogQueue.open(tmp_path, config)
        queue.append(records(0, 4), kept=[Kept(1, failures=3), Kept(3, ("k",), 1)])
        await queue.commit()
        queue.close()  # a crash before any delivery
        queue = LogQueue.open(tmp_path, config)
        before_snapshot = first_failures(queue, 2)
        queue.ack_many([0, 1])
        await queue.commit()  # a snapshot (compaction at every commit)
        await queue.shutdown()
        queue = LogQueue.open(tmp_path, config)
        after_snapshot = first_failures(queue, 2)
        queue.requeue([3], failed=True)
        again = first_failures(queue, 1)
        queue.ack_many([2, 3])
        queue.append(records(4, 1), kept=[Kept(0, failures=5)])
        queue.purge()
        queue.append(records(5, 1))
        await queue.commit()
        await queue.shutdown()
        queue = LogQueue.open(tmp_path, config)
        after_purge = (queue.failures(4), first_failures(queue, 1))
        queue.close()
        return before_snapshot, after_snapshot, again, after_purge

    before_snapshot, after_snapshot, again, after_purge = run(scenario())
    assert before_snapshot == [(b"body-0", 0), (b"body-1", 3)]
    assert after_snapshot == [(b"body-2", 0), (b"body-3", 1)]
    assert again == [(b"body-3", 2)]
    assert after_purge == (0, [(b"body-5", 0)])


def test_what_is_kept_about_undelivered_messages_survives_a_clean_shutdown(tmp_path):
    """A clean shutdown writes a CLIP at the exact delivered mark: it must not take the BCC
    keys and carried failures of the messages above it with it (it once did)."""

    async def scenario():
        queue = LogQueue.open(tmp_path)
        queue.append(records(0, 3), kept=[Kept(2, ("b",), 4)])
        queue.take_many(1)
        await queue.commit()
        await queue.shutdown()
        queue = LogQueue.open(tmp_path)
        kept = [queue.bcc_keys(offset) for offset in range(3)]
        failures = [m.failed_count for m in queue.take_many(3)]
        queue.close()
        return kept, failures

    assert run(scenario()) == ([(), (), ("b",)], [1, 0, 4])


def test_a_priority_queue_keeps_bcc_keys_per_level(tmp_path):
    from warrenmq.server.queue.priority import PriorityQueue

    def with_priority(priority: int, body: bytes):
        # Basic properties: flags 0x0800 (priority), then the octet.
        return (b"", b"k", b"\x08\x00" + bytes([priority]), body)

    queue = PriorityQueue(tmp_path, 5, 1 << 20, LogQueue.open)
    queue.append(
        [with_priority(1, b"low"), with_priority(5, b"high"), with_priority(1, b"low-bcc")],
        kept=[Kept(2, ("b-low",)), Kept(1, ("b-high",))],
    )
    keys = {message.body: queue.bcc_keys(message.offset) for message in queue.take_many(3)}
    queue.close()
    assert keys == {b"high": ("b-high",), b"low": (), b"low-bcc": ("b-low",)}

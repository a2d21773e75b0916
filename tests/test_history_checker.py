"""The fault tests' checker on histories written by hand: a clean one passes, and each
violation it exists to catch is caught, by name."""

from __future__ import annotations

from history_checker import (
    CONFIRMED,
    NACKED,
    UNKNOWN,
    Consume,
    Depth,
    GroupAck,
    GroupDelivery,
    Publish,
    QueueHistory,
    Reject,
    SessionEnd,
    StreamHistory,
    StreamPublish,
    StreamRead,
    check_queues,
    check_streams,
)


def queue_history() -> QueueHistory:
    """m1 consumed twice (redelivered after a lost ack), m2 nacked and never seen, m3 unknown
    yet consumed, m4 rejected into the dead-letter queue and consumed there."""
    return QueueHistory(
        publishes=[
            Publish("q", "m1", CONFIRMED),
            Publish("q", "m2", NACKED),
            Publish("q", "m3", UNKNOWN),
            Publish("q", "m4", CONFIRMED),
        ],
        consumes=[
            Consume("q", "m1", False, "c1"),
            Consume("q", "m1", True, "c2"),
            Consume("q", "m3", False, "c1"),
            Consume("q", "m4", False, "c1"),
            Consume("q.dlq", "m4", False, "c3"),
        ],
        rejects=[Reject("q", "m4", "c1")],
        depths=[Depth("q", 0), Depth("q.dlq", 0)],
        dead_letter_queues={"q": "q.dlq"},
    )


def test_a_clean_queue_history_passes_and_counts_its_duplicates():
    verdict = check_queues(queue_history())
    assert verdict.violations == {}
    assert verdict.row() == {
        "published": 4,
        "confirmed": 2,
        "consumed": 4,
        "lost": 0,
        "duplicated": 1,
    }
    assert (verdict.nacked, verdict.unknown) == (1, 1)


def test_a_confirmed_message_never_consumed_is_lost():
    history = queue_history()
    history.consumes = [c for c in history.consumes if c.id != "m1"]
    assert check_queues(history).violations == {"lost": ["q: m1"]}


def test_a_dead_lettered_message_missing_from_the_dead_letter_queue_is_lost():
    history = queue_history()
    history.consumes = [c for c in history.consumes if c.queue != "q.dlq"]
    assert check_queues(history).violations == {"lost": ["q: m4 dead-lettered, never in q.dlq"]}


def test_a_message_never_published_is_a_phantom_as_is_one_in_the_dlq_never_rejected():
    history = queue_history()
    history.consumes += [Consume("q", "m9", False, "c1"), Consume("q.dlq", "m1", False, "c3")]
    assert check_queues(history).violations == {"phantoms": ["q: m9", "q.dlq: m1"]}


def test_a_queue_left_with_messages_after_the_drain_is_undrained():
    history = queue_history()
    history.depths = [Depth("q", 3), Depth("q.dlq", 0)]
    assert check_queues(history).violations == {"undrained": {"q": 3}}


def stream_history() -> StreamHistory:
    """p1 published r1..r3 to partition s-0 (r3 unknown, yet written); a consumer read all of
    it, then again from offset 1 after a reconnect; a group's members handed s-0 over."""
    return StreamHistory(
        publishes=[
            StreamPublish("s", "r1", "p1", 1, CONFIRMED),
            StreamPublish("s", "r2", "p1", 2, CONFIRMED),
            StreamPublish("s", "r3", "p1", 3, UNKNOWN),
        ],
        reads=[
            StreamRead("s-0", 0, "r1", "c1", 1, 0),
            StreamRead("s-0", 1, "r2", "c1", 1, 0),
            StreamRead("s-0", 2, "r3", "c1", 1, 0),
            StreamRead("s-0", 1, "r2", "c1", 2, 1),
        ],
        group_deliveries=[
            GroupDelivery("g", "s-0", 0, "a", 1, 1.0),
            GroupDelivery("g", "s-0", 1, "b", 1, 3.0),
        ],
        group_acks=[GroupAck("g", "s-0", 0, "a", 1, 2.0)],
    )


def test_a_clean_stream_history_passes():
    verdict = check_streams(stream_history())
    assert verdict.violations == {}
    assert verdict.row() == {
        "published": 3,
        "confirmed": 2,
        "consumed": 3,
        "lost": 0,
        "duplicated": 0,
    }


def test_a_confirmed_record_never_read_is_lost_and_an_unpublished_one_a_phantom():
    history = stream_history()
    history.reads = [r for r in history.reads if r.id != "r2"]
    history.reads.append(StreamRead("s-0", 1, "x", "c2", 1, 1))
    assert check_streams(history).violations == {
        "lost": ["r2"],
        "phantoms": ["s-0@1: x"],
        "gaps": ["c1#1 on s-0: 2, expected 1"],
    }


def test_two_records_at_one_offset_or_one_record_at_two_offsets_are_reordered():
    history = stream_history()
    history.reads.append(StreamRead("s-0", 2, "r1", "c2", 1, 2))
    assert check_streams(history).violations == {
        "reordered": ["s-0@2: r3 and r1", "r1 at ('s-0', 0) and at ('s-0', 2)"]
    }


def test_a_publishers_later_record_at_an_earlier_offset_is_reordered():
    history = stream_history()
    history.reads = [
        StreamRead("s-0", 0, "r2", "c1", 1, 0),
        StreamRead("s-0", 1, "r1", "c1", 1, 0),
    ]
    assert check_streams(history).violations == {"reordered": ["p1 on s-0: r2@0 before r1@1"]}


def test_a_subscription_that_skips_or_goes_back_is_caught():
    history = stream_history()
    history.reads += [
        StreamRead("s-0", 0, "r1", "c3", 1, 1),
        StreamRead("s-0", 2, "r3", "c4", 1, 0),
    ]
    assert check_streams(history).violations == {
        "backwards": ["c3#1 on s-0: 0 after 0"],
        "gaps": ["c4#1 on s-0: 2, expected 0"],
    }


def test_two_members_holding_one_partition_at_once_share_it():
    history = stream_history()
    # b's delivery comes while a has not acked offset 0 yet.
    history.group_acks = [GroupAck("g", "s-0", 0, "a", 1, 4.0)]
    assert check_streams(history).violations == {"shared": ["g on s-0: a#1 and b#1"]}


def test_a_member_whose_session_ended_holds_nothing_after_it():
    history = stream_history()
    history.group_acks = []
    history.session_ends = [SessionEnd("a", 1, 2.5)]
    assert check_streams(history).violations == {}
    history.session_ends = [SessionEnd("a", 1, 3.5)]
    assert check_streams(history).violations == {"shared": ["g on s-0: a#1 and b#1"]}

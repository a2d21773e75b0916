"""What a work queue hands to dead-lettering, on a fake clock (no socket, no broker): which
messages die, for which reason, and that each stays in flight until `dead_lettered`."""

from __future__ import annotations

import asyncio
import struct

import pytest
from doubles import work_queue
from test_queue_behaviour import (
    CONFIG,
    NO_PROPERTIES,
    T0,
    drain,
    make_queue,
    properties,
    publish,
)

from warrenmq.amqp import frames
from warrenmq.log import LogConfig
from warrenmq.server.queue import LogQueue, QueueConfig, ack_log
from warrenmq.server.queue.work_queue import WorkQueue

__all__ = ["make_queue"]  # the fixture, shared with the behaviour tests

DLX = {"x-dead-letter-exchange": "dlx"}


def dead(queue: WorkQueue) -> list[tuple[bytes, str]]:
    return [(message.body, reason) for message, reason in queue.take_dead_letters()]


def test_a_rejected_delivery_dies_and_stays_in_flight_until_dead_lettered(make_queue):
    queue = make_queue(**DLX)
    publish(queue, T0, b"a", b"b")
    message = queue.take(T0)
    queue.reject([message.offset])
    pending = queue.take_dead_letters()
    assert [(m.body, reason) for m, reason in pending] == [(b"a", "rejected")]
    # Neither ready nor gone: a crash now would bring it back.
    assert queue.ready_count == 1
    assert queue.engine.unacked_count == 1
    queue.dead_lettered([m.offset for m, _ in pending])
    assert queue.engine.unacked_count == 0
    assert drain(queue, T0) == [b"b"]


def test_without_a_dead_letter_exchange_a_rejected_delivery_is_dropped(make_queue):
    queue = make_queue()
    publish(queue, T0, b"a")
    queue.reject([queue.take(T0).offset])
    assert queue.dead_letters == []
    assert queue.engine.unacked_count == 0
    assert queue.ready_count == 0


def test_expired_messages_die_at_the_head_in_order(make_queue):
    queue = make_queue(**DLX, **{"x-message-ttl": 100})
    publish(queue, T0, b"a", b"b")
    publish(queue, T0 + 50, b"c")
    queue.run_timers(T0 + 100)
    assert dead(queue) == [(b"a", "expired"), (b"b", "expired")]
    assert queue.ready_count == 1
    queue.run_timers(T0 + 150)
    assert dead(queue) == [(b"c", "expired")]


def test_per_message_expiration_dies_with_reason_expired(make_queue):
    queue = make_queue(**DLX)
    publish(queue, T0, b"a", props=properties(expiration="10"))
    assert queue.take(T0 + 10) is None
    assert dead(queue) == [(b"a", "expired")]


def test_drop_head_overflow_dead_letters_the_head(make_queue):
    queue = make_queue(**DLX, **{"x-max-length": 2})
    publish(queue, T0, b"a", b"b", b"c")
    assert dead(queue) == [(b"a", "maxlen")]
    assert drain(queue, T0) == [b"b", b"c"]


def test_max_length_bytes_overflow_dead_letters_the_head(make_queue):
    queue = make_queue(**DLX, **{"x-max-length-bytes": 4})
    publish(queue, T0, b"aa", b"bb", b"cc")
    assert dead(queue) == [(b"aa", "maxlen")]
    assert drain(queue, T0) == [b"bb", b"cc"]


def test_reject_publish_dlx_dead_letters_the_refused_message(make_queue):
    queue = make_queue(**DLX, **{"x-max-length": 1, "x-overflow": "reject-publish-dlx"})
    assert queue.stage((b"", b"q", NO_PROPERTIES, b"a"), False)
    assert not queue.stage((b"", b"q", NO_PROPERTIES, b"b"), False)
    pending = queue.take_dead_letters()
    # Never stored here: nothing to settle in this queue.
    assert [(m.offset, m.body, reason) for m, reason in pending] == [(-1, b"b", "maxlen")]


def test_reject_publish_without_dlx_dead_letters_nothing(make_queue):
    queue = make_queue(**DLX, **{"x-max-length": 1, "x-overflow": "reject-publish"})
    assert queue.stage((b"", b"q", NO_PROPERTIES, b"a"), False)
    assert not queue.stage((b"", b"q", NO_PROPERTIES, b"b"), False)
    assert queue.dead_letters == []


def test_a_message_past_its_delivery_limit_dies_instead_of_coming_back(make_queue):
    queue = make_queue(**DLX, **{"x-delivery-limit": 2})
    publish(queue, T0, b"a")
    for delivery in (1, 2):
        message = queue.take(T0)
        assert message.delivery_count == delivery
        queue.requeue([message.offset], failed=True)
        assert queue.dead_letters == []
    message = queue.take(T0)
    queue.requeue([message.offset], failed=True)
    assert dead(queue) == [(b"a", "delivery_limit")]
    assert queue.ready_count == 0


def test_past_its_delivery_limit_without_dlx_a_message_is_dropped(make_queue):
    queue = make_queue(**{"x-delivery-limit": 0})
    publish(queue, T0, b"a")
    queue.requeue([queue.take(T0).offset], failed=True)
    assert queue.ready_count == 0
    assert queue.engine.unacked_count == 0


def redelivery_headers(queue: WorkQueue, failed: list[bool]) -> list[dict | None]:
    """The headers of a delivery and of its redelivery after each return in `failed` (True:
    a failed delivery, as basic.reject; False: as basic.nack)."""
    headers = []
    for failure in [*failed, None]:
        message = queue.take(T0)
        headers.append(frames.decode_properties(message.properties).headers)
        if failure is not None:
            queue.requeue([message.offset], failed=failure)
    return headers


def test_redeliveries_carry_x_delivery_count_where_there_is_a_delivery_limit(make_queue):
    queue = make_queue(**{"x-delivery-limit": 10})
    publish(queue, T0, b"a", props=properties(headers={"h": "v"}))
    assert redelivery_headers(queue, [True, True]) == [
        {"h": "v"},
        {"h": "v", "x-acquired-count": 1, "x-delivery-count": 1},
        {"h": "v", "x-acquired-count": 2, "x-delivery-count": 2},
    ]


def test_x_delivery_count_counts_failed_deliveries_and_x_acquired_count_every_return(
    make_queue,
):
    # RabbitMQ 4.3 (PR 15387): basic.reject counts a failed delivery, basic.nack does not;
    # x-delivery-count appears with the first failure, x-acquired-count with the first return.
    queue = make_queue(**{"x-delivery-limit": 10})
    publish(queue, T0, b"a")
    assert redelivery_headers(queue, [False, True, False, True]) == [
        None,
        {"x-acquired-count": 1},
        {"x-acquired-count": 2, "x-delivery-count": 1},
        {"x-acquired-count": 3, "x-delivery-count": 1},
        {"x-acquired-count": 4, "x-delivery-count": 2},
    ]


def test_returns_that_are_no_failures_never_reach_the_delivery_limit(make_queue):
    queue = make_queue(**DLX, **{"x-delivery-limit": 1})
    publish(queue, T0, b"a")
    for _ in range(30):
        queue.requeue([queue.take(T0).offset], failed=False)
    assert queue.dead_letters == []
    queue.requeue([queue.take(T0).offset], failed=True)
    assert queue.dead_letters == []
    # The second failure exceeds the limit of 1, whatever the returns in between.
    queue.requeue([queue.take(T0).offset], failed=False)
    message = queue.take(T0)
    assert (message.delivery_count, message.failed_count) == (33, 1)
    queue.requeue([message.offset], failed=True)
    assert dead(queue) == [(b"a", "delivery_limit")]


def test_a_priority_queue_counts_failed_deliveries_per_message(make_queue):
    queue = make_queue(**DLX, **{"x-max-priority": 5, "x-delivery-limit": 0})
    publish(queue, T0, b"high", props=properties(priority=5))
    publish(queue, T0, b"low", props=properties(priority=1))
    high = queue.take(T0)
    queue.requeue([high.offset], failed=False)
    high = queue.take(T0)
    assert (high.body, high.delivery_count, high.failed_count) == (b"high", 2, 0)
    queue.requeue([high.offset], failed=True)
    assert dead(queue) == [(b"high", "delivery_limit")]
    assert [m.body for m in queue.take_many(2, T0)] == [b"low"]


def test_a_classic_queue_without_a_delivery_limit_adds_no_header(make_queue):
    queue = make_queue()
    publish(queue, T0, b"a")
    assert redelivery_headers(queue, [True, False]) == [None, None, None]


def test_a_quorum_queue_has_rabbitmq_4s_delivery_limit_of_20_and_minus_1_disables_it(tmp_path):
    def quorum(name: str, **arguments) -> WorkQueue:
        engine = LogQueue.open(tmp_path / name)
        engine.close()
        return work_queue(engine, name, "quorum", **arguments)

    assert quorum("default").delivery_limit == 20
    assert quorum("unlimited", **{"x-delivery-limit": -1}).delivery_limit is None
    assert quorum("five", **{"x-delivery-limit": 5}).delivery_limit == 5


def counts(messages: list) -> list[tuple[bytes, int, int]]:
    """(body, deliveries, failed deliveries) of each message."""
    return [(m.body, m.delivery_count, m.failed_count) for m in messages]


def reopened_counts(path, config: QueueConfig | None = None) -> list[tuple[bytes, int, int]]:
    """Open the queue in `path` again and take everything: the counts each message has."""
    engine = LogQueue.open(path, config)
    try:
        return counts(engine.take_many(100))
    finally:
        engine.close()


@pytest.mark.parametrize("crash", [False, True])
def test_delivery_counts_survive_a_restart_and_a_crash(tmp_path, crash):
    async def scenario() -> None:
        engine = LogQueue.open(tmp_path)
        engine.append([(b"", b"q", NO_PROPERTIES, b"a")])
        for failed in (True, False, True):
            engine.requeue([engine.take_many(1)[0].offset], failed=failed)
        if crash:
            await engine.commit()
            engine.close()
        else:
            await engine.shutdown()

    asyncio.run(scenario())
    # Returned before the crash: the crash took it from no consumer, so no failure is added.
    assert reopened_counts(tmp_path) == [(b"a", 4, 2)]


def test_a_crash_counts_a_failed_delivery_for_what_was_with_a_consumer_once(tmp_path):
    async def scenario() -> None:
        engine = LogQueue.open(tmp_path)
        engine.append([(b"", b"q", NO_PROPERTIES, body) for body in (b"a", b"b", b"c")])
        a, b, c = engine.take_many(3)
        engine.requeue([a.offset], failed=False)
        engine.requeue([b.offset], failed=True)
        engine.take_many(1)  # a again: in flight at the crash, its count durable
        await engine.commit()
        engine.close()  # the crash
        # Opened and crashed again before anything is delivered: no second failure.
        engine = LogQueue.open(tmp_path)
        await engine.commit()
        engine.close()

    asyncio.run(scenario())
    # a: in flight, b: returned, c: in flight since its first delivery (no count recorded).
    assert reopened_counts(tmp_path) == [(b"a", 3, 1), (b"b", 2, 1), (b"c", 2, 1)]


def test_delivery_counts_survive_ack_log_compaction(tmp_path):
    # Tiny segments and a snapshot at every commit: the records written before a snapshot
    # are deleted, so only the snapshot can carry the counts over.
    config = QueueConfig(
        ack_log=LogConfig(segment_bytes_max=128, tail_cache_bytes_max=0),
        ack_log_compact_bytes=1,
    )

    async def scenario() -> None:
        engine = LogQueue.open(tmp_path, config)
        engine.append([(b"", b"q", NO_PROPERTIES, body) for body in (b"a", b"b", b"c")])
        for failed in (True, False):
            taken = engine.take_many(3)
            engine.requeue([m.offset for m in taken], failed=failed)
            await engine.commit()
        # Acks after the counts: more snapshots, each of which must carry the counts and
        # which message was returned.
        first, second = engine.take_many(2)
        engine.ack_many([first.offset])
        for _ in range(4):
            await engine.commit()
            engine.ack_many([])
        assert engine._acks.start_offset > 0
        engine.close()

    asyncio.run(scenario())
    # a: acked, gone; b: in flight at the crash (a failure more); c: returned.
    assert reopened_counts(tmp_path, config) == [(b"b", 4, 2), (b"c", 3, 1)]


def test_counts_written_before_the_split_replay_with_every_return_failed(tmp_path):
    # Earlier versions wrote COUNTS records of (offset, deliveries), every return a failure
    # (x-delivery-limit bounded them): such a message keeps its limit after the upgrade.
    state = ack_log.AckState()
    state.apply(ack_log.HEAD.pack(ack_log.COUNTS, 0, 0, 2) + struct.pack("<4Q", 3, 4, 7, 2))
    assert (state.counts, state.failures, state.returned) == ({3: 4, 7: 2}, {3: 3, 7: 1}, set())
    # A newer record of the same offset replaces it.
    (record,) = ack_log.encode_counts(ack_log.RETURNED, [(3, 5, 3)])
    state.apply(record[3])
    assert (state.counts, state.failures, state.returned) == ({3: 5, 7: 2}, {3: 3, 7: 1}, {3})


def test_an_old_counts_record_in_a_data_dir_still_counts(tmp_path):
    async def scenario() -> None:
        engine = LogQueue.open(tmp_path)
        engine.append([(b"", b"q", NO_PROPERTIES, b"a")])
        engine.take_many(1)
        await engine.commit()
        # What an earlier version wrote after three deliveries.
        engine._acks.append(
            [(b"", b"", b"", ack_log.HEAD.pack(ack_log.COUNTS, 0, 0, 1) + struct.pack("<2Q", 0, 3))]
        )
        await engine.commit()
        engine.close()

    asyncio.run(scenario())
    # Two failed returns before, and the crash cut the third delivery.
    assert reopened_counts(tmp_path) == [(b"a", 4, 3)]


def test_a_requeued_message_waits_its_exponential_delay_while_others_flow_past(make_queue):
    queue = make_queue(**{"x-requeue-delay": 100, "x-requeue-delay-max": 300})
    publish(queue, T0, b"a", b"b")
    waits = []
    now = T0
    for _ in range(4):
        message = queue.take(now)
        assert message.body == b"a"
        queue.requeue([message.offset], failed=False)
        ready_at = queue.run_timers(now)
        waits.append(ready_at - now)
        # Meanwhile "a" is not ready; "b" is the only ready message.
        assert queue.ready_count == 1
        now = ready_at
    assert waits == [100, 200, 300, 300]
    assert queue.take(now).body == b"a"
    assert drain(queue, now) == [b"b"]


def test_the_requeue_delay_counts_deliveries_and_the_delivery_limit_still_applies(make_queue):
    queue = make_queue(**DLX, **{"x-requeue-delay": 10, "x-delivery-limit": 1})
    publish(queue, T0, b"a")
    queue.requeue([queue.take(T0).offset], failed=True)
    ready_at = queue.run_timers(T0)
    assert queue.take(ready_at - 1) is None
    message = queue.take(ready_at)
    assert message.delivery_count == 2
    queue.requeue([message.offset], failed=True)
    assert dead(queue) == [(b"a", "delivery_limit")]


def test_browsing_shows_ready_and_unacked_messages_without_delivering_them(make_queue):
    from warrenmq.dlq.inspect import describe, raw_message

    queue = make_queue()
    publish(queue, T0, b"a", b"b", b"c", props=properties(headers={"k": "v"}, delivery_mode=2))
    taken = queue.take(T0)
    queue.ack([queue.take(T0).offset])
    browsed = queue.engine.browse(0, 10)
    assert [(m.body, in_flight) for m, in_flight in browsed] == [(b"a", True), (b"c", False)]
    assert queue.engine.browse(browsed[1][0].offset, 10)[0][0].body == b"c"
    assert [m.body for m, _ in queue.engine.browse(0, 1)] == [b"a"]
    # Browsing changed nothing: "c" is still the next delivery, "a" still in flight.
    assert queue.ready_count == 1 and queue.engine.unacked_count == 1
    message, in_flight = browsed[0]
    line = describe(
        message.offset,
        message.exchange,
        message.routing_key,
        message.properties,
        message.body,
        in_flight=in_flight,
        redelivered=message.redelivered,
    )
    assert line["state"] == "unacked" and line["headers"] == {"k": "v"}
    assert line["properties"] == {"delivery_mode": 2}
    assert raw_message(line) == ("q", taken.properties, b"a")


def test_browsing_a_priority_queue_covers_every_level(make_queue):
    queue = make_queue(**{"x-max-priority": 5})
    for priority, body in ((1, b"low"), (5, b"high")):
        publish(queue, T0, body, props=properties(priority=priority))
    assert sorted(m.body for m, _ in queue.engine.browse(0, 10)) == [b"high", b"low"]


def _waits(queue: WorkQueue, now: int, returns: list[bool]) -> list[int]:
    """Take the one message and return it (failed or not) once per entry: how long each
    return kept it back (0: ready at once)."""
    waits = []
    for failed in returns:
        message = queue.take(now)
        queue.requeue([message.offset], failed=failed)
        ready_at = queue.run_timers(now)
        waits.append(0 if ready_at is None else ready_at - now)
        now = now if ready_at is None else ready_at
    return waits


@pytest.mark.parametrize(
    ("retry_type", "returns", "waits"),
    [
        # min * failed deliveries (this one included), at least min once, at most max.
        ("failed", [True, True, True, False, True], [100, 200, 250, 0, 250]),
        # A return that is no failure leaves the failed count as it was (at least 1 x min).
        ("returned", [False, True, False, False], [100, 0, 100, 100]),
        ("all", [False, True, True], [100, 100, 200]),
    ],
)
def test_rabbitmq_4_3_delayed_retry(make_queue, retry_type, returns, waits):
    queue = make_queue(
        **{
            "x-delayed-retry-type": retry_type,
            "x-delayed-retry-min": 100,
            "x-delayed-retry-max": 250,
        }
    )
    publish(queue, T0, b"a")
    assert _waits(queue, T0, returns) == waits


@pytest.mark.parametrize(
    "arguments",
    [
        {"x-delayed-retry-type": "all"},
        {"x-delayed-retry-type": "disabled", "x-delayed-retry-min": 100},
        {"x-delayed-retry-type": "sometimes", "x-delayed-retry-min": 100},
        {"x-delayed-retry-type": "all", "x-delayed-retry-min": 0},
    ],
)
def test_a_delayed_retry_without_a_type_or_a_positive_minimum_is_disabled(make_queue, arguments):
    queue = make_queue(**arguments)
    publish(queue, T0, b"a")
    assert _waits(queue, T0, [True, False]) == [0, 0]


def test_the_delayed_retry_maximum_defaults_to_the_minimum(make_queue):
    queue = make_queue(**{"x-delayed-retry-type": b"failed", "x-delayed-retry-min": 100})
    publish(queue, T0, b"a")
    assert _waits(queue, T0, [True, True, True]) == [100, 100, 100]


def _reopened_work_queue(path, **arguments) -> WorkQueue:
    return work_queue(LogQueue.open(path, CONFIG), **arguments)


@pytest.mark.parametrize("crash", [False, True])
@pytest.mark.parametrize("failed", [False, True])
def test_a_requeue_delay_survives_a_restart_and_a_crash(tmp_path, crash, failed):
    """The message waits out its delay after the queue came back, others flow past it
    meanwhile, and no failed delivery is added for the outage: it was with no consumer."""
    delay = {"x-requeue-delay": 1000}
    queue = _reopened_work_queue(tmp_path, **delay)
    publish(queue, T0, b"a", b"b")
    queue.requeue([queue.take(T0).offset], failed=failed)
    assert queue.run_timers(T0) == T0 + 1000

    async def go_down() -> None:
        await queue.engine.commit()
        if crash:
            queue.engine.close()
        else:
            await queue.engine.shutdown()

    asyncio.run(go_down())
    queue = _reopened_work_queue(tmp_path, **delay)
    try:
        assert queue.has_timers
        assert queue.run_timers(T0 + 10) == T0 + 1000
        assert queue.take(T0 + 10).body == b"b"
        assert queue.take(T0 + 999) is None
        message = queue.take(T0 + 1000)
        assert (message.body, message.delivery_count, message.failed_count) == (
            b"a",
            2,
            int(failed),
        )
    finally:
        queue.engine.close()


def test_a_held_message_survives_an_ack_log_snapshot(tmp_path):
    """Compaction rewrites the whole state: the hold and its due time are part of it."""
    config = QueueConfig(ack_log_compact_bytes=1)
    engine = LogQueue.open(tmp_path, config)
    engine.append([(b"", b"q", NO_PROPERTIES, body) for body in (b"a", b"b", b"c")])
    taken = engine.take_many(3)
    assert engine.hold([taken[0].offset], T0 + 500, failed=True) == 1
    assert engine.ready_count == 0 and engine.unacked_count == 3

    async def settle_and_crash() -> None:
        await engine.commit()
        engine.ack_many([taken[1].offset])
        await engine.commit()
        engine.ack_many([taken[2].offset])
        await engine.commit()
        engine.close()

    asyncio.run(settle_and_crash())
    engine = LogQueue.open(tmp_path, config)
    try:
        assert engine.held() == [(taken[0].offset, T0 + 500)]
        assert engine.ready_count == 0 and engine.unacked_count == 1
        assert engine.release([taken[0].offset]) == 1
        (message,) = engine.take_many(1)
        assert (message.body, message.delivery_count, message.failed_count) == (b"a", 2, 1)
    finally:
        engine.close()


def test_an_ack_of_a_held_message_is_ignored(tmp_path):
    """A stale ack (its visibility timeout gave it back) does not settle a waiting message."""
    engine = LogQueue.open(tmp_path)
    try:
        engine.append([(b"", b"q", NO_PROPERTIES, b"a")])
        offset = engine.take_many(1)[0].offset
        engine.hold([offset], T0)
        assert engine.ack_many([offset]) == 0
        assert engine.release([offset]) == 1
        assert engine.take_many(1)[0].body == b"a"
    finally:
        engine.close()


def test_a_policy_taking_the_requeue_delay_away_makes_waiting_messages_ready(make_queue):
    queue = make_queue(**{"x-requeue-delay": 1000})
    publish(queue, T0, b"a")
    queue.requeue([queue.take(T0).offset], failed=False)
    assert queue.run_timers(T0) == T0 + 1000
    queue.requeue([], failed=False)
    queue.apply_arguments({})
    assert queue.has_timers
    queue.run_timers(T0 + 1)
    assert drain(queue, T0 + 1) == [b"a"]


def test_dead_letters_a_target_could_not_store_go_out_again_later_not_at_once(make_queue):
    from warrenmq.server.queue.work_queue import DEAD_LETTER_RETRY_MS

    queue = make_queue(**DLX, **{"x-message-ttl": 10})
    publish(queue, T0, b"a")
    queue.run_timers(T0 + 10)
    failed = queue.take_dead_letters()
    queue.retry_dead_letters(failed)
    # Still in flight, and not dying again every tick meanwhile.
    assert queue.engine.unacked_count == 1 and queue.ready_count == 0
    assert queue.run_timers(T0 + 20) == T0 + 20 + DEAD_LETTER_RETRY_MS
    assert queue.dead_letters == []
    assert queue.run_timers(T0 + 20 + DEAD_LETTER_RETRY_MS - 1) == T0 + 20 + DEAD_LETTER_RETRY_MS
    queue.run_timers(T0 + 20 + DEAD_LETTER_RETRY_MS)
    assert dead(queue) == [(b"a", "expired")]
    assert queue.engine.unacked_count == 1

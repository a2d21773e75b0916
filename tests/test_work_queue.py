"""The work queue without sockets, over a real durable engine: basic.get's take, and
dispatch to consumers (credit, round-robin, priorities, single active consumer)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from doubles import work_queue

from warrenmq.server.queue import LogQueue, QueueConfig
from warrenmq.server.queue.consumer import Consumer
from warrenmq.server.queue.priority import PriorityQueue
from warrenmq.server.queue.work_queue import QueueDeposed, WorkQueue
from warrenmq.server.session.channel import BrokerChannel

PERSISTENT = b"\x10\x00\x02"  # delivery-mode 2
NOW_MS = 1_000_000  # no TTL here: any time serves


def publish(queue: WorkQueue, count: int) -> None:
    for i in range(count):
        assert queue.stage((b"", b"q", PERSISTENT, b"%d" % i), persistent=True)
    queue.flush(NOW_MS)


async def basic_get(queue: WorkQueue):
    """What the broker's basic.get does with the queue."""
    message = queue.take(NOW_MS)
    if message is None and queue.held_until_commit:
        message = await queue.take_after_commit(NOW_MS)
    return message


@pytest.mark.parametrize("kind", ["classic", "quorum", "priority"])
def test_basic_get_drains_past_the_delivered_mark(tmp_path, kind):
    """No commit runs but the ones basic.get waits for: every message still comes out."""

    async def scenario():
        config = QueueConfig(delivered_mark_lead=4, deliver_uncommitted=kind == "classic")
        if kind == "priority":
            engine = PriorityQueue(
                tmp_path,
                2,
                config.message_log.batch_bytes_max,
                lambda level: LogQueue.open(level, config),
            )
        else:
            engine = LogQueue.open(tmp_path, config)
        queue = work_queue(engine)
        publish(queue, 20)
        bodies = []
        while (message := await basic_get(queue)) is not None:
            queue.ack([message.offset])  # no-ack
            bodies.append(message.body)
        assert bodies == [b"%d" % i for i in range(20)] and queue.ready_count == 0
        engine.close()

    asyncio.run(scenario())


def test_a_priority_level_held_until_a_commit_holds_the_levels_below(tmp_path):
    """A lower level must not serve while a higher one waits for its delivered mark."""

    async def scenario():
        config = QueueConfig(delivered_mark_lead=4)
        engine = PriorityQueue(
            tmp_path,
            2,
            config.message_log.batch_bytes_max,
            lambda level: LogQueue.open(level, config),
        )
        queue = work_queue(engine)
        for i in range(6):
            assert queue.stage((b"", b"q", b"\x08\x00\x02", b"high-%d" % i), persistent=False)
        assert queue.stage((b"", b"q", b"\x00\x00", b"low"), persistent=False)
        queue.flush(NOW_MS)
        bodies = []
        while (message := await basic_get(queue)) is not None:
            queue.ack([message.offset])
            bodies.append(message.body)
        assert bodies == [b"high-%d" % i for i in range(6)] + [b"low"]
        engine.close()

    asyncio.run(scenario())


def test_a_get_waiting_for_a_commit_of_a_deleted_queue_finds_nothing(tmp_path):
    async def scenario():
        engine = LogQueue.open(tmp_path, QueueConfig(deliver_uncommitted=False))
        queue = work_queue(engine)
        publish(queue, 3)
        assert queue.take(NOW_MS) is None and queue.held_until_commit
        waiting = asyncio.ensure_future(queue.take_after_commit(NOW_MS))
        await asyncio.sleep(0)
        queue.deleted = True  # what VirtualHost.take_queue does
        engine.delete()
        assert await waiting is None

    asyncio.run(scenario())


def test_a_deposed_queue_fails_its_commits_instead_of_confirming_them(tmp_path):
    """A replicated queue's leader moved away (`VirtualHost.step_down`): the publishes that
    waited for its commit are not on the quorum, so the commit raises and they are nacked,
    where a deleted queue's commit returns (RabbitMQ confirms publishes to a deleted queue)."""

    async def scenario():
        engine = LogQueue.open(tmp_path, QueueConfig())
        queue = work_queue(engine)
        publish(queue, 3)
        queue.deposed = queue.deleted = True
        with pytest.raises(QueueDeposed):
            await queue.commit()
        engine.close()

    asyncio.run(scenario())


def test_publishes_staged_on_a_queue_leaving_this_node_are_handed_back_not_written(tmp_path):
    """`VirtualHost.step_down` refuses what is staged and not yet written: the tick skips a
    deleted queue, so its publishes would otherwise be confirmed and never stored."""
    engine = LogQueue.open(tmp_path, QueueConfig())
    queue = work_queue(engine)
    queue.stage((b"", b"q", PERSISTENT, b"a"), persistent=True, publisher=("channel", 1))
    queue.stage((b"", b"q", PERSISTENT, b"b"), persistent=True, publisher=None)
    assert queue.drop_staged() == [("channel", 1), None]
    queue.flush(NOW_MS)
    assert queue.take_written() == ([], [], False)
    assert engine.end_offset == 0
    engine.close()


# -- consumers: credit bookkeeping, round-robin, priorities, single active ------------------

# The delivered mark never holds dispatch back here: these tests are about consumers.
NO_MARK = QueueConfig(delivered_mark_lead=1 << 40)


class FakeConnection:
    """What a BrokerChannel needs of its connection: writability and the deliveries."""

    def __init__(self):
        self.writable = True
        self.amqp = SimpleNamespace(channel=lambda number: SimpleNamespace(tx_mode=False))
        self.channels = {}
        self.delivered: list[tuple[str, bytes]] = []  # (consumer tag, body)

    def output_ready(self):
        pass

    def send_deliveries(self, channel, consumer_tag, first_tag, messages):
        self.delivered.extend((consumer_tag, message.body) for message in messages)

    def take_delivered(self):
        delivered, self.delivered = self.delivered, []
        return delivered


def consume(
    queue, channel, tag, *, priority=0, prefetch=0, no_ack=False, exclusive=False
) -> Consumer:
    """What basic.consume does with the queue."""
    consumer = Consumer(tag, channel, queue, no_ack, exclusive, priority, prefetch)
    channel.consumers[tag] = consumer
    queue.add_consumer(consumer)
    return consumer


def dispatch(queue):
    while queue.dispatch(NOW_MS):
        pass


def publish_one(queue, body):
    assert queue.stage((b"", b"q", b"\x00\x00", body), persistent=False)
    queue.flush(NOW_MS)
    dispatch(queue)


def ack(channel, delivery_tag):
    """What basic.ack does: settle, then dispatch what that may have unblocked."""
    for queue in channel.apply(channel.take(delivery_tag, False), None, failed=False):
        dispatch(queue)


def tags(delivered):
    return [tag for tag, _ in delivered]


@pytest.fixture
def queue(tmp_path):
    engine = LogQueue.open(tmp_path, NO_MARK)
    yield work_queue(engine)
    engine.close()


@pytest.fixture
def connection():
    return FakeConnection()


def channel_of(connection, number, unacked_max=1 << 20):
    return BrokerChannel(connection, number, unacked_max, tx_messages_max=100)


@pytest.fixture
def credit_checks(monkeypatch):
    """How many times dispatch asked a consumer whether it has credit."""
    counter = {"calls": 0}
    credit = Consumer.credit

    def counting(consumer, count_max):
        counter["calls"] += 1
        return credit(consumer, count_max)

    monkeypatch.setattr(Consumer, "credit", counting)
    return counter


@pytest.mark.parametrize("lacking", ["prefetch", "flow"])
def test_consumers_without_credit_cost_a_publish_nothing(queue, connection, credit_checks, lacking):
    """50,000 consumers without credit (each at prefetch 1 with a message unacked, or on a
    flow-stopped channel) and one with credit: a publish and its dispatch look at a bounded
    number of consumers, not at all of them."""
    idle_count, publishes = 50_000, 20
    idle = channel_of(connection, 1)
    for i in range(idle_count):
        consume(queue, idle, f"idle-{i}", prefetch=1)
    if lacking == "prefetch":
        publish(queue, idle_count)
        dispatch(queue)
        assert len(connection.take_delivered()) == len(idle.unacked) == idle_count
    else:
        idle.flow_active = False
    busy = channel_of(connection, 2)
    consume(queue, busy, "busy", no_ack=True)
    # The first dispatch finds each idle consumer out of credit once, and blocks it.
    publish_one(queue, b"first")
    assert connection.take_delivered() == [("busy", b"first")]

    credit_checks["calls"] = 0
    for i in range(publishes):
        publish_one(queue, b"%d" % i)
    assert connection.take_delivered() == [("busy", b"%d" % i) for i in range(publishes)]
    assert credit_checks["calls"] <= 2 * publishes

    # Credit coming back to one idle consumer (an ack) or to the idle channel (flow) puts
    # just those consumers back in rotation, after the one already there.
    credit_checks["calls"] = 0
    if lacking == "prefetch":
        ack(idle, 7)  # idle-6's delivery
        for i in range(3):
            publish_one(queue, b"after-%d" % i)
        assert tags(connection.take_delivered()) == ["busy", "idle-6", "busy"]
        assert credit_checks["calls"] <= 6
    else:
        idle.flow_active = True
        assert idle.unblock_consumers() == {queue}
        for i in range(4):
            publish_one(queue, b"after-%d" % i)
        assert tags(connection.take_delivered()) == ["busy", "idle-0", "idle-1", "idle-2"]


def test_round_robin_within_a_level_as_credit_comes_and_goes(queue, connection):
    """Consumers with credit take turns; one whose credit returns rejoins the turn last (as
    rabbit_queue_consumers' unblock does)."""
    channel = channel_of(connection, 1)
    for tag in ("a", "b", "c"):
        consume(queue, channel, tag, prefetch=1)
    for i in range(5):
        publish_one(queue, b"%d" % i)
    assert connection.take_delivered() == [("a", b"0"), ("b", b"1"), ("c", b"2")]
    ack(channel, 2)  # b's
    assert connection.take_delivered() == [("b", b"3")]
    ack(channel, 1)  # a's
    assert connection.take_delivered() == [("a", b"4")]
    ack(channel, 3)  # c's: nothing is ready
    for i in range(5, 7):
        publish_one(queue, b"%d" % i)
    assert connection.take_delivered() == [("c", b"5")]
    for tag in (4, 5, 6):
        ack(channel, tag)
    assert connection.take_delivered() == [("b", b"6")]
    ack(channel, 7)
    for i in range(7, 10):
        publish_one(queue, b"%d" % i)
    assert tags(connection.take_delivered()) == ["b", "a", "c"]


def test_equal_consumers_with_credit_take_turns(queue, connection):
    channel = channel_of(connection, 1)
    for tag in ("a", "b", "c"):
        consume(queue, channel, tag)
    publish(queue, 7)
    dispatch(queue)
    assert tags(connection.take_delivered()) == ["a", "b", "c", "a", "b", "c", "a"]


def test_a_lower_priority_is_served_only_while_every_higher_consumer_lacks_credit(
    queue, connection
):
    channel = channel_of(connection, 1)
    consume(queue, channel, "low")
    consume(queue, channel, "high-1", priority=10, prefetch=1)
    consume(queue, channel, "high-2", priority=10, prefetch=1)
    consume(queue, channel, "middle", priority=5, prefetch=1)
    for i in range(6):
        publish_one(queue, b"%d" % i)
    assert tags(connection.take_delivered()) == ["high-1", "high-2", "middle", "low", "low", "low"]
    ack(channel, 2)  # high-2's
    publish_one(queue, b"6")
    assert connection.take_delivered() == [("high-2", b"6")]
    ack(channel, 3)  # middle's
    publish_one(queue, b"7")
    publish_one(queue, b"8")
    assert tags(connection.take_delivered()) == ["middle", "low"]


def test_a_single_active_consumer_gets_everything_until_it_goes(tmp_path, connection):
    engine = LogQueue.open(tmp_path, NO_MARK)
    queue = work_queue(engine, **{"x-single-active-consumer": True})
    channel = channel_of(connection, 1)
    first = consume(queue, channel, "first", prefetch=1)
    consume(queue, channel, "second")
    for i in range(3):
        publish_one(queue, b"%d" % i)
    assert connection.take_delivered() == [("first", b"0")]
    ack(channel, 1)
    assert connection.take_delivered() == [("first", b"1")]
    queue.remove_consumer(first)
    channel.consumers.pop("first")
    dispatch(queue)
    assert connection.take_delivered() == [("second", b"2")]
    engine.close()


def test_channel_credit_unblocks_the_channels_consumers(queue, connection):
    """Global prefetch is the channel's: consumers blocked on it come back with an ack of
    any of them, and a cancelled one is forgotten by the channel."""
    channel = channel_of(connection, 1)
    channel.global_prefetch = 2
    a, b, c = (consume(queue, channel, tag) for tag in ("a", "b", "c"))
    for i in range(4):
        publish_one(queue, b"%d" % i)
    assert tags(connection.take_delivered()) == ["a", "b"]
    assert set(channel.blocked) == {a, b, c}
    queue.remove_consumer(b)
    channel.consumers.pop("b")
    assert set(channel.blocked) == {a, c}
    ack(channel, 1)  # a's
    assert tags(connection.take_delivered()) == ["c"]
    channel.global_prefetch = 0  # basic.qos global=true, prefetch 0
    for changed in channel.unblock_consumers():
        dispatch(changed)
    assert tags(connection.take_delivered()) == ["a"]


def test_a_full_socket_blocks_no_ack_consumers_until_it_drains(queue, connection):
    channel = channel_of(connection, 1)
    consume(queue, channel, "a", no_ack=True)
    consume(queue, channel, "b", no_ack=True)
    connection.writable = False
    publish_one(queue, b"0")
    assert connection.take_delivered() == []
    assert len(channel.blocked_no_ack) == 2
    connection.writable = True  # resume_writing
    for changed in channel.unblock_consumers():
        dispatch(changed)
    assert connection.take_delivered() == [("a", b"0")]


def test_the_exclusive_consumer_is_the_only_one(queue, connection):
    channel = channel_of(connection, 1)
    shared = consume(queue, channel, "shared")
    assert queue.exclusive_consumer() is None
    queue.remove_consumer(shared)
    alone = consume(queue, channel, "alone", exclusive=True)
    assert queue.exclusive_consumer() is alone
    queue.remove_consumer(alone)
    assert queue.exclusive_consumer() is None


# -- the consumer timeout (the channel's side) ------------------------------------------------


def test_timed_out_finds_deliveries_past_their_queues_timeout_oldest_first(tmp_path, connection):
    short = work_queue(LogQueue.open(tmp_path / "short", NO_MARK), "short")
    long = work_queue(LogQueue.open(tmp_path / "long", NO_MARK), "long")
    short.consumer_timeout_ms = 100
    channel = BrokerChannel(connection, 1, 1000, tx_messages_max=100, consumer_timeout_ms=10_000)
    try:
        for queue in (long, short):
            consume(queue, channel, f"c-{queue.name}")
            publish_one(queue, b"m")
        delivered_ms = {entry.queue: entry.delivered_ms for entry in channel.unacked.values()}
        assert channel.shortest_timeout_ms == 100
        # The long queue's delivery is older but within the broker's 10 s default.
        assert channel.timed_out(delivered_ms[short] + 99) == ([], [])
        assert [e.queue for e in channel.timed_out(delivered_ms[short] + 100)[0]] == [short]
        assert len(channel.timed_out(delivered_ms[long] + 10_000)[0]) == 2
    finally:
        short.engine.close()
        long.engine.close()


def test_a_timeout_of_0_disables_it(queue, connection):
    channel = BrokerChannel(connection, 1, 1000, tx_messages_max=100, consumer_timeout_ms=0)
    consume(queue, channel, "c")
    publish_one(queue, b"m")
    assert channel.timed_out(1 << 62) == ([], [])


def test_late_settles_of_reclaimed_deliveries_are_ignored(queue, connection):
    channel = channel_of(connection, 1)
    consumer = consume(queue, channel, "c")
    for body in (b"a", b"b", b"c"):
        publish_one(queue, body)
    reclaimed = channel.reclaim(consumer)
    assert [entry.tag for entry in reclaimed] == [1, 2, 3]
    channel.apply(reclaimed, True, failed=False)
    assert channel.unacked == {}
    # A late ack of a reclaimed tag is no error and settles nothing...
    assert channel.take(2, False) == []
    # ... but only once: the tag is forgotten afterwards, as any settled tag.
    with pytest.raises(Exception, match="unknown delivery tag 2"):
        channel.take(2, False)
    assert queue.ready_count == 3


def test_a_multiple_ack_through_a_reclaimed_tag_settles_the_deliveries_below_it(queue, connection):
    channel = channel_of(connection, 1)
    first = consume(queue, channel, "first")
    publish_one(queue, b"a")
    queue.remove_consumer(first)
    consume(queue, channel, "second")
    publish_one(queue, b"b")
    late = consume(queue, channel, "late")
    queue.remove_consumer(channel.consumers["second"])
    publish_one(queue, b"c")
    channel.apply(channel.reclaim(late), True, failed=False)
    assert [entry.tag for entry in channel.take(3, True)] == [1, 2]


def test_past_its_visibility_timeout_a_delivery_gives_its_message_back_and_goes_stale(
    queue, connection
):
    queue.visibility_timeout_ms = 100
    channel = channel_of(connection, 1)
    consume(queue, channel, "c", prefetch=1)
    publish_one(queue, b"m")
    entry = channel.unacked[1]
    assert channel.timed_out(entry.delivered_ms + 99) == ([], [])
    expired, visible = channel.timed_out(entry.delivered_ms + 100)
    assert expired == [] and visible == [entry]
    assert channel.reveal(visible) == {queue}
    assert entry.stale and queue.ready_count == 1
    # Still held by its consumer (its prefetch of 1 is used): not delivered again to it yet.
    dispatch(queue)
    assert list(channel.unacked) == [1]
    # Its ack counts as stale and leaves the message, now ready again, alone.
    ack(channel, 1)
    assert queue.stale_settles == 1
    assert queue.ready_count == 0 and list(channel.unacked) == [2]
    assert channel.unacked[2].queue is queue


def test_an_extended_delivery_stays_invisible_and_a_stale_one_cannot_be_extended(queue, connection):
    queue.visibility_timeout_ms = 100
    channel = channel_of(connection, 1)
    consume(queue, channel, "c")
    publish_one(queue, b"m")
    entry = channel.unacked[1]
    assert channel.extend([1], 1000, entry.delivered_ms)
    assert channel.timed_out(entry.delivered_ms + 999) == ([], [])
    assert channel.timed_out(entry.delivered_ms + 1000)[1] == [entry]
    channel.reveal([entry])
    assert not channel.extend([1], 1000, entry.delivered_ms)
    assert not channel.extend([99], None, entry.delivered_ms)


def test_which_returns_of_a_channel_count_as_failed_deliveries(queue, connection):
    # RabbitMQ 4.3: a lost channel counts a failed delivery, basic.recover does not; Warren's
    # visibility timeout does ("redelivered, count + 1"); a transaction's settles keep theirs.
    queue.visibility_timeout_ms = 100
    channel = channel_of(connection, 1)
    consume(queue, channel, "c")
    publish_one(queue, b"m")
    offset = channel.unacked[1].offset
    failures = []
    channel.requeue_all(failed=False)  # basic.recover
    dispatch(queue)
    failures.append(queue.engine.failures(offset))
    channel.reveal([channel.unacked[2]])
    dispatch(queue)
    failures.append(queue.engine.failures(offset))
    channel.hold(channel.take(3, False), True, failed=True)  # basic.reject in a transaction
    failures.append(queue.engine.failures(offset))
    channel.commit_settles()
    dispatch(queue)
    failures.append(queue.engine.failures(offset))
    channel.requeue_all(failed=True)  # the channel closes
    failures.append(queue.engine.failures(offset))
    assert failures == [0, 1, 1, 2, 3]

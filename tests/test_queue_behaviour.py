"""Work-queue behaviour on a fake clock: no socket, no AMQP session, no sleeps.

A `WorkQueue` over a real `LogQueue` (or `PriorityQueue`) engine in a temporary directory,
driven the way the broker drives it (stage, flush at a tick, dispatch, run_timers) with every
time passed in as epoch milliseconds. Consumers deliver into `FakeChannel`, which keeps the
credit bookkeeping of the AMQP channel (server/session/channel.py) without the wire.

The expected behaviour is RabbitMQ's (classic queues), from its documentation (rabbitmq.com
docs: ttl, maxlength, priority, consumer-priority, consumers#single-active-consumer,
consumer-prefetch) and, where the documentation is silent, from
deps/rabbit/src/rabbit_amqqueue_process.erl. Tests marked xfail(strict) show where Warren
differs today.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from doubles import work_queue
from pamqp import commands

from warrenmq.amqp import frames
from warrenmq.server.queue import LogQueue, QueueConfig
from warrenmq.server.queue.consumer import (
    BLOCKED_BY_CHANNEL,
    BLOCKED_BY_PREFETCH,
    CANCELLED,
    ROTATING,
    Consumer,
)
from warrenmq.server.queue.engine import Message
from warrenmq.server.queue.priority import PriorityQueue
from warrenmq.server.queue.work_queue import WorkQueue

T0 = 1_700_000_000_000  # the fake clock's start, epoch milliseconds
# The engine's delivered mark never holds messages back here: that is engine durability, not
# queue behaviour (tests/test_work_queue.py covers it).
CONFIG = QueueConfig(delivered_mark_lead=1 << 40)
UNLIMITED = 1 << 30


def properties(**fields) -> bytes:
    """Content-header property bytes as a client sends them (pamqp, the project's encoder)."""
    return frames.encode_properties(commands.Basic.Properties(**fields))


NO_PROPERTIES = properties()
assert NO_PROPERTIES == b"\x00\x00"


# -- the queue ----------------------------------------------------------------------------


@pytest.fixture
def make_queue(tmp_path):
    """A factory of WorkQueues over real engines (a PriorityQueue with x-max-priority, as
    broker._open_engine decides), each in its own directory; closed at teardown."""
    engines = []

    def make(**arguments) -> WorkQueue:
        directory = tmp_path / f"q{len(engines)}"
        max_priority = arguments.get("x-max-priority")
        if max_priority:
            engine = PriorityQueue(
                directory,
                max_priority,
                CONFIG.message_log.batch_bytes_max,
                lambda level: LogQueue.open(level, CONFIG),
            )
        else:
            engine = LogQueue.open(directory, CONFIG)
        engines.append(engine)
        return work_queue(engine, f"q{len(engines)}", **arguments)

    yield make
    for engine in engines:
        engine.close()


def publish_with(queue: WorkQueue, now_ms: int, *messages: tuple[bytes, bytes]) -> None:
    """Publishes of one tick, each (properties, body): staged (`expiring` as the session sets
    it), then written stamped `now_ms`."""
    for props, body in messages:
        expiring = frames.decode_properties(props).expiration is not None
        assert queue.stage((b"", b"q", props, body), False, expiring), body
    queue.flush(now_ms)


def publish(queue: WorkQueue, now_ms: int, *bodies: bytes, props: bytes = NO_PROPERTIES) -> None:
    """Publishes of one tick, all with the same properties."""
    publish_with(queue, now_ms, *((props, body) for body in bodies))


def drain(queue: WorkQueue, now_ms: int) -> list[bytes]:
    """basic.get (no-ack) until the queue is empty: the bodies, in delivery order."""
    bodies = []
    while (message := queue.take(now_ms)) is not None:
        queue.ack([message.offset])
        bodies.append(message.body)
    return bodies


def run(queue: WorkQueue, now_ms: int) -> None:
    """What the tick does: dispatch until it stops for want of messages or credit."""
    while queue.dispatch(now_ms):
        pass


# -- the consumer side ----------------------------------------------------------------------


class FakeChannel:
    """A `ConsumerChannel` as server/session/channel.py's BrokerChannel behaves, minus the wire.

    `limit` is the channel's shared unacked limit (global prefetch; None: unlimited) and `open`
    whether it may deliver at all (flow, a writable socket). Deliveries needing an ack are
    counted on the consumer (`unacked_count`) and kept by delivery tag until settled;
    consumers their queue found without the channel's credit are kept in `blocked` and handed
    back (`queue.unblock`) once the channel has credit again.
    """

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self.open = True
        self.delivery_tag = 0
        self.unacked: dict[int, tuple[Consumer, Message]] = {}
        self.delivered: list[tuple[str, Message]] = []
        self.blocked: dict[Consumer, None] = {}
        self.blocked_no_ack: dict[Consumer, None] = {}
        self.cancelled: list[tuple[str, str]] = []

    # The consumer interface.

    def can_deliver(self) -> bool:
        return self.open

    def credit(self) -> int:
        return UNLIMITED if self.limit is None else self.limit - len(self.unacked)

    def block(self, consumer: Consumer) -> None:
        (self.blocked_no_ack if consumer.no_ack else self.blocked)[consumer] = None

    def forget_blocked(self, consumer: Consumer) -> None:
        self.blocked.pop(consumer, None)
        self.blocked_no_ack.pop(consumer, None)

    def deliver(self, consumer: Consumer, messages) -> None:
        if consumer.no_ack:
            consumer.queue.ack([message.offset for message in messages])
        else:
            for message in messages:
                self.delivery_tag += 1
                self.unacked[self.delivery_tag] = (consumer, message)
            consumer.unacked_count += len(messages)
        self.delivered += [(consumer.tag, message) for message in messages]

    def cancel(self, consumer: Consumer, reason: str) -> None:
        self.cancelled.append((consumer.tag, reason))

    # What the test does with it.

    def take_delivered(self) -> list[tuple[str, bytes]]:
        """(consumer tag, body) of each delivery since the last call."""
        delivered, self.delivered = self.delivered, []
        return [(tag, message.body) for tag, message in delivered]

    def take_messages(self) -> list[Message]:
        delivered, self.delivered = self.delivered, []
        return [message for _, message in delivered]

    def settle(self, bodies: Iterable[bytes], requeue: bool = False) -> set[WorkQueue]:
        """basic.ack (or basic.nack requeue=true) of the unacked deliveries with these bodies,
        as BrokerChannel.apply: returns the queues to dispatch."""
        wanted = set(bodies)
        tags = [tag for tag, (_, message) in self.unacked.items() if message.body in wanted]
        assert len(tags) == len(wanted), (wanted, tags)
        by_queue: dict[WorkQueue, list[int]] = {}
        for tag in tags:
            consumer, message = self.unacked.pop(tag)
            by_queue.setdefault(consumer.queue, []).append(message.offset)
            consumer.unacked_count -= 1
            consumer.queue.prefetch_freed(consumer)
        for queue, offsets in by_queue.items():
            if requeue:
                queue.requeue(offsets, failed=False)
            else:
                queue.ack(offsets)
        return set(by_queue) | self.unblock_consumers()

    def unblock_consumers(self) -> set[WorkQueue]:
        if not (self.blocked or self.blocked_no_ack) or not self.can_deliver():
            return set()
        unblocked = list(self.blocked_no_ack)
        self.blocked_no_ack = {}
        if self.credit() > 0:
            unblocked += self.blocked
            self.blocked = {}
        for consumer in unblocked:
            consumer.queue.unblock(consumer)
        return {consumer.queue for consumer in unblocked}


def consume(
    queue: WorkQueue,
    channel: FakeChannel,
    tag: str,
    *,
    priority: int = 0,
    prefetch: int = 0,
    no_ack: bool = False,
) -> Consumer:
    consumer = Consumer(tag, channel, queue, no_ack, False, priority, prefetch)
    queue.add_consumer(consumer)
    return consumer


def settle(channel: FakeChannel, now_ms: int, *bodies: bytes, requeue: bool = False) -> None:
    """basic.ack / basic.nack then the dispatch the broker's tick runs on what it touched."""
    for queue in channel.settle(bodies, requeue):
        run(queue, now_ms)


def bodies(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(count)]


# -- 1. priorities (x-max-priority) ---------------------------------------------------------


def test_higher_priority_first_and_fifo_within_a_level(make_queue):
    queue = make_queue(**{"x-max-priority": 5})
    publish_with(
        queue,
        T0,
        (properties(priority=1), b"p1-a"),
        (properties(priority=3), b"p3-a"),
        (properties(priority=1), b"p1-b"),
        (properties(priority=5), b"p5-a"),
        (properties(priority=3), b"p3-b"),
        (properties(priority=1), b"p1-c"),
    )
    assert queue.ready_count == 6
    assert drain(queue, T0) == [b"p5-a", b"p3-a", b"p3-b", b"p1-a", b"p1-b", b"p1-c"]


def test_a_priority_above_the_maximum_counts_as_the_maximum(make_queue):
    """rabbitmq.com/docs/priority: "Messages with a priority which is higher than the queue's
    maximum are treated as if they were published with the maximum priority": one level, so
    publish order decides among them."""
    queue = make_queue(**{"x-max-priority": 5})
    publish_with(
        queue,
        T0,
        (properties(priority=4), b"four"),
        (properties(priority=9), b"nine"),
        (properties(priority=5), b"five"),
        (properties(priority=255), b"max-octet"),
        (properties(priority=6), b"six"),
    )
    assert drain(queue, T0) == [b"nine", b"five", b"max-octet", b"six", b"four"]


def test_a_missing_priority_counts_as_zero(make_queue):
    """rabbitmq.com/docs/priority: "Messages without a priority property are treated as if
    their priority were 0"."""
    queue = make_queue(**{"x-max-priority": 3})
    publish_with(
        queue,
        T0,
        (NO_PROPERTIES, b"none-a"),
        (properties(priority=0), b"zero"),
        (properties(content_type="text/plain"), b"none-b"),
        (properties(priority=1), b"one"),
    )
    assert drain(queue, T0) == [b"one", b"none-a", b"zero", b"none-b"]


def test_a_consumer_gets_the_highest_priority_first_and_a_requeue_keeps_it_there(make_queue):
    queue = make_queue(**{"x-max-priority": 2})
    channel = FakeChannel()
    consume(queue, channel, "c", prefetch=1)
    publish_with(
        queue,
        T0,
        (properties(priority=0), b"low"),
        (properties(priority=2), b"high-a"),
        (properties(priority=2), b"high-b"),
    )
    run(queue, T0)
    assert channel.take_delivered() == [("c", b"high-a")]
    settle(channel, T0, b"high-a", requeue=True)  # back ahead of high-b, redelivered
    [message] = channel.take_messages()
    assert (message.body, message.redelivered, message.delivery_count) == (b"high-a", True, 2)
    for body, following in ((b"high-a", b"high-b"), (b"high-b", b"low")):
        settle(channel, T0, body)
        assert channel.take_delivered() == [("c", following)]


# -- 2. single active consumer ----------------------------------------------------------------


def test_only_the_first_registered_consumer_is_active(make_queue):
    """rabbitmq.com/docs/consumers#single-active-consumer: one consumer gets every message;
    the others wait even while it has no credit, however much credit they have."""
    queue = make_queue(**{"x-single-active-consumer": True})
    channel = FakeChannel()
    first = consume(queue, channel, "first", prefetch=2)
    consume(queue, channel, "second")
    consume(queue, channel, "third")
    publish(queue, T0, *bodies("m", 5))
    run(queue, T0)
    assert channel.take_delivered() == [("first", b"m0"), ("first", b"m1")]
    assert first.state is BLOCKED_BY_PREFETCH and queue.ready_count == 3
    run(queue, T0)
    assert channel.take_delivered() == []
    settle(channel, T0, b"m0")
    assert channel.take_delivered() == [("first", b"m2")]


def test_the_next_registered_consumer_takes_over_when_the_active_one_goes(make_queue):
    queue = make_queue(**{"x-single-active-consumer": True})
    channel = FakeChannel()
    first = consume(queue, channel, "first", prefetch=1)
    second = consume(queue, channel, "second", prefetch=2)
    consume(queue, channel, "third")
    publish(queue, T0, *bodies("m", 6))
    run(queue, T0)
    assert channel.take_delivered() == [("first", b"m0")]

    queue.remove_consumer(first)  # basic.cancel: m0 stays unacked on the channel
    assert first.state is CANCELLED
    run(queue, T0)
    assert channel.take_delivered() == [("second", b"m1"), ("second", b"m2")]
    # The channel returns the cancelled consumer's delivery (basic.recover): the active one
    # gets it, redelivered, once it has credit.
    settle(channel, T0, b"m0", requeue=True)
    assert channel.take_delivered() == []
    settle(channel, T0, b"m1")
    [message] = channel.take_messages()
    assert (message.body, message.redelivered) == (b"m0", True)

    queue.remove_consumer(second)
    run(queue, T0)
    assert channel.take_delivered() == [("third", b"m3"), ("third", b"m4"), ("third", b"m5")]


# -- 3. round-robin and consumer priorities ---------------------------------------------------


def test_equal_consumers_take_turns(make_queue):
    queue = make_queue()
    channel = FakeChannel()
    for tag in ("a", "b", "c"):
        consume(queue, channel, tag)
    publish(queue, T0, *bodies("m", 7))
    run(queue, T0)
    assert [tag for tag, _ in channel.take_delivered()] == ["a", "b", "c", "a", "b", "c", "a"]
    publish(queue, T0 + 1, b"x", b"y")  # the turn carries on across ticks
    run(queue, T0 + 1)
    assert channel.take_delivered() == [("b", b"x"), ("c", b"y")]


def test_a_lower_priority_consumer_is_served_only_while_every_higher_one_lacks_credit(
    make_queue,
):
    """rabbitmq.com/docs/consumer-priority: messages go "to lower priority consumers when the
    high priority consumers block" (for want of credit, or a congested channel); round-robin
    within a priority; x-priority may be negative."""
    queue = make_queue()
    channel = FakeChannel()
    high_channel = FakeChannel()
    low = consume(queue, channel, "low", priority=-1)
    middle = consume(queue, channel, "middle", priority=5, prefetch=1)
    high = consume(queue, high_channel, "high", priority=10, prefetch=2)
    publish(queue, T0, *bodies("m", 5))
    run(queue, T0)
    assert high_channel.take_delivered() == [("high", b"m0"), ("high", b"m1")]
    assert channel.take_delivered() == [("middle", b"m2"), ("low", b"m3"), ("low", b"m4")]
    assert high.state is BLOCKED_BY_PREFETCH and middle.state is BLOCKED_BY_PREFETCH
    assert low.state is ROTATING

    settle(high_channel, T0, b"m0")  # credit back: the higher consumer comes first again
    publish(queue, T0 + 1, b"n0", b"n1")
    run(queue, T0 + 1)
    assert high_channel.take_delivered() == [("high", b"n0")]
    assert channel.take_delivered() == [("low", b"n1")]

    # A channel that may not deliver (flow, a full socket) blocks its consumers there; the
    # lower consumer serves until the channel hands them back.
    settle(high_channel, T0 + 2, b"m1", b"n0")
    high_channel.open = False
    publish(queue, T0 + 2, b"o0")
    run(queue, T0 + 2)
    assert high.state is BLOCKED_BY_CHANNEL and set(high_channel.blocked) == {high}
    assert channel.take_delivered() == [("low", b"o0")]
    high_channel.open = True
    for changed in high_channel.unblock_consumers():
        run(changed, T0 + 3)
    publish(queue, T0 + 3, b"p0")
    run(queue, T0 + 3)
    assert high_channel.take_delivered() == [("high", b"p0")]
    assert channel.take_delivered() == []


def test_a_removed_consumer_blocked_by_its_channel_is_forgotten_there(make_queue):
    queue = make_queue()
    channel = FakeChannel(limit=1)
    a = consume(queue, channel, "a")
    b = consume(queue, channel, "b")
    publish(queue, T0, *bodies("m", 3))
    run(queue, T0)
    assert channel.take_delivered() == [("a", b"m0")]
    assert set(channel.blocked) == {a, b}
    queue.remove_consumer(b)
    assert set(channel.blocked) == {a} and b.state is CANCELLED
    settle(channel, T0, b"m0")
    assert channel.take_delivered() == [("a", b"m1")]


# -- 4. prefetch ----------------------------------------------------------------------------


def test_a_consumer_never_has_more_than_its_prefetch_unacked(make_queue):
    queue = make_queue()
    channel = FakeChannel()
    consumer = consume(queue, channel, "c", prefetch=3)
    publish(queue, T0, *bodies("m", 10))
    run(queue, T0)
    assert channel.take_delivered() == [("c", b"m0"), ("c", b"m1"), ("c", b"m2")]
    assert consumer.unacked_count == 3 and queue.ready_count == 7
    assert consumer.state is BLOCKED_BY_PREFETCH
    run(queue, T0)
    assert channel.take_delivered() == []

    settle(channel, T0, b"m1")  # prefetch_freed: one more
    assert channel.take_delivered() == [("c", b"m3")]
    settle(channel, T0, b"m0", b"m2")
    assert channel.take_delivered() == [("c", b"m4"), ("c", b"m5")]
    assert consumer.unacked_count == 3 and queue.ready_count == 4
    # A requeue frees credit too; the message comes back first, redelivered.
    settle(channel, T0, b"m3", requeue=True)
    [message] = channel.take_messages()
    assert (message.body, message.redelivered) == (b"m3", True)
    assert consumer.unacked_count == 3 and queue.ready_count == 4


def test_the_channel_limit_is_shared_by_its_consumers(make_queue):
    """basic.qos global=true: the channel's consumers share one unacked limit."""
    queue = make_queue()
    channel = FakeChannel(limit=2)
    a = consume(queue, channel, "a")
    b = consume(queue, channel, "b")
    publish(queue, T0, *bodies("m", 5))
    run(queue, T0)
    assert channel.take_delivered() == [("a", b"m0"), ("b", b"m1")]
    assert a.state is BLOCKED_BY_CHANNEL and b.state is BLOCKED_BY_CHANNEL
    settle(channel, T0, b"m1")
    assert channel.take_delivered() == [("a", b"m2")]


def test_a_no_ack_consumer_ignores_prefetch(make_queue):
    """Prefetch limits deliveries that need acks; automatic-ack deliveries are not counted."""
    queue = make_queue()
    channel = FakeChannel(limit=1)
    consumer = consume(queue, channel, "c", prefetch=1, no_ack=True)
    publish(queue, T0, *bodies("m", 4))
    run(queue, T0)
    assert [body for _, body in channel.take_delivered()] == bodies("m", 4)
    assert consumer.unacked_count == 0 and queue.ready_count == 0
    assert channel.unacked == {}


# -- 5. x-message-ttl --------------------------------------------------------------------------


def test_a_message_lives_until_just_before_its_ttl_and_dies_at_it(make_queue):
    """RabbitMQ stamps expiry = arrival + TTL and drops when `Now >= Expiry`
    (rabbit_amqqueue_process:drop_expired_msgs): alive at TTL - 1 ms, dead at TTL."""
    queue = make_queue(**{"x-message-ttl": 1000})
    publish(queue, T0, b"a", b"b")
    message = queue.take(T0 + 999)
    assert message is not None and (message.body, message.timestamp_ms) == (b"a", T0)
    assert queue.ready_count == 1
    assert queue.take(T0 + 1000) is None
    assert queue.ready_count == 0


def test_run_timers_follows_ttl_at_the_head(make_queue):
    queue = make_queue(**{"x-message-ttl": 1000})
    assert queue.run_timers(T0) is None  # nothing ready, nothing due
    publish(queue, T0, b"a")
    publish(queue, T0 + 300, b"b", b"c")
    assert queue.run_timers(T0 + 500) == T0 + 1000
    assert queue.ready_count == 3
    assert queue.run_timers(T0 + 999) == T0 + 1000
    assert queue.ready_count == 3
    assert queue.run_timers(T0 + 1000) == T0 + 1300
    assert queue.ready_count == 2
    assert queue.run_timers(T0 + 1299) == T0 + 1300
    assert queue.run_timers(T0 + 1300) is None
    assert queue.ready_count == 0
    publish(queue, T0 + 5000, b"d")  # a late arrival starts its own TTL
    assert queue.run_timers(T0 + 5000) == T0 + 6000


def test_a_delivered_message_does_not_expire_until_it_is_requeued(make_queue):
    """The TTL counts while a message is ready: "a message added to the queue will live in
    the queue for 1 second or until it is delivered to a consumer" (rabbitmq.com/docs/ttl)."""
    queue = make_queue(**{"x-message-ttl": 1000})
    publish(queue, T0, b"a", b"b")
    taken = queue.take(T0 + 600)
    assert taken is not None and taken.body == b"a"
    assert queue.run_timers(T0 + 5000) is None  # b expired; a, in flight, did not
    assert queue.ready_count == 0
    queue.requeue([taken.offset], failed=False)  # back long past its original expiry
    assert queue.take(T0 + 5000) is None and queue.ready_count == 0


def test_a_requeued_message_keeps_its_original_timestamp(make_queue):
    """rabbitmq.com/docs/ttl: a message requeued (a method with a requeue parameter, a
    channel closure) keeps its original expiry time; the TTL does not start again."""
    queue = make_queue(**{"x-message-ttl": 1000})
    publish(queue, T0, b"a")
    taken = queue.take(T0 + 600)
    assert taken is not None
    queue.requeue([taken.offset], failed=False)
    assert queue.run_timers(T0 + 900) == T0 + 1000  # not T0 + 600 + 1000
    again = queue.take(T0 + 999)
    assert again is not None
    assert (again.body, again.timestamp_ms, again.redelivered) == (b"a", T0, True)
    queue.requeue([again.offset], failed=False)
    assert queue.take(T0 + 1000) is None and queue.ready_count == 0


def test_an_expired_message_is_never_delivered_to_a_consumer(make_queue):
    queue = make_queue(**{"x-message-ttl": 1000})
    channel = FakeChannel()
    publish(queue, T0, b"old-a", b"old-b")
    publish(queue, T0 + 400, b"young")
    consumer = consume(queue, channel, "c", prefetch=1)
    run(queue, T0 + 999)
    assert channel.take_delivered() == [("c", b"old-a")]
    assert consumer.state is BLOCKED_BY_PREFETCH
    # old-b reaches its TTL while the consumer is busy: the credit an ack frees skips it.
    settle(channel, T0 + 1000, b"old-a")
    assert channel.take_delivered() == [("c", b"young")]
    assert queue.ready_count == 0


def test_a_consumer_taking_many_at_once_gets_no_expired_message(make_queue):
    """A consumer alone on its queue takes all its credit allows in one take: expired messages
    among them are left out, and later ones still come."""
    queue = make_queue(**{"x-message-ttl": 1000})
    channel = FakeChannel()
    consume(queue, channel, "c", prefetch=10)
    publish(queue, T0, b"p0", b"p1")
    publish(queue, T0 + 2500, b"p2", b"p3")
    run(queue, T0 + 3000)
    assert channel.take_delivered() == [("c", b"p2"), ("c", b"p3")]
    assert queue.ready_count == 0


@pytest.mark.parametrize("ttl", ["queue", "message"])
def test_a_message_with_ttl_0_goes_to_a_consumer_waiting_for_it(make_queue, ttl):
    """rabbitmq.com/docs/ttl: "Setting the TTL to 0 causes messages to be expired upon
    reaching a queue unless they can be delivered to a consumer immediately"; the same holds
    for an expiration of "0" (rabbit_amqqueue_process:deliver_or_enqueue tries the consumers
    before it enqueues, and expiry is looked at only for enqueued messages)."""
    if ttl == "queue":
        queue = make_queue(**{"x-message-ttl": 0})
        props = NO_PROPERTIES
    else:
        queue = make_queue()
        props = properties(expiration="0")
    channel = FakeChannel()
    consume(queue, channel, "c")
    publish_with(queue, T0, (props, b"now"))
    run(queue, T0)
    assert channel.take_delivered() == [("c", b"now")]


# -- 6. per-message expiration -------------------------------------------------------------------


def test_the_lower_of_message_and_queue_ttl_applies(make_queue):
    queue = make_queue(**{"x-message-ttl": 1000})
    publish_with(
        queue,
        T0,
        (properties(expiration="300"), b"short"),  # its own 300 ms
        (properties(expiration="5000"), b"long"),  # the queue's 1000 ms
        (NO_PROPERTIES, b"plain"),  # the queue's 1000 ms
    )
    assert queue.run_timers(T0) == T0 + 300
    assert queue.run_timers(T0 + 299) == T0 + 300 and queue.ready_count == 3
    assert queue.run_timers(T0 + 300) == T0 + 1000 and queue.ready_count == 2
    assert queue.run_timers(T0 + 999) == T0 + 1000 and queue.ready_count == 2
    assert queue.run_timers(T0 + 1000) is None and queue.ready_count == 0


def test_a_message_expiration_without_queue_ttl(make_queue):
    queue = make_queue()
    publish_with(queue, T0, (properties(expiration="250"), b"brief"), (NO_PROPERTIES, b"ever"))
    assert queue.run_timers(T0) == T0 + 250
    message = queue.take(T0 + 249)
    assert message is not None and message.body == b"brief"
    queue.requeue([message.offset], failed=False)
    assert queue.run_timers(T0 + 250) is None  # the new head never expires
    assert drain(queue, T0 + 10**9) == [b"ever"]


def test_expiration_acts_only_at_the_head(make_queue):
    """rabbitmq.com/docs/ttl, per-message TTL caveats: expired messages are removed only when
    they reach the head; one behind a longer-lived message stays (and counts) until then, but
    is never delivered."""
    queue = make_queue()
    publish_with(
        queue,
        T0,
        (properties(expiration="10000"), b"long"),
        (properties(expiration="100"), b"short"),
    )
    assert queue.run_timers(T0 + 5000) == T0 + 10000
    assert queue.ready_count == 2  # short is past its expiry, still there
    message = queue.take(T0 + 5000)
    assert message is not None and message.body == b"long"
    assert queue.run_timers(T0 + 5000) is None  # short has reached the head
    assert queue.ready_count == 0

    # The same through a consumer: behind the head it waits, at the head it is dropped.
    channel = FakeChannel()
    publish_with(
        queue,
        T0 + 6000,
        (properties(expiration="10000"), b"long-2"),
        (properties(expiration="100"), b"short-2"),
        (NO_PROPERTIES, b"plain-2"),
    )
    consume(queue, channel, "c", prefetch=1)
    run(queue, T0 + 7000)
    assert channel.take_delivered() == [("c", b"long-2")]
    settle(channel, T0 + 7000, b"long-2")
    assert channel.take_delivered() == [("c", b"plain-2")]
    assert queue.ready_count == 0


def test_a_take_drops_the_expired_messages_it_brings_to_the_head(make_queue):
    """rabbit_amqqueue_process:fetch runs drop_expired_msgs right after BQ:fetch, and
    basic_get answers BQ:len after that: an expired message the get uncovered is already
    gone from basic.get-ok's message_count (which the session takes from ready_count)."""
    queue = make_queue()
    publish_with(
        queue,
        T0,
        (properties(expiration="10000"), b"long"),
        (properties(expiration="100"), b"short"),
    )
    message = queue.take(T0 + 5000)
    assert message is not None and message.body == b"long"
    assert queue.ready_count == 0


# -- 7. length limits ---------------------------------------------------------------------------


def test_max_length_drops_the_oldest_ready_messages(make_queue):
    """rabbitmq.com/docs/maxlength: drop-head (the default) drops from the front; only ready
    messages count, unacknowledged ones do not."""
    queue = make_queue(**{"x-max-length": 3})
    publish(queue, T0, *bodies("m", 5))
    assert queue.ready_count == 3
    publish(queue, T0 + 1, b"m5")
    assert queue.ready_count == 3
    taken = queue.take(T0 + 2)
    assert taken is not None and taken.body == b"m3"
    publish(queue, T0 + 3, b"m6")  # m3 is in flight: 3 ready, nothing dropped
    assert queue.ready_count == 3
    queue.ack([taken.offset])
    assert drain(queue, T0 + 4) == [b"m4", b"m5", b"m6"]


def test_max_length_bytes_counts_the_bodies_of_ready_messages(make_queue):
    queue = make_queue(**{"x-max-length-bytes": 10})
    big_properties = properties(content_type="x" * 200, headers={"h": "v" * 100})
    publish(queue, T0, b"aaaa", b"bbbb", props=big_properties)
    publish(queue, T0 + 1, b"cc")  # 10 bytes: at the limit, not over it
    assert queue.ready_count == 3
    publish(queue, T0 + 2, b"d")  # 11: the oldest goes
    assert queue.ready_count == 3
    taken = queue.take(T0 + 3)
    assert taken is not None and taken.body == b"bbbb"
    publish(queue, T0 + 4, b"eeee")  # bbbb is in flight: 3 + 4 ready bytes
    publish(queue, T0 + 5, b"fff")  # 10
    assert queue.ready_count == 4
    queue.ack([taken.offset])
    assert drain(queue, T0 + 6) == [b"cc", b"d", b"eeee", b"fff"]


def test_max_length_bytes_forgets_what_expired_and_what_was_purged(make_queue):
    queue = make_queue(**{"x-max-length-bytes": 10, "x-message-ttl": 1000})
    publish(queue, T0, b"12345678")
    assert queue.run_timers(T0 + 1000) is None and queue.ready_count == 0
    publish(queue, T0 + 1000, b"abcdefgh")  # had the expired bytes counted, it would go
    assert queue.ready_count == 1
    assert queue.purge() == 1
    publish(queue, T0 + 1001, b"ABCDEFGH")
    assert drain(queue, T0 + 1001) == [b"ABCDEFGH"]


@pytest.mark.parametrize("overflow", ["reject-publish", "reject-publish-dlx"])
def test_reject_publish_refuses_when_full_and_drops_nothing(make_queue, overflow):
    queue = make_queue(**{"x-max-length": 2, "x-overflow": overflow})
    assert queue.stage((b"", b"q", NO_PROPERTIES, b"a"), False)
    assert queue.stage((b"", b"q", NO_PROPERTIES, b"b"), False)
    assert not queue.stage((b"", b"q", NO_PROPERTIES, b"c"), False)  # staged ones count
    queue.flush(T0)
    assert queue.ready_count == 2
    assert not queue.stage((b"", b"q", NO_PROPERTIES, b"d"), False)
    taken = queue.take(T0 + 1)  # in flight no longer counts: room for one
    assert taken is not None and taken.body == b"a"
    assert queue.stage((b"", b"q", NO_PROPERTIES, b"e"), False)
    assert not queue.stage((b"", b"q", NO_PROPERTIES, b"f"), False)
    queue.flush(T0 + 2)
    assert queue.enforce_length() == 0
    queue.requeue([taken.offset], failed=False)  # back over the limit: reject-publish never drops
    assert queue.enforce_length() == 0 and queue.ready_count == 3
    assert drain(queue, T0 + 3) == [b"a", b"b", b"e"]


def test_reject_publish_by_bytes(make_queue):
    """rabbit_amqqueue_process:will_overflow: refused when ready bytes + this body > max."""
    queue = make_queue(**{"x-max-length-bytes": 5, "x-overflow": b"reject-publish"})
    assert queue.stage((b"", b"q", NO_PROPERTIES, b"abc"), False)
    assert not queue.stage((b"", b"q", NO_PROPERTIES, b"def"), False)
    assert queue.stage((b"", b"q", NO_PROPERTIES, b"de"), False)
    queue.flush(T0)
    assert not queue.stage((b"", b"q", NO_PROPERTIES, b"f"), False)
    assert queue.stage((b"", b"q", NO_PROPERTIES, b""), False)
    queue.flush(T0 + 1)
    assert drain(queue, T0 + 2) == [b"abc", b"de", b""]


@pytest.mark.parametrize(
    "limit", [{"x-max-length": 2}, {"x-max-length-bytes": 2}], ids=["length", "bytes"]
)
def test_a_requeue_beyond_the_length_limit_drops_the_head(make_queue, limit):
    """rabbit_amqqueue_process:requeue_and_run requeues, then maybe_drop_head: the queue is
    never over its limit, and the requeued message (the oldest, back at the head) goes."""
    queue = make_queue(**limit)
    publish(queue, T0, b"a", b"b")
    taken = queue.take(T0)
    publish(queue, T0 + 1, b"c")
    assert queue.ready_count == 2
    queue.requeue([taken.offset], failed=False)
    assert queue.ready_count == 2
    assert drain(queue, T0 + 2) == [b"b", b"c"]


@pytest.mark.parametrize("length_max", [0, 1])
def test_drop_head_spares_messages_a_waiting_consumer_takes(make_queue, length_max):
    """RabbitMQ (deliver_or_enqueue) hands an arriving message to a consumer with credit
    before it is enqueued; maybe_drop_head runs only for enqueued ones. With a consumer
    waiting (prefetch 10), three publishes all reach it, whatever x-max-length is."""
    queue = make_queue(**{"x-max-length": length_max})
    channel = FakeChannel()
    consume(queue, channel, "c", prefetch=10)
    publish(queue, T0, b"a", b"b", b"c")
    run(queue, T0)
    assert channel.take_delivered() == [("c", b"a"), ("c", b"b"), ("c", b"c")]


@pytest.mark.xfail(
    strict=True,
    reason="x-overflow reject-publish counts staged messages a waiting consumer with credit "
    "would take at once; RabbitMQ accepts and delivers them",
)
def test_reject_publish_accepts_what_a_waiting_consumer_takes(make_queue):
    """rabbit_amqqueue_process:will_overflow compares ready messages + 1 with the limit; a
    message handed to a consumer on arrival never becomes ready, so with a consumer waiting
    every publish to a queue with x-max-length 1 is accepted."""
    queue = make_queue(**{"x-max-length": 1, "x-overflow": "reject-publish"})
    channel = FakeChannel()
    consume(queue, channel, "c", prefetch=10)
    assert queue.stage((b"", b"q", NO_PROPERTIES, b"a"), False)
    assert queue.stage((b"", b"q", NO_PROPERTIES, b"b"), False)


# -- 8. x-expires -----------------------------------------------------------------------------


def test_an_unused_queue_expires_at_last_use_plus_x_expires(make_queue):
    queue = make_queue(**{"x-expires": 1000})
    queue.touch(T0)  # declared
    assert not queue.unused_expired(T0 + 999)
    assert queue.unused_expired(T0 + 1000)
    assert queue.unused_expired(T0 + 10**6)
    queue.touch(T0 + 500)  # a redeclare, a basic.get: renewed
    assert not queue.unused_expired(T0 + 1499)
    assert queue.unused_expired(T0 + 1500)
    publish(queue, T0 + 600, b"m")  # a publish is no use
    assert queue.unused_expired(T0 + 1500)
    assert queue.run_timers(T0 + 600) == T0 + 1500


def test_a_queue_with_a_consumer_never_expires(make_queue):
    queue = make_queue(**{"x-expires": 1000})
    channel = FakeChannel()
    queue.touch(T0)
    consumer = consume(queue, channel, "c")
    assert not queue.unused_expired(T0 + 1000)
    assert not queue.unused_expired(T0 + 10**9)
    assert queue.run_timers(T0 + 10**9) is None
    queue.remove_consumer(consumer)
    queue.touch(T0 + 10**9)  # the last consumer gone counts as a use (VirtualHost.cancel)
    assert not queue.unused_expired(T0 + 10**9 + 999)
    assert queue.unused_expired(T0 + 10**9 + 1000)
    assert queue.run_timers(T0 + 10**9) == T0 + 10**9 + 1000


def test_run_timers_wants_the_earliest_of_x_expires_and_the_head_expiry(make_queue):
    queue = make_queue(**{"x-expires": 5000, "x-message-ttl": 1000})
    queue.touch(T0)
    assert queue.run_timers(T0) == T0 + 5000  # nothing ready: only x-expires
    publish(queue, T0 + 100, b"m")
    assert queue.run_timers(T0 + 100) == T0 + 1100  # the message first
    assert queue.run_timers(T0 + 1100) == T0 + 5000 and queue.ready_count == 0

    queue = make_queue(**{"x-expires": 500, "x-message-ttl": 1000})
    queue.touch(T0)
    publish(queue, T0, b"m")
    assert queue.run_timers(T0) == T0 + 500  # the queue goes first
    assert queue.unused_expired(T0 + 500)

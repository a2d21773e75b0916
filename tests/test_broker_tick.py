"""The broker's tick: a publisher's confirms are released in tick order, only after the
tick's fsync; another publisher's do not wait for them.

Driven directly (no sockets): queues whose commit waits on an event the test controls, and
connections that record the confirms the broker sends.
"""

from __future__ import annotations

import asyncio

from warrenmq.server.broker import Broker
from warrenmq.server.config import BrokerConfig
from warrenmq.server.queue.dead_letter_counts import DeadLetterCounts
from warrenmq.server.queue.work_queue import WorkQueue
from warrenmq.server.session.channel import BrokerChannel


class WireChannel:
    tx_mode = False


class RecordingAmqp:
    def __init__(self):
        self.confirms = []
        self.wire = WireChannel()

    def channel(self, number):
        return self.wire

    def confirm(self, channel, tag, multiple=False, nack=False):
        self.confirms.append((tag, multiple, nack))
        return True

    def data_to_send(self):
        return b""


class FakeConnection:
    def __init__(self):
        self.amqp = RecordingAmqp()
        self.channels = {}
        self.writable = True

    def output_ready(self):
        pass


class GatedEngine:
    """A queue engine whose appends can fail and whose fsync completes when the test says."""

    batch_bytes_max = 1 << 20

    def __init__(self):
        self.gate = asyncio.Event()
        self.gate.set()
        self.commit_failure = None
        self.append_failure = None
        self.records = []
        self.batches = []

    def append(self, records, timestamp_ms=None):
        if self.append_failure is not None:
            raise self.append_failure
        self.records.extend(records)
        self.batches.append(len(records))

    ready_count = 0
    needs_commit = False

    def held(self):
        return []

    async def commit(self):
        await self.gate.wait()
        if self.commit_failure is not None:
            raise self.commit_failure


def gated_queue(name, *, durable=True):
    engine = GatedEngine()
    queue = WorkQueue(
        "/",
        name,
        engine,
        durable=durable,
        auto_delete=False,
        exclusive_owner=None,
        arguments={},
        queue_type="classic",
        batch_records_max=128,
        dead_letter_counts=DeadLetterCounts(),
    )
    return queue, engine


def make_broker():
    broker = Broker(BrokerConfig(port=0))
    broker._loop = asyncio.get_running_loop()
    connection = FakeConnection()
    channel = BrokerChannel(connection, 1, unacked_max=100, tx_messages_max=100)
    connection.channels[1] = channel
    return broker, connection, channel


async def settle():
    for _ in range(5):
        await asyncio.sleep(0)


def publish(broker, channel, queue, tag, persistent, body=b"body"):
    """What the AMQP session does for one confirmed publish routed to `queue`."""
    queue.stage((b"", queue.name.encode(), b"", body), persistent, False, (channel, tag))
    broker.staged(queue)
    broker.stage_confirm(channel, tag)


def test_confirms_wait_for_the_fsync_and_keep_tick_order():
    async def scenario():
        broker, connection, channel = make_broker()
        durable, durable_engine = gated_queue("durable")
        transient, _ = gated_queue("transient")
        durable_engine.gate.clear()
        publish(broker, channel, durable, 1, persistent=True)
        publish(broker, channel, durable, 2, persistent=True)
        await settle()
        assert connection.amqp.confirms == []
        # A later tick that needs no fsync must not confirm tags 1-2 by `multiple`.
        publish(broker, channel, transient, 3, persistent=False)
        await settle()
        assert connection.amqp.confirms == []
        durable_engine.gate.set()
        await settle()
        assert connection.amqp.confirms == [(2, True, False), (3, True, False)]

    asyncio.run(scenario())


def test_one_publishers_confirms_do_not_wait_for_anothers_slow_queue():
    """A queue whose commit waits (for its quorum in a failover, or a slow disk) holds its
    own publishers' confirms, and the later ones of those publishers; not every publisher's
    on the node."""

    async def scenario():
        broker, connection, slow_channel = make_broker()
        other_connection = FakeConnection()
        other_channel = BrokerChannel(other_connection, 1, unacked_max=100, tx_messages_max=100)
        other_connection.channels[1] = other_channel
        slow, slow_engine = gated_queue("slow")
        fast, _ = gated_queue("fast")
        slow_engine.gate.clear()
        publish(broker, slow_channel, slow, 1, persistent=True)
        await settle()
        publish(broker, other_channel, fast, 1, persistent=True)
        publish(broker, slow_channel, fast, 2, persistent=True)
        await settle()
        assert other_connection.amqp.confirms == [(1, True, False)]
        assert connection.amqp.confirms == [], "tag 2 would confirm tag 1 by `multiple`"
        waiter = broker.after_commit()
        await settle()
        assert not waiter.done(), "a tx commit waits for everything staged before it"
        slow_engine.gate.set()
        await settle()
        assert connection.amqp.confirms == [(1, True, False), (2, True, False)]
        assert waiter.done()

    asyncio.run(scenario())


def test_a_failed_fsync_nacks_the_publishes_written_to_that_queue_only():
    async def scenario():
        broker, connection, channel = make_broker()
        failing, failing_engine = gated_queue("failing")
        healthy, healthy_engine = gated_queue("healthy")
        failing_engine.commit_failure = OSError(5, "Input/output error")
        publish(broker, channel, healthy, 1, persistent=True)
        publish(broker, channel, failing, 2, persistent=True)
        publish(broker, channel, healthy, 3, persistent=True)
        await settle()
        assert connection.amqp.confirms == [(1, True, False), (2, False, True), (3, True, False)]
        assert len(healthy_engine.records) == 2

    asyncio.run(scenario())


def test_a_failed_append_nacks_its_publishes_and_leaves_the_other_queues_of_the_tick_correct():
    async def scenario():
        broker, connection, channel = make_broker()
        first, first_engine = gated_queue("first")
        failing, failing_engine = gated_queue("failing")
        last, last_engine = gated_queue("last")
        failing_engine.append_failure = OSError(28, "No space left on device")
        publish(broker, channel, first, 1, persistent=True)
        publish(broker, channel, failing, 2, persistent=True)
        publish(broker, channel, failing, 3, persistent=True)
        publish(broker, channel, last, 4, persistent=True)
        await settle()
        assert connection.amqp.confirms == [
            (1, True, False),
            (2, False, True),
            (3, False, True),
            (4, True, False),
        ]
        assert len(first_engine.records) == len(last_engine.records) == 1
        # The disk has room again: the same queue takes and confirms the next publish.
        failing_engine.append_failure = None
        publish(broker, channel, failing, 5, persistent=True)
        await settle()
        assert connection.amqp.confirms[-1] == (5, True, False)
        assert len(failing_engine.records) == 1

    asyncio.run(scenario())


def test_a_failed_append_is_reported_by_the_next_tick_even_when_nothing_else_happens():
    """The original defect: the tick raised, and the confirm waited for another client."""

    async def scenario():
        broker, connection, channel = make_broker()
        queue, engine = gated_queue("q")
        engine.append_failure = OSError(28, "No space left on device")
        publish(broker, channel, queue, 1, persistent=True)
        await settle()
        assert connection.amqp.confirms == [(1, False, True)]
        assert not broker._ticks

    asyncio.run(scenario())


def test_a_tick_splits_what_it_writes_into_batches_within_the_logs_bound():
    async def scenario():
        broker, connection, channel = make_broker()
        queue, engine = gated_queue("q")
        body = b"x" * (300 << 10)
        for tag in range(1, 8):
            publish(broker, channel, queue, tag, persistent=True, body=body)
        await settle()
        assert sum(engine.batches) == 7 and len(engine.batches) == 3
        assert connection.amqp.confirms == [(7, True, False)]

    asyncio.run(scenario())


def test_refused_messages_get_single_nacks_between_multiple_acks():
    async def scenario():
        broker, connection, channel = make_broker()
        queue, _ = gated_queue("q")
        for tag in range(1, 7):
            queue.stage((b"", b"q", b"", b""), False, False, (channel, tag))
            broker.staged(queue)
            broker.stage_confirm(channel, tag, refused=tag in (1, 4))
        await settle()
        assert connection.amqp.confirms == [
            (1, False, True),
            (3, True, False),
            (4, False, True),
            (6, True, False),
        ]

    asyncio.run(scenario())


def test_tx_commit_waiters_resolve_after_the_commit():
    async def scenario():
        broker, connection, channel = make_broker()
        queue, engine = gated_queue("q")
        engine.gate.clear()
        queue.stage((b"", b"q", b"", b""), True)
        broker.staged(queue)
        waiter = broker.after_commit()
        await settle()
        assert not waiter.done()
        engine.gate.set()
        await settle()
        assert waiter.done()

    asyncio.run(scenario())


def test_a_failed_write_fails_the_transaction_being_committed():
    async def scenario():
        broker, connection, channel = make_broker()
        channel.wire.tx_mode = True
        queue, engine = gated_queue("q")
        engine.commit_failure = OSError(5, "Input/output error")
        queue.stage((b"", b"q", b"", b""), True, False, (channel, 0))
        broker.staged(queue)
        waiter = broker.after_commit()
        await settle()
        assert waiter.done() and channel.tx_failed

    asyncio.run(scenario())


def test_a_queue_deleted_while_its_commit_runs_does_not_fail_the_other_queues():
    async def scenario():
        broker, connection, channel = make_broker()
        doomed, doomed_engine = gated_queue("doomed")
        kept, _ = gated_queue("kept")
        doomed_engine.gate.clear()
        doomed_engine.commit_failure = OSError("log is closed")
        publish(broker, channel, doomed, 1, persistent=True)
        publish(broker, channel, kept, 2, persistent=True)
        await settle()
        doomed.deleted = True
        doomed_engine.gate.set()
        await settle()
        # RabbitMQ confirms messages whose queue was deleted normally.
        assert connection.amqp.confirms == [(2, True, False)]

    asyncio.run(scenario())


def test_confirms_for_a_closed_channel_are_not_sent_to_its_successor():
    async def scenario():
        broker, connection, channel = make_broker()
        queue, engine = gated_queue("q")
        engine.gate.clear()
        publish(broker, channel, queue, 1, persistent=True)
        await settle()
        connection.channels[1] = BrokerChannel(connection, 1, unacked_max=100, tx_messages_max=100)
        engine.gate.set()
        await settle()
        assert connection.amqp.confirms == []

    asyncio.run(scenario())

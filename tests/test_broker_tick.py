"""The broker's tick: confirms are released in tick order, only after the tick's fsync.

Driven directly (no sockets): queues whose commit waits on an event the test controls, and
connections that record the confirms the broker sends.
"""

from __future__ import annotations

import asyncio

from warrenmq.server.broker import Broker
from warrenmq.server.channel import BrokerChannel
from warrenmq.server.config import BrokerConfig


class RecordingAmqp:
    def __init__(self):
        self.confirms = []

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
        self.flushes = 0

    def flush(self):
        self.flushes += 1


class GatedQueue:
    """A queue whose records need an fsync that completes when the test says so."""

    def __init__(self, name):
        self.name = name
        self.vhost = "/"
        self.deleted = False
        self.committing = False
        self.expires_messages = False
        self.gate = asyncio.Event()
        self.failure = None
        self._wanted = False
        self.staged_records = 0

    def stage(self, persistent):
        self.staged_records += 1
        self._wanted = self._wanted or persistent

    def flush(self):
        pass

    def take_commit_wanted(self):
        wanted, self._wanted = self._wanted, False
        return wanted

    def dispatch(self):
        return False

    @property
    def needs_commit(self):
        return False

    async def commit(self):
        await self.gate.wait()
        if self.failure is not None:
            raise self.failure


def make_broker():
    broker = Broker(BrokerConfig(port=0))
    broker._loop = asyncio.get_running_loop()
    connection = FakeConnection()
    channel = BrokerChannel(connection, 1, unacked_max=100)
    connection.channels[1] = channel
    return broker, connection, channel


async def settle():
    for _ in range(5):
        await asyncio.sleep(0)


def publish(broker, channel, queue, tag, persistent):
    queue.stage(persistent)
    broker.staged(queue)
    broker.stage_confirm(channel, tag)


def test_confirms_wait_for_the_fsync_and_keep_tick_order():
    async def scenario():
        broker, connection, channel = make_broker()
        durable = GatedQueue("durable")
        transient = GatedQueue("transient")
        publish(broker, channel, durable, 1, persistent=True)
        publish(broker, channel, durable, 2, persistent=True)
        await settle()
        assert connection.amqp.confirms == []
        # A later tick that needs no fsync must not confirm tags 1-2 by `multiple`.
        publish(broker, channel, transient, 3, persistent=False)
        await settle()
        assert connection.amqp.confirms == []
        durable.gate.set()
        await settle()
        assert connection.amqp.confirms == [(2, True, False), (3, True, False)]
    asyncio.run(scenario())


def test_a_failed_fsync_nacks_its_tick():
    async def scenario():
        broker, connection, channel = make_broker()
        queue = GatedQueue("q")
        queue.failure = OSError("disk gone")
        publish(broker, channel, queue, 1, persistent=True)
        await settle()
        queue.gate.set()
        await settle()
        assert connection.amqp.confirms == [(1, True, True)]
    asyncio.run(scenario())


def test_refused_messages_get_single_nacks_between_multiple_acks():
    async def scenario():
        broker, connection, channel = make_broker()
        queue = GatedQueue("q")
        for tag in range(1, 7):
            queue.stage(False)
            broker.staged(queue)
            broker.stage_confirm(channel, tag, refused=tag in (1, 4))
        await settle()
        assert connection.amqp.confirms == [
            (1, False, True), (3, True, False), (4, False, True), (6, True, False)]
    asyncio.run(scenario())


def test_tx_commit_waiters_resolve_after_the_commit():
    async def scenario():
        broker, connection, channel = make_broker()
        queue = GatedQueue("q")
        queue.stage(True)
        broker.staged(queue)
        waiter = broker.after_commit()
        await settle()
        assert not waiter.done()
        queue.gate.set()
        await settle()
        assert waiter.done()
    asyncio.run(scenario())


def test_confirms_for_a_closed_channel_are_not_sent_to_its_successor():
    async def scenario():
        broker, connection, channel = make_broker()
        queue = GatedQueue("q")
        publish(broker, channel, queue, 1, persistent=True)
        await settle()
        connection.channels[1] = BrokerChannel(connection, 1, unacked_max=100)
        queue.gate.set()
        await settle()
        assert connection.amqp.confirms == []
    asyncio.run(scenario())

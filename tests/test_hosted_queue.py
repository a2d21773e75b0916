"""The hosted queue without sockets: basic.get's take, over a real durable engine."""

from __future__ import annotations

import asyncio

import pytest
from warrenmq.server.hosted_queue import HostedQueue
from warrenmq.server.priority_queue import PriorityQueue
from warrenmq.server.queue import DurableQueue, QueueConfig

PERSISTENT = b"\x10\x00\x02"  # delivery-mode 2


def hosted(engine, **arguments) -> HostedQueue:
    return HostedQueue("/", "q", engine, durable=True, auto_delete=False, exclusive_owner=None,
                       arguments=arguments, queue_type="classic", batch_records_max=64)


def publish(queue: HostedQueue, count: int) -> None:
    for i in range(count):
        assert queue.stage((b"", b"q", PERSISTENT, b"%d" % i), persistent=True)
    queue.flush()


async def basic_get(queue: HostedQueue):
    """What the broker's basic.get does with the queue."""
    message = queue.take()
    if message is None and queue.held_until_commit:
        message = await queue.take_after_commit()
    return message


@pytest.mark.parametrize("kind", ["classic", "quorum", "priority"])
def test_basic_get_drains_past_the_delivered_mark(tmp_path, kind):
    """No commit runs but the ones basic.get waits for: every message still comes out."""

    async def scenario():
        config = QueueConfig(delivered_mark_lead=4, deliver_uncommitted=kind == "classic")
        if kind == "priority":
            engine = PriorityQueue(tmp_path, 2, lambda level: DurableQueue.open(level, config))
        else:
            engine = DurableQueue.open(tmp_path, config)
        queue = hosted(engine)
        publish(queue, 20)
        bodies = []
        while (message := await basic_get(queue)) is not None:
            queue.ack([message.offset])  # no-ack
            bodies.append(message.body)
        assert bodies == [b"%d" % i for i in range(20)] and queue.ready_count == 0
        engine.close()

    asyncio.run(scenario())


def test_a_get_waiting_for_a_commit_of_a_deleted_queue_finds_nothing(tmp_path):
    async def scenario():
        engine = DurableQueue.open(tmp_path, QueueConfig(deliver_uncommitted=False))
        queue = hosted(engine)
        publish(queue, 3)
        assert queue.take() is None and queue.held_until_commit
        waiting = asyncio.ensure_future(queue.take_after_commit())
        await asyncio.sleep(0)
        queue.deleted = True  # what VirtualHost.take_queue does
        engine.delete()
        assert await waiting is None

    asyncio.run(scenario())

"""Found by the fault tests (issue 12), reduced here with no fault injected: a consumer on a
node other than its queue's leader that cancels, or closes its connection, while deliveries
are on their way over the link leaves some of them unacked at the leader for good — with no
consumer, channel or connection left anywhere, `messages_unacknowledged` stays above 0 and
no consumer or basic.get ever receives those messages: confirmed, and never consumed."""

from __future__ import annotations

import asyncio

import aio_pika
import pytest
from http_api import HttpApi

from warrenmq.server.local_cluster import LocalCluster

MESSAGES = 3000
ROUNDS = 40
SETTLE_S = 2.0


@pytest.fixture
def cluster(tmp_path):
    running = LocalCluster(tmp_path / "cluster", 2)
    running.start_all()
    yield running
    running.stop()


async def acked(delivery: aio_pika.abc.AbstractIncomingMessage) -> None:
    await delivery.ack()


async def churn(cluster: LocalCluster, cancel_first: bool) -> None:
    """Fill `q` (led by node 1), then consume it through node 2 in short sessions, each
    ended while deliveries flow: by basic.cancel then a close, or by the close alone."""
    publisher = await aio_pika.connect(cluster.nodes[1].amqp_url)
    channel = await publisher.channel(publisher_confirms=True)
    await channel.declare_queue("q", durable=True)
    message = aio_pika.Message(b"m", delivery_mode=aio_pika.DeliveryMode.PERSISTENT)
    await asyncio.gather(*(channel.default_exchange.publish(message, "q") for _ in range(MESSAGES)))
    await publisher.close()
    for _ in range(ROUNDS):
        consumer = await aio_pika.connect(cluster.nodes[2].amqp_url)
        consuming = await consumer.channel()
        await consuming.set_qos(prefetch_count=20)
        queue = await consuming.get_queue("q", ensure=False)
        tag = await queue.consume(acked)
        await asyncio.sleep(0.05)
        if cancel_first:
            await queue.cancel(tag)
        await consumer.close()
    await asyncio.sleep(SETTLE_S)


@pytest.mark.slow
@pytest.mark.parametrize("cancel_first", [True, False], ids=["cancel", "close"])
def test_a_forwarded_consumer_that_goes_away_leaves_nothing_unacked(cluster, cancel_first):
    asyncio.run(churn(cluster, cancel_first))
    figures = HttpApi(cluster.nodes[1].http_url).get("/api/queues/%2F/q").json
    assert figures["consumers"] == 0
    assert figures["messages_unacknowledged"] == 0

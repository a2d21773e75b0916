"""Found by the fault tests (issue 12) with no fault injected: two nodes forwarding publishes
to each other at once. Node 1's client publishes with confirms to a queue node 2 leads while
node 2's client publishes to one node 1 leads; after a message or two neither gets another
confirm (the messages are stored: consumers get them), and the link stays so — a later
publisher on node 2 gets none either. A publisher through one node alone, or two nodes
forwarding to a third, is confirmed throughout."""

from __future__ import annotations

import asyncio

import aio_pika
import pytest

from warrenmq.server.local_cluster import LocalCluster

MESSAGES = 50
CONFIRM_TIMEOUT_S = 5.0


async def confirmed(url: str, queue: str, messages: int) -> int:
    """How many of `messages` publishes were confirmed in turn, up to the first that was not."""
    connection = await aio_pika.connect(url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        for number in range(messages):
            try:
                await asyncio.wait_for(
                    channel.default_exchange.publish(
                        aio_pika.Message(b"m", delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                        queue,
                    ),
                    CONFIRM_TIMEOUT_S,
                )
            except TimeoutError:
                return number
        return messages
    finally:
        await connection.close()


@pytest.fixture
def cluster(tmp_path):
    running = LocalCluster(tmp_path / "cluster", 2)
    running.start_all()
    yield running
    running.stop()


@pytest.mark.slow
def test_two_nodes_forwarding_publishes_to_each_other_at_once_keep_getting_confirms(cluster):
    urls = {node: cluster.nodes[node].amqp_url for node in cluster.nodes}

    async def run() -> tuple[list[int], int]:
        for node in (1, 2):
            connection = await aio_pika.connect(urls[node])
            await (await connection.channel()).declare_queue(f"q{node}", durable=True)
            await connection.close()
        crossed = await asyncio.gather(
            confirmed(urls[1], "q2", MESSAGES), confirmed(urls[2], "q1", MESSAGES)
        )
        return list(crossed), await confirmed(urls[2], "q1", 5)

    crossed, afterwards = asyncio.run(run())
    assert (crossed, afterwards) == ([MESSAGES, MESSAGES], 5)

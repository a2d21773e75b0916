"""A replicated queue with no leader for a moment (its leader stepped down, none elected
yet: issue 12's failover): what a client publishes to it is refused (nacked), and what is
dead-lettered to it waits in its source queue, and a delayed message due for it waits in
its exchange: none is confirmed, acked or dropped with nothing holding it.

A cluster makes this state only in a failover's window, so the tests make it on one node:
the queue's record is given three replicas and no leader, and the node steps it down as
`ClusterNode` does when it applies such a record. A real pika client publishes over a real
socket. (A fault run lost 787 confirmed messages this way: aio-pika sends a headers table,
whose publishes took the routing path that treated such a queue as unroutable.)"""

from __future__ import annotations

import dataclasses
import time

import pika
import pika.exceptions
import pytest

from warrenmq.server.metadata.records import NO_LEADER

DURABLE = {"durable": True}


def leave_unled(running, name: str) -> None:
    """Make `name` a replicated queue whose leader stepped down and none is elected."""
    vhost = running.broker.vhosts["/"]

    async def step_down() -> None:
        queues = vhost.store.state._queues["/"]
        queues[name] = dataclasses.replace(queues[name], node=NO_LEADER, replicas=(1, 2, 3))
        vhost.replicate = True
        vhost.step_down(vhost.queues[name])

    running.call(step_down())


def elect_here_again(running, name: str) -> None:
    """The node leads the queue again, from the files it kept (`host_elected`)."""
    vhost = running.broker.vhosts["/"]

    async def elect() -> None:
        queues = vhost.store.state._queues["/"]
        queues[name] = dataclasses.replace(queues[name], node=1, isr=(1,))
        vhost.host_elected(queues[name])

    running.call(elect())


@pytest.mark.parametrize(
    "exchange, properties",
    [
        ("", pika.BasicProperties(delivery_mode=2)),
        # A headers table (aio-pika always sends one) takes the routing path.
        ("", pika.BasicProperties(delivery_mode=2, headers={"h": 1}, message_id="m")),
        ("amq.direct", pika.BasicProperties(delivery_mode=2)),
    ],
    ids=["default", "default-with-headers", "bound"],
)
def test_a_publish_to_a_queue_with_no_leader_is_nacked(
    tmp_path, start_broker, exchange, properties
):
    running = start_broker(tmp_path / "data")
    connection = running.connect()
    channel = connection.channel()
    channel.queue_declare("q", **DURABLE)
    channel.queue_bind("q", "amq.direct", "q")
    channel.confirm_delivery()
    leave_unled(running, "q")
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish(exchange, "q", b"body", properties)
    connection.close()


def test_a_dead_letter_to_a_queue_with_no_leader_waits_and_arrives_once_it_has_one(
    tmp_path, start_broker
):
    running = start_broker(tmp_path / "data")
    connection = running.connect()
    channel = connection.channel()
    channel.queue_declare("dlq", **DURABLE)
    channel.queue_declare(
        "src",
        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dlq"},
        **DURABLE,
    )
    channel.basic_publish("", "src", b"dying", pika.BasicProperties(delivery_mode=2))
    leave_unled(running, "dlq")
    method, _, _ = channel.basic_get("src")
    channel.basic_reject(method.delivery_tag, requeue=False)
    # Its target has no leader: it stays in flight in its queue, and is tried again.
    time.sleep(1.5)
    assert running.broker.vhosts["/"].queues["src"].engine.browse(0, 10), "dropped, not kept"
    elect_here_again(running, "dlq")
    assert get_within(channel, "dlq", 10) == b"dying"
    assert channel.queue_declare("src", passive=True).method.message_count == 0
    connection.close()


def get_within(channel, queue: str, timeout_s: float) -> bytes | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _, _, body = channel.basic_get(queue, auto_ack=True)
        if body is not None:
            return body
        time.sleep(0.1)
    return None


def test_a_delayed_message_due_for_a_queue_with_no_leader_waits_for_one(tmp_path, start_broker):
    running = start_broker(tmp_path / "data")
    connection = running.connect()
    channel = connection.channel()
    channel.exchange_declare(
        "dx", "x-delayed-message", durable=True, arguments={"x-delayed-type": "direct"}
    )
    channel.queue_declare("q", **DURABLE)
    channel.queue_bind("q", "dx", "k")
    leave_unled(running, "q")
    properties = pika.BasicProperties(delivery_mode=2, headers={"x-delay": 100})
    channel.basic_publish("dx", "k", b"later", properties)
    time.sleep(1.5)  # due while the queue has no leader
    elect_here_again(running, "q")
    assert get_within(channel, "q", 10) == b"later"
    connection.close()

"""Messages from empty to the maximum size: confirmed means stored, past the maximum is 406.

RabbitMQ's default max_message_size is 128 MiB. Warren once confirmed messages over its log's
16 MiB record limit (and transactions over its 64 MiB batch limit) without storing them.
"""

from __future__ import annotations

import os

import pika
import pytest
from pika_helpers import channel_error

PERSISTENT = pika.BasicProperties(delivery_mode=2)
MIB = 1 << 20
MESSAGE_BYTES_MAX = 128 * MIB


def _body(size: int) -> bytes:
    # Distinct bytes at both ends, so a truncated or shifted body cannot pass for the original.
    return (
        os.urandom(min(size, 64))
        + b"m" * max(0, size - 128)
        + os.urandom(min(max(size - 64, 0), 64))
    )


def _get_all(channel, queue: str, count: int) -> list[bytes]:
    bodies = []
    for _ in range(count):
        method, _, body = channel.basic_get(queue, auto_ack=True)
        assert method is not None, f"{queue} held {len(bodies)} of {count} messages"
        bodies.append(body)
    assert channel.basic_get(queue, auto_ack=True)[0] is None
    return bodies


@pytest.mark.slow
def test_confirmed_messages_of_every_size_are_stored_and_survive_a_restart(broker, uid):
    sizes = [0, 1, MIB, 16 * MIB - 600, 16 * MIB + 1, 17 * MIB, 100 * MIB]
    bodies = [_body(size) for size in sizes]
    queue = f"{uid}-sizes"
    conn = pika.BlockingConnection(broker.params())
    try:
        channel = conn.channel()
        channel.queue_declare(queue, durable=True)
        channel.confirm_delivery()
        for body in bodies:
            # pika raises NackError or UnroutableError unless the broker acks.
            channel.basic_publish("", queue, body, PERSISTENT)
        assert channel.queue_declare(queue, passive=True).method.message_count == len(sizes)
    finally:
        conn.close()
    broker.restart()
    conn = pika.BlockingConnection(broker.params())
    try:
        channel = conn.channel()
        got = _get_all(channel, queue, len(sizes))
        assert [len(body) for body in got] == [len(body) for body in bodies]
        assert got == bodies
        channel.queue_delete(queue)
    finally:
        conn.close()


@pytest.mark.slow
def test_a_transaction_larger_than_a_log_batch_is_stored_whole(channel, uid):
    queue = f"{uid}-tx"
    channel.queue_declare(queue, durable=True)
    bodies = [_body(10 * MIB) for _ in range(7)]
    channel.tx_select()
    for body in bodies:
        channel.basic_publish("", queue, body, PERSISTENT)
    channel.tx_commit()
    assert _get_all(channel, queue, len(bodies)) == bodies
    channel.queue_delete(queue)


@pytest.mark.slow
def test_a_message_at_the_maximum_size_is_stored_and_one_byte_more_is_refused(connection, uid):
    queue = f"{uid}-max"
    channel = connection.channel()
    channel.queue_declare(queue, durable=True)
    channel.confirm_delivery()
    body = _body(MESSAGE_BYTES_MAX)
    channel.basic_publish("", queue, body, PERSISTENT)
    assert _get_all(channel, queue, 1) == [body]
    del body
    too_big = connection.channel()
    too_big.confirm_delivery()
    assert channel_error(
        too_big.basic_publish, "", queue, b"x" * (MESSAGE_BYTES_MAX + 1), PERSISTENT
    ) == (
        406,
        f"PRECONDITION_FAILED - message size {MESSAGE_BYTES_MAX + 1} is larger than "
        f"configured max size {MESSAGE_BYTES_MAX}",
    )
    channel.queue_delete(queue)

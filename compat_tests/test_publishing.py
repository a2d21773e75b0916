"""Publisher confirms, transactions and direct reply-to."""

from __future__ import annotations

import time

import pika
import pytest
from pamqp import body as content_body
from pamqp import commands, frame, header
from pika_helpers import channel_error, drain, sync, wait_get
from raw_client import RawClient

import amqp

PERSISTENT = pika.BasicProperties(delivery_mode=2)


def test_confirmed_publish_to_durable_queue(channel, uid):
    channel.confirm_delivery()
    channel.queue_declare(f"{uid}-q", durable=True)
    for i in range(20):
        channel.basic_publish("", f"{uid}-q", str(i).encode(), PERSISTENT)
    assert drain(channel, f"{uid}-q") == [str(i).encode() for i in range(20)]
    channel.queue_delete(f"{uid}-q")


def test_confirmed_unroutable_mandatory_is_returned_then_acked(channel, uid):
    channel.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError) as unroutable:
        channel.basic_publish("amq.direct", f"{uid}-nowhere", b"x", mandatory=True)
    (returned,) = unroutable.value.messages
    assert (returned.method.reply_code, returned.method.reply_text) == (312, "NO_ROUTE")
    channel.basic_publish("amq.direct", f"{uid}-nowhere", b"x")


def _publish_bytes(
    channel: int, exchange: str, key: str, payload: bytes, persistent: bool
) -> bytes:
    """basic.publish, its content header and body, encoded for one write."""
    properties = commands.Basic.Properties(delivery_mode=2 if persistent else 1)
    return b"".join(
        [
            frame.marshal(commands.Basic.Publish(exchange=exchange, routing_key=key), channel),
            frame.marshal(header.ContentHeader(0, len(payload), properties), channel),
            frame.marshal(content_body.ContentBody(payload), channel),
        ]
    )


@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "transient"])
def test_confirms_cover_every_publish_once_in_order(broker, uid, persistent):
    count = 500
    with RawClient(broker.host, broker.port) as raw:
        raw.handshake()
        raw.open_channel(1)
        raw.send(1, commands.Confirm.Select())
        raw.expect(commands.Confirm.SelectOk)
        raw.send(1, commands.Queue.Declare(queue=f"{uid}-q", durable=True))
        raw.expect(commands.Queue.DeclareOk)
        raw.send_bytes(
            b"".join(
                _publish_bytes(1, "", f"{uid}-q", str(i).encode(), persistent) for i in range(count)
            )
        )
        confirmed: list[int] = []
        highest = 0
        while highest < count:
            _, ack = raw.expect(commands.Basic.Ack)
            assert ack.delivery_tag > highest
            if ack.multiple:
                confirmed.extend(range(highest + 1, ack.delivery_tag + 1))
            else:
                confirmed.append(ack.delivery_tag)
            highest = ack.delivery_tag
        assert confirmed == list(range(1, count + 1))
        raw.send(1, commands.Queue.Delete(queue=f"{uid}-q"))
        _, deleted = raw.expect(commands.Queue.DeleteOk)
        assert deleted.message_count == count


def test_confirms_with_py_amqp(broker, uid):
    conn = amqp.Connection(f"{broker.host}:{broker.port}", confirm_publish=True)
    conn.connect()
    try:
        ch = conn.channel()
        ch.queue_declare(f"{uid}-q", exclusive=True)
        for i in range(10):
            ch.basic_publish(amqp.Message(str(i), delivery_mode=2), "", f"{uid}-q")
        assert ch.queue_declare(f"{uid}-q", passive=True).message_count == 10
    finally:
        conn.close()


def test_tx_commit_and_rollback_of_publishes(connection, uid):
    observer = connection.channel()
    observer.queue_declare(f"{uid}-q", exclusive=True)
    tx = connection.channel()
    tx.tx_select()
    tx.basic_publish("", f"{uid}-q", b"rolled back")
    sync(tx)
    assert drain(observer, f"{uid}-q") == []
    tx.tx_rollback()
    tx.basic_publish("", f"{uid}-q", b"committed")
    tx.tx_commit()
    assert drain(observer, f"{uid}-q") == [b"committed"]


def test_tx_commit_and_rollback_of_acks(connection, uid):
    ch = connection.channel()
    ch.queue_declare(f"{uid}-q", exclusive=True)
    ch.basic_publish("", f"{uid}-q", b"m")
    ch.tx_select()
    method, _, _ = wait_get(ch, f"{uid}-q")
    ch.basic_ack(method.delivery_tag)
    ch.tx_rollback()
    ch.basic_ack(method.delivery_tag)
    ch.tx_commit()
    ch.close()
    assert connection.channel().queue_declare(f"{uid}-q", passive=True).method.message_count == 0


def test_an_ack_in_a_transaction_gives_prefetch_credit_back_only_at_commit(connection, uid):
    """RabbitMQ's limiter hears of a transaction's acks at tx.commit: until then the acked
    delivery still counts against the consumer's prefetch."""
    ch = connection.channel()
    ch.queue_declare(f"{uid}-q", exclusive=True)
    for body in (b"first", b"second"):
        ch.basic_publish("", f"{uid}-q", body)
    ch.tx_select()
    ch.basic_qos(prefetch_count=1)
    received = []
    ch.basic_consume(f"{uid}-q", lambda c, method, p, body: received.append((method, body)))
    connection.process_data_events(time_limit=1)
    assert [body for _, body in received] == [b"first"]
    ch.basic_ack(received[0][0].delivery_tag)
    connection.process_data_events(time_limit=1)
    assert [body for _, body in received] == [b"first"]
    ch.tx_commit()
    connection.process_data_events(time_limit=1)
    assert [body for _, body in received] == [b"first", b"second"]


def test_closing_a_channel_discards_its_uncommitted_acks(connection, uid):
    observer = connection.channel()
    observer.queue_declare(f"{uid}-q", exclusive=True)
    observer.basic_publish("", f"{uid}-q", b"m")
    ch = connection.channel()
    ch.tx_select()
    method, _, _ = wait_get(ch, f"{uid}-q")
    ch.basic_ack(method.delivery_tag)
    ch.close()
    method, _, body = wait_get(observer, f"{uid}-q")
    assert (body, method.redelivered) == (b"m", True)


@pytest.mark.warren_only  # RabbitMQ bounds a transaction only from 4.3.6 (3.10 has no limit)
def test_a_transaction_holds_at_most_channel_tx_message_max_publishes(connection, uid):
    ch = connection.channel()
    ch.queue_declare(f"{uid}-q", exclusive=True)
    ch.tx_select()
    for _ in range(10_000):
        ch.basic_publish("", f"{uid}-q", b"m")
    sync(ch)
    code, text = channel_error(lambda: (ch.basic_publish("", f"{uid}-q", b"m"), sync(ch)))
    assert (code, text) == (
        406,
        "PRECONDITION_FAILED - reached maximum (10000) of messages in a transaction",
    )
    observer = connection.channel()
    assert observer.queue_declare(f"{uid}-q", passive=True).method.message_count == 0


def test_tx_commit_without_select_is_406(channel):
    code, text = channel_error(channel.tx_commit)
    assert (code, text) == (406, "PRECONDITION_FAILED - channel is not transactional")


def test_tx_rollback_without_select_is_406(channel):
    code, text = channel_error(channel.tx_rollback)
    assert (code, text) == (406, "PRECONDITION_FAILED - channel is not transactional")


def test_confirm_and_tx_exclude_each_other(connection):
    ch = connection.channel()
    ch.tx_select()
    code, text = channel_error(ch.confirm_delivery)
    assert (code, text) == (406, "PRECONDITION_FAILED - cannot switch from tx to confirm mode")
    ch = connection.channel()
    ch.confirm_delivery()
    code, text = channel_error(ch.tx_select)
    assert (code, text) == (406, "PRECONDITION_FAILED - cannot switch from confirm to tx mode")


REPLY_TO = "amq.rabbitmq.reply-to"


def test_direct_reply_to_rpc(connection, open_connection, uid):
    server = open_connection()
    server_ch = server.channel()
    server_ch.queue_declare(f"{uid}-rpc", exclusive=True)

    client = connection.channel()
    replies = []
    client.basic_consume(
        REPLY_TO, lambda ch, m, p, b: replies.append((p.correlation_id, b)), auto_ack=True
    )
    client.basic_publish(
        "", f"{uid}-rpc", b"ping", pika.BasicProperties(reply_to=REPLY_TO, correlation_id="c-7")
    )
    method, props, body = wait_get(server_ch, f"{uid}-rpc")
    assert props.reply_to.startswith(REPLY_TO + ".") and props.reply_to != REPLY_TO + "."
    server_ch.basic_publish(
        "",
        props.reply_to,
        b"pong:" + body,
        pika.BasicProperties(correlation_id=props.correlation_id),
    )
    server_ch.basic_ack(method.delivery_tag)
    deadline = time.monotonic() + 5
    while not replies and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    assert replies == [("c-7", b"pong:ping")]


def test_direct_reply_to_requires_no_ack(channel):
    code, text = channel_error(channel.basic_consume, REPLY_TO, lambda *a: None, auto_ack=False)
    assert (code, text) == (406, "PRECONDITION_FAILED - reply consumer cannot acknowledge")


def test_direct_reply_to_needs_a_consumer_first(channel, uid):
    channel.queue_declare(f"{uid}-q", exclusive=True)
    channel.basic_publish("", f"{uid}-q", b"x", pika.BasicProperties(reply_to=REPLY_TO))
    code, text = channel_error(sync, channel)
    assert (code, text) == (406, "PRECONDITION_FAILED - fast reply consumer does not exist")


def test_reply_to_a_gone_client_is_dropped(connection, open_connection, uid):
    server_ch = connection.channel()
    server_ch.queue_declare(f"{uid}-rpc", exclusive=True)
    client = open_connection()
    client_ch = client.channel()
    client_ch.basic_consume(REPLY_TO, lambda *a: None, auto_ack=True)
    client_ch.basic_publish("", f"{uid}-rpc", b"ping", pika.BasicProperties(reply_to=REPLY_TO))
    _, props, _ = wait_get(server_ch, f"{uid}-rpc")
    client.close()
    server_ch.basic_publish("", props.reply_to, b"pong")
    sync(server_ch)
    assert server_ch.is_open


def test_a_transaction_with_a_refused_message_fails_as_partial_completion(connection, uid):
    """rabbit_channel:complete_tx: a queue refused one of the messages (reject-publish)."""
    channel = connection.channel()
    queue = f"{uid}-full"
    channel.queue_declare(queue, arguments={"x-max-length": 1, "x-overflow": "reject-publish"})
    channel.tx_select()
    channel.basic_publish("", queue, b"fits")
    channel.basic_publish("", queue, b"refused")
    assert channel_error(channel.tx_commit) == (406, "PRECONDITION_FAILED - partial tx completion")
    channel = connection.channel()
    assert drain(channel, queue) == [b"fits"]
    channel.queue_delete(queue)

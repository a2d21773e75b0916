"""Broker restarts: durable entities and persistent messages come back, transient ones do not.

Warren is restarted as a process (SIGTERM, then `warren serve` again on the same data dir).
The private RabbitMQ is restarted with `rabbitmqctl stop_app/start_app`, which closes every
connection and recovers queues from disk exactly as a node restart does, in about 2 s. A
reference given by WARREN_REFERENCE_URL is not ours to restart, so these tests skip there.
"""

from __future__ import annotations

import pika
import pytest
from pika_helpers import drain, wait_get
from raw_client import RawClient

PERSISTENT = pika.BasicProperties(delivery_mode=2)


@pytest.mark.slow
def test_restart_keeps_durable_and_drops_transient(broker, uid):
    conn = pika.BlockingConnection(broker.params())
    ch = conn.channel()
    ch.confirm_delivery()
    ch.exchange_declare(f"{uid}-dx", "topic", durable=True)
    ch.exchange_declare(f"{uid}-tx", "topic", durable=False)
    ch.queue_declare(f"{uid}-dq", durable=True)
    ch.queue_declare(f"{uid}-tq", durable=False)
    ch.queue_declare(f"{uid}-xq", durable=True, arguments={"x-queue-type": "quorum"})
    ch.queue_bind(f"{uid}-dq", f"{uid}-dx", "orders.#")
    for i in range(50):
        ch.basic_publish(f"{uid}-dx", "orders.new", f"m{i}".encode(), PERSISTENT)
        ch.basic_publish("", f"{uid}-xq", f"q{i}".encode(), PERSISTENT)
    # Three in flight at the restart: unacked, so they must come back redelivered.
    consumer = conn.channel()
    consumer.basic_qos(prefetch_count=3)
    in_flight = [wait_get(consumer, f"{uid}-dq") for _ in range(3)]
    assert [body for _, _, body in in_flight] == [b"m0", b"m1", b"m2"]
    # Two acked before the restart: must never come back.
    acker = conn.channel()
    acked = [wait_get(acker, f"{uid}-xq") for _ in range(2)]
    acker.basic_ack(acked[-1][0].delivery_tag, multiple=True)
    acker.queue_declare(f"{uid}-xq", passive=True)

    broker.restart()
    assert not conn.is_open or _closed_by_restart(conn)

    conn = pika.BlockingConnection(broker.params())
    try:
        ch = conn.channel()
        ch.exchange_declare(f"{uid}-dx", "topic", passive=True)
        for missing in ("exchange", "queue"):
            probe = conn.channel()
            with pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone:
                if missing == "exchange":
                    probe.exchange_declare(f"{uid}-tx", passive=True)
                else:
                    probe.queue_declare(f"{uid}-tq", passive=True)
            assert gone.value.reply_code == 404
        ch = conn.channel()
        method, _, body = wait_get(ch, f"{uid}-dq")
        assert (body, method.redelivered) == (b"m0", True)
        ch.basic_ack(method.delivery_tag)
        rest = drain(ch, f"{uid}-dq")
        assert rest == [f"m{i}".encode() for i in range(1, 50)]
        assert drain(ch, f"{uid}-xq") == [f"q{i}".encode() for i in range(2, 50)]
        # The binding survived with its exchange and queue.
        ch.confirm_delivery()
        ch.basic_publish(f"{uid}-dx", "orders.after", b"after", PERSISTENT)
        assert drain(ch, f"{uid}-dq") == [b"after"]
        ch.queue_delete(f"{uid}-dq")
        ch.queue_delete(f"{uid}-xq")
        ch.exchange_delete(f"{uid}-dx")
    finally:
        if conn.is_open:
            conn.close()


@pytest.mark.slow
def test_get_drains_a_deep_queue_across_a_restart(broker, uid):
    """basic.get with no-ack takes a deep queue before and after a restart: each run hands out
    more than a batch of its delivered-mark bookkeeping, and nothing is lost or repeated."""
    count, before_restart = 20_000, 6_000
    bodies = [str(i).encode() for i in range(count)]
    conn = pika.BlockingConnection(broker.params())
    ch = conn.channel()
    ch.queue_declare(f"{uid}-q", durable=True)
    with RawClient(broker.host, broker.port) as raw:
        raw.handshake()
        raw.open_channel(1)
        raw.publish_confirmed(1, f"{uid}-q", bodies)
    got = [ch.basic_get(f"{uid}-q", auto_ack=True)[2] for _ in range(before_restart)]
    assert got == bodies[:before_restart]

    broker.restart()
    _closed_by_restart(conn)
    conn = pika.BlockingConnection(broker.params())
    try:
        ch = conn.channel()
        assert (
            ch.queue_declare(f"{uid}-q", passive=True).method.message_count
            == count - before_restart
        )
        assert drain(ch, f"{uid}-q") == bodies[before_restart:]
        ch.queue_delete(f"{uid}-q")
    finally:
        if conn.is_open:
            conn.close()


def _closed_by_restart(conn: pika.BlockingConnection) -> bool:
    """Drive pika until it notices that the broker went away; True once it has."""
    try:
        conn.process_data_events(time_limit=2)
        conn.channel()
    except pika.exceptions.AMQPConnectionError:
        return True
    return False


@pytest.mark.slow
def test_shutdown_closes_connections_with_320(broker):
    closed: list[tuple[int, str]] = []

    def on_closed(connection, reason):
        closed.append((getattr(reason, "reply_code", None), getattr(reason, "reply_text", "")))
        connection.ioloop.stop()

    connection = pika.SelectConnection(
        broker.params(),
        on_open_callback=lambda conn: conn.ioloop.stop(),
        on_close_callback=on_closed,
    )
    connection.ioloop.start()
    broker.restart()
    timer = connection.ioloop.call_later(10, connection.ioloop.stop)
    connection.ioloop.start()
    connection.ioloop.remove_timeout(timer)
    assert len(closed) == 1
    code, text = closed[0]
    assert code == 320
    # RabbitMQ adds " with reason 'shutdown'"; what clients key on is the code and this text.
    assert text.startswith("CONNECTION_FORCED - broker forced connection closure")


@pytest.mark.slow
def test_restart_closes_exclusive_queues(broker, uid):
    conn = pika.BlockingConnection(broker.params())
    conn.channel().queue_declare(f"{uid}-ex", exclusive=True)
    broker.restart()
    _closed_by_restart(conn)
    conn = pika.BlockingConnection(broker.params())
    try:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as gone:
            conn.channel().queue_declare(f"{uid}-ex", passive=True)
        assert gone.value.reply_code == 404
    finally:
        conn.close()

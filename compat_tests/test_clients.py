"""Round trips with each unmodified client library: pika's async adapters, aio-pika, kombu,
py-amqp and AMQPStorm, and a Celery worker with the rpc:// result backend."""

from __future__ import annotations

import asyncio
import time

import aio_pika
import amqpstorm
import kombu
import pika
import pytest
from pika.adapters.asyncio_connection import AsyncioConnection

import amqp

MESSAGES = 20


def test_pika_select_connection_round_trip(broker, uid):
    received: list[bytes] = []
    state: dict = {}

    def on_open(connection):
        connection.channel(on_open_callback=on_channel)

    def on_channel(channel):
        state["channel"] = channel
        channel.confirm_delivery(on_confirm)
        channel.queue_declare(f"{uid}-q", exclusive=True, callback=on_declared)

    def on_declared(_frame):
        channel = state["channel"]
        channel.basic_qos(prefetch_count=5)
        channel.basic_consume(f"{uid}-q", on_message)
        for i in range(MESSAGES):
            channel.basic_publish(
                "", f"{uid}-q", str(i).encode(), pika.BasicProperties(delivery_mode=2)
            )

    def on_confirm(frame):
        state["confirmed"] = frame.method.delivery_tag

    def on_message(channel, method, properties, body):
        received.append(body)
        channel.basic_ack(method.delivery_tag)
        if len(received) == MESSAGES:
            connection.close()

    connection = pika.SelectConnection(
        broker.params(),
        on_open_callback=on_open,
        on_open_error_callback=lambda conn, error: conn.ioloop.stop(),
        on_close_callback=lambda conn, reason: conn.ioloop.stop(),
    )
    timer = connection.ioloop.call_later(10, connection.ioloop.stop)
    connection.ioloop.start()
    connection.ioloop.remove_timeout(timer)
    assert received == [str(i).encode() for i in range(MESSAGES)]
    assert state["confirmed"] == MESSAGES


def test_pika_asyncio_connection_round_trip(broker, uid):
    async def main() -> list[bytes]:
        loop = asyncio.get_running_loop()
        opened: asyncio.Future = loop.create_future()
        closed: asyncio.Future = loop.create_future()
        connection = AsyncioConnection(
            broker.params(),
            on_open_callback=lambda conn: opened.set_result(conn),
            on_open_error_callback=lambda conn, error: opened.set_exception(error),
            on_close_callback=lambda conn, reason: closed.done() or closed.set_result(reason),
            custom_ioloop=loop,
        )
        await asyncio.wait_for(opened, 5)
        channel_ready: asyncio.Future = loop.create_future()
        connection.channel(on_open_callback=channel_ready.set_result)
        channel = await asyncio.wait_for(channel_ready, 5)
        declared: asyncio.Future = loop.create_future()
        channel.queue_declare(f"{uid}-q", exclusive=True, callback=declared.set_result)
        await asyncio.wait_for(declared, 5)
        received: list[bytes] = []
        done: asyncio.Future = loop.create_future()

        def on_message(ch, method, properties, body):
            received.append(body)
            ch.basic_ack(method.delivery_tag)
            if len(received) == MESSAGES and not done.done():
                done.set_result(None)

        channel.basic_consume(f"{uid}-q", on_message)
        for i in range(MESSAGES):
            channel.basic_publish("", f"{uid}-q", str(i).encode())
        await asyncio.wait_for(done, 10)
        connection.close()
        await asyncio.wait_for(closed, 5)
        return received

    assert asyncio.run(main()) == [str(i).encode() for i in range(MESSAGES)]


def test_aio_pika_round_trip_with_confirms(broker, uid):
    async def main() -> list[bytes]:
        connection = await aio_pika.connect(broker.url, timeout=5)
        async with connection:
            channel = await connection.channel(publisher_confirms=True)
            await channel.set_qos(prefetch_count=4)
            exchange = await channel.declare_exchange(
                f"{uid}-x", aio_pika.ExchangeType.TOPIC, auto_delete=True
            )
            queue = await channel.declare_queue(f"{uid}-q", exclusive=True)
            await queue.bind(exchange, "jobs.#")
            for i in range(MESSAGES):
                confirmation = await exchange.publish(
                    aio_pika.Message(
                        str(i).encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT
                    ),
                    routing_key="jobs.new",
                )
                assert confirmation is not None
            received = []
            async with queue.iterator() as messages:
                async for message in messages:
                    async with message.process():
                        received.append(message.body)
                    if len(received) == MESSAGES:
                        break
            return received

    assert asyncio.run(asyncio.wait_for(main(), 20)) == [str(i).encode() for i in range(MESSAGES)]


def test_aio_pika_channel_error(broker, uid):
    async def main():
        connection = await aio_pika.connect(broker.url, timeout=5)
        async with connection:
            channel = await connection.channel()
            with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity) as missing:
                await channel.declare_queue(f"{uid}-nope", passive=True)
            return missing.value

    error = asyncio.run(asyncio.wait_for(main(), 20))
    assert f"NOT_FOUND - no queue '{uid}-nope' in vhost '/'" in str(error)


def test_kombu_producer_and_consumer(broker, uid):
    exchange = kombu.Exchange(f"{uid}-x", "direct", durable=True)
    queue = kombu.Queue(f"{uid}-q", exchange, routing_key="work", durable=True)
    received = []
    with kombu.Connection(broker.url, transport="pyamqp", connect_timeout=5) as conn:
        producer = conn.Producer(serializer="json")
        for i in range(MESSAGES):
            producer.publish(
                {"n": i},
                exchange=exchange,
                routing_key="work",
                declare=[queue],
                delivery_mode=2,
                retry=False,
            )

        def on_message(body, message):
            received.append(body["n"])
            message.ack()

        with conn.Consumer(queue, callbacks=[on_message], prefetch_count=5):
            deadline = time.monotonic() + 10
            while len(received) < MESSAGES and time.monotonic() < deadline:
                conn.drain_events(timeout=1)
        queue.bind(conn).delete()
        exchange.bind(conn).delete()
    assert received == list(range(MESSAGES))


def test_kombu_simple_queue(broker, uid):
    with kombu.Connection(broker.url, connect_timeout=5) as conn:
        simple = conn.SimpleQueue(f"{uid}-simple")
        simple.put({"hello": "world"})
        message = simple.get(block=True, timeout=5)
        assert message.payload == {"hello": "world"}
        message.ack()
        simple.close()
        conn.default_channel.queue_delete(f"{uid}-simple")


def test_py_amqp_consume_and_drain(broker, uid):
    conn = amqp.Connection(f"{broker.host}:{broker.port}", connect_timeout=5)
    conn.connect()
    try:
        ch = conn.channel()
        ch.queue_declare(f"{uid}-q", exclusive=True)
        for i in range(MESSAGES):
            ch.basic_publish(amqp.Message(str(i)), "", f"{uid}-q")
        received = []

        def on_message(message):
            received.append(message.body)
            ch.basic_ack(message.delivery_tag)

        ch.basic_qos(0, 5, False)
        ch.basic_consume(f"{uid}-q", callback=on_message)
        deadline = time.monotonic() + 10
        while len(received) < MESSAGES and time.monotonic() < deadline:
            conn.drain_events(timeout=1)
        assert [
            bytes(body) if not isinstance(body, str) else body.encode() for body in received
        ] == [str(i).encode() for i in range(MESSAGES)]
    finally:
        conn.close()


def test_py_amqp_channel_error(broker, uid):
    conn = amqp.Connection(f"{broker.host}:{broker.port}", connect_timeout=5)
    conn.connect()
    try:
        with pytest.raises(amqp.exceptions.NotFound) as missing:
            conn.channel().queue_declare(f"{uid}-nope", passive=True)
        assert missing.value.reply_code == 404
        assert missing.value.reply_text == f"NOT_FOUND - no queue '{uid}-nope' in vhost '/'"
    finally:
        conn.close()


def test_amqpstorm_round_trip(broker, uid):
    with amqpstorm.UriConnection(broker.url + "?heartbeat=60&timeout=5") as connection:
        with connection.channel() as channel:
            channel.confirm_deliveries()
            channel.queue.declare(f"{uid}-q", exclusive=True)
            for i in range(MESSAGES):
                message = amqpstorm.Message.create(channel, str(i), {"delivery_mode": 2})
                assert message.publish(f"{uid}-q") is True
            received = []

            def on_message(message):
                received.append(message.body)
                message.ack()
                if len(received) == MESSAGES:
                    channel.stop_consuming()

            channel.basic.qos(prefetch_count=5)
            channel.basic.consume(on_message, f"{uid}-q")
            channel.start_consuming(to_tuple=False)
            assert received == [str(i) for i in range(MESSAGES)]


def test_amqpstorm_channel_error(broker, uid):
    with amqpstorm.UriConnection(broker.url + "?timeout=5") as connection:
        with connection.channel() as channel:
            with pytest.raises(amqpstorm.AMQPChannelError) as missing:
                channel.queue.declare(f"{uid}-nope", passive=True)
            assert missing.value.error_code == 404


@pytest.mark.slow
def test_celery_task_round_trip_with_rpc_backend(broker, uid):
    from celery import Celery
    from celery.contrib.testing.worker import start_worker

    app = Celery(f"compat-{uid}", broker=broker.url, backend="rpc://")
    app.conf.update(
        task_default_queue=f"{uid}-celery",
        broker_connection_retry_on_startup=False,
        worker_hijack_root_logger=False,
        result_expires=None,
    )

    @app.task(name=f"{uid}.add")
    def add(x, y):
        return x + y

    @app.task(name=f"{uid}.fail")
    def fail():
        raise ValueError("on purpose")

    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=60):
        assert add.delay(2, 3).get(timeout=15) == 5
        results = [add.delay(i, i) for i in range(5)]
        assert [r.get(timeout=15) for r in results] == [0, 2, 4, 6, 8]
        with pytest.raises(ValueError, match="on purpose"):
            fail.delay().get(timeout=15)

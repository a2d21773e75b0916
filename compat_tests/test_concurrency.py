"""Several publishing and consuming connections at once: every confirmed message arrives once."""

from __future__ import annotations

import threading
import time

import pika

PUBLISHERS = 4
CONSUMERS = 3
MESSAGES_PER_PUBLISHER = 250


def test_concurrent_confirmed_publishers_and_competing_consumers(broker, uid):
    queue = f"{uid}-q"
    setup = pika.BlockingConnection(broker.params())
    setup.channel().queue_declare(queue, durable=True)
    errors: list[BaseException] = []
    received: list[bytes] = []
    lock = threading.Lock()
    stop = threading.Event()

    def publish(index: int) -> None:
        try:
            conn = pika.BlockingConnection(broker.params())
            ch = conn.channel()
            ch.confirm_delivery()
            for n in range(MESSAGES_PER_PUBLISHER):
                ch.basic_publish(
                    "", queue, f"{index}:{n}".encode(), pika.BasicProperties(delivery_mode=2)
                )
            conn.close()
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    def consume() -> None:
        try:
            conn = pika.BlockingConnection(broker.params())
            ch = conn.channel()
            ch.basic_qos(prefetch_count=20)

            def on_message(channel, method, properties, body):
                with lock:
                    received.append(body)
                channel.basic_ack(method.delivery_tag)

            ch.basic_consume(queue, on_message)
            while not stop.is_set():
                conn.process_data_events(time_limit=0.05)
            conn.close()
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=consume) for _ in range(CONSUMERS)]
    threads += [threading.Thread(target=publish, args=(i,)) for i in range(PUBLISHERS)]
    for thread in threads:
        thread.start()
    total = PUBLISHERS * MESSAGES_PER_PUBLISHER
    deadline = time.monotonic() + 30
    while len(received) < total and time.monotonic() < deadline and not errors:
        time.sleep(0.05)
    time.sleep(0.2)
    stop.set()
    for thread in threads:
        thread.join(10)
    try:
        assert errors == []
        assert sorted(received) == sorted(
            f"{i}:{n}".encode() for i in range(PUBLISHERS) for n in range(MESSAGES_PER_PUBLISHER)
        )
        for index in range(PUBLISHERS):
            mine = [int(b.split(b":")[1]) for b in received if b.startswith(f"{index}:".encode())]
            assert len(mine) == MESSAGES_PER_PUBLISHER
        assert setup.channel().queue_delete(queue).method.message_count == 0
    finally:
        setup.close()

"""A stream under SIGKILL: every confirmed message is there after the restart, once, in
publication order, at dense offsets from 0."""

from __future__ import annotations

import signal
import threading
import time

import pika
import pika.exceptions
import pytest

STREAM = "crash-stream"


def _publish_until_killed(port, confirmed, stop):
    from brokers import connect

    try:
        connection = connect(port)
        channel = connection.channel()
        channel.confirm_delivery()
        n = 0
        while not stop.is_set():
            body = str(n).encode()
            # In confirm mode basic_publish returns once the broker confirmed it.
            channel.basic_publish("", STREAM, body)
            confirmed.append(body)
            n += 1
    except (pika.exceptions.AMQPError, OSError):
        return


def _replay(connection, count_min):
    channel = connection.channel()
    channel.basic_qos(prefetch_count=500)
    got = []

    def on_message(ch, method, properties, body):
        got.append((properties.headers["x-stream-offset"], body))
        ch.basic_ack(method.delivery_tag)

    channel.basic_consume(STREAM, on_message, arguments={"x-stream-offset": "first"})
    deadline = time.monotonic() + 30
    idle_until = None
    while time.monotonic() < deadline:
        before = len(got)
        connection.process_data_events(time_limit=0.1)
        if len(got) >= count_min and len(got) == before:
            idle_until = idle_until or time.monotonic() + 0.5
            if time.monotonic() > idle_until:
                break
        else:
            idle_until = None
    return got


@pytest.mark.slow
def test_confirmed_messages_survive_sigkill(warren_process):
    warren_process.start()
    connection = warren_process.connect()
    connection.channel().queue_declare(STREAM, durable=True, arguments={"x-queue-type": "stream"})
    connection.close()
    confirmed: list[bytes] = []
    stop = threading.Event()
    publishers = [
        threading.Thread(target=_publish_until_killed, args=(warren_process.port, confirmed, stop))
    ]
    for publisher in publishers:
        publisher.start()
    time.sleep(1.5)
    warren_process.stop(signal.SIGKILL)
    stop.set()
    for publisher in publishers:
        publisher.join(10)
    assert len(confirmed) > 50

    warren_process.start()
    connection = warren_process.connect()
    try:
        got = _replay(connection, len(confirmed))
    finally:
        connection.close()
    offsets = [offset for offset, _ in got]
    assert offsets == list(range(len(got)))
    bodies = [body for _, body in got]
    # Publication order, each once; what was written but never confirmed may be there too.
    assert bodies == [str(n).encode() for n in range(len(bodies))]
    assert bodies[: len(confirmed)] == confirmed


@pytest.mark.slow
def test_a_tracked_offset_survives_sigkill(warren_process):
    warren_process.start()
    connection = warren_process.connect()
    channel = connection.channel()
    channel.queue_declare(STREAM, durable=True, arguments={"x-queue-type": "stream"})
    channel.confirm_delivery()
    for n in range(20):
        channel.basic_publish("", STREAM, str(n).encode())
    reader = connection.channel()
    reader.basic_qos(prefetch_count=10)
    tags = []
    reader.basic_consume(
        STREAM,
        lambda ch, method, properties, body: tags.append(method.delivery_tag),
        consumer_tag="tracked",
        arguments={"x-stream-offset": "first"},
    )
    while len(tags) < 10:
        connection.process_data_events(time_limit=0.1)
    reader.basic_ack(tags[9], multiple=True)
    # The ack's offset write is fsynced by the tick after it; a round trip and a pause.
    connection.channel().queue_declare(STREAM, passive=True)
    time.sleep(0.5)
    warren_process.stop(signal.SIGKILL)

    warren_process.start()
    connection = warren_process.connect()
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=50)
        got = []
        channel.basic_consume(
            STREAM,
            lambda ch, method, properties, body: got.append(body),
            consumer_tag="tracked",
        )
        deadline = time.monotonic() + 10
        while len(got) < 10 and time.monotonic() < deadline:
            connection.process_data_events(time_limit=0.1)
        assert got == [str(n).encode() for n in range(10, 20)]
    finally:
        connection.close()


def _produce_until_killed(port, confirmed, stop):
    from brokers import connect

    try:
        connection = connect(port)
        channel = connection.channel()
        channel.confirm_delivery()
        sequence = 0
        while not stop.is_set():
            channel.basic_publish(
                "",
                STREAM,
                str(sequence).encode(),
                pika.BasicProperties(
                    headers={"x-producer-id": "p", "x-producer-sequence": sequence}
                ),
            )
            confirmed.append(sequence)
            sequence += 1
    except (pika.exceptions.AMQPError, OSError):
        return


@pytest.mark.slow
def test_an_idempotent_producer_retrying_after_sigkill_appends_each_message_once(
    warren_process,
):
    warren_process.start()
    connection = warren_process.connect()
    connection.channel().queue_declare(STREAM, durable=True, arguments={"x-queue-type": "stream"})
    connection.close()
    confirmed: list[int] = []
    stop = threading.Event()
    producer = threading.Thread(
        target=_produce_until_killed, args=(warren_process.port, confirmed, stop)
    )
    producer.start()
    time.sleep(1.5)
    warren_process.stop(signal.SIGKILL)
    stop.set()
    producer.join(10)
    assert len(confirmed) > 50

    warren_process.start()
    connection = warren_process.connect()
    try:
        # The producer retries from the last sequence it knows was confirmed, and past the
        # one that was in flight at the crash.
        channel = connection.channel()
        channel.confirm_delivery()
        retried = range(max(0, len(confirmed) - 20), len(confirmed) + 20)
        for sequence in retried:
            channel.basic_publish(
                "",
                STREAM,
                str(sequence).encode(),
                pika.BasicProperties(
                    headers={"x-producer-id": "p", "x-producer-sequence": sequence}
                ),
            )
        got = _replay(connection, retried[-1] + 1)
    finally:
        connection.close()
    assert [body for _, body in got] == [str(n).encode() for n in range(retried[-1] + 1)]

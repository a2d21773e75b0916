"""Stream queues over AMQP 0-9-1 (`x-queue-type: stream`), as RabbitMQ 3.10 has them.

Declare and consume refusals with RabbitMQ's codes and texts, `x-stream-offset` in each of its
forms, deliveries carrying `x-stream-offset`, acks as credit, and a stream kept across a
restart. Every test passes against the reference RabbitMQ too.
"""

from __future__ import annotations

import datetime
import socket
import threading
import time

import pika
import pytest
from pika_helpers import channel_error, connection_error, run_events, run_events_until

STREAM = {"x-queue-type": "stream"}


def declare(channel, name, **arguments):
    channel.queue_declare(name, durable=True, arguments={**STREAM, **arguments})


def publish(channel, name, count, start=0):
    """Confirmed one at a time: each message is a chunk of its own on both brokers."""
    if not channel._delivery_confirmation:
        channel.confirm_delivery()
    for i in range(start, start + count):
        channel.basic_publish("", name, f"m{i}".encode(), pika.BasicProperties(headers={"i": i}))


class Consumer:
    """A stream consumer collecting (offset header, body) until told to stop."""

    def __init__(self, connection, name, prefetch=100, ack=True, **arguments):
        self.connection = connection
        self.channel = connection.channel()
        self.channel.basic_qos(prefetch_count=prefetch)
        self.got = []
        self.tags = []
        self.ack = ack
        self.channel.basic_consume(name, self._on_message, arguments=arguments)

    def _on_message(self, channel, method, properties, body):
        assert not method.redelivered
        self.got.append((properties.headers["x-stream-offset"], body))
        self.tags.append(method.delivery_tag)
        if self.ack:
            channel.basic_ack(method.delivery_tag)

    def wait_for(self, count, timeout_s=10.0):
        run_events_until(self.connection, lambda: len(self.got) >= count, timeout_s)
        return self.got

    def bodies(self):
        return [body for _, body in self.got]


def _resource(name):
    return f"queue '{name}' in vhost '/'"


@pytest.mark.parametrize(
    ("options", "arguments", "text"),
    [
        ({"durable": False}, {}, "invalid property 'non-durable' for {q}"),
        ({"exclusive": True}, {}, "invalid property 'exclusive-owner' for {q}"),
        ({"auto_delete": True}, {}, "invalid property 'auto-delete' for {q}"),
        (
            {},
            {"x-max-priority": 5},
            "invalid arg 'x-max-priority' for {q} of queue type rabbit_stream_queue",
        ),
        (
            {},
            {"x-message-ttl": 5, "x-max-priority": 5},
            "invalid arg 'x-message-ttl' for {q} of queue type rabbit_stream_queue",
        ),
        (
            {},
            {"x-dead-letter-exchange": "dlx"},
            "invalid arg 'x-dead-letter-exchange' for {q} of queue type rabbit_stream_queue",
        ),
        (
            {},
            {"x-single-active-consumer": True},
            "invalid arg 'x-single-active-consumer' for {q} of queue type rabbit_stream_queue",
        ),
        (
            {},
            {"x-message-ttl": -1, "x-max-length-bytes": -1},
            "invalid arg 'x-max-length-bytes' for {q}: {{value_negative,-1}}",
        ),
        (
            {},
            {"x-max-priority": 2, "x-max-age": "1x"},
            "invalid arg 'x-max-age' for {q}: invalid_max_age",
        ),
        ({}, {"x-max-age": 5}, "invalid arg 'x-max-age' for {q}: {{unacceptable_type,signedint}}"),
        (
            {},
            {"x-initial-cluster-size": 0},
            "invalid arg 'x-initial-cluster-size' for {q}: {{value_zero,0}}",
        ),
        (
            {},
            {"x-stream-max-segment-size-bytes": 3_000_000_001},
            "Exceeded max value for x-stream-max-segment-size-bytes",
        ),
        (
            {"durable": False},
            {"x-stream-max-segment-size-bytes": 3_000_000_001},
            "invalid property 'non-durable' for {q}",
        ),
    ],
)
def test_declare_refusals_are_rabbitmqs(channel, uid, options, arguments, text):
    code, reply = channel_error(
        channel.queue_declare,
        uid,
        **{"durable": True, **options},
        arguments={**STREAM, **arguments},
    )
    assert (code, reply) == (406, "PRECONDITION_FAILED - " + text.format(q=_resource(uid)))


def test_declare_accepts_the_stream_arguments_and_refuses_server_names(channel, uid):
    declare(
        channel,
        uid,
        **{
            "x-max-age": "1Y",
            "x-max-length-bytes": 10_000_000,
            "x-stream-max-segment-size-bytes": 3_000_000_000,
            "x-initial-cluster-size": 3,
            "x-queue-leader-locator": "balanced",
        },
    )
    channel.queue_declare(uid, passive=True)
    code, text = channel_error(channel.queue_declare, "", durable=True, arguments=STREAM)
    assert (code, text) == (
        406,
        "PRECONDITION_FAILED - Cannot declare a server-named queue for type rabbit_stream_queue",
    )


def test_an_invalid_max_age_without_a_count_closes_the_connection(connection, uid):
    code, text = connection_error(
        connection.channel().queue_declare,
        uid,
        durable=True,
        arguments={**STREAM, "x-max-age": "zz"},
    )
    assert (code, text) == (541, "INTERNAL_ERROR")


@pytest.mark.parametrize(
    ("prefetch", "arguments", "code", "text"),
    [
        (0, {}, 406, "PRECONDITION_FAILED - consumer prefetch count is not set for '{q}'"),
        (
            0,
            {"x-priority": 1},
            406,
            "PRECONDITION_FAILED - invalid arg 'x-priority' for {q} of queue type "
            "rabbit_stream_queue",
        ),
        (
            0,
            {"x-priority": 1, "x-stream-offset": "99x"},
            406,
            "PRECONDITION_FAILED - invalid arg 'x-stream-offset' for {q}: "
            '{{invalid_stream_offset_arg,{{longstr,<<"99x">>}}}}',
        ),
        (
            5,
            {"x-stream-offset": "0s"},
            406,
            "PRECONDITION_FAILED - invalid arg 'x-stream-offset' for {q}: "
            '{{invalid_stream_offset_arg,{{longstr,<<"0s">>}}}}',
        ),
        (5, {"x-stream-offset": "bad"}, 541, "INTERNAL_ERROR"),
        (5, {"x-stream-offset": True}, 541, "INTERNAL_ERROR"),
    ],
)
def test_consume_refusals_are_rabbitmqs(connection, uid, prefetch, arguments, code, text):
    channel = connection.channel()
    declare(channel, uid)
    if prefetch:
        channel.basic_qos(prefetch_count=prefetch)
    error = channel_error if code < 500 else connection_error
    assert error(channel.basic_consume, uid, lambda *a: None, arguments=arguments) == (
        code,
        text.format(q=_resource(uid)),
    )


def test_no_ack_get_and_purge_close_the_connection(broker, uid):
    name = _resource(uid)
    for call, text in [
        (
            lambda ch: ch.basic_consume(uid, lambda *a: None, auto_ack=True),
            f"automatic acknowledgement not supported by stream queues {name}",
        ),
        (lambda ch: ch.basic_get(uid), f"basic.get not supported by stream queues {name}"),
        (lambda ch: ch.queue_purge(uid), f"queue.purge not supported by stream queues {name}"),
    ]:
        conn = pika.BlockingConnection(broker.params())
        try:
            channel = conn.channel()
            declare(channel, uid)
            channel.basic_qos(prefetch_count=5)
            assert connection_error(call, channel) == (540, "NOT_IMPLEMENTED - " + text)
        finally:
            if conn.is_open:
                conn.close()


def test_offsets_first_number_last_next_and_time(connection, uid):
    channel = connection.channel()
    declare(channel, uid)
    publish(channel, uid, 10)
    expected = [(i, f"m{i}".encode()) for i in range(10)]
    assert Consumer(connection, uid, **{"x-stream-offset": "first"}).wait_for(10) == expected
    assert Consumer(connection, uid, **{"x-stream-offset": 5}).wait_for(5) == expected[5:]
    assert Consumer(connection, uid, **{"x-stream-offset": -1}).wait_for(10) == expected
    hour_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1)
    assert Consumer(connection, uid, **{"x-stream-offset": hour_ago}).wait_for(10) == expected
    assert Consumer(connection, uid, **{"x-stream-offset": "30m"}).wait_for(10) == expected
    # Each confirmed publish was a chunk of its own: "last" is the last message.
    last = Consumer(connection, uid, **{"x-stream-offset": "last"})
    later = [
        Consumer(connection, uid),
        Consumer(connection, uid, **{"x-stream-offset": "next"}),
        Consumer(connection, uid, **{"x-stream-offset": 1000}),
        Consumer(
            connection,
            uid,
            **{
                "x-stream-offset": datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
            },
        ),
    ]
    assert last.wait_for(1) == expected[9:]
    run_events(connection, 0.5)
    assert [consumer.got for consumer in later] == [[], [], [], []]
    publish(channel, uid, 1, start=10)
    # A time ahead starts at the end, as "next" does.
    for consumer, count in [(last, 2), (later[0], 1), (later[1], 1), (later[3], 1)]:
        assert consumer.wait_for(count)[-1] == (10, b"m10")
    run_events(connection, 0.3)
    # Offset 1000 skips everything below it.
    assert later[2].got == []


def test_deliveries_keep_the_publishers_headers_and_properties(connection, uid):
    channel = connection.channel()
    declare(channel, uid)
    channel.confirm_delivery()
    channel.basic_publish(
        "",
        uid,
        b"body",
        pika.BasicProperties(content_type="text/plain", message_id="id-1", headers={"k": "v"}),
    )
    got = []
    consumer = connection.channel()
    consumer.basic_qos(prefetch_count=1)
    consumer.basic_consume(
        uid,
        lambda ch, method, properties, body: got.append((method, properties, body)),
        arguments={"x-stream-offset": "first"},
    )
    run_events_until(connection, lambda: got)
    method, properties, body = got[0]
    assert (method.exchange, method.routing_key, method.redelivered, body) == (
        "",
        uid,
        False,
        b"body",
    )
    assert (properties.content_type, properties.message_id) == ("text/plain", "id-1")
    assert list(properties.headers.items()) == [("k", "v"), ("x-stream-offset", 0)]


def test_acks_are_credit(connection, uid):
    channel = connection.channel()
    declare(channel, uid)
    publish(channel, uid, 6)
    consumer = Consumer(connection, uid, prefetch=2, ack=False, **{"x-stream-offset": "first"})
    consumer.wait_for(2)
    run_events(connection, 0.5)
    assert consumer.bodies() == [b"m0", b"m1"]
    consumer.channel.basic_ack(consumer.tags[0])
    consumer.wait_for(3)
    run_events(connection, 0.3)
    assert consumer.bodies() == [b"m0", b"m1", b"m2"]
    consumer.channel.basic_ack(consumer.tags[-1], multiple=True)
    assert consumer.wait_for(5)[:5] == [(i, f"m{i}".encode()) for i in range(5)]


@pytest.mark.parametrize("settle", ["nack", "reject"])
def test_nack_and_reject_close_the_connection(connection, uid, settle):
    channel = connection.channel()
    declare(channel, uid)
    publish(channel, uid, 1)
    consumer = Consumer(connection, uid, ack=False, **{"x-stream-offset": "first"})
    consumer.wait_for(1)
    if settle == "nack":
        consumer.channel.basic_nack(consumer.tags[0])
    else:
        consumer.channel.basic_reject(consumer.tags[0], requeue=False)
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        run_events(connection, 2.0)
    assert (closed.value.reply_code, closed.value.reply_text) == (
        540,
        "NOT_IMPLEMENTED - basic.nack and basic.reject not supported by stream queues "
        + _resource(uid),
    )


def test_a_closed_channel_puts_nothing_back_and_delete_counts_nothing(connection, uid):
    channel = connection.channel()
    declare(channel, uid)
    publish(channel, uid, 3)
    first = Consumer(connection, uid, ack=False, **{"x-stream-offset": "first"})
    first.wait_for(3)
    first.channel.close()
    again = Consumer(connection, uid, **{"x-stream-offset": "first"})
    assert again.wait_for(3) == [(i, f"m{i}".encode()) for i in range(3)]
    again.channel.close()
    assert channel.queue_delete(uid, if_empty=True, if_unused=True).method.message_count == 0


def _declare_once_up(connection, name, **arguments):
    """RabbitMQ answers 404 "home node ... is down" until its stream coordinator has the
    stream back after a restart: declare again until it has."""
    deadline = time.monotonic() + 30
    while True:
        channel = connection.channel()
        try:
            declare(channel, name, **arguments)
            return channel
        except pika.exceptions.ChannelClosedByBroker as error:
            if error.reply_code != 404 or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


@pytest.mark.slow
def test_a_stream_survives_a_restart(broker, uid):
    connection = pika.BlockingConnection(broker.params())
    declare(connection.channel(), uid, **{"x-max-age": "1D"})
    publish(connection.channel(), uid, 5)
    connection.close()
    broker.restart()
    connection = pika.BlockingConnection(broker.params())
    try:
        channel = _declare_once_up(connection, uid, **{"x-max-age": "1D"})
        publish(channel, uid, 1, start=5)
        got = Consumer(connection, uid, **{"x-stream-offset": "first"}).wait_for(6)
        assert got == [(i, f"m{i}".encode()) for i in range(6)]
        channel.queue_delete(uid)
    finally:
        connection.close()


def test_many_messages_replay_in_order(connection, uid):
    channel = connection.channel()
    declare(channel, uid)
    for i in range(2000):
        channel.basic_publish("", uid, str(i).encode())
    channel.confirm_delivery()
    channel.basic_publish("", uid, b"end")
    consumer = Consumer(connection, uid, prefetch=50, **{"x-stream-offset": "first"})
    got = consumer.wait_for(2001, timeout_s=30)
    assert [offset for offset, _ in got] == list(range(2001))
    assert consumer.bodies() == [str(i).encode() for i in range(2000)] + [b"end"]


@pytest.mark.warren_only  # RabbitMQ tracks offsets only over its stream protocol
@pytest.mark.slow
def test_a_named_consumer_resumes_after_its_contiguous_acks_across_a_restart(broker, uid):
    connection = pika.BlockingConnection(broker.params())
    channel = connection.channel()
    declare(channel, uid)
    publish(channel, uid, 10)
    reader = connection.channel()
    reader.basic_qos(prefetch_count=5)
    tags = []
    reader.basic_consume(
        uid,
        lambda ch, method, properties, body: tags.append(method.delivery_tag),
        consumer_tag="reader",
        arguments={"x-stream-offset": "first"},
    )
    run_events_until(connection, lambda: len(tags) == 5)
    # Offsets 0, 1 and 3 acked: the contiguous prefix ends at 2.
    for tag in (tags[3], tags[0], tags[1]):
        reader.basic_ack(tag)
    run_events(connection, 0.5)
    connection.close()
    broker.restart()
    connection = pika.BlockingConnection(broker.params())
    try:
        got = []
        channel = connection.channel()
        channel.basic_qos(prefetch_count=20)
        channel.basic_consume(
            uid,
            lambda ch, method, properties, body: got.append(properties.headers["x-stream-offset"]),
            consumer_tag="reader",
        )
        run_events_until(connection, lambda: len(got) == 8)
        assert got == list(range(2, 10))
    finally:
        connection.close()


def _produce(channel, name, producer, sequences):
    for sequence in sequences:
        channel.basic_publish(
            "",
            name,
            f"{producer}-{sequence}".encode(),
            pika.BasicProperties(
                headers={"x-producer-id": producer, "x-producer-sequence": sequence}
            ),
        )


@pytest.mark.warren_only  # RabbitMQ deduplicates only over its stream protocol
@pytest.mark.slow
def test_an_idempotent_producer_appends_each_message_once_across_a_restart(broker, uid):
    connection = pika.BlockingConnection(broker.params())
    channel = connection.channel()
    declare(channel, uid)
    channel.confirm_delivery()
    _produce(channel, uid, "p", range(1, 6))
    # A retry after a lost confirm: every publish is confirmed, none appended twice.
    _produce(channel, uid, "p", range(3, 8))
    _produce(channel, uid, "q", [1, 1])
    connection.close()
    broker.restart()
    connection = pika.BlockingConnection(broker.params())
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        _produce(channel, uid, "p", range(6, 9))
        expected = [f"p-{n}".encode() for n in range(1, 8)] + [b"q-1", b"p-8"]
        consumer = Consumer(connection, uid, **{"x-stream-offset": "first"})
        consumer.wait_for(len(expected))
        run_events(connection, 0.5)
        assert consumer.bodies() == expected
    finally:
        connection.close()


@pytest.mark.warren_only  # RabbitMQ 3.13's filtering; the reference 3.10 has none
def test_a_filtered_consumer_gets_exactly_what_it_asked_for(connection, uid):
    channel = connection.channel()
    declare(channel, uid)
    channel.confirm_delivery()
    values = ["eu", "us", None, "asia", "eu", None] * 5
    for index, value in enumerate(values):
        headers = None if value is None else {"x-stream-filter-value": value}
        channel.basic_publish("", uid, str(index).encode(), pika.BasicProperties(headers=headers))
    wanted = Consumer(
        connection,
        uid,
        prefetch=3,
        **{
            "x-stream-offset": "first",
            "x-stream-filter": ["eu", "asia"],
            "x-stream-match-unfiltered": True,
        },
    )
    expected = [i for i, value in enumerate(values) if value in ("eu", "asia", None)]
    wanted.wait_for(len(expected))
    run_events(connection, 0.3)
    assert [offset for offset, _ in wanted.got] == expected
    refused = connection.channel()
    refused.basic_qos(prefetch_count=5)
    code, text = channel_error(
        refused.basic_consume,
        uid,
        lambda *a: None,
        arguments={"x-stream-filter": 5},
    )
    assert code == 406 and "x-stream-filter" in text


@pytest.mark.warren_only  # RabbitMQ has single active consumers on super streams only over
# its stream protocol
def test_a_consumer_group_shares_partitions_and_takes_over_a_gone_member(
    connection, open_connection, uid
):
    channel = connection.channel()
    channel.exchange_declare(
        uid, "x-super-stream", durable=True, arguments={"x-super-stream-partitions": 3}
    )
    channel.confirm_delivery()
    for i in range(30):
        channel.basic_publish(uid, f"key-{i}", str(i).encode())
    got: dict[str, list] = {"a": [], "b": []}
    members = {}
    for name in ("a", "b"):
        member_connection = open_connection()
        member = member_connection.channel()
        member.basic_qos(prefetch_count=100)

        def on_message(ch, method, properties, body, name=name):
            headers = properties.headers
            got[name].append((headers["x-stream-partition"], headers["x-stream-offset"], body))
            ch.basic_ack(method.delivery_tag)

        member.basic_consume(
            uid,
            on_message,
            arguments={"x-consumer-group": "billing", "x-stream-offset": "first"},
        )
        members[name] = member_connection
        run_events(member_connection, 0.3)
    for _ in range(10):
        for member_connection in members.values():
            run_events(member_connection, 0.05)
    seen = {body for deliveries in got.values() for _, _, body in deliveries}
    assert seen == {str(i).encode() for i in range(30)}
    # Every partition was read by one member at a time, in order.
    for name, deliveries in got.items():
        for partition in {p for p, _, _ in deliveries}:
            offsets = [o for p, o, _ in deliveries if p == partition]
            assert offsets == sorted(offsets), name
    # b goes; a takes its partitions over from where b acked.
    members["b"].close()
    for i in range(30, 60):
        channel.basic_publish(uid, f"key-{i}", str(i).encode())
    run_events_until(
        members["a"],
        lambda: {b for _, _, b in got["a"]} >= {str(i).encode() for i in range(30, 60)},
    )
    assert {p for p, _, _ in got["a"][-30:]} == {f"{uid}-0", f"{uid}-1", f"{uid}-2"}


@pytest.mark.warren_only  # RabbitMQ has single active consumers on super streams only over
# its stream protocol
def test_three_members_joining_and_leaving_under_load(connection, open_connection, uid):
    """While a publisher keeps publishing, a, b and c join one by one, then a dies, then b:
    every message reaches the group, and each partition's deliveries,
    in the order they were handled, are its offsets from 0 without a gap or a repeat (one
    member at a time, each taking over where the last one acked)."""
    total = 3000
    channel = connection.channel()
    channel.exchange_declare(
        uid, "x-super-stream", durable=True, arguments={"x-super-stream-partitions": 3}
    )
    published = 0
    publisher_error: list[BaseException] = []

    def publish_all():
        try:
            nonlocal published
            publisher = open_connection()
            publishing = publisher.channel()
            publishing.confirm_delivery()
            for i in range(total):
                publishing.basic_publish(uid, f"key-{i}", str(i).encode())
                published = i + 1
        except BaseException as error:  # reported by the test's thread
            publisher_error.append(error)

    handled: list[tuple[str, int, str, bytes]] = []
    members: dict[str, tuple[pika.BlockingConnection, object]] = {}

    def join(name):
        member_connection = open_connection()
        member = member_connection.channel()
        member.basic_qos(prefetch_count=50)

        def on_message(ch, method, properties, body):
            headers = properties.headers
            handled.append((headers["x-stream-partition"], headers["x-stream-offset"], name, body))
            ch.basic_ack(method.delivery_tag)

        tag = member.basic_consume(
            uid, on_message, arguments={"x-consumer-group": "g", "x-stream-offset": "first"}
        )
        members[name] = (member_connection, (member, tag))

    def die(name):
        """The member's process dies: its socket goes without a word (pika's own close would
        nack the deliveries it holds, and a stream closes the connection on a nack)."""
        member_connection = members.pop(name)[0]
        member_connection._impl._transport._sock.shutdown(socket.SHUT_RDWR)
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            run_events(member_connection, 1)

    def run_members_until(condition, timeout_s=60.0):
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert time.monotonic() < deadline, f"published {published}, handled {len(handled)}"
            assert not publisher_error, publisher_error
            for member_connection, _ in list(members.values()):
                if member_connection.is_open:
                    run_events(member_connection, 0.01)

    thread = threading.Thread(target=publish_all, daemon=True)
    join("a")
    thread.start()
    run_members_until(lambda: published >= 500)
    join("b")
    run_members_until(lambda: published >= 1000)
    join("c")
    run_members_until(lambda: published >= 1500)
    die("a")
    run_members_until(lambda: published >= 2000)
    die("b")
    thread.join(60)
    assert not publisher_error and published == total
    run_members_until(lambda: len({body for *_, body in handled}) == total)
    run_events(members["c"][0], 0.3)

    assert {body for *_, body in handled} == {str(i).encode() for i in range(total)}
    handlers = {name for _, _, name, _ in handled}
    assert handlers == {"a", "b", "c"}
    for partition in (f"{uid}-0", f"{uid}-1", f"{uid}-2"):
        offsets = [offset for p, offset, _, _ in handled if p == partition]
        assert offsets == list(range(len(offsets))), partition
    # c alone owns every partition at the end.
    assert {name for _, _, name, _ in handled[-30:]} == {"c"}

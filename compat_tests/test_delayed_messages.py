"""Delayed messages: the x-delayed-message exchange type of rabbitmq-delayed-message-exchange,
seen by an unmodified client (the plugin's own suite, plugin_SUITE.erl, tests the same
things: declare checks, delay order, string delays, a restart before the delays expire)."""

from __future__ import annotations

import time

import pika
import pika.exceptions
import pytest
from pika_helpers import channel_error, connection_error, drain

# The reference RabbitMQ 3.10 runs without the rabbitmq_delayed_message_exchange plugin.
pytestmark = pytest.mark.warren_only

PERSISTENT = 2


def declare(channel, name, routing="direct", durable=False):
    channel.exchange_declare(
        name, "x-delayed-message", durable=durable, arguments={"x-delayed-type": routing}
    )


def held(delay, body=None):
    properties = pika.BasicProperties(delivery_mode=PERSISTENT, headers={"x-delay": delay})
    return (body if body is not None else str(delay).encode()), properties


def consume(channel, queue, count, timeout_s):
    """(body, x-delay header, seconds since the call) of `count` messages, in arrival order."""
    started = time.monotonic()
    got = []
    for method, properties, body in channel.consume(queue, inactivity_timeout=timeout_s):
        if method is None:
            break
        got.append((body, properties.headers["x-delay"], time.monotonic() - started))
        channel.basic_ack(method.delivery_tag)
        if len(got) == count:
            break
    channel.cancel()
    return got


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        ({}, "Invalid argument, 'x-delayed-type' must be an existing exchange type"),
        (
            {"x-delayed-type": 1},
            "Invalid argument, 'x-delayed-type' must be an existing exchange type",
        ),
        (
            {"x-delayed-type": "x-delayed-message"},
            "Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'",
        ),
    ],
)
def test_declare_refuses_a_missing_or_unusable_delayed_type(connection, uid, arguments, text):
    code, reply = channel_error(
        connection.channel().exchange_declare, f"{uid}-x", "x-delayed-message", arguments=arguments
    )
    assert (code, reply) == (406, f"PRECONDITION_FAILED - {text}")


def test_declare_with_an_unknown_delayed_type_closes_the_connection(connection, uid):
    code, reply = connection_error(
        connection.channel().exchange_declare,
        f"{uid}-x",
        "x-delayed-message",
        arguments={"x-delayed-type": "x-no-such-type"},
    )
    assert (code, reply) == (503, "COMMAND_INVALID - unknown exchange type 'x-no-such-type'")


def test_messages_arrive_in_delay_order_when_due_with_x_delay_negated(channel, uid):
    declare(channel, f"{uid}-x")
    channel.queue_declare(f"{uid}-q", exclusive=True)
    channel.queue_bind(f"{uid}-q", f"{uid}-x", "k")
    channel.confirm_delivery()
    delays = [500, 100, 300, 200, 100, 400]
    started = time.monotonic()
    for delay in delays:
        channel.basic_publish(f"{uid}-x", "k", *held(delay))
    # Confirmed once stored: the first, of 500 ms, before it was due.
    assert time.monotonic() - started < 0.45
    got = consume(channel, f"{uid}-q", len(delays), timeout_s=3)
    assert [body for body, _, _ in got] == [b"100", b"100", b"200", b"300", b"400", b"500"]
    assert [header for _, header, _ in got] == [-100, -100, -200, -300, -400, -500]
    for body, _, arrived_s in got:
        assert arrived_s >= int(body) / 1000 - 0.1  # measured from after the publishes


def test_a_string_delay_delays_too(channel, uid):
    declare(channel, f"{uid}-x", routing="fanout")
    channel.queue_declare(f"{uid}-q", exclusive=True)
    channel.queue_bind(f"{uid}-q", f"{uid}-x")
    for delay in ("300", "100"):
        channel.basic_publish(f"{uid}-x", "", *held(delay, delay.encode()))
    assert drain(channel, f"{uid}-q") == []
    got = consume(channel, f"{uid}-q", 2, timeout_s=2)
    assert [(body, header) for body, header, _ in got] == [(b"100", -100), (b"300", -300)]


def test_a_message_without_a_delay_is_routed_at_once(channel, uid):
    declare(channel, f"{uid}-x", routing="topic")
    channel.queue_declare(f"{uid}-q", exclusive=True)
    channel.queue_bind(f"{uid}-q", f"{uid}-x", "orders.*")
    channel.confirm_delivery()
    channel.basic_publish(f"{uid}-x", "orders.new", b"now")
    channel.basic_publish(f"{uid}-x", "orders.old", *held(0, b"zero"))
    channel.basic_publish(f"{uid}-x", "other", b"unrouted")
    assert drain(channel, f"{uid}-q") == [b"now", b"zero"]


def test_a_mandatory_held_message_is_returned_and_delivered_when_due(channel, uid):
    """The plugin does not know where a held message will go, so a mandatory one comes back
    at once with NO_ROUTE; it is delivered when due all the same."""
    declare(channel, f"{uid}-x")
    channel.queue_declare(f"{uid}-q", exclusive=True)
    channel.queue_bind(f"{uid}-q", f"{uid}-x", "k")
    channel.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError) as returned:
        channel.basic_publish(f"{uid}-x", "k", *held(200, b"held"), mandatory=True)
    (message,) = returned.value.messages
    assert (message.method.reply_code, message.method.reply_text) == (312, "NO_ROUTE")
    assert message.properties.headers == {"x-delay": 200}
    assert [body for body, _, _ in consume(channel, f"{uid}-q", 1, timeout_s=2)] == [b"held"]


@pytest.mark.slow
def test_a_restart_before_the_delays_expire_keeps_them(broker, uid):
    connection = pika.BlockingConnection(broker.params())
    channel = connection.channel()
    declare(channel, f"{uid}-x", durable=True)
    channel.queue_declare(f"{uid}-q", durable=True)
    channel.queue_bind(f"{uid}-q", f"{uid}-x", "k")
    channel.confirm_delivery()
    # Seconds apart, and the first far enough out for a whole cluster's restart on a loaded
    # machine to finish before it.
    delays = [10000, 6000, 8000, 12000, 7000]
    started = time.monotonic()
    for delay in delays:
        channel.basic_publish(f"{uid}-x", "k", *held(delay))
    connection.close()
    broker.restart()
    assert time.monotonic() - started < min(delays) / 1000, "restarted too late to test it"
    connection = pika.BlockingConnection(broker.params())
    channel = connection.channel()
    assert drain(channel, f"{uid}-q") == []
    got = consume(channel, f"{uid}-q", len(delays), timeout_s=min(delays) / 1000 + 2)
    assert [body for body, _, _ in got] == [str(delay).encode() for delay in sorted(delays)]
    channel.queue_delete(f"{uid}-q")
    channel.exchange_delete(f"{uid}-x")
    connection.close()

"""Small pika conveniences shared by the compat tests."""

from __future__ import annotations

import time

import pika
import pytest

# More than any test publishes: a queue that never runs empty is a bug, not a long queue.
DRAIN_MESSAGES_MAX = 100_000


def drain(channel, queue: str, settle_s: float = 0.0) -> list[bytes]:
    """Every message body now in ``queue``, taken with basic.get and no-ack, in order.

    ``settle_s`` waits first for messages still being routed (a publish is asynchronous).
    """
    if settle_s:
        time.sleep(settle_s)
    bodies = []
    for _ in range(DRAIN_MESSAGES_MAX):
        method, _, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return bodies
        bodies.append(body)
    raise AssertionError(f"{queue} never ran empty")


def wait_get(channel, queue: str, timeout_s: float = 5.0, auto_ack: bool = False):
    """basic.get until a message arrives: (method, properties, body); fail after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        method, properties, body = channel.basic_get(queue, auto_ack=auto_ack)
        if method is not None:
            return method, properties, body
        time.sleep(0.02)
    raise AssertionError(f"no message in {queue} within {timeout_s} s")


def channel_error(call, *args, **kwargs) -> tuple[int, str]:
    """Run a pika call that must close its channel; return (reply_code, reply_text)."""
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        call(*args, **kwargs)
    return closed.value.reply_code, closed.value.reply_text


def connection_error(call, *args, **kwargs) -> tuple[int, str]:
    """Run a pika call that must close its connection; return (reply_code, reply_text)."""
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as closed:
        call(*args, **kwargs)
    return closed.value.reply_code, closed.value.reply_text


def sync(channel) -> None:
    """A round trip on ``channel``, so that earlier asynchronous publishes have been handled."""
    channel.queue_declare("", exclusive=True, auto_delete=True)


def run_events(connection, seconds: float) -> None:
    """Let a BlockingConnection's callbacks run for `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.02)


def run_events_until(connection, condition, timeout_s: float = 5.0) -> None:
    """Run a BlockingConnection's callbacks until `condition()` holds; fail after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout_s} s"
        connection.process_data_events(time_limit=0.02)

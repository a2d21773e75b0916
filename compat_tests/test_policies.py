"""Policies, set with each broker's own command line (`warren policies set`, `rabbitmqctl
set_policy`): a limit reaching a queue that already holds messages, a TTL, dead-lettering and a
quorum queue's delivery limit, the highest priority alone applying, how a policy and a declared
argument combine, and a cleared policy letting go."""

from __future__ import annotations

import time

import pika
import pytest
from pika_helpers import drain, sync, wait_get

TTL_MS = 2000
EXPIRED_AFTER_S = TTL_MS / 1000 + 1.0
# A policy reaches queues that already exist a moment after it is set, in both brokers.
APPLIED_S_MAX = 10.0


class Policies:
    """Policies of "/" a test sets through its broker's command line, cleared after it."""

    def __init__(self, broker) -> None:
        self.broker = broker
        self.names: list[str] = []

    def set(self, name: str, pattern: str, definition: dict, **options) -> None:
        self.broker.set_policy(name, pattern, definition, **options)
        self.names.append(name)

    def clear(self, name: str) -> None:
        self.broker.clear_policy(name)
        self.names.remove(name)


@pytest.fixture
def policies(broker):
    set_by_test = Policies(broker)
    yield set_by_test
    for name in list(set_by_test.names):
        set_by_test.clear(name)


def message_count(channel, queue: str) -> int:
    return channel.queue_declare(queue, passive=True).method.message_count


def publish(channel, queue: str, *bodies: bytes) -> None:
    for body in bodies:
        channel.basic_publish("", queue, body)
    sync(channel)


def wait_for_count(channel, queue: str, expected: int) -> None:
    deadline = time.monotonic() + APPLIED_S_MAX
    while (count := message_count(channel, queue)) != expected:
        assert time.monotonic() < deadline, f"{queue} holds {count}, never {expected}"
        time.sleep(0.05)


def test_a_max_length_policy_trims_a_queue_that_holds_more(channel, uid, policies):
    channel.queue_declare(f"{uid}-q", exclusive=True)
    channel.queue_declare(f"{uid}-other", exclusive=True)
    publish(channel, f"{uid}-q", b"1", b"2", b"3")
    publish(channel, f"{uid}-other", b"1", b"2", b"3")
    policies.set(f"{uid}-limit", f"^{uid}-q$", {"max-length": 2})
    wait_for_count(channel, f"{uid}-q", 2)
    publish(channel, f"{uid}-q", b"4")
    assert drain(channel, f"{uid}-q") == [b"3", b"4"]
    # The pattern is a regex searched for in the name: the other queue keeps everything.
    assert message_count(channel, f"{uid}-other") == 3


def test_a_message_ttl_policy_expires_messages(channel, uid, policies):
    policies.set(f"{uid}-ttl", f"^{uid}-q$", {"message-ttl": TTL_MS})
    channel.queue_declare(f"{uid}-q", exclusive=True)
    published = time.monotonic()
    publish(channel, f"{uid}-q", b"expires")
    assert message_count(channel, f"{uid}-q") == 1
    time.sleep(max(0.0, published + EXPIRED_AFTER_S - time.monotonic()))
    assert drain(channel, f"{uid}-q") == []


def dead_letter_to(queue: str) -> dict:
    return {"dead-letter-exchange": "", "dead-letter-routing-key": queue}


def test_a_dead_letter_policy_routes_rejected_messages(channel, uid, policies):
    channel.queue_declare(f"{uid}-dlq", exclusive=True)
    policies.set(f"{uid}-dlx", f"^{uid}-q$", dead_letter_to(f"{uid}-dlq"))
    channel.queue_declare(f"{uid}-q", exclusive=True)
    publish(channel, f"{uid}-q", b"dead")
    method, _, _ = wait_get(channel, f"{uid}-q")
    channel.basic_reject(method.delivery_tag, requeue=False)
    _, properties, body = wait_get(channel, f"{uid}-dlq")
    death = properties.headers["x-death"][0]
    assert (body, death["queue"], death["reason"]) == (b"dead", f"{uid}-q", "rejected")


def test_a_declared_dead_letter_routing_key_wins_over_the_policys(channel, uid, policies):
    for queue in ("mine", "theirs"):
        channel.queue_declare(f"{uid}-{queue}", exclusive=True)
    policies.set(f"{uid}-dlx", f"^{uid}-q$", dead_letter_to(f"{uid}-theirs"))
    channel.queue_declare(
        f"{uid}-q",
        exclusive=True,
        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": f"{uid}-mine"},
    )
    publish(channel, f"{uid}-q", b"dead")
    method, _, _ = wait_get(channel, f"{uid}-q")
    channel.basic_reject(method.delivery_tag, requeue=False)
    assert wait_get(channel, f"{uid}-mine")[2] == b"dead"
    assert message_count(channel, f"{uid}-theirs") == 0


def test_a_delivery_limit_policy_on_a_quorum_queue(channel, uid, policies):
    channel.queue_declare(f"{uid}-dlq", exclusive=True)
    policies.set(
        f"{uid}-limit", f"^{uid}-q$", {"delivery-limit": 0, **dead_letter_to(f"{uid}-dlq")}
    )
    channel.queue_declare(f"{uid}-q", durable=True, arguments={"x-queue-type": "quorum"})
    try:
        publish(channel, f"{uid}-q", b"poison")
        method, _, _ = wait_get(channel, f"{uid}-q")
        channel.basic_reject(method.delivery_tag, requeue=True)
        _, properties, body = wait_get(channel, f"{uid}-dlq")
        death = properties.headers["x-death"][0]
        assert (body, death["reason"]) == (b"poison", "delivery_limit")
    finally:
        channel.queue_delete(f"{uid}-q")


def test_only_the_highest_priority_policy_applies(channel, uid, policies):
    policies.set(f"{uid}-low", f"^{uid}-", {"max-length": 1, "message-ttl": 1}, priority=1)
    policies.set(f"{uid}-high", f"^{uid}-q", {"max-length": 3}, priority=2)
    channel.queue_declare(f"{uid}-q", exclusive=True)
    publish(channel, f"{uid}-q", b"1", b"2", b"3", b"4")
    # The low policy's TTL would have dropped them: its definition is not merged in.
    time.sleep(0.1)
    assert drain(channel, f"{uid}-q") == [b"2", b"3", b"4"]


def test_the_smaller_of_a_declared_limit_and_the_policys_applies(channel, uid, policies):
    policies.set(f"{uid}-limit", f"^{uid}-", {"max-length": 2})
    channel.queue_declare(f"{uid}-argument-larger", exclusive=True, arguments={"x-max-length": 5})
    channel.queue_declare(f"{uid}-argument-smaller", exclusive=True, arguments={"x-max-length": 1})
    for queue in (f"{uid}-argument-larger", f"{uid}-argument-smaller"):
        publish(channel, queue, b"1", b"2", b"3")
    assert drain(channel, f"{uid}-argument-larger") == [b"2", b"3"]
    assert drain(channel, f"{uid}-argument-smaller") == [b"3"]


def test_a_declared_overflow_wins_over_the_policys(channel, uid, policies):
    policies.set(f"{uid}-overflow", f"^{uid}-", {"overflow": "drop-head", "max-length": 1})
    channel.confirm_delivery()
    channel.queue_declare(f"{uid}-q", exclusive=True, arguments={"x-overflow": "reject-publish"})
    channel.basic_publish("", f"{uid}-q", b"fits")
    with pytest.raises(pika.exceptions.NackError):
        channel.basic_publish("", f"{uid}-q", b"refused")
    assert drain(channel, f"{uid}-q") == [b"fits"]


def test_a_cleared_policy_lets_go_of_the_queue(channel, uid, policies):
    policies.set(f"{uid}-limit", f"^{uid}-q$", {"max-length": 1})
    channel.queue_declare(f"{uid}-q", exclusive=True)
    publish(channel, f"{uid}-q", b"1", b"2")
    assert message_count(channel, f"{uid}-q") == 1
    policies.clear(f"{uid}-limit")
    deadline = time.monotonic() + APPLIED_S_MAX
    while message_count(channel, f"{uid}-q") < 3:
        assert time.monotonic() < deadline, "the cleared policy still limits the queue"
        publish(channel, f"{uid}-q", b"more")

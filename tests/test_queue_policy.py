"""Which policy applies to a queue and the arguments it makes effective (server/queue/policy.py):
priorities and the tie-break, pattern search, apply-to, the keys a queue type refuses, and the
merge with declared arguments, key by key and type by type."""

from __future__ import annotations

import pytest

from warrenmq.server.metadata.records import Policy
from warrenmq.server.queue.policy import effective_arguments, queue_policy


def policy(name="p", pattern=".*", definition=None, priority=0, apply_to="all") -> Policy:
    return Policy("/", name, pattern, apply_to, priority, definition or {"max-length": 1})


def test_no_policy_leaves_the_declared_arguments_as_they_are():
    declared = {"x-max-length": 5}
    assert effective_arguments("q", "classic", declared, []) is declared
    unmatched = policy(pattern="^other$", definition={"message-ttl": 1})
    assert effective_arguments("q", "classic", declared, [unmatched]) is declared


def test_the_highest_priority_wins_alone():
    low = policy("low", definition={"message-ttl": 1000, "max-length": 10}, priority=1)
    high = policy("high", definition={"max-length": 20}, priority=5)
    negative = policy("negative", definition={"expires": 60000}, priority=-3)
    assert queue_policy("q", "classic", [low, negative, high]) is high
    # The definitions of lower policies are not combined into it.
    assert effective_arguments("q", "classic", {}, [low, negative, high]) == {"x-max-length": 20}
    assert queue_policy("q", "classic", [negative]) is negative


def test_equal_priorities_go_to_the_smallest_name_whatever_the_order():
    b = policy("b", definition={"max-length": 2}, priority=1)
    a = policy("a", definition={"max-length": 1}, priority=1)
    c = policy("c", definition={"max-length": 3}, priority=1)
    for order in ([a, b, c], [c, b, a], [b, c, a]):
        assert queue_policy("q", "classic", order) is a


def test_priorities_may_be_floats():
    assert (
        queue_policy("q", "classic", [policy("a", priority=1), policy("b", priority=1.5)]).name
        == "b"
    )


@pytest.mark.parametrize(
    ("pattern", "name", "matches"),
    [
        ("orders", "new-orders-eu", True),  # unanchored, as re:run searches
        ("^orders$", "new-orders-eu", False),
        ("^orders$", "orders", True),
        ("^amq\\.gen-", "amq.gen-AbC", True),
        ("", "anything", True),  # the empty pattern matches every name
        ("(?i)^ORDERS", "orders.eu", True),
        ("q[0-9]+", "q", False),
    ],
)
def test_the_pattern_is_searched_for_in_the_name(pattern, name, matches):
    assert (queue_policy(name, "classic", [policy(pattern=pattern)]) is not None) is matches


@pytest.mark.parametrize(
    ("apply_to", "classic", "quorum", "stream"),
    [
        ("all", True, True, True),
        ("queues", True, True, True),
        ("classic_queues", True, False, False),
        ("quorum_queues", False, True, False),
        ("streams", False, False, True),
        ("exchanges", False, False, False),
    ],
)
def test_apply_to(apply_to, classic, quorum, stream):
    # max-length-bytes is a key every queue type takes.
    chosen = policy(apply_to=apply_to, definition={"max-length-bytes": 1})
    for queue_type, expected in (("classic", classic), ("quorum", quorum), ("stream", stream)):
        assert (queue_policy("q", queue_type, [chosen]) is not None) is expected, queue_type


def test_a_key_the_queue_type_refuses_keeps_the_whole_policy_off_it():
    stream_only = policy(
        "stream-only", definition={"max-age": "1D", "max-length-bytes": 5}, priority=9
    )
    classic_only = policy("classic-only", definition={"queue-mode": "lazy", "max-length": 6})
    quorum_only = policy("quorum-only", definition={"dead-letter-strategy": "at-least-once"})
    policies = [stream_only, classic_only, quorum_only]
    # The higher stream policy does not apply to a classic queue; the next one does.
    assert queue_policy("q", "classic", policies) is classic_only
    assert effective_arguments("q", "classic", {}, policies) == {"x-max-length": 6}
    assert queue_policy("q", "quorum", policies) is quorum_only
    assert queue_policy("q", "stream", policies) is stream_only
    # max-length is a classic and quorum key: with it, the policy applies to no stream.
    assert (
        queue_policy("q", "stream", [policy(definition={"max-age": "1D", "max-length": 5})]) is None
    )


def test_classic_queues_take_delivery_limit_policies_unlike_rabbitmq():
    """Warren's deviation (issue 8): x-delivery-limit works on classic queues too."""
    limit = policy(definition={"delivery-limit": 3})
    assert effective_arguments("q", "classic", {}, [limit]) == {"x-delivery-limit": 3}


def test_a_policy_adds_what_was_not_declared_and_keeps_the_rest():
    declared = {"x-queue-type": "quorum", "x-single-active-consumer": True, "custom": b"v"}
    definition = {
        "message-ttl": 1,
        "expires": 2,
        "max-length": 3,
        "max-length-bytes": 4,
        "overflow": "reject-publish",
        "dead-letter-exchange": "dlx",
        "dead-letter-routing-key": "dead",
        "delivery-limit": 5,
        "consumer-timeout": 6,
        # Valid, but no setting of Warren's queues: not merged.
        "alternate-exchange": "ae",
        "queue-version": 2,
    }
    assert effective_arguments("q", "quorum", declared, [policy(definition=definition)]) == {
        **declared,
        "x-message-ttl": 1,
        "x-expires": 2,
        "x-max-length": 3,
        "x-max-length-bytes": 4,
        "x-overflow": "reject-publish",
        "x-dead-letter-exchange": "dlx",
        "x-dead-letter-routing-key": "dead",
        "x-delivery-limit": 5,
        "x-consumer-timeout": 6,
    }
    assert declared == {"x-queue-type": "quorum", "x-single-active-consumer": True, "custom": b"v"}


SMALLER = ("message-ttl", "expires", "max-length", "max-length-bytes", "consumer-timeout")


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
@pytest.mark.parametrize("key", SMALLER)
def test_numeric_limits_take_the_smaller_of_argument_and_policy(queue_type, key):
    def merged(argument, policy_value):
        chosen = policy(definition={key: policy_value})
        return effective_arguments("q", queue_type, {"x-" + key: argument}, [chosen])["x-" + key]

    assert merged(10, 20) == 10
    assert merged(20, 10) == 10
    # A declared value that is no number loses, numbers being Erlang's smallest terms.
    assert merged("junk", 10) == 10


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
@pytest.mark.parametrize(
    ("argument", "policy_value", "effective"),
    [(10, 20, 10), (20, 10, 10), (-1, 5, 5), (5, -1, 5), (-1, -2, -1), (0, 3, 0)],
)
def test_delivery_limit_takes_the_smaller_unless_one_is_unlimited(
    queue_type, argument, policy_value, effective
):
    chosen = policy(definition={"delivery-limit": policy_value})
    merged = effective_arguments("q", queue_type, {"x-delivery-limit": argument}, [chosen])
    assert merged["x-delivery-limit"] == effective


@pytest.mark.parametrize(
    ("queue_type", "key", "argument", "policy_value", "effective"),
    [
        ("classic", "overflow", "drop-head", "reject-publish", "drop-head"),
        ("quorum", "overflow", "drop-head", "reject-publish", "reject-publish"),
        ("classic", "dead-letter-exchange", "mine", "theirs", "mine"),
        ("quorum", "dead-letter-exchange", "mine", "theirs", "mine"),
        ("classic", "dead-letter-routing-key", "mine", "theirs", "mine"),
        ("quorum", "dead-letter-routing-key", "mine", "theirs", "mine"),
        ("stream", "max-length-bytes", 10, 20, 20),
        ("stream", "max-age", "1D", "2h", "2h"),
        ("stream", "stream-max-segment-size-bytes", 10, 20, 20),
        ("stream", "stream-filter-size-bytes", 16, 32, 32),
        ("stream", "consumer-timeout", 10, 20, 10),
        ("quorum", "delayed-retry-type", "failed", "all", "all"),
        ("classic", "delayed-retry-type", "failed", "all", "all"),
        ("quorum", "delayed-retry-min", 10, 20, 10),
        ("quorum", "delayed-retry-max", 30, 20, 20),
    ],
)
def test_which_side_wins_per_key_and_type(queue_type, key, argument, policy_value, effective):
    chosen = policy(definition={key: policy_value})
    merged = effective_arguments("q", queue_type, {"x-" + key: argument}, [chosen])
    assert merged["x-" + key] == effective


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_warrens_own_arguments_are_policy_keys_and_the_declared_one_wins(queue_type):
    definition = {"visibility-timeout": 30_000, "requeue-delay": 100, "requeue-delay-max": 800}
    timing = policy("timing", definition=definition, apply_to="queues")
    assert effective_arguments("q", queue_type, {}, [timing]) == {
        "x-visibility-timeout": 30_000,
        "x-requeue-delay": 100,
        "x-requeue-delay-max": 800,
    }
    declared = {"x-visibility-timeout": 5}
    assert effective_arguments("q", queue_type, declared, [timing])["x-visibility-timeout"] == 5

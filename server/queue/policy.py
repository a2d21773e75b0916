"""Which policy applies to a queue, and the arguments it makes effective, as RabbitMQ 4.2 does it.

Pure functions of the queue's name, type and declared arguments and its vhost's policies.

Choosing the policy (rabbit_policy:match_all/3, matches/3, priority_comparator/2;
rabbit_queue_type:is_policy_applicable/2 with each type's `unsupported_policies`):

* `apply-to` is "all", "queues" or the queue's own type ("classic_queues", "quorum_queues",
  "streams"); "exchanges" never applies to a queue;
* the pattern finds the name: `re:run(Name, Pattern)`, an unanchored search (`re.search`), so
  "orders" matches "new-orders-eu" and anchors must be written ("^orders$");
* no key of the definition is one the queue's type refuses (`UNSUPPORTED_KEYS`): a policy
  holding "max-age" never applies to a classic queue, nor one holding "queue-mode" to a quorum
  queue, not even for its other keys;
* of the policies left, the one with the highest priority applies, and it alone: two policies'
  definitions are never combined. Between equal priorities RabbitMQ takes whichever its
  runtime-parameter table lists first (an unordered ETS set under both Mnesia and Khepri; its
  docs call the choice undeterministic). Warren takes the smallest name, so that every replica
  and every restart chooses the same policy.

Merging with the declared arguments: each key of the definition becomes the argument "x-KEY".
When the queue declared that argument too, the queue type's resolver for the key decides
(rabbit_queue_type_util:args_policy_lookup/3 and its callers: rabbit_amqqueue_process's
process_args_policy/1 for classic queues, rabbit_quorum_queue's gather_policy_config/2,
dead_letter_handler/2 and resolve_delivery_limit/2, rabbit_stream_queue's update_stream_conf/2,
rabbit_channel's get_queue_consumer_timeout/2):

| key                       | classic  | quorum   | stream |
|---------------------------|----------|----------|--------|
| message-ttl               | smaller  | smaller  | -      |
| expires                   | smaller  | smaller  | -      |
| max-length                | smaller  | smaller  | -      |
| max-length-bytes          | smaller  | smaller  | policy |
| delivery-limit            | limit*   | limit*   | -      |
| consumer-timeout          | smaller  | smaller  | smaller|
| overflow                  | argument | policy   | -      |
| dead-letter-exchange      | argument | argument | -      |
| dead-letter-routing-key   | argument | argument | -      |
| delayed-retry-type        | policy*  | policy   | -      |
| delayed-retry-min, -max   | smaller* | smaller  | -      |
| max-age, stream-max-segment-size-bytes, stream-filter-size-bytes | - | - | policy |

"smaller": the smaller of the two numbers (Erlang's min/2; a declared value that is not a
number loses to the policy's, numbers being the smallest Erlang terms). "limit*": the smaller,
unless either is negative (unlimited), then the larger. Other valid keys (queue-mode,
queue-version, the locators, ...) change nothing in Warren's queues and are not merged.

Where 3.10 differed (read in v3.10.8): a quorum queue gave a policy's expires precedence over
its argument, and delivery-limit had no negative "unlimited" value. The "argument wins" rule
the RabbitMQ docs state holds only for the "argument" rows above.

Warren's deviation (*): a classic queue takes delivery-limit and the delayed retries (4.3) as
a quorum queue does (issue 8: x-delivery-limit works on classic and quorum queues alike),
where RabbitMQ lists them among a classic queue's unsupported policy keys. Warren has no
operator policies.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from warrenmq.server.metadata.records import Policy

APPLY_TO_OF_TYPE = {"classic": "classic_queues", "quorum": "quorum_queues", "stream": "streams"}
# Each type's `unsupported_policies` (rabbit_classic_queue, rabbit_quorum_queue and
# rabbit_stream_queue capabilities/0), without the keys validation refuses anyway (ha-*,
# max-priority) and, for classic queues, without delivery-limit (see above).
UNSUPPORTED_KEYS = {
    "classic": frozenset(
        {
            "max-age",
            "stream-max-segment-size-bytes",
            "initial-cluster-size",
            "dead-letter-strategy",
            "max-in-memory-length",
            "max-in-memory-bytes",
            "target-group-size",
        }
    ),
    "quorum": frozenset(
        {
            "queue-mode",
            "queue-master-locator",
            "max-age",
            "stream-max-segment-size-bytes",
            "initial-cluster-size",
        }
    ),
    "stream": frozenset(
        {
            "expires",
            "message-ttl",
            "dead-letter-exchange",
            "dead-letter-routing-key",
            "max-length",
            "max-in-memory-length",
            "max-in-memory-bytes",
            "overflow",
            "queue-mode",
            "delivery-limit",
            "queue-master-locator",
            "dead-letter-strategy",
            "target-group-size",
        }
    ),
}

Resolve = Callable[[Any, Any], Any]


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _smaller(policy_value: Any, argument_value: Any) -> Any:
    if not _is_number(argument_value):
        return policy_value
    return min(policy_value, argument_value)


def _delivery_limit(policy_value: Any, argument_value: Any) -> Any:
    if _is_number(argument_value) and (policy_value < 0 or argument_value < 0):
        return max(policy_value, argument_value)
    return _smaller(policy_value, argument_value)


def _argument(_policy_value: Any, argument_value: Any) -> Any:
    return argument_value


def _policy(policy_value: Any, _argument_value: Any) -> Any:
    return policy_value


# Warren's own queue arguments as policy keys: the declared argument wins, as for the
# dead-letter settings (a queue declared with its own timing keeps it).
WARREN_RESOLVERS: dict[str, Resolve] = {
    "visibility-timeout": _argument,
    "requeue-delay": _argument,
    "requeue-delay-max": _argument,
}

# RabbitMQ 4.3's delayed retries (rabbit_quorum_queue's get_delayed_retry_config/1): the
# policy's type wins, the smaller delays win. Warren takes them on classic queues too.
DELAYED_RETRY_RESOLVERS: dict[str, Resolve] = {
    "delayed-retry-type": _policy,
    "delayed-retry-min": _smaller,
    "delayed-retry-max": _smaller,
}

RESOLVERS: dict[str, dict[str, Resolve]] = {
    "classic": {
        "message-ttl": _smaller,
        "expires": _smaller,
        "max-length": _smaller,
        "max-length-bytes": _smaller,
        "delivery-limit": _delivery_limit,
        "consumer-timeout": _smaller,
        "overflow": _argument,
        "dead-letter-exchange": _argument,
        "dead-letter-routing-key": _argument,
        **WARREN_RESOLVERS,
        **DELAYED_RETRY_RESOLVERS,
    },
    "quorum": {
        "message-ttl": _smaller,
        "expires": _smaller,
        "max-length": _smaller,
        "max-length-bytes": _smaller,
        "delivery-limit": _delivery_limit,
        "consumer-timeout": _smaller,
        "overflow": _policy,
        "dead-letter-exchange": _argument,
        "dead-letter-routing-key": _argument,
        **WARREN_RESOLVERS,
        **DELAYED_RETRY_RESOLVERS,
    },
    "stream": {
        "max-length-bytes": _policy,
        "max-age": _policy,
        "stream-max-segment-size-bytes": _policy,
        "stream-filter-size-bytes": _policy,
        "consumer-timeout": _smaller,
    },
}


def applies(policy: Policy, name: str, queue_type: str) -> bool:
    """Whether `policy` may apply to the queue `name` of `queue_type` (before priorities)."""
    if policy.apply_to not in ("all", "queues", APPLY_TO_OF_TYPE[queue_type]):
        return False
    if not UNSUPPORTED_KEYS[queue_type].isdisjoint(policy.definition):
        return False
    return re.search(policy.pattern, name) is not None


def outranks(policy: Policy, other: Policy) -> bool:
    """Whether `policy` wins over `other` when both apply: a higher priority, or between equal
    ones the smaller name."""
    if policy.priority != other.priority:
        return policy.priority > other.priority
    return policy.name < other.name


def queue_policy(name: str, queue_type: str, policies: Iterable[Policy]) -> Policy | None:
    """The one policy that applies to the queue, or None."""
    chosen = None
    for policy in policies:
        # Ranked first: a policy that could not win costs no regex search.
        if (chosen is None or outranks(policy, chosen)) and applies(policy, name, queue_type):
            chosen = policy
    return chosen


def effective_arguments(
    name: str, queue_type: str, arguments: Mapping[str, Any], policies: Iterable[Policy]
) -> Mapping[str, Any]:
    """The queue's arguments as its policy makes them: the declared ones, with each key of the
    policy's definition merged in as "x-KEY" by the table above. Without a policy, the
    declared mapping itself (a queue holds no second copy)."""
    chosen = queue_policy(name, queue_type, policies)
    if chosen is None:
        return arguments
    effective = dict(arguments)
    resolvers = RESOLVERS[queue_type]
    for key, policy_value in chosen.definition.items():
        resolve = resolvers.get(key)
        if resolve is None:
            continue
        argument = "x-" + key
        if argument in arguments:
            effective[argument] = resolve(policy_value, arguments[argument])
        else:
            effective[argument] = policy_value
    return effective

"""queue.declare and basic.consume arguments, checked as RabbitMQ 3.10 checks them.

``rabbit_amqqueue:check_declare_arguments`` runs one validator per known key and reports the
first failure as 406 PRECONDITION_FAILED "invalid arg 'KEY' for queue 'Q' in vhost 'V': ERROR"
where ERROR is the Erlang term printed with ``~p`` (``{value_negative,-1}``,
``"expected integer, got longstr"``). Unknown keys are accepted and kept, as RabbitMQ keeps
them. Redeclaration (equivalence) is the metadata state machine's check.

Queue types: "classic" and "quorum" both become Warren's log-backed queue (quorum queues
keep their own restrictions: durable, not exclusive, not auto-delete, no priorities or lazy
mode). "stream" is Warren's retained stream: its checks are ``server/stream/arguments``,
which runs those of `DECLARE_CHECKS` that apply to a stream.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from warrenmq.exchanges.errors import PreconditionFailed as precondition_failed
from warrenmq.exchanges.field_values import amqp_type_name

QUEUE_TYPES_SUPPORTED = ("classic", "quorum", "stream")
# RabbitMQ's ?MAX_EXPIRY_TIMER: the largest TTL or expiry an Erlang timer accepts.
EXPIRY_MS_MAX = 4_294_967_295
PRIORITY_MAX = 255
_INTEGER_TYPES = (
    "byte",
    "short",
    "signedint",
    "long",
    "unsignedbyte",
    "unsignedshort",
    "unsignedint",
)
_OVERFLOW_MODES = ("drop-head", "reject-publish", "reject-publish-dlx")
_QUEUE_MODES = ("default", "lazy")
# 3.10's rabbit_queue_location: "balanced" too (and the older names).
_LEADER_LOCATORS = ("client-local", "random", "least-leaders", "balanced")
_MAX_AGE_UNITS = ("Y", "M", "D", "h", "m", "s")
_QUORUM_REFUSED_ARGUMENTS = ("x-max-priority", "x-queue-mode")

Check = Callable[[Any, Mapping[str, Any]], str | None]


def _type_of(value: Any) -> str:
    return amqp_type_name(value)


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def _check_int(value: Any, _arguments: Mapping[str, Any]) -> str | None:
    if isinstance(value, bool) or _type_of(value) not in _INTEGER_TYPES:
        return f'"expected integer, got {_type_of(value)}"'
    return None


def _check_non_negative_int(value: Any, arguments: Mapping[str, Any]) -> str | None:
    error = _check_int(value, arguments)
    if error is None and value < 0:
        return f"{{value_negative,{value}}}"
    return error


def _check_expiry(value: int) -> str | None:
    if value < 0:
        return f"{{value_negative,{value}}}"
    if value > EXPIRY_MS_MAX:
        return f"{{value_too_large,{value},{EXPIRY_MS_MAX}}}"
    return None


def _check_expires(value: Any, arguments: Mapping[str, Any]) -> str | None:
    error = _check_int(value, arguments)
    if error is not None:
        return error
    if value == 0:
        return f"{{value_zero,{value}}}"
    return _check_expiry(value)


def _check_message_ttl(value: Any, arguments: Mapping[str, Any]) -> str | None:
    return _check_int(value, arguments) or _check_expiry(value)


def _check_max_priority(value: Any, arguments: Mapping[str, Any]) -> str | None:
    error = _check_non_negative_int(value, arguments)
    if error is None and value > PRIORITY_MAX:
        return f"{{max_value_exceeded,{value}}}"
    return error


def _check_bool(value: Any, _arguments: Mapping[str, Any]) -> str | None:
    return None if isinstance(value, bool) else f"{{unacceptable_type,{_type_of(value)}}}"


def _check_positive_int(value: Any, arguments: Mapping[str, Any]) -> str | None:
    error = _check_non_negative_int(value, arguments)
    if error is None and value == 0:
        return f"{{value_zero,{value}}}"
    return error


def _one_of(choices: tuple[str, ...], invalid: Callable[[str], str]) -> Check:
    def check(value: Any, _arguments: Mapping[str, Any]) -> str | None:
        text = _text(value)
        if text is None:
            return f"{{unacceptable_type,{_type_of(value)}}}"
        return None if text in choices else invalid(text)

    return check


def _check_dead_letter_exchange(value: Any, _arguments: Mapping[str, Any]) -> str | None:
    return None if _text(value) is not None else f"{{unacceptable_type,{_type_of(value)}}}"


def _check_dead_letter_routing_key(value: Any, arguments: Mapping[str, Any]) -> str | None:
    if _text(value) is None:
        return f"{{unacceptable_type,{_type_of(value)}}}"
    if "x-dead-letter-exchange" not in arguments:
        return "routing_key_but_no_dlx_defined"
    return None


def check_max_age(value: Any, _arguments: Mapping[str, Any]) -> str | None:
    text = _text(value)
    if text is None:
        return f"{{unacceptable_type,{_type_of(value)}}}"
    digits = len(text) - len(text.lstrip("0123456789"))
    if digits == 0 or int(text[:digits]) <= 0 or text[digits:] not in _MAX_AGE_UNITS:
        return "invalid_max_age"
    return None


# rabbit_amqqueue:declare_args/0, in RabbitMQ's order: the first failing key is reported.
DECLARE_CHECKS: tuple[tuple[str, Check], ...] = (
    ("x-expires", _check_expires),
    ("x-message-ttl", _check_message_ttl),
    ("x-dead-letter-exchange", _check_dead_letter_exchange),
    ("x-dead-letter-routing-key", _check_dead_letter_routing_key),
    ("x-max-length", _check_non_negative_int),
    ("x-max-length-bytes", _check_non_negative_int),
    ("x-max-in-memory-length", _check_non_negative_int),
    ("x-max-in-memory-bytes", _check_non_negative_int),
    ("x-max-priority", _check_max_priority),
    ("x-overflow", _one_of(_OVERFLOW_MODES, lambda text: "invalid_overflow")),
    ("x-queue-mode", _one_of(_QUEUE_MODES, lambda text: f"\"unsupported queue mode '{text}'\"")),
    ("x-single-active-consumer", _check_bool),
    (
        "x-queue-type",
        _one_of(QUEUE_TYPES_SUPPORTED, lambda text: f"\"unsupported queue type '{text}'\""),
    ),
    ("x-quorum-initial-group-size", _check_positive_int),
    ("x-max-age", check_max_age),
    ("x-stream-max-segment-size-bytes", _check_non_negative_int),
    ("x-initial-cluster-size", _check_positive_int),
    ("x-queue-leader-locator", _one_of(_LEADER_LOCATORS, lambda text: "invalid_queue_locator_arg")),
    # RabbitMQ 3.12+ and 4.x check these; 3.10 accepted any value.
    ("x-consumer-timeout", _check_non_negative_int),
    ("x-delivery-limit", _check_int),
    ("x-visibility-timeout", _check_non_negative_int),
    ("x-requeue-delay", _check_non_negative_int),
    ("x-requeue-delay-max", _check_non_negative_int),
)
CONSUME_CHECKS: tuple[tuple[str, Check], ...] = (
    ("x-priority", _check_int),
    ("x-cancel-on-ha-failover", _check_bool),
)


def resource(kind: str, name: str, vhost: str) -> str:
    """rabbit_misc:rs/1: "queue 'q' in vhost '/'"."""
    return f"{kind} '{name}' in vhost '{vhost}'"


def check_arguments(
    checks: tuple[tuple[str, Check], ...], queue: str, vhost: str, arguments: Mapping[str, Any]
) -> None:
    for key, check in checks:
        if key in arguments:
            error = check(arguments[key], arguments)
            if error is not None:
                raise precondition_failed(
                    f"invalid arg '{key}' for {resource('queue', queue, vhost)}: {error}"
                )


def check_declare(
    queue: str,
    vhost: str,
    durable: bool,
    exclusive: bool,
    auto_delete: bool,
    arguments: Mapping[str, Any],
) -> str:
    """Validate a new queue's arguments; returns its type ("classic" or "quorum")."""
    check_arguments(DECLARE_CHECKS, queue, vhost, arguments)
    declared_type = queue_type(arguments)
    if declared_type == "quorum":
        # rabbit_quorum_queue:declare's order: arguments, auto-delete, exclusive, durable.
        name = resource("queue", queue, vhost)
        for key in _QUORUM_REFUSED_ARGUMENTS:
            if key in arguments:
                raise precondition_failed(f"invalid arg '{key}' for {name}")
        if auto_delete:
            raise precondition_failed(f"invalid property 'auto-delete' for {name}")
        if exclusive:
            raise precondition_failed(f"invalid property 'exclusive-owner' for {name}")
        if not durable:
            raise precondition_failed(f"invalid property 'non-durable' for {name}")
    return declared_type


def queue_type(arguments: Mapping[str, Any]) -> str:
    return _text(arguments.get("x-queue-type")) or "classic"


def max_priority(arguments: Mapping[str, Any]) -> int | None:
    """The highest priority level of a priority queue (`x-max-priority`), None for another."""
    value = arguments.get("x-max-priority")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def check_consume(queue: str, vhost: str, arguments: Mapping[str, Any]) -> None:
    check_arguments(CONSUME_CHECKS, queue, vhost, arguments)

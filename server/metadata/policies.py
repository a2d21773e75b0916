"""Policy validation as RabbitMQ 4.2 does it, with its texts.

Read in rabbitmq-server v4.2.9 (and checked against a running 3.10.8 where the two agree):
rabbit_policy.erl (`policy_validation/0`, `validation/3`, `apply_to_validation/2`),
rabbit_policies.erl (`validate_policy0/2`, one clause per key), rabbit_classic_queue.erl and
rabbit_quorum_queue.erl (the two keys they register), rabbit_parameter_validation.erl
(`regex/2`, `number/2`), rabbit_re.erl (the 1,024-byte pattern bound) and
rabbit_runtime_parameters.erl (`format_error/1`).

* Every error found is reported, one per line, after "Validation failed" and a blank line:
  the definition's first, then apply-to's, then the pattern's, then the priority's (RabbitMQ
  folds its constraint list and prepends each result).
* The definition: an empty one is "no policy provided"; otherwise its keys are checked in
  the order RabbitMQ's map holds them (sorted), the first bad value reported as
  "VALUE is not a valid ..."; only when every known key is good are the unknown ones
  reported, all together: "[{<<"foo">>,1}] are not recognised policy settings".
* Values are shown as Erlang prints them (`~tp`): strings as `<<"abc">>` (`<<"é"/utf8>>`),
  null as `null`, arrays as `[1,2]`, objects as `#{<<"k">> => 1}`. Two liberties: floats
  in Python's shortest form in Erlang's spelling (1.0e20), and no line wrapping of long terms.
* An invalid pattern is "pattern should be regular expression but is invalid: {MSG,POS}":
  the shape of PCRE's report with Python's message and position, since Warren matches with
  Python's `re` (the syntax both engines share behaves the same; PCRE-only syntax such as
  \\Q...\\E is refused here, as `re` cannot run it).

A client sees the text as RabbitMQ's HTTP API gives it, `{"error": "bad_request", "reason":
TEXT}` (400), and the CLI prints it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from warrenmq.server.metadata.errors import BadRequest

APPLY_TO = ("all", "queues", "exchanges", "classic_queues", "quorum_queues", "streams")
# rabbit_re:max_pattern_length/0.
PATTERN_BYTES_MAX = 1024
# ?MAX_STREAM_MAX_SEGMENT_SIZE in rabbit.hrl.
STREAM_SEGMENT_BYTES_MAX = 3_000_000_000
_MAX_AGE = re.compile(r"([0-9]+)([YMDhms])")
# What `io_lib` prints inside quotes with a backslash, for the characters it prints at all.
_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    "\b": "\\b",
    "\f": "\\f",
    "\x1b": "\\e",
}


def _is_integer(value: Any) -> bool:
    # JSON true is not 1, nor 1.0 an integer: Erlang's is_integer/1 tells them apart.
    return isinstance(value, int) and not isinstance(value, bool)


def _integer(minimum: int | None = None, maximum: int | None = None) -> Callable[[Any], bool]:
    def check(value: Any) -> bool:
        return (
            _is_integer(value)
            and (minimum is None or value >= minimum)
            and (maximum is None or value <= maximum)
        )

    return check


def _one_of(*choices: Any) -> Callable[[Any], bool]:
    def check(value: Any) -> bool:
        return any(type(value) is type(choice) and value == choice for choice in choices)

    return check


def _text(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate (JSON allows "\\ud800") has no UTF-8 form: it could not be stored.
        return False
    return True


def _max_age(value: Any) -> bool:
    # rabbit_amqqueue:check_max_age/1: a positive count of years, months, days, hours,
    # minutes or seconds.
    if not isinstance(value, str):
        return False
    match = _MAX_AGE.fullmatch(value)
    return match is not None and int(match.group(1)) > 0


# Every key a policy may hold in RabbitMQ 4.2 without plugins, with its check and the end of
# its refusal ("VALUE is not a valid ..."). The "maximum memory in bytes" of
# max-in-memory-length is RabbitMQ's own text.
DEFINITION_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "alternate-exchange": (_text, "is not a valid alternate exchange name"),
    # Warren's extensions (x-visibility-timeout, x-requeue-delay, x-requeue-delay-max), in
    # RabbitMQ's style: every queue argument is also a policy key.
    "visibility-timeout": (_integer(0), "is not a valid visibility timeout"),
    "requeue-delay": (_integer(0), "is not a valid requeue delay"),
    "requeue-delay-max": (_integer(0), "is not a valid maximum requeue delay"),
    "consumer-timeout": (_integer(0), "is not a valid consumer timeout"),
    # RabbitMQ 4.3's delayed retries (rabbit_quorum_queue's validate_policy0/2).
    "delayed-retry-max": (
        _integer(1),
        "is not a valid delayed retry maximum delay. Must be a positive integer",
    ),
    "delayed-retry-min": (
        _integer(1),
        "is not a valid delayed retry minimum delay. Must be a positive integer",
    ),
    "delayed-retry-type": (
        _one_of("all", "failed", "returned", "disabled"),
        "is not a valid delayed retry type. Must be one of: all, failed, returned, disabled",
    ),
    "dead-letter-exchange": (_text, "is not a valid dead letter exchange name"),
    "dead-letter-routing-key": (_text, "is not a valid dead letter routing key"),
    "dead-letter-strategy": (
        _one_of("at-most-once", "at-least-once"),
        "is not a valid dead letter strategy",
    ),
    "delivery-limit": (_integer(), "is not a valid delivery limit"),
    "expires": (_integer(1), "is not a valid queue expiry"),
    "initial-cluster-size": (_integer(0), "is not a valid cluster size"),
    "max-age": (_max_age, "is not a valid max age"),
    "max-in-memory-bytes": (_integer(0), "is not a valid maximum memory in bytes"),
    "max-in-memory-length": (_integer(0), "is not a valid maximum memory in bytes"),
    "max-length": (_integer(0), "is not a valid maximum length"),
    "max-length-bytes": (_integer(0), "is not a valid maximum length in bytes"),
    "message-ttl": (_integer(0), "is not a valid message TTL"),
    "overflow": (
        _one_of("drop-head", "reject-publish", "reject-publish-dlx"),
        "is not a valid overflow value",
    ),
    "queue-leader-locator": (
        _one_of("client-local", "balanced", "random", "least-leaders"),
        "is not a valid queue leader locator value",
    ),
    "queue-master-locator": (
        _one_of("client-local", "balanced", "random", "least-leaders", "min-masters"),
        "is not a valid master locator",
    ),
    "queue-mode": (_one_of("default", "lazy"), "is not a valid queue-mode value"),
    "queue-version": (_one_of(1, 2), "is not a valid queue-version value"),
    "stream-filter-size-bytes": (
        _integer(16, 255),
        "is not a valid filter size. Valid range is 16-255",
    ),
    "stream-max-segment-size-bytes": (
        _integer(0, STREAM_SEGMENT_BYTES_MAX),
        "is not a valid segment size",
    ),
    "target-group-size": (_integer(1), "is not a valid qq target count value"),
}


def validate(pattern: Any, definition: Any, priority: Any, apply_to: Any) -> None:
    """Raise BadRequest with RabbitMQ's text unless a policy with these fields may be set."""
    errors = [
        error
        for error in (
            _definition_error(definition),
            _apply_to_error(apply_to),
            _pattern_error(pattern),
            _priority_error(priority),
        )
        if error is not None
    ]
    if errors:
        raise BadRequest("Validation failed\n\n" + "".join(error + "\n" for error in errors))


def sorted_definition(definition: Mapping[str, Any]) -> dict[str, Any]:
    """The definition with its keys in the order RabbitMQ's map keeps them (bytewise, which
    for UTF-8 is code-point order)."""
    return dict(sorted(definition.items()))


def _definition_error(definition: Any) -> str | None:
    if isinstance(definition, (Mapping, list)) and not definition:
        return "no policy provided"
    if isinstance(definition, list):
        return f"definition must be a dictionary: {erlang_term(definition)}"
    if not isinstance(definition, Mapping):
        return (
            "parse error while reading policy definition: "
            f"{erlang_term(definition)}. Validator: policy_validator."
        )
    unknown = []
    for key, value in sorted_definition(definition).items():
        known = DEFINITION_CHECKS.get(key)
        if known is None:
            unknown.append((key, value))
            continue
        check, refusal = known
        if not check(value):
            return f"{erlang_term(value)} {refusal}"
    retry_error = _delayed_retry_error(definition)
    if retry_error is not None:
        return retry_error
    if unknown:
        return f"{erlang_term(unknown)} are not recognised policy settings"
    return None


def _delayed_retry_error(definition: Mapping[str, Any]) -> str | None:
    """rabbit_quorum_queue's validate_delayed_retry_constraints/1."""
    retry_type = definition.get("delayed-retry-type")
    least = definition.get("delayed-retry-min")
    most = definition.get("delayed-retry-max")
    if retry_type not in (None, "disabled") and least is None:
        return f"delayed-retry-min is required when delayed-retry-type is {retry_type}"
    if least is not None and most is not None and most < least:
        return f"delayed-retry-max ({most}) must not be smaller than delayed-retry-min ({least})"
    return None


def _apply_to_error(apply_to: Any) -> str | None:
    if isinstance(apply_to, str) and apply_to in APPLY_TO:
        return None
    shown = apply_to if isinstance(apply_to, str) else erlang_term(apply_to)
    # Two spaces after 'classic_queues', as RabbitMQ's concatenated literals have them.
    return (
        f"apply-to '{shown}' unrecognised; should be one of: 'queues', 'classic_queues', "
        " 'quorum_queues', 'streams', 'exchanges', or 'all'"
    )


def _pattern_error(pattern: Any) -> str | None:
    if not isinstance(pattern, str):
        return f"pattern should be a binary but was {erlang_term(pattern)}"
    if len(pattern.encode("utf-8")) > PATTERN_BYTES_MAX:
        return f"pattern must not exceed {PATTERN_BYTES_MAX} bytes"
    try:
        re.compile(pattern)
    except re.error as error:
        position = error.pos if error.pos is not None else 0
        reason = erlang_term((_ErlangString(error.msg), position))
        return f"pattern should be regular expression but is invalid: {reason}"
    return None


def _priority_error(priority: Any) -> str | None:
    if isinstance(priority, (int, float)) and not isinstance(priority, bool):
        if math.isfinite(priority):
            return None
    return f"priority should be a number, actually was {erlang_term(priority)}"


class _ErlangString(str):
    """A character list (PCRE's error message), which Erlang prints in double quotes."""


def erlang_term(value: Any) -> str:
    """`value` (a decoded JSON value, or a tuple of them) as Erlang's `~tp` prints the term
    RabbitMQ decodes it to."""
    if isinstance(value, _ErlangString):
        return _quoted(value)
    if isinstance(value, str):
        data = value.encode("utf-8", "surrogatepass")
        if not _printable(value):
            return "<<" + ",".join(str(byte) for byte in data) + ">>"
        return f"<<{_quoted(value)}{'/utf8' if not value.isascii() else ''}>>"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _erlang_float(value)
    if isinstance(value, tuple):
        return "{" + ",".join(erlang_term(item) for item in value) + "}"
    if isinstance(value, list):
        # A list of character codes is a string to Erlang, and printed as one.
        if value and all(_is_integer(item) and 0 <= item < 0x110000 for item in value):
            text = "".join(chr(item) for item in value)
            if _printable(text):
                return _quoted(text)
        return "[" + ",".join(erlang_term(item) for item in value) + "]"
    if isinstance(value, Mapping):
        pairs = sorted(value.items())
        return "#{" + ",".join(f"{erlang_term(k)} => {erlang_term(v)}" for k, v in pairs) + "}"
    return repr(value)


def _printable(text: str) -> bool:
    # io_lib:printable_unicode_list/1: the escapable controls and every character from space
    # up, except DEL and the C1 controls.
    return all(
        char in _ESCAPES or (" " <= char <= "~") or char >= "\xa0" for char in text
    ) and not any("\ud800" <= char <= "\udfff" for char in text)


def _quoted(text: str) -> str:
    return '"' + "".join(_ESCAPES.get(char, char) for char in text) + '"'


def _erlang_float(value: float) -> str:
    text = repr(value)
    if not math.isfinite(value):
        return text
    mantissa, _, exponent = text.partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    if not exponent:
        return mantissa
    return f"{mantissa}e{int(exponent)}"

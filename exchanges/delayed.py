"""The `x-delayed-message` exchange type, as RabbitMQ's delayed-message plugin defines it
(rabbitmq-delayed-message-exchange 3.x: rabbit_exchange_type_delayed_message.erl and
rabbit_delayed_message_utils.erl), texts included:

* declare: the `x-delayed-type` argument names the type whose routing the exchange uses.
  Missing, or not a string: 406 "Invalid argument, 'x-delayed-type' must be an existing
  exchange type"; `x-delayed-message` itself: 406 "Invalid argument, 'x-delayed-message'
  can't be used for 'x-delayed-type'"; a type that does not exist: 503 "unknown exchange
  type '...'" (connection-level), as for the type of any declare. Only a new exchange is
  checked: a redeclare compares what any exchange compares (`Router._assert_equivalence`).
* publish: a message whose `x-delay` header is a delay in milliseconds in (0, 2^32 - 1]
  is held and routed when due; any other message is routed at once, by the delayed type's
  bindings. Integer types are taken as they are, floats and decimals truncated, strings of
  digits parsed; every other type, and a delay out of that range, means "no delay".
  (The plugin crashes the publisher's connection with 541 on a string that is not an
  integer; here such a string, like every other unusable value, means "no delay".)

Routing stops at a delayed exchange that holds a message: the router reports it as a
`DelayedTarget` among the queue names, and the broker stores the message for it. When due,
the message is routed from that exchange again with `x-delay` negated (the plugin's
convention), so no delayed exchange on its way holds it a second time.
"""

from __future__ import annotations

import decimal
import math
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from warrenmq.exchanges.errors import PreconditionFailed

DELAYED_MESSAGE = "x-delayed-message"
DELAYED_TYPE = "x-delayed-type"
DELAY_HEADER = "x-delay"
# The plugin's bound: an Erlang timer runs at most 2^32 - 1 ms (49.7 days) ahead.
DELAY_MS_MAX = 2**32 - 1
# What Erlang's binary_to_integer/1 accepts.
_INTEGER_TEXT = re.compile(r"[+-]?[0-9]+")


class DelayedTarget(NamedTuple):
    """A delayed exchange that holds a message for `delay_ms`, in a route's queue names."""

    exchange: str
    delay_ms: int


def routing_type(arguments: Mapping[str, Any]) -> str:
    """The type whose routing a new delayed exchange uses (unchecked against the known types:
    the router answers an unknown one as it answers any unknown type)."""
    value = arguments.get(DELAYED_TYPE)
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", "surrogateescape")
    if not isinstance(value, str):
        raise PreconditionFailed(
            f"Invalid argument, '{DELAYED_TYPE}' must be an existing exchange type"
        )
    if value == DELAYED_MESSAGE:
        raise PreconditionFailed(
            f"Invalid argument, '{DELAYED_MESSAGE}' can't be used for '{DELAYED_TYPE}'"
        )
    return value


def delay_ms(headers: Mapping[str, Any] | None) -> int:
    """How long a message with these (decoded) headers is held; 0: route it now."""
    if not headers:
        return 0
    value = headers.get(DELAY_HEADER)
    if isinstance(value, bool):
        return 0
    if isinstance(value, (str, bytes)):
        text = value.decode("latin-1") if isinstance(value, bytes) else value
        if not _INTEGER_TEXT.fullmatch(text):
            return 0
        value = int(text)
    elif isinstance(value, (float, decimal.Decimal)):
        if not math.isfinite(value):
            return 0
        value = int(value)
    elif not isinstance(value, int):
        return 0
    return value if 0 < value <= DELAY_MS_MAX else 0

"""Vhost and user limits, as RabbitMQ's `set_vhost_limits` and `set_user_limits` keep them.

A vhost may hold "max-connections" and "max-queues", a user "max-connections" and
"max-channels" (rabbit_vhost_limit, rabbit_auth_backend_internal in 3.10.8). Each value is an
integer: a negative one means no limit, 0 refuses every connection (queue, channel). Setting a
vhost's or user's limits replaces all of them; an empty mapping clears them.

The refusals are RabbitMQ's (rabbit_reader, rabbit_channel in 3.10.8):
* connection.open beyond a vhost's max-connections: 530 "access to vhost 'v' refused for
  user 'u': connection limit (N) is reached"; beyond a user's: 530 "connection refused for
  user 'u': user connection limit (N) is reached";
* a channel beyond a user's max-channels (all of the user's connections together): 530
  "number of channels opened for user 'u' has reached the maximum allowed user limit of (N)";
* queue.declare beyond a vhost's max-queues: 406 "cannot declare queue 'q': queue limit in
  vhost 'v' (N) is reached".
Values that fail validation are a 400 with rabbit_parameter_validation's texts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from warrenmq.server.metadata.errors import BadRequest
from warrenmq.server.metadata.policies import erlang_term

MAX_CONNECTIONS = "max-connections"
MAX_QUEUES = "max-queues"
MAX_CHANNELS = "max-channels"
VHOST_LIMITS = (MAX_CONNECTIONS, MAX_QUEUES)
USER_LIMITS = (MAX_CONNECTIONS, MAX_CHANNELS)
# rabbit_parameter_validation names the component in its "Unrecognised terms" text.
_COMPONENTS = {VHOST_LIMITS: "vhost-limits", USER_LIMITS: "user-limits"}


def validate_limits(limits: Any, known: tuple[str, ...]) -> dict[str, int]:
    """The limits as stored (keys sorted), or BadRequest with RabbitMQ's text."""
    if not isinstance(limits, Mapping):
        raise BadRequest(
            f"Validation failed\n\n{_COMPONENTS[known]} should be a JSON object, "
            f"actually was {erlang_term(limits)}\n"
        )
    errors = []
    for key in sorted(limits):
        value = limits[key]
        if key in known and not (isinstance(value, int) and not isinstance(value, bool)):
            errors.append(f"{key} should be a number, actually was {erlang_term(value)}")
    unknown = [(key, limits[key]) for key in sorted(limits) if key not in known]
    if unknown:
        errors.append(f"Unrecognised terms {erlang_term(unknown)} in {_COMPONENTS[known]}")
    if errors:
        raise BadRequest("Validation failed\n\n" + "".join(error + "\n" for error in errors))
    return {key: limits[key] for key in sorted(limits)}


def limit_reached(limits: Mapping[str, int] | None, key: str, count: int) -> int | None:
    """The limit `key` when `count` things already use it up, else None (no limit, or room)."""
    if limits is None:
        return None
    limit = limits.get(key)
    if limit is None or limit < 0 or count < limit:
        return None
    return limit

"""Metadata refusals: the routing layer's family (`warrenmq.exchanges.errors`), plus the codes
only metadata raises.

One family, so the broker and the CLI catch every refusal with one `except RoutingError` and
map it to `channel.close` or `connection.close` by `connection_level`. `reply_text` is the
explanation alone, as RabbitMQ formats it ("no queue 'q' in vhost '/'"); the amqp layer
prefixes the code name for the wire.

Errors a client cannot trigger over AMQP (adding a user twice, deleting a missing vhost from
the CLI) use the code RabbitMQ's HTTP API answers with (404 for a missing entity, 406 for a
conflict, 400 for a value it refuses to store), so every error still has a code.
"""

from __future__ import annotations

from warrenmq.exchanges.errors import AccessRefused, NotFound, PreconditionFailed, RoutingError

BAD_REQUEST = 400
RESOURCE_LOCKED = 405
NOT_ALLOWED = 530

__all__ = [
    "AccessRefused",
    "BadRequest",
    "NotAllowed",
    "NotFound",
    "PreconditionFailed",
    "ResourceLocked",
    "RoutingError",
]


class BadRequest(RoutingError):
    """400: a value RabbitMQ's HTTP API refuses with {"error": "bad_request", "reason": reply_text}
    (a policy that fails validation). No AMQP method carries one, so it never goes on the wire."""

    reply_code = BAD_REQUEST


class ResourceLocked(RoutingError):
    reply_code = RESOURCE_LOCKED


class NotAllowed(RoutingError):
    """530: refused at connection.open (vhost access), so it closes the connection."""

    reply_code = NOT_ALLOWED
    connection_level = True

"""Metadata errors: a reply code, RabbitMQ's explanation text, and the scope of the close.

They carry the same attributes as `warrenmq.exchanges.errors.RoutingError` (`reply_code`,
`reply_text`, `connection_level`), so the broker maps both families to `channel.close` or
`connection.close` with one handler. `reply_text` is the explanation alone, as RabbitMQ formats
it ("no queue 'q' in vhost '/'"); the amqp layer prefixes the code name for the wire.

Errors a client cannot trigger over AMQP (adding a user twice, deleting a missing vhost from
the CLI) use the code RabbitMQ's HTTP API answers with (404 for a missing entity, 406 for a
conflict), so every error still has a code.
"""

from __future__ import annotations

from warrenmq.exchanges.errors import RoutingError

ACCESS_REFUSED = 403
NOT_FOUND = 404
RESOURCE_LOCKED = 405
PRECONDITION_FAILED = 406
NOT_ALLOWED = 530


class MetadataError(RoutingError):
    """An operation refused with `reply_code` and RabbitMQ's explanation `reply_text`.

    A kind of the routing layer's refusal, so the broker and the CLI catch both with one
    `except RoutingError`.
    """


class AccessRefused(MetadataError):
    reply_code = ACCESS_REFUSED


class NotFound(MetadataError):
    reply_code = NOT_FOUND


class ResourceLocked(MetadataError):
    reply_code = RESOURCE_LOCKED


class PreconditionFailed(MetadataError):
    reply_code = PRECONDITION_FAILED


class NotAllowed(MetadataError):
    """530: refused at connection.open (vhost access), so it closes the connection."""

    reply_code = NOT_ALLOWED
    connection_level = True

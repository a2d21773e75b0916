"""Routing errors as RabbitMQ reports them: a reply code, a reply text and a scope.

`exchanges/` must not import `amqp/`, so the codes are repeated here as plain integers; the
broker maps an error to `channel.close` or `connection.close` by `connection_level`, which
follows the AMQP 0-9-1 spec's soft/hard split (403, 404 and 406 are soft, 503 is hard).
"""

from __future__ import annotations

ACCESS_REFUSED = 403
NOT_FOUND = 404
PRECONDITION_FAILED = 406
COMMAND_INVALID = 503


class RoutingError(Exception):
    """An operation refused with `reply_code` and RabbitMQ's `reply_text`."""

    reply_code: int = 0
    connection_level: bool = False

    def __init__(self, reply_text: str) -> None:
        super().__init__(reply_text)
        self.reply_text = reply_text

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.reply_code}, {self.reply_text!r})"


class AccessRefused(RoutingError):
    reply_code = ACCESS_REFUSED


class NotFound(RoutingError):
    reply_code = NOT_FOUND


class PreconditionFailed(RoutingError):
    reply_code = PRECONDITION_FAILED


class CommandInvalid(RoutingError):
    reply_code = COMMAND_INVALID
    connection_level = True

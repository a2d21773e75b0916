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
_SHORTSTR_BYTES_MAX = 255


class RoutingError(Exception):
    """An operation refused with `reply_code` and RabbitMQ's `reply_text`."""

    reply_code: int = 0
    connection_level: bool = False

    def __init__(self, reply_text: str) -> None:
        super().__init__(reply_text)
        self.reply_text = reply_text

    @property
    def reply_name(self) -> str:
        return _REPLY_NAMES[self.reply_code]

    @property
    def wire_reply_text(self) -> str:
        """The reply-text RabbitMQ puts in channel.close/connection.close: the reply name, " - ",
        the explanation, cut to the 255 bytes of a shortstr as 252 bytes plus "..."
        (rabbit_binary_generator:amqp_exception_explanation/2)."""
        text = f"{self.reply_name} - {self.reply_text}".encode()
        if len(text) > _SHORTSTR_BYTES_MAX:
            # A cut inside a UTF-8 sequence drops that character rather than send broken UTF-8.
            text = text[: _SHORTSTR_BYTES_MAX - 3].decode("utf-8", "ignore").encode() + b"..."
        return text.decode()

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


_REPLY_NAMES = {
    ACCESS_REFUSED: "ACCESS_REFUSED",
    NOT_FOUND: "NOT_FOUND",
    PRECONDITION_FAILED: "PRECONDITION_FAILED",
    COMMAND_INVALID: "COMMAND_INVALID",
}

"""Shorthands for the protocol errors the broker raises, with RabbitMQ's codes.

Texts are the explanation only; ``amqp.replies`` adds the "CODE_NAME - " prefix on the wire.
A routing error from ``exchanges/`` maps to the same classes by its reply code.
"""

from __future__ import annotations

from warrenmq.amqp import replies
from warrenmq.exchanges.errors import RoutingError


def not_found(text: str) -> replies.ChannelError:
    return replies.ChannelError(replies.NOT_FOUND, text)


def access_refused(text: str) -> replies.ChannelError:
    return replies.ChannelError(replies.ACCESS_REFUSED, text)


def precondition_failed(text: str) -> replies.ChannelError:
    return replies.ChannelError(replies.PRECONDITION_FAILED, text)


def not_allowed(text: str) -> replies.AMQPConnectionError:
    return replies.AMQPConnectionError(replies.NOT_ALLOWED, text)


def command_invalid(text: str) -> replies.AMQPConnectionError:
    return replies.AMQPConnectionError(replies.COMMAND_INVALID, text)


def not_implemented(text: str) -> replies.AMQPConnectionError:
    return replies.AMQPConnectionError(replies.NOT_IMPLEMENTED, text)


def internal_error(text: str) -> replies.AMQPConnectionError:
    return replies.AMQPConnectionError(replies.INTERNAL_ERROR, text)


def from_routing(error: RoutingError) -> replies.ProtocolError:
    """The AMQP exception for a Router error: soft codes close the channel, 503 the connection."""
    return replies.protocol_error(error.reply_code, error.reply_text)

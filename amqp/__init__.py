"""Sans-I/O AMQP 0-9-1: frame codec, methods, connection and channel state machines."""

from .channel import IllegalTransition
from .connection import Connection, ConnectionConfig, ConnectionState
from .replies import AMQPConnectionError, ChannelError, ProtocolError, protocol_error

__all__ = [
    "AMQPConnectionError",
    "ChannelError",
    "Connection",
    "ConnectionConfig",
    "ConnectionState",
    "IllegalTransition",
    "ProtocolError",
    "protocol_error",
]

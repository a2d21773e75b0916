"""Sans-I/O AMQP 0-9-1: frame codec, methods, connection and channel state machines.

* ``connection.Connection`` — one client connection: ``receive_data(data, now)``, then
  ``next_event()`` until None; answer ``AuthenticationRequested`` / ``VhostAccessRequested``
  with ``accept_login``/``refuse_login`` and ``accept_vhost``/``refuse_vhost``; reply with
  ``send_method``, ``declare_ok``, ``consume_ok``, ``cancel_ok``, ``deliver``, ``get_ok``,
  ``basic_return``, ``confirm``; turn a raised ``ProtocolError`` into a close with
  ``fail(error, channel)``; write ``data_to_send()``; call ``tick(now)`` at
  ``next_tick_at()``; close the transport once ``finished``.
* ``events`` — what ``next_event`` returns.
* ``replies`` — reply codes, RabbitMQ-style texts, ``ChannelError`` / ``AMQPConnectionError``.
* ``fastpath`` — hand-written publish/deliver/ack codecs and the replies that carry names;
  ``frames`` — frame layout and the general pamqp codec; ``auth`` — SASL PLAIN/AMQPLAIN;
  ``testing`` — a pamqp-built client.
"""

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

"""Events the connection machine hands to the broker (``Connection.next_event``).

Each names something the broker must act on. The machine answers the protocol's own
bookkeeping itself (start, tune, channel.open-ok, close-ok, flow-ok, confirm.select-ok,
heartbeats); everything that needs broker state arrives here.
"""

from dataclasses import dataclass
from typing import NamedTuple


@dataclass(slots=True)
class AuthenticationRequested:
    """The client chose a mechanism and sent credentials.

    Answer with ``Connection.accept_login(username)`` or ``Connection.refuse_login(reason)``;
    the machine reads no further input until then.
    """

    mechanism: str
    username: str
    password: str
    client_properties: dict


@dataclass(slots=True)
class VhostAccessRequested:
    """connection.open: the authenticated user asks for a virtual host.

    Answer with ``Connection.accept_vhost()`` or ``Connection.refuse_vhost(reason)``.
    """

    vhost: str
    username: str


@dataclass(slots=True)
class ChannelOpened:
    """channel.open was accepted; open-ok is already queued."""

    channel: int


@dataclass(slots=True)
class ChannelClosed:
    """The channel is gone: the client closed it (and got close-ok), or acknowledged ours.

    The channel number may be reused by the next frame, so drop its state now.
    """

    channel: int
    reply_code: int
    reply_text: str
    by_peer: bool


@dataclass(slots=True)
class FlowChanged:
    """channel.flow active=true from the client; flow-ok is already queued.

    ``active`` is always True: active=false is refused with 540 NOT_IMPLEMENTED, as RabbitMQ
    refuses it, so deliveries are never paused by the client.
    """

    channel: int
    active: bool


@dataclass(slots=True)
class MethodReceived:
    """A method for the broker (queue.declare, basic.consume, basic.qos, tx.commit, ...).

    ``method`` is the pamqp object; reply with ``Connection.send_method`` or raise a
    ``replies.ChannelError`` and pass it to ``Connection.fail``.
    """

    channel: int
    method: object


class MessagePublished(NamedTuple):
    """basic.publish with its content header and body, assembled.

    ``properties`` are the content-header property bytes (flags and values) exactly as the
    client sent them; store them as they are and hand them back to ``Connection.deliver``.
    ``delivery_mode``, ``priority``, ``expiration`` and ``user_id`` are read from them (None
    when absent). ``confirm_tag`` is the publisher-confirm sequence number in confirm mode,
    0 otherwise. (basic.publish with immediate=true never gets here: RabbitMQ refuses it with
    540 NOT_IMPLEMENTED, and so does this machine.)

    A tuple, one per message: built by ``tuple.__new__`` it costs no Python call.
    """

    channel: int
    exchange: str
    routing_key: str
    mandatory: bool
    properties: bytes
    body: bytes
    delivery_mode: int | None
    priority: int | None
    expiration: str | None
    user_id: str | None
    confirm_tag: int


@dataclass(slots=True)
class Acked:
    channel: int
    delivery_tag: int
    multiple: bool


@dataclass(slots=True)
class Nacked:
    channel: int
    delivery_tag: int
    multiple: bool
    requeue: bool


@dataclass(slots=True)
class Rejected:
    channel: int
    delivery_tag: int
    requeue: bool


@dataclass(slots=True)
class ConnectionClosed:
    """The connection is no longer usable: drop every channel's state.

    Emitted exactly once. ``by_peer`` is True when the client sent connection.close.
    ``reply_code`` is 0 when no AMQP reason applies (missed heartbeats, a bad protocol header,
    a handshake timeout). Bytes may still be queued (close-ok, or our connection.close):
    flush ``data_to_send()`` and close the transport once ``Connection.finished`` is True.
    """

    reply_code: int
    reply_text: str
    by_peer: bool

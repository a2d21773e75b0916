"""One AMQP channel: its lifecycle state and the content assembler (method + header + body).

The connection machine owns the channel table and the lifecycle frames (channel.open, close,
close-ok); a ``Channel`` handles every other frame on an open channel and turns it into an
event. Errors follow RabbitMQ's ``rabbit_command_assembler`` and ``rabbit_channel``:

* a method frame while a content header or body is expected: 505 UNEXPECTED_FRAME "expected
  content header for class 60, got non content header frame instead" / "expected content
  body, got non content body frame instead", with basic.publish's ids;
* a header or body frame while a method is expected: 505 "expected method frame, got non
  method frame instead";
* a header for another class, or with a non-zero weight: 505 "expected content header for
  class 60, got one for class N instead" / "... got non content header frame instead";
* a body frame longer than what remains of the announced body size: 501 FRAME_ERROR "content
  body frame exceeds remaining content size";
* content-header property bytes that do not parse (a length past the end, trailing bytes, a
  malformed headers table): 541 INTERNAL_ERROR with no explanation and ids 0, as RabbitMQ's
  reader answers when the channel process crashes decoding them. Properties that parse but
  are refused here though RabbitMQ takes them (text that is not UTF-8, an unknown flag,
  headers nested deeper than ``field_table.TABLE_DEPTH_MAX``) are 501 FRAME_ERROR with the
  reason;
* a body larger than the configured maximum: 406 PRECONDITION_FAILED "message size N is larger
  than configured max size M" (``rabbit_channel:check_msg_size``). RabbitMQ checks after the
  whole body arrived; this machine checks the size announced in the header, so it never
  buffers a body it will refuse;
* basic.publish with immediate=true: 540 NOT_IMPLEMENTED "immediate=true";
* confirm.select on a transactional channel: 406 "cannot switch from tx to confirm mode",
  tx.select on a confirm channel: 406 "cannot switch from confirm to tx mode";
* a method the client may not send (a server-to-client method, connection.* on a channel):
  503 COMMAND_INVALID "unimplemented method" (``rabbit_channel``'s last clause);
* channel.flow active=false: 540 NOT_IMPLEMENTED "active=false" (a connection error, as in
  RabbitMQ, which never pauses deliveries for a client); active=true is answered flow-ok.
"""

import enum

from pamqp import commands

from . import events, fastpath, frames, replies

_new = tuple.__new__
_MESSAGE_PUBLISHED = events.MessagePublished

AWAIT_METHOD = 0
AWAIT_HEADER = 1
AWAIT_BODY = 2


def _undecodable(payload, class_id, method_id):
    """RabbitMQ's answer to a method whose arguments do not decode."""
    return replies.AMQPConnectionError(
        replies.FRAME_ERROR,
        f"cannot decode <<{','.join(map(str, payload[4:]))}>>",
        class_id,
        method_id,
    )


def method_key(class_id, method_id):
    return (class_id << 16) | method_id


PUBLISH = method_key(60, 40)
ACK = method_key(60, 80)
NACK = method_key(60, 120)
REJECT = method_key(60, 90)
CHANNEL_OPEN = method_key(20, 10)
CHANNEL_FLOW = method_key(20, 20)
CHANNEL_CLOSE = method_key(20, 40)
CHANNEL_CLOSE_OK = method_key(20, 41)
CONFIRM_SELECT = method_key(85, 10)
TX_SELECT = method_key(90, 10)
TX_COMMIT = method_key(90, 20)
TX_ROLLBACK = method_key(90, 30)

# Methods a client may send on an open channel (the spec's "chassis server" methods), other
# than the lifecycle ones the connection handles and the fast-path ones above.
CLIENT_METHODS = frozenset(
    method_key(c, m)
    for c, m in (
        (20, 20),
        (40, 10),
        (40, 20),
        (40, 30),
        (40, 40),
        (50, 10),
        (50, 20),
        (50, 30),
        (50, 40),
        (50, 50),
        (60, 10),
        (60, 20),
        (60, 30),
        (60, 70),
        (60, 100),
        (60, 110),
        (85, 10),
        (90, 10),
        (90, 20),
        (90, 30),
    )
)


class ChannelState(enum.Enum):
    OPEN = "open"
    CLOSING = "closing"  # we sent channel.close; everything but close and close-ok is dropped
    CLOSED = "closed"


# The channel lifecycle. Inputs are what happened; a missing entry is an illegal transition.
TRANSITIONS = {
    ChannelState.OPEN: {
        "close-sent": ChannelState.CLOSING,
        "close-received": ChannelState.CLOSED,
    },
    ChannelState.CLOSING: {
        "close-received": ChannelState.CLOSING,
        "close-ok-received": ChannelState.CLOSED,
    },
    ChannelState.CLOSED: {},
}


class IllegalTransition(Exception):
    """A lifecycle input arrived in a state whose table has no entry for it (a bug here)."""


def unexpected(text):
    return replies.AMQPConnectionError(replies.UNEXPECTED_FRAME, text, 60, 40)


def decode_general(class_id, method_id, arguments):
    """A pamqp method, or the error RabbitMQ gives for an unknown id or undecodable arguments."""
    try:
        return frames.decode_method(class_id, method_id, arguments)
    except KeyError:
        raise replies.AMQPConnectionError(
            replies.NOT_IMPLEMENTED,
            f"unknown method {{{class_id},{method_id}}}",
            class_id,
            method_id,
        ) from None
    except ValueError:
        raise replies.AMQPConnectionError(
            replies.FRAME_ERROR,
            f"cannot decode <<{','.join(map(str, arguments))}>>",
            class_id,
            method_id,
        ) from None


class Channel:
    """State of one open channel; ``handle_*`` return an event or None, or raise ProtocolError."""

    __slots__ = (
        "number",
        "state",
        "content_state",
        "send",
        "message_bytes_max",
        "last_method_ids",
        "confirm_mode",
        "tx_mode",
        "publish_seq",
        "_exchange",
        "_routing_key",
        "_mandatory",
        "_properties",
        "_scan",
        "_remaining",
        "_parts",
    )

    def __init__(self, number, send, message_bytes_max):
        self.number = number
        self.state = ChannelState.OPEN
        self.content_state = AWAIT_METHOD
        self.send = send
        self.message_bytes_max = message_bytes_max
        self.last_method_ids = (20, 10)
        self.confirm_mode = False
        self.tx_mode = False
        self.publish_seq = 0
        self._reset_content()

    def _reset_content(self):
        self.content_state = AWAIT_METHOD
        self._exchange = self._routing_key = ""
        self._mandatory = False
        self._properties = b""
        self._scan = (None, None, None, None)
        self._remaining = 0
        self._parts = None

    def transition(self, what):
        try:
            self.state = TRANSITIONS[self.state][what]
        except KeyError:
            raise IllegalTransition(f"channel {self.number}: {what} in {self.state}") from None
        if self.state is not ChannelState.OPEN:
            self._reset_content()

    def handle_method(self, key, class_id, method_id, payload):
        if self.content_state != AWAIT_METHOD:
            if self.content_state == AWAIT_HEADER:
                raise unexpected(
                    "expected content header for class 60, got non content header frame instead"
                )
            raise unexpected("expected content body, got non content body frame instead")
        self.last_method_ids = (class_id, method_id)
        if key == PUBLISH:
            return self._publish(payload)
        if key == ACK:
            delivery_tag, multiple = self._fast(fastpath.decode_ack, payload, class_id, method_id)
            return events.Acked(self.number, delivery_tag, multiple)
        if key == NACK:
            delivery_tag, multiple, requeue = self._fast(
                fastpath.decode_nack, payload, class_id, method_id
            )
            return events.Nacked(self.number, delivery_tag, multiple, requeue)
        if key == REJECT:
            delivery_tag, requeue = self._fast(fastpath.decode_reject, payload, class_id, method_id)
            return events.Rejected(self.number, delivery_tag, requeue)
        method = decode_general(class_id, method_id, payload[4:])
        if key == CHANNEL_OPEN:
            raise replies.AMQPConnectionError(
                replies.CHANNEL_ERROR, "second 'channel.open' seen", class_id, method_id
            )
        if key not in CLIENT_METHODS:
            raise replies.AMQPConnectionError(
                replies.COMMAND_INVALID, "unimplemented method", class_id, method_id
            )
        if key == CHANNEL_FLOW:
            if not method.active:
                raise replies.AMQPConnectionError(
                    replies.NOT_IMPLEMENTED, "active=false", class_id, method_id
                )
            self.send(frames.encode_method(self.number, commands.Channel.FlowOk(active=True)))
            return events.FlowChanged(self.number, True)
        if key == CONFIRM_SELECT:
            if self.tx_mode:
                raise replies.ChannelError(
                    replies.PRECONDITION_FAILED, "cannot switch from tx to confirm mode", 85, 10
                )
            self.confirm_mode = True
            if not method.nowait:
                self.send(frames.encode_method(self.number, commands.Confirm.SelectOk()))
            return None
        if key == TX_SELECT:
            if self.confirm_mode:
                raise replies.ChannelError(
                    replies.PRECONDITION_FAILED, "cannot switch from confirm to tx mode", 90, 10
                )
            self.tx_mode = True
        elif (key == TX_COMMIT or key == TX_ROLLBACK) and not self.tx_mode:
            raise replies.ChannelError(
                replies.PRECONDITION_FAILED, "channel is not transactional", class_id, method_id
            )
        return events.MethodReceived(self.number, method)

    @staticmethod
    def _fast(decoder, payload, class_id, method_id):
        try:
            return decoder(payload)
        except ValueError:
            raise _undecodable(payload, class_id, method_id) from None

    def _publish(self, payload):
        try:
            exchange, routing_key, mandatory, immediate = fastpath.decode_publish(payload)
        except ValueError:
            raise _undecodable(payload, 60, 40) from None
        if immediate:
            raise replies.AMQPConnectionError(replies.NOT_IMPLEMENTED, "immediate=true", 60, 40)
        if self.confirm_mode:
            self.publish_seq += 1
        self._exchange = exchange
        self._routing_key = routing_key
        self._mandatory = mandatory
        self.content_state = AWAIT_HEADER
        return None

    def handle_header(self, payload):
        if self.content_state != AWAIT_HEADER:
            if self.content_state == AWAIT_METHOD:
                raise replies.AMQPConnectionError(
                    replies.UNEXPECTED_FRAME, "expected method frame, got non method frame instead"
                )
            raise unexpected("expected content body, got non content body frame instead")
        class_id, weight, body_size, properties = fastpath.decode_content_header(payload)
        if weight != 0:
            raise unexpected(
                "expected content header for class 60, got non content header frame instead"
            )
        if class_id != 60:
            raise unexpected(
                f"expected content header for class 60, got one for class {class_id} instead"
            )
        try:
            self._scan = fastpath.scan_properties(properties)
        except fastpath.MalformedProperties:
            raise replies.AMQPConnectionError(replies.INTERNAL_ERROR, "") from None
        except ValueError as error:
            raise replies.AMQPConnectionError(replies.FRAME_ERROR, str(error), 60, 40) from None
        if body_size > self.message_bytes_max:
            raise replies.ChannelError(
                replies.PRECONDITION_FAILED,
                f"message size {body_size} is larger than configured max size "
                f"{self.message_bytes_max}",
                60,
                40,
            )
        self._properties = properties
        if body_size == 0:
            return self._published(b"")
        self._remaining = body_size
        self.content_state = AWAIT_BODY
        return None

    def handle_body(self, payload):
        if self.content_state != AWAIT_BODY:
            if self.content_state == AWAIT_METHOD:
                raise replies.AMQPConnectionError(
                    replies.UNEXPECTED_FRAME, "expected method frame, got non method frame instead"
                )
            raise unexpected(
                "expected content header for class 60, got non content header frame instead"
            )
        remaining = self._remaining - len(payload)
        if remaining < 0:
            raise replies.AMQPConnectionError(
                replies.FRAME_ERROR, "content body frame exceeds remaining content size", 60, 40
            )
        if not payload:
            # Nothing to keep: a client sending empty body frames without end must not grow
            # the list (RabbitMQ's assembler keeps each one).
            return None
        parts = self._parts
        if remaining:
            # A body split over frames is gathered; one in a single frame (the usual case)
            # never needs the list.
            if parts is None:
                self._parts = [payload]
            else:
                parts.append(payload)
            self._remaining = remaining
            return None
        if parts is not None:
            parts.append(payload)
            payload = b"".join(parts)
        return self._published(payload)

    def _published(self, body):
        delivery_mode, priority, expiration, user_id = self._scan
        event = _new(
            _MESSAGE_PUBLISHED,
            (
                self.number,
                self._exchange,
                self._routing_key,
                self._mandatory,
                self._properties,
                body,
                delivery_mode,
                priority,
                expiration,
                user_id,
                self.publish_seq if self.confirm_mode else 0,
            ),
        )
        # Only the state and the gathered body parts need resetting: the other fields are
        # all set again by the next publish before they are read.
        self.content_state = AWAIT_METHOD
        self._parts = None
        return event

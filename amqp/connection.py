"""The AMQP 0-9-1 connection as a sans-I/O state machine: bytes in, events out; calls in, bytes out.

Use (the asyncio shell)::

    conn = Connection(ConnectionConfig(), now=loop.time())
    # data_received:
    conn.receive_data(data, loop.time())
    while (event := conn.next_event()) is not None:
        ...handle event; on a replies.ProtocolError raised by the handler: conn.fail(error, channel)
    transport.write(conn.data_to_send())
    if conn.finished: transport.close()
    # a timer at conn.next_tick_at(): conn.tick(loop.time()), then write/close as above

``next_event`` parses lazily, one frame after another, so an error the broker raises for one
event (``fail``) takes effect before the next frame of the same read is looked at: frames that
follow a channel.close on that channel are dropped, exactly as RabbitMQ drops them.

What is matched against RabbitMQ (``rabbit_reader.erl``, ``rabbit_command_assembler.erl``,
``rabbit_channel.erl``, ``rabbit_heartbeat.erl``, main branch):

* Protocol header: ``AMQP 0 0 9 1`` starts the handshake. Anything else is answered with
  ``AMQP 0 0 9 1`` and the connection closes (RabbitMQ 3.x; 4.x answers most headers with
  the AMQP 1.0 SASL header since it speaks 1.0 too).
* connection.start carries RabbitMQ's nine capabilities, mechanisms "PLAIN AMQPLAIN" (and
  EXTERNAL where the broker's config offers it), locale en_US. The broker checks credentials
  (``AuthenticationRequested``). A refused login is 403 ACCESS_REFUSED "Login was refused
  using authentication mechanism PLAIN. For details see the broker logfile.", sent only if
  the client announced authentication_failure_close; otherwise the socket just closes.
* Errors before the connection is open close silently, as ``rabbit_reader:handle_exception``
  does, except: a refused login (above), 530 NOT_ALLOWED while tuning, and any error while
  opening (awaiting or checking connection.open), which get a connection.close.
* connection.tune-ok: frame_max below 4096, or 0 / above the server's, and channel_max 0 /
  above the server's, are 530 NOT_ALLOWED "negotiated frame_max = N is lower than the minimum
  allowed value (4096)" / "... is higher than the maximum allowed value (M)" with
  connection.tune's ids (10, 30). The client's heartbeat is used as sent.
* connection.open: the broker checks the vhost (``VhostAccessRequested``); a refusal is 530
  NOT_ALLOWED "access to vhost 'v' refused for user 'u'" with connection.open's ids.
* Frames: a payload larger than the negotiated frame_max (4096 until tune-ok) is 501
  FRAME_ERROR "type T, all octets = <<>>: {frame_too_large,S,M}" where M is frame_max - 8; a
  frame end other than 0xCE is 501 "...: {invalid_frame_end_marker,B}". Both are fatal: the
  close is sent and no more input is read. An unknown frame type, a heartbeat with a payload,
  a method frame under 4 bytes or a header frame under 12 are 501 "...: unknown_frame".
  A header or body frame on channel 0, or a heartbeat on another channel, is 505
  UNEXPECTED_FRAME "type T, all octets = <<...>>".
* Methods on channel 0 in the wrong state: 504 CHANNEL_ERROR "unexpected method in connection
  state running" (or starting, tuning, opening). Undecodable arguments (truncated, or bytes
  after the last field): 501 "cannot decode <<...>>" with the method's ids. A field table
  among them that does not parse (``field_table``) crashes RabbitMQ's reader: the socket
  closes with no connection.close, and so it does here; only on channel 0 of an open
  connection is the crash caught, and answered 541 INTERNAL_ERROR "INTERNAL_ERROR" with ids
  0. A method id pamqp does not know: 540 NOT_IMPLEMENTED "unknown method {C,M}" (RabbitMQ's
  reader crashes on it, which drops the socket).
* Channels: a frame for a new channel when channel_max channels are open is 530 NOT_ALLOWED
  "number of channels opened (N) has reached the negotiated channel_max (M)"; one the
  broker's limits refuse (``ConnectionConfig.channel_refusal``) is 530 with their text. Both
  have ids 0 and come instead of channel.open-ok. channel_max
  bounds how many channels are open, not their numbers: any number from 1 to 65535 may be
  opened below the count (``rabbit_reader:create_channel/2``), and clients' own test suites
  rely on that. A method other than channel.open on a channel that is not open is 504
  CHANNEL_ERROR "expected 'channel.open'".
  After sending channel.close, everything on that channel but close and close-ok is dropped;
  after sending connection.close, everything but close and close-ok.
* Heartbeats: one is sent when nothing was sent for half the negotiated interval. A client
  silent for two intervals is dropped without a close frame, as RabbitMQ does after "missed
  heartbeats from client" (RabbitMQ fires after two to three intervals; this machine at two).
* Handshake timeout 10 s (``handshake_timeout``). After sending connection.close the wait for
  close-ok is the connection's timeout_sec when it is under 30 s (``?CLOSING_TIMEOUT``): 3 s
  (``?NORMAL_TIMEOUT``) until tune-ok, the negotiated heartbeat after; then the transport is
  closed without more ado (``close_connection``).
"""

import collections
import enum
from collections.abc import Callable
from dataclasses import dataclass, field

from pamqp import commands

from . import auth, events, fastpath, field_table, frames, replies
from .channel import (
    AWAIT_METHOD,
    CHANNEL_CLOSE,
    CHANNEL_CLOSE_OK,
    CHANNEL_OPEN,
    Channel,
    ChannelState,
    IllegalTransition,
    decode_general,
    method_key,
)

CAPABILITIES = (
    "publisher_confirms",
    "exchange_exchange_bindings",
    "basic.nack",
    "consumer_cancel_notify",
    "connection.blocked",
    "consumer_priorities",
    "authentication_failure_close",
    "per_consumer_qos",
    "direct_reply_to",
)

CHANNEL_MAX_LIMIT = 65535
HEARTBEAT_S_LIMIT = 65535
FRAME_BYTES_LIMIT = 0xFFFFFFFF


# rabbit_reader's ?NORMAL_TIMEOUT: the connection's timeout_sec during the handshake.
NORMAL_TIMEOUT_S = 3.0


@dataclass(frozen=True, slots=True)
class ConnectionConfig:
    """What the server offers in connection.tune, and the machine's bounds."""

    frame_bytes_max: int = 131072
    channel_max: int = 2047
    heartbeat_s: int = 60
    message_bytes_max: int = 128 * 1024 * 1024
    handshake_timeout_s: float = 10.0
    closing_timeout_s: float = 30.0
    mechanisms: tuple = auth.PASSWORD_MECHANISMS
    channel_refusal: Callable[[str], str | None] | None = None
    """Asked with the user's name before a channel is created: why the broker's limits
    refuse it (a text), or None. A refusal is 530 NOT_ALLOWED with ids 0 and no open-ok, as
    rabbit_reader:create_channel refuses before the channel exists."""
    server_properties: dict = field(
        default_factory=lambda: {"product": "Warren", "platform": "Python"}
    )

    def __post_init__(self):
        assert frames.FRAME_MIN_BYTES <= self.frame_bytes_max <= FRAME_BYTES_LIMIT
        assert 1 <= self.channel_max <= CHANNEL_MAX_LIMIT
        assert 0 <= self.heartbeat_s <= HEARTBEAT_S_LIMIT
        assert self.message_bytes_max > 0
        assert self.handshake_timeout_s > 0 and self.closing_timeout_s > 0
        assert set(self.mechanisms) <= set(auth.MECHANISMS) and self.mechanisms


class ConnectionState(enum.Enum):
    AWAITING_HEADER = "awaiting protocol header"
    STARTING = "starting"  # connection.start sent, awaiting start-ok
    AUTHENTICATING = "authenticating"  # the broker is checking the credentials
    TUNING = "tuning"  # connection.tune sent, awaiting tune-ok
    OPENING = "opening"  # awaiting connection.open
    VHOST_CHECK = "vhost check"  # the broker is checking vhost access
    OPEN = "open"
    CLOSING = "closing"  # connection.close sent, awaiting close-ok
    CLOSED = "closed"


S = ConnectionState

# The connection lifecycle. Inputs are what happened; a missing entry is an illegal transition.
TRANSITIONS = {
    S.AWAITING_HEADER: {"protocol-header": S.STARTING, "abort": S.CLOSED},
    S.STARTING: {"start-ok": S.AUTHENTICATING, "close-sent": S.CLOSING, "abort": S.CLOSED},
    S.AUTHENTICATING: {"login-accepted": S.TUNING, "close-sent": S.CLOSING, "abort": S.CLOSED},
    S.TUNING: {"tune-ok": S.OPENING, "close-sent": S.CLOSING, "abort": S.CLOSED},
    S.OPENING: {"open": S.VHOST_CHECK, "close-sent": S.CLOSING, "abort": S.CLOSED},
    S.VHOST_CHECK: {"vhost-accepted": S.OPEN, "close-sent": S.CLOSING, "abort": S.CLOSED},
    S.OPEN: {"close-received": S.CLOSED, "close-sent": S.CLOSING, "abort": S.CLOSED},
    S.CLOSING: {"close-ok-received": S.CLOSED, "abort": S.CLOSED},
    S.CLOSED: {},
}

# rabbit_reader's connection_state names, used in its "unexpected method" text.
RABBIT_STATE_NAMES = {
    S.STARTING: "starting",
    S.AUTHENTICATING: "securing",
    S.TUNING: "tuning",
    S.OPENING: "opening",
    S.VHOST_CHECK: "opening",
    S.OPEN: "running",
}

# Which handshake errors get a connection.close rather than a silent close
# (rabbit_reader:handle_exception/3).
_ANNOUNCED_BEFORE_OPEN = {
    S.OPENING: lambda code, conn: True,
    S.VHOST_CHECK: lambda code, conn: True,
    S.TUNING: lambda code, conn: code == replies.NOT_ALLOWED,
    S.STARTING: lambda code, conn: (
        code == replies.ACCESS_REFUSED
        and conn.capabilities.get("authentication_failure_close") is True
    ),
    S.AUTHENTICATING: lambda code, conn: (
        code == replies.ACCESS_REFUSED
        and conn.capabilities.get("authentication_failure_close") is True
    ),
    S.AWAITING_HEADER: lambda code, conn: False,
}

START_OK = method_key(10, 11)
TUNE_OK = method_key(10, 31)
OPEN = method_key(10, 40)
CLOSE = method_key(10, 50)
CLOSE_OK = method_key(10, 51)
UPDATE_SECRET = method_key(10, 70)

_METHOD = frames.FRAME_METHOD
_HEADER = frames.FRAME_HEADER
_BODY = frames.FRAME_BODY
_HEARTBEAT = frames.FRAME_HEARTBEAT
_FRAME_END = frames.FRAME_END
_UNPACK_HEADER = frames.HEADER.unpack_from
_UNPACK_IDS = frames.METHOD_IDS.unpack_from
_CONTENT_PREFIX_BYTES = frames.CONTENT_HEADER_PREFIX_BYTES
_OPEN = S.OPEN
_CHANNEL_OPEN = ChannelState.OPEN
_MESSAGE_PUBLISHED = events.MessagePublished
_PUBLISH_IDS = (60, 40)
_publish_frames = fastpath.publish_frames


class Connection:
    """One client connection. Not thread-safe; one per transport."""

    def __init__(self, config=None, now=0.0):
        self.config = config or ConnectionConfig()
        self.state = S.AWAITING_HEADER
        self.frame_bytes_max = frames.FRAME_MIN_BYTES
        self.channel_max = self.config.channel_max
        self.heartbeat_s = 0
        self.client_properties = {}
        self.capabilities = {}
        self.mechanism = ""
        self.username = ""
        self.vhost = ""
        self._channels = {}
        self._pending = collections.deque()
        self._out = []
        self.delivered_body_bytes = 0
        """Message bodies of the deliveries queued since the last ``data_to_send``."""
        self._now = now
        self._created_at = now
        self._last_received_at = now
        self._last_sent_at = now
        self._heartbeat_monitor_paused = False
        # RabbitMQ's connection timeout_sec: ?NORMAL_TIMEOUT (3 s) from connection.start until
        # tune-ok, then the negotiated heartbeat. It bounds the wait for close-ok
        # (rabbit_reader start_connection and close_connection).
        self._timeout_s = NORMAL_TIMEOUT_S
        self._closing_deadline = now
        self._buffer = b""
        self._offset = 0
        self._chunks = []
        self._chunked_bytes = 0
        self._bytes_needed = frames.PROTOCOL_HEADER_BYTES
        self._last_method0_ids = (0, 0)
        self._stop_at_content = False
        self.stopped_at_content = False
        """A content frame was parsed while `stop_at_content` was on: no frame is parsed
        until it is turned off (the shell blocks the connection meanwhile)."""

    # -- input ---------------------------------------------------------------------------

    def receive_data(self, data, now):
        """Buffer bytes read from the transport; pull the resulting events with next_event."""
        self._now = now
        if self.state is S.CLOSED or not data:
            return
        self._last_received_at = now
        if self._offset >= len(self._buffer) and not self._chunks:
            self._buffer = bytes(data)
            self._offset = 0
            return
        self._chunks.append(bytes(data))
        self._chunked_bytes += len(data)
        if len(self._buffer) - self._offset + self._chunked_bytes >= self._bytes_needed:
            self._merge_chunks()

    def stop_at_content(self, on):
        """While on (a resource alarm is in effect), parsing stops after each content header
        or body frame: rabbit_reader blocks a publishing connection there, before the rest
        of the message is read, so a body does not pile up while memory is short. Turning it
        off lets parsing go on."""
        self._stop_at_content = on
        if not on:
            self.stopped_at_content = False

    @property
    def buffered_bytes(self):
        """Bytes received and not yet parsed: the shell pauses reading above its own bound."""
        return len(self._buffer) - self._offset + self._chunked_bytes

    def _merge_chunks(self):
        self._buffer = b"".join([self._buffer[self._offset :], *self._chunks])
        self._offset = 0
        self._chunks = []
        self._chunked_bytes = 0

    def next_event(self):
        """The next event, or None when more input (or a broker answer) is needed."""
        pending = self._pending
        if pending:
            return pending.popleft()
        while True:
            if self.stopped_at_content:
                return None
            state = self.state
            if state is not _OPEN:
                if state is S.AUTHENTICATING or state is S.VHOST_CHECK or state is S.CLOSED:
                    return None
                if state is S.AWAITING_HEADER:
                    self._receive_protocol_header()
                    if pending:
                        return pending.popleft()
                    if self.state is S.AWAITING_HEADER:
                        return None
                    continue
            buffer = self._buffer
            offset = self._offset
            payload_start = offset + frames.FRAME_HEADER_BYTES
            if payload_start > len(buffer):
                if self._chunks:
                    self._merge_chunks()
                    continue
                self._bytes_needed = frames.FRAME_HEADER_BYTES
                return None
            frame_type, channel_number, size = _UNPACK_HEADER(buffer, offset)
            if frame_type == _METHOD and state is _OPEN and _publish_frames is not None:
                # A whole publish (method, header, body) in the buffer is parsed in one step
                # when compiled; anything off its common case goes on one frame at a time.
                channel = self._channels.get(channel_number)
                if (
                    channel is not None
                    and channel.state is _CHANNEL_OPEN
                    and channel.content_state == AWAIT_METHOD
                    and not self._stop_at_content
                ):
                    confirm_mode = channel.confirm_mode
                    found = _publish_frames(
                        buffer,
                        offset,
                        self.frame_bytes_max,
                        channel.message_bytes_max,
                        channel.publish_seq + 1 if confirm_mode else 0,
                        _MESSAGE_PUBLISHED,
                    )
                    if found is not None:
                        self._offset, event = found
                        channel.last_method_ids = _PUBLISH_IDS
                        if confirm_mode:
                            channel.publish_seq += 1
                        return event
            if size > self.frame_bytes_max:
                self._fatal(
                    replies.AMQPConnectionError(
                        replies.FRAME_ERROR,
                        frames.frame_error_text(
                            frame_type,
                            b"",
                            f"{{frame_too_large,{size},"
                            f"{self.frame_bytes_max - frames.FRAME_OVERHEAD_BYTES}}}",
                        ),
                    )
                )
                return pending.popleft() if pending else None
            end = payload_start + size
            if end >= len(buffer):
                self._bytes_needed = size + frames.FRAME_OVERHEAD_BYTES
                if self._chunks and (
                    len(buffer) - offset + self._chunked_bytes >= self._bytes_needed
                ):
                    self._merge_chunks()
                    continue
                return None
            payload = buffer[payload_start:end]
            if buffer[end] != _FRAME_END:
                self._fatal(
                    replies.AMQPConnectionError(
                        replies.FRAME_ERROR,
                        frames.frame_error_text(
                            frame_type, payload, f"{{invalid_frame_end_marker,{buffer[end]}}}"
                        ),
                    )
                )
                return pending.popleft() if pending else None
            self._offset = end + 1
            try:
                if state is _OPEN:
                    channel = self._channels.get(channel_number) if channel_number else None
                    # The message path (content and methods on an open channel) goes straight
                    # to the channel; everything else takes the general route.
                    if channel is not None and channel.state is _CHANNEL_OPEN:
                        if frame_type == _BODY:
                            event = channel.handle_body(payload)
                            self.stopped_at_content = self._stop_at_content
                        elif frame_type == _HEADER and len(payload) >= _CONTENT_PREFIX_BYTES:
                            event = channel.handle_header(payload)
                            self.stopped_at_content = self._stop_at_content
                        elif frame_type == _METHOD and len(payload) >= 4:
                            class_id, method_id = _UNPACK_IDS(payload)
                            key = (class_id << 16) | method_id
                            if key == CHANNEL_CLOSE and channel.content_state == AWAIT_METHOD:
                                event = self._peer_closed_channel(
                                    channel, class_id, method_id, payload
                                )
                            else:
                                event = channel.handle_method(key, class_id, method_id, payload)
                        else:
                            event = self._frame_open(frame_type, channel_number, payload)
                    else:
                        event = self._frame_open(frame_type, channel_number, payload)
                elif state is S.CLOSING:
                    event = self._frame_closing(frame_type, channel_number, payload)
                else:
                    event = self._frame_handshake(frame_type, channel_number, payload)
            except replies.ProtocolError as error:
                self._fail(error, channel_number)
                event = None
            except field_table.MalformedFieldTable as error:
                if state is _OPEN and channel_number == 0:
                    # rabbit_reader:handle_method0 catches the crash and answers a bare 541.
                    self._fail(replies.AMQPConnectionError(replies.INTERNAL_ERROR, ""), 0)
                else:
                    # Anywhere else the crash ends RabbitMQ's reader: the socket closes and
                    # nothing is sent.
                    self._abort(0, f"malformed field table: {error}")
                event = None
            if pending:
                if event is not None:
                    pending.append(event)
                return pending.popleft()
            if event is not None:
                return event

    def _receive_protocol_header(self):
        if self.buffered_bytes < frames.PROTOCOL_HEADER_BYTES:
            return
        if self._chunks:
            self._merge_chunks()
        header = self._buffer[self._offset : self._offset + frames.PROTOCOL_HEADER_BYTES]
        self._offset += frames.PROTOCOL_HEADER_BYTES
        if header != frames.PROTOCOL_HEADER:
            self._send(frames.PROTOCOL_HEADER)
            self._abort(0, f"bad header {frames.erlang_binary(header)}")
            return
        self._transition("protocol-header")
        capabilities = {name: True for name in CAPABILITIES}
        server_properties = dict(self.config.server_properties, capabilities=capabilities)
        self._send(
            frames.encode_method(
                0,
                commands.Connection.Start(
                    version_major=0,
                    version_minor=9,
                    server_properties=server_properties,
                    mechanisms=" ".join(self.config.mechanisms),
                    locales="en_US",
                ),
            )
        )

    # -- frames by connection state ------------------------------------------------------

    def _frame_open(self, frame_type, channel_number, payload):
        if channel_number == 0:
            if frame_type == _METHOD:
                return self._method0(payload)
            if frame_type == _HEARTBEAT and not payload:
                return None
            return self._bad_frame(frame_type, payload)
        channel = self._channels.get(channel_number)
        if frame_type == _METHOD:
            if len(payload) < 4:
                return self._unknown_frame(frame_type, payload)
            class_id, method_id = _UNPACK_IDS(payload)
            key = (class_id << 16) | method_id
            if channel is None:
                return self._new_channel(channel_number, key, class_id, method_id, payload)
            if channel.state is ChannelState.OPEN:
                if key == CHANNEL_CLOSE and channel.content_state == AWAIT_METHOD:
                    return self._peer_closed_channel(channel, class_id, method_id, payload)
                return channel.handle_method(key, class_id, method_id, payload)
            return self._method_on_closing_channel(channel, key, class_id, method_id, payload)
        if frame_type == _BODY:
            if channel is None:
                return self._new_channel(channel_number, None, 0, 0, payload)
            if channel.state is ChannelState.OPEN:
                return channel.handle_body(payload)
            return None
        if frame_type == _HEADER:
            if len(payload) < frames.CONTENT_HEADER_PREFIX_BYTES:
                return self._unknown_frame(frame_type, payload)
            if channel is None:
                return self._new_channel(channel_number, None, 0, 0, payload)
            if channel.state is ChannelState.OPEN:
                return channel.handle_header(payload)
            return None
        if frame_type == _HEARTBEAT and not payload:
            raise replies.AMQPConnectionError(
                replies.UNEXPECTED_FRAME, frames.unexpected_frame_text(frame_type, payload)
            )
        return self._unknown_frame(frame_type, payload)

    def _frame_handshake(self, frame_type, channel_number, payload):
        if frame_type == _METHOD and channel_number == 0:
            return self._method0(payload)
        if frame_type == _HEARTBEAT and not payload and channel_number == 0:
            return None
        return self._bad_frame(frame_type, payload)

    def _frame_closing(self, frame_type, channel_number, payload):
        """After our connection.close only close and close-ok on channel 0 matter."""
        if channel_number != 0 or frame_type != _METHOD or len(payload) < 4:
            return None
        class_id, method_id = _UNPACK_IDS(payload)
        key = (class_id << 16) | method_id
        if key == CLOSE:
            self._send(frames.encode_method(0, commands.Connection.CloseOk()))
        elif key == CLOSE_OK:
            self._transition("close-ok-received")
        return None

    def _bad_frame(self, frame_type, payload):
        """A frame that is well formed but not allowed here (505), or malformed (501)."""
        well_formed = (
            (frame_type == _METHOD and len(payload) >= 4)
            or (frame_type == _HEADER and len(payload) >= frames.CONTENT_HEADER_PREFIX_BYTES)
            or frame_type == _BODY
            or (frame_type == _HEARTBEAT and not payload)
        )
        if well_formed:
            raise replies.AMQPConnectionError(
                replies.UNEXPECTED_FRAME, frames.unexpected_frame_text(frame_type, payload)
            )
        return self._unknown_frame(frame_type, payload)

    @staticmethod
    def _unknown_frame(frame_type, payload):
        raise replies.AMQPConnectionError(
            replies.FRAME_ERROR, frames.frame_error_text(frame_type, payload, "unknown_frame")
        )

    # -- channel 0 -----------------------------------------------------------------------

    def _method0(self, payload):
        if len(payload) < 4:
            return self._unknown_frame(_METHOD, payload)
        class_id, method_id = _UNPACK_IDS(payload)
        self._last_method0_ids = (class_id, method_id)
        method = decode_general(class_id, method_id, payload[4:])
        key = (class_id << 16) | method_id
        state = self.state
        if state is S.STARTING and key == START_OK:
            return self._start_ok(method, class_id, method_id)
        if state is S.TUNING and key == TUNE_OK:
            return self._tune_ok(method)
        if state is S.OPENING and key == OPEN:
            self.vhost = method.virtual_host
            self._transition("open")
            return events.VhostAccessRequested(self.vhost, self.username)
        if state is S.OPEN and key == CLOSE:
            self._send(frames.encode_method(0, commands.Connection.CloseOk()))
            self._transition("close-received")
            self._drop_channels()
            return events.ConnectionClosed(method.reply_code, method.reply_text, True)
        if state is S.OPEN and key == UPDATE_SECRET:
            return events.MethodReceived(0, method)
        raise replies.AMQPConnectionError(
            replies.CHANNEL_ERROR,
            f"unexpected method in connection state {RABBIT_STATE_NAMES[state]}",
            class_id,
            method_id,
        )

    def _start_ok(self, method, class_id, method_id):
        client_properties = method.client_properties or {}
        self.client_properties = client_properties
        capabilities = client_properties.get("capabilities")
        self.capabilities = capabilities if isinstance(capabilities, dict) else {}
        self.mechanism = method.mechanism
        if self.mechanism not in self.config.mechanisms:
            raise replies.AMQPConnectionError(
                replies.COMMAND_INVALID,
                f"unknown authentication mechanism '{self.mechanism}'",
                class_id,
                method_id,
            )
        username, password = auth.parse_response(
            self.mechanism, method.response, class_id, method_id
        )
        self.username = username
        self._transition("start-ok")
        return events.AuthenticationRequested(self.mechanism, username, password, client_properties)

    def _tune_ok(self, method):
        self._check_negotiated(
            "frame_max", frames.FRAME_MIN_BYTES, method.frame_max, self.config.frame_bytes_max
        )
        self._check_negotiated("channel_max", 1, method.channel_max, self.config.channel_max)
        self.frame_bytes_max = method.frame_max
        self.channel_max = method.channel_max
        self.heartbeat_s = method.heartbeat
        self._timeout_s = method.heartbeat
        self._last_sent_at = self._last_received_at = self._now
        self._transition("tune-ok")
        return None

    @staticmethod
    def _check_negotiated(name, minimum, client_value, server_value):
        """rabbit_reader:validate_negotiated_integer_value/3 and its texts."""
        if client_value != 0 and client_value < minimum:
            detail, which, bound = "lower", "minimum", minimum
        elif client_value == 0 or client_value > server_value:
            detail, which, bound = "higher", "maximum", server_value
        else:
            return
        no_limit = " (no limit)" if name == "channel_max" and client_value == 0 else ""
        raise replies.AMQPConnectionError(
            replies.NOT_ALLOWED,
            f"negotiated {name} = {client_value}{no_limit} is {detail} than the {which} "
            f"allowed value ({bound})",
            10,
            30,
        )

    # -- channels ------------------------------------------------------------------------

    def _new_channel(self, number, key, class_id, method_id, payload):
        """A frame for a channel that does not exist: only channel.open may create it."""
        if len(self._channels) >= self.channel_max:
            raise replies.AMQPConnectionError(
                replies.NOT_ALLOWED,
                f"number of channels opened ({len(self._channels)}) has reached the "
                f"negotiated channel_max ({self.channel_max})",
            )
        refusal = self.config.channel_refusal
        if refusal is not None and (text := refusal(self.username)) is not None:
            raise replies.AMQPConnectionError(replies.NOT_ALLOWED, text)
        if key is None:
            raise replies.AMQPConnectionError(
                replies.UNEXPECTED_FRAME, "expected method frame, got non method frame instead"
            )
        decode_general(class_id, method_id, payload[4:])
        if key != CHANNEL_OPEN:
            raise replies.AMQPConnectionError(
                replies.CHANNEL_ERROR, "expected 'channel.open'", class_id, method_id
            )
        self._channels[number] = Channel(number, self._send, self.config.message_bytes_max)
        self._send(frames.encode_method(number, commands.Channel.OpenOk()))
        return events.ChannelOpened(number)

    def _peer_closed_channel(self, channel, class_id, method_id, payload):
        method = decode_general(class_id, method_id, payload[4:])
        channel.transition("close-received")
        del self._channels[channel.number]
        self._send(frames.encode_method(channel.number, commands.Channel.CloseOk()))
        return events.ChannelClosed(channel.number, method.reply_code, method.reply_text, True)

    def _method_on_closing_channel(self, channel, key, class_id, method_id, payload):
        """After our channel.close: answer a crossing close, finish on close-ok, drop the rest."""
        if key == CHANNEL_CLOSE:
            channel.transition("close-received")
            self._send(frames.encode_method(channel.number, commands.Channel.CloseOk()))
        elif key == CHANNEL_CLOSE_OK:
            channel.transition("close-ok-received")
            del self._channels[channel.number]
        return None

    def transport_lost(self):
        """The socket is gone: drop the channels, half-received content with them, and the
        unparsed input now, not when the collector finds the cycles they are in."""
        self._drop_channels()
        self._discard_input()

    def _drop_channels(self):
        for channel in self._channels.values():
            channel.state = ChannelState.CLOSED
        self._channels.clear()

    # -- errors --------------------------------------------------------------------------

    def _fail(self, error, channel_number):
        state = self.state
        if state is S.CLOSING or state is S.CLOSED:
            return
        if isinstance(error, replies.ChannelError) and channel_number != 0 and state is S.OPEN:
            channel = self._channels.get(channel_number)
            if channel is None or channel.state is not ChannelState.OPEN:
                return
            channel.transition("close-sent")
            self._send(
                frames.encode_method(
                    channel_number,
                    commands.Channel.Close(
                        reply_code=error.code,
                        reply_text=error.reply_text,
                        class_id=error.class_id,
                        method_id=error.method_id,
                    ),
                )
            )
            self._pending.append(
                events.ChannelClosed(channel_number, error.code, error.reply_text, False)
            )
            return
        announce = state is S.OPEN or _ANNOUNCED_BEFORE_OPEN[state](error.code, self)
        self._drop_channels()
        if announce:
            self._send(
                frames.encode_method(
                    0,
                    commands.Connection.Close(
                        reply_code=error.code,
                        reply_text=error.reply_text,
                        class_id=error.class_id,
                        method_id=error.method_id,
                    ),
                )
            )
            self._closing_deadline = self._now + self._close_ok_wait_s()
            self._transition("close-sent")
        else:
            self._transition("abort")
        self._pending.append(events.ConnectionClosed(error.code, error.reply_text, False))

    def _fatal(self, error):
        """The input is out of sync: announce the error if we may, then read nothing more."""
        self._fail(error, 0)
        if self.state is not S.CLOSED:
            self._transition("abort")

    def _abort(self, reply_code, reply_text):
        self._drop_channels()
        self._transition("abort")
        self._pending.append(events.ConnectionClosed(reply_code, reply_text, False))

    def _discard_input(self):
        self._buffer = b""
        self._offset = 0
        self._chunks = []
        self._chunked_bytes = 0

    def _transition(self, what):
        try:
            self.state = TRANSITIONS[self.state][what]
        except KeyError:
            raise IllegalTransition(f"connection: {what} in state {self.state}") from None
        if self.state is S.CLOSED:
            # Nothing after the end is read: drop the rest of the input now.
            self._discard_input()

    # -- broker answers ------------------------------------------------------------------

    def accept_login(self, username=None):
        """The credentials of AuthenticationRequested are good: connection.tune is queued."""
        self._transition("login-accepted")
        if username is not None:
            self.username = username
        self._send(
            frames.encode_method(
                0,
                commands.Connection.Tune(
                    channel_max=self.config.channel_max,
                    frame_max=self.config.frame_bytes_max,
                    heartbeat=self.config.heartbeat_s,
                ),
            )
        )

    def refuse_login(self):
        """The credentials are bad: 403 ACCESS_REFUSED, sent if the client asked for it."""
        if self.state is not S.AUTHENTICATING:
            raise IllegalTransition(f"connection: login refused in state {self.state}")
        self._fail(
            replies.AMQPConnectionError(
                replies.ACCESS_REFUSED,
                f"Login was refused using authentication mechanism {self.mechanism}. "
                "For details see the broker logfile.",
            ),
            0,
        )

    def accept_vhost(self):
        """The user may use the vhost of VhostAccessRequested: connection.open-ok is queued."""
        self._transition("vhost-accepted")
        self._send(frames.encode_method(0, commands.Connection.OpenOk()))

    def refuse_vhost(self, text=None):
        """530 NOT_ALLOWED; the default text is RabbitMQ's for a user without access."""
        if self.state is not S.VHOST_CHECK:
            raise IllegalTransition(f"connection: vhost refused in state {self.state}")
        self._fail(
            replies.AMQPConnectionError(
                replies.NOT_ALLOWED,
                text or f"access to vhost '{self.vhost}' refused for user '{self.username}'",
                10,
                40,
            ),
            0,
        )

    def fail(self, error, channel=0):
        """Turn an error the broker raised while handling an event on ``channel`` into a close.

        A ChannelError closes that channel; any other ProtocolError closes the connection.
        Class and method ids of 0 are filled in with the method last received there, as
        rabbit_channel does. A ChannelClosed or ConnectionClosed event follows from next_event.
        """
        assert isinstance(error, replies.ProtocolError), error
        if error.class_id == 0 and error.method_id == 0:
            if channel == 0:
                error.class_id, error.method_id = self._last_method0_ids
            elif channel in self._channels:
                error.class_id, error.method_id = self._channels[channel].last_method_ids
        self._fail(error, channel)

    def close(self, reply_code=replies.CONNECTION_FORCED, text="broker forced connection closure"):
        """Close the connection from the broker's side (320 CONNECTION_FORCED by default)."""
        self._fail(replies.AMQPConnectionError(reply_code, text), 0)
        # Parsed again, if stopped at content, for the client's close-ok.
        self.stopped_at_content = False

    # -- output --------------------------------------------------------------------------

    def _send(self, data):
        self._out.append(data)
        # The time of the latest input or tick: sends happen in response to one of them.
        self._last_sent_at = self._now

    def data_to_send(self):
        """Everything queued since the last call, as one bytes: one transport.write."""
        out = self.parts_to_send()
        return out[0] if len(out) == 1 else b"".join(out)

    def parts_to_send(self):
        """Everything queued since the last call, as bytes objects for one
        transport.writelines: a large body is a part of its own, written without a copy."""
        out = self._out
        if not out:
            return ()
        self._out = []
        self.delivered_body_bytes = 0
        return out

    def channel_is_open(self, channel):
        ch = self._channels.get(channel)
        return ch is not None and ch.state is ChannelState.OPEN

    def send_method(self, channel, method):
        """Queue a pamqp method. Returns False (and sends nothing) if the channel is not open.

        Replies that carry a queue name or consumer tag go through ``declare_ok``,
        ``consume_ok`` and ``cancel_ok`` instead: pamqp refuses names RabbitMQ accepts.
        """
        assert not isinstance(method, (commands.Channel.Close, commands.Connection.Close)), (
            "close with fail() or close(), so the machine tracks the handshake"
        )
        if channel != 0 and not self.channel_is_open(channel):
            return False
        if channel == 0 and self.state is not S.OPEN:
            return False
        self._send(frames.encode_method(channel, method))
        return True

    def declare_ok(self, channel, queue, message_count, consumer_count):
        """Queue queue.declare-ok for any name RabbitMQ accepts. False if the channel is not
        open."""
        if not self.channel_is_open(channel):
            return False
        self._send(fastpath.encode_declare_ok(channel, queue, message_count, consumer_count))
        return True

    def consume_ok(self, channel, consumer_tag):
        """Queue basic.consume-ok. False if the channel is not open."""
        if not self.channel_is_open(channel):
            return False
        self._send(fastpath.encode_consume_ok(channel, consumer_tag))
        return True

    def channel(self, number):
        """The open channel `number`'s state (its confirm and tx modes), or None."""
        return self._channels.get(number)

    def cancel_ok(self, channel, consumer_tag):
        """Queue basic.cancel-ok. False if the channel is not open."""
        if not self.channel_is_open(channel):
            return False
        self._send(fastpath.encode_cancel_ok(channel, consumer_tag))
        return True

    def deliver(
        self,
        channel,
        consumer_tag,
        delivery_tag,
        redelivered,
        exchange,
        routing_key,
        properties,
        body,
    ):
        """Queue basic.deliver + header + body frames. False if the channel is not open."""
        message = fastpath.Delivery(
            exchange.encode(), routing_key.encode(), properties, body, redelivered
        )
        return self.deliver_many(channel, consumer_tag, delivery_tag, [message])

    def deliver_many(self, channel, consumer_tag, first_tag, messages):
        """``deliver`` for each of ``messages`` (see ``fastpath.deliver_many_parts``), tags
        counting up from ``first_tag``. False if the channel is not open."""
        ch = self._channels.get(channel)
        if ch is None or ch.state is not ChannelState.OPEN:
            return False
        self.delivered_body_bytes += fastpath.deliver_many_parts(
            self._out, channel, consumer_tag, first_tag, messages, self.frame_bytes_max
        )
        self._last_sent_at = self._now
        return True

    def get_ok(
        self,
        channel,
        delivery_tag,
        redelivered,
        exchange,
        routing_key,
        message_count,
        properties,
        body,
    ):
        """Queue basic.get-ok + header + body frames. False if the channel is not open."""
        if not self.channel_is_open(channel):
            return False
        self._send(
            fastpath.encode_get_ok(
                channel,
                delivery_tag,
                redelivered,
                exchange,
                routing_key,
                message_count,
                properties,
                body,
                self.frame_bytes_max,
            )
        )
        return True

    def basic_return(self, channel, reply_code, text, exchange, routing_key, properties, body):
        """Queue basic.return for an unroutable mandatory message (312 NO_ROUTE usually)."""
        if not self.channel_is_open(channel):
            return False
        self._send(
            fastpath.encode_return(
                channel,
                reply_code,
                replies.format_reply_text(reply_code, text),
                exchange,
                routing_key,
                properties,
                body,
                self.frame_bytes_max,
            )
        )
        return True

    def confirm(self, channel, delivery_tag, multiple=False, nack=False):
        """Queue a publisher confirm: basic.ack (or basic.nack) for confirm tags up to the tag."""
        if not self.channel_is_open(channel):
            return False
        if nack:
            self._send(fastpath.encode_nack(channel, delivery_tag, multiple))
        else:
            self._send(fastpath.encode_ack(channel, delivery_tag, multiple))
        return True

    def block(self, reason):
        """connection.blocked, if the client announced the connection.blocked capability."""
        if self.state is S.OPEN and self.capabilities.get("connection.blocked") is True:
            self._send(frames.encode_method(0, commands.Connection.Blocked(reason=reason)))
            return True
        return False

    def unblock(self):
        if self.state is S.OPEN and self.capabilities.get("connection.blocked") is True:
            self._send(frames.encode_method(0, commands.Connection.Unblocked()))
            return True
        return False

    def pause_heartbeat_monitor(self):
        """Stop expecting the client's heartbeats: the shell is not reading (a blocked
        publisher), as rabbit_reader pauses its heartbeat monitor. Heartbeats still go out."""
        self._heartbeat_monitor_paused = True

    def resume_heartbeat_monitor(self, now):
        self._heartbeat_monitor_paused = False
        self._last_received_at = now

    # -- time ----------------------------------------------------------------------------

    def _close_ok_wait_s(self):
        if 0 < self._timeout_s < self.config.closing_timeout_s:
            return self._timeout_s
        return self.config.closing_timeout_s

    @property
    def finished(self):
        """True once the transport should be closed (after writing data_to_send())."""
        return self.state is S.CLOSED

    def next_tick_at(self):
        """When tick() must next be called, or None if no timer is running."""
        state = self.state
        if state is S.CLOSED:
            return None
        if state is S.CLOSING:
            return self._closing_deadline
        if state is not S.OPEN:
            return self._created_at + self.config.handshake_timeout_s
        if not self.heartbeat_s:
            return None
        send_at = self._last_sent_at + self.heartbeat_s / 2
        if self._heartbeat_monitor_paused:
            return send_at
        return min(self._last_received_at + 2 * self.heartbeat_s, send_at)

    def tick(self, now):
        """Run the timers: heartbeats, heartbeat timeout, handshake and close-ok timeouts.

        Returns a ConnectionClosed event when a timeout ends the connection, else None.
        """
        self._now = now
        state = self.state
        if state is S.CLOSED:
            return None
        if state is S.CLOSING:
            if now >= self._closing_deadline:
                self._transition("abort")
            return None
        if state is not S.OPEN:
            if now - self._created_at >= self.config.handshake_timeout_s:
                self._abort(0, "handshake timeout")
                return self._pending.popleft()
            return None
        heartbeat_s = self.heartbeat_s
        if not heartbeat_s:
            return None
        if not self._heartbeat_monitor_paused and now - self._last_received_at >= 2 * heartbeat_s:
            self._abort(0, f"missed heartbeats from client, timeout: {heartbeat_s}s")
            return self._pending.popleft()
        if now - self._last_sent_at >= heartbeat_s / 2:
            self._out.append(frames.HEARTBEAT_FRAME)
            self._last_sent_at = now
        return None

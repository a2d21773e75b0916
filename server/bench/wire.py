"""The load generator's wire format: broker URLs, hand-built publish frames, incoming frame parsing.

The load generator is a client, so it builds the frames a client sends (basic.publish with its
content, basic.ack) and parses the ones a broker sends (basic.deliver, publisher confirms).
Everything here is pure: bytes in, bytes out, no sockets and no clock.

A benchmark publishes the same message shape over and over, so ``PublishTemplate`` encodes the
method frame, the content header and the body frame's header once; a message on the wire is
then that prefix, the body and the frame end. Bodies that carry a send timestamp
(``stamped_body``) differ only in their first 8 bytes. Frames of the slow, rare methods
(handshake, declare, qos, consume) go through pamqp (``warrenmq.amqp.frames``).
"""

from __future__ import annotations

import struct
import urllib.parse
from dataclasses import dataclass

from warrenmq.amqp import frames

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"
AMQP_PORT = 5672
AMQPS_PORT = 5671
# The TLS query parameters of an amqps:// URL (RabbitMQ's URI query parameters): PEM files.
TLS_PARAMETERS = ("cacertfile", "certfile", "keyfile")
SHORTSTR_BYTES_MAX = 255

BASIC_CLASS = 60
PUBLISH_METHOD = 40
DELIVER_METHOD = 60
ACK_METHOD = 80
NACK_METHOD = 120
REJECT_METHOD = 90
# (class id << 16 | method id) of the methods the hot path dispatches on.
BASIC_DELIVER_ID = BASIC_CLASS << 16 | DELIVER_METHOD
BASIC_ACK_ID = BASIC_CLASS << 16 | ACK_METHOD
BASIC_NACK_ID = BASIC_CLASS << 16 | NACK_METHOD

# Content-header property bytes: flags with only delivery-mode set, then delivery-mode 2.
PERSISTENT_PROPERTIES = b"\x10\x00\x02"
TRANSIENT_PROPERTIES = b"\x10\x00\x01"

TIMESTAMP = struct.Struct(">Q")
TIMESTAMP_BYTES = TIMESTAMP.size

_METHOD_HEAD = struct.Struct(">BHIHH")  # frame header + class id + method id
_CONTENT_HEAD = struct.Struct(">BHIHHQ")  # frame header + class id + weight + body size
_ACK_FRAME = struct.Struct(">BHIHHQBB")
_ACK_PAYLOAD = struct.Struct(">HHQB")  # class id, method id, delivery tag, bits
_METHOD_ID = struct.Struct(">I")
_DELIVERY_TAG = struct.Struct(">Q")
_BODY_SIZE = struct.Struct(">Q")


@dataclass(frozen=True)
class BrokerAddress:
    """Where and as whom to connect, from an ``amqp://user:password@host:port/vhost`` URL."""

    host: str
    port: int
    username: str
    password: str
    vhost: str
    tls: tuple[tuple[str, str], ...] | None = None
    """amqps: the TLS parameters given ((name, PEM file) pairs, maybe none); None: plain."""

    def display(self) -> str:
        """The URL without its password, for reports."""
        vhost = urllib.parse.quote(self.vhost, safe="")
        scheme = "amqp" if self.tls is None else "amqps"
        return f"{scheme}://{self.username}@{self.host}:{self.port}/{vhost}"


def parse_url(url: str) -> BrokerAddress:
    """A BrokerAddress from an AMQP URI as RabbitMQ's clients read it.

    ``amqps://...?cacertfile=CA.pem&certfile=CERT.pem&keyfile=KEY.pem`` connects over TLS
    (port 5671 by default), verifying the broker against the CA bundle (the system's without
    one) and presenting the client certificate when given.

    Missing parts take the usual defaults (guest/guest, localhost, 5672, vhost "/"); the vhost
    is the percent-decoded path without its leading slash, so ".../%2F" is "/". An empty path
    ("amqp://host" or "amqp://host/") means the default vhost "/", as pika reads it; the
    empty vhost name is not reachable (no broker defines one by default).
    """
    parsed = urllib.parse.urlsplit(url)
    if parsed.scheme not in ("amqp", "amqps"):
        raise ValueError(f"only amqp:// and amqps:// URLs are supported, got {url!r}")
    query = urllib.parse.parse_qsl(parsed.query, keep_blank_values=True)
    if parsed.fragment or (parsed.scheme == "amqp" and query):
        raise ValueError(f"URL query parameters are not supported: {url!r}")
    unknown = [name for name, _ in query if name not in TLS_PARAMETERS]
    if unknown:
        raise ValueError(f"only {', '.join(TLS_PARAMETERS)} may follow an amqps URL: {url!r}")
    tls = tuple(query) if parsed.scheme == "amqps" else None
    try:
        port = parsed.port or (AMQP_PORT if tls is None else AMQPS_PORT)
    except ValueError as error:
        raise ValueError(f"bad port in {url!r}: {error}") from error
    vhost = urllib.parse.unquote(parsed.path[1:]) or "/"
    return BrokerAddress(
        host=parsed.hostname or "localhost",
        port=port,
        username=urllib.parse.unquote(parsed.username) if parsed.username is not None else "guest",
        password=urllib.parse.unquote(parsed.password) if parsed.password is not None else "guest",
        vhost=vhost,
        tls=tls,
    )


def _shortstr(text: str) -> bytes:
    encoded = text.encode("utf-8")
    if len(encoded) > SHORTSTR_BYTES_MAX:
        raise ValueError(f"shortstr longer than {SHORTSTR_BYTES_MAX} bytes: {text[:32]!r}...")
    return bytes((len(encoded),)) + encoded


class PublishTemplate:
    """basic.publish + content header + body frames for one message shape on one channel.

    ``frame(body)`` is one whole message on the wire; bodies must be ``body_bytes`` long, and
    a body longer than a frame allows is split into several body frames as the spec requires.
    """

    def __init__(
        self,
        channel: int,
        exchange: str,
        routing_key: str,
        body_bytes: int,
        frame_max: int,
        property_bytes: bytes = PERSISTENT_PROPERTIES,
        mandatory: bool = False,
    ) -> None:
        if frame_max < frames.FRAME_MIN_BYTES:
            raise ValueError(f"frame_max {frame_max} is below the minimum {frames.FRAME_MIN_BYTES}")
        if body_bytes < 0:
            raise ValueError(f"negative body size {body_bytes}")
        arguments = (
            b"\x00\x00"
            + _shortstr(exchange)
            + _shortstr(routing_key)
            + (b"\x01" if mandatory else b"\x00")
        )
        method = (
            _METHOD_HEAD.pack(
                frames.FRAME_METHOD, channel, 4 + len(arguments), BASIC_CLASS, PUBLISH_METHOD
            )
            + arguments
            + frames.FRAME_END_BYTE
        )
        header = (
            _CONTENT_HEAD.pack(
                frames.FRAME_HEADER, channel, 12 + len(property_bytes), BASIC_CLASS, 0, body_bytes
            )
            + property_bytes
            + frames.FRAME_END_BYTE
        )
        self.channel = channel
        self.body_bytes = body_bytes
        self._chunk_bytes_max = frame_max - frames.FRAME_OVERHEAD_BYTES
        self._single_frame = 0 < body_bytes <= self._chunk_bytes_max
        if self._single_frame:
            self._prefix = (
                method + header + frames.HEADER.pack(frames.FRAME_BODY, channel, body_bytes)
            )
        else:
            self._prefix = method + header

    def frame(self, body: bytes) -> bytes:
        """One message: method, header and body frames, as one bytes."""
        if len(body) != self.body_bytes:
            raise ValueError(f"body is {len(body)} bytes, template is for {self.body_bytes}")
        if self._single_frame:
            return self._prefix + body + frames.FRAME_END_BYTE
        parts = [self._prefix]
        view = memoryview(body)
        for start in range(0, self.body_bytes, self._chunk_bytes_max):
            chunk = view[start : start + self._chunk_bytes_max]
            parts.append(frames.HEADER.pack(frames.FRAME_BODY, self.channel, len(chunk)))
            parts.append(chunk)
            parts.append(frames.FRAME_END_BYTE)
        return b"".join(parts)


def stamped_body(padding: bytes, timestamp_ns: int) -> bytes:
    """A body that starts with its send time (8 bytes, big-endian nanoseconds), then padding."""
    return TIMESTAMP.pack(timestamp_ns) + padding


def body_timestamp_ns(body: bytes) -> int:
    """The send time that ``stamped_body`` put at the front of a body."""
    return TIMESTAMP.unpack_from(body)[0]


def encode_reject(channel: int, delivery_tag: int) -> bytes:
    """A basic.reject frame, requeue false (the message is dead-lettered or dropped)."""
    return _ACK_FRAME.pack(
        frames.FRAME_METHOD,
        channel,
        _ACK_PAYLOAD.size,
        BASIC_CLASS,
        REJECT_METHOD,
        delivery_tag,
        0,
        frames.FRAME_END,
    )


def encode_ack(channel: int, delivery_tag: int, multiple: bool) -> bytes:
    """A basic.ack frame from a consumer."""
    return _ACK_FRAME.pack(
        frames.FRAME_METHOD,
        channel,
        _ACK_PAYLOAD.size,
        BASIC_CLASS,
        ACK_METHOD,
        delivery_tag,
        1 if multiple else 0,
        frames.FRAME_END,
    )


def method_id(payload: bytes) -> int:
    """(class id << 16 | method id) of a method frame's payload."""
    return _METHOD_ID.unpack_from(payload)[0]


def decode_confirm(payload: bytes) -> tuple[int, bool]:
    """(delivery_tag, multiple) from a basic.ack or basic.nack payload sent by a broker."""
    if len(payload) != _ACK_PAYLOAD.size:
        raise ValueError(f"malformed publisher confirm of {len(payload)} bytes")
    _, _, delivery_tag, bits = _ACK_PAYLOAD.unpack(payload)
    return delivery_tag, bool(bits & 1)


def decode_deliver_tag(payload: bytes) -> int:
    """The delivery tag of a basic.deliver payload (it follows the consumer tag)."""
    return _DELIVERY_TAG.unpack_from(payload, 5 + payload[4])[0]


def decode_body_size(payload: bytes) -> int:
    """The body size announced by a content header payload."""
    return _BODY_SIZE.unpack_from(payload, 4)[0]


class FrameError(ValueError):
    """The broker sent bytes that are not AMQP frames."""


def split_frames(data: bytes, frame_bytes_max: int) -> tuple[list[tuple[int, int, bytes]], bytes]:
    """([(frame type, channel, payload)], the incomplete rest) for bytes received from a broker.

    ``frame_bytes_max`` bounds what one frame may announce (the negotiated frame_max), so a
    garbled size cannot make the reader buffer without limit.
    """
    out = []
    offset = 0
    end = len(data)
    unpack_header = frames.HEADER.unpack_from
    while end - offset >= frames.FRAME_HEADER_BYTES:
        frame_type, channel, size = unpack_header(data, offset)
        if size + frames.FRAME_OVERHEAD_BYTES > frame_bytes_max:
            raise FrameError(f"frame of {size} bytes exceeds frame_max {frame_bytes_max}")
        payload_end = offset + frames.FRAME_HEADER_BYTES + size
        if payload_end >= end:
            break
        if data[payload_end] != frames.FRAME_END:
            raise FrameError(f"frame end marker is {data[payload_end]:#04x}, not 0xce")
        out.append((frame_type, channel, data[offset + frames.FRAME_HEADER_BYTES : payload_end]))
        offset = payload_end + 1
    return out, data[offset:]

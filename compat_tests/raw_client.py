"""A deliberately small AMQP 0-9-1 client over a plain socket, for what real clients refuse to do.

pika and py-amqp check channel_max, frame_max and channel state on the client side, so they
never send the frames whose server-side handling we must compare: a channel above
channel_max, a frame above frame_max, a method on an unopened channel, a corrupt frame end.
This client encodes with pamqp and sends whatever it is told, in order, and reads frames back.
"""

from __future__ import annotations

import socket
import ssl
import struct
import time

from pamqp import body as content_body
from pamqp import commands, frame, header, heartbeat
from pamqp.exceptions import UnmarshalingException

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_END = b"\xce"
READ_BYTES_MAX = 1 << 20


class Closed(Exception):
    """The broker closed the TCP connection."""


class RawClient:
    def __init__(
        self, host: str, port: int, timeout_s: float = 5.0, tls: ssl.SSLContext | None = None
    ) -> None:
        """Connected to host:port; over TLS with `tls`, the broker named "localhost"."""
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if tls is not None:
            self.sock = tls.wrap_socket(self.sock, server_hostname="localhost")
        self.buffer = b""
        self.timeout_s = timeout_s
        self.server_properties: dict = {}
        self.tune: commands.Connection.Tune | None = None

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, channel: int, value) -> None:
        self.sock.sendall(frame.marshal(value, channel))

    def _fill(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no frame from the broker in time")
        self.sock.settimeout(remaining)
        data = self.sock.recv(READ_BYTES_MAX)
        if not data:
            raise Closed("the broker closed the connection")
        self.buffer += data

    def recv(self, timeout_s: float | None = None, skip_heartbeats: bool = True):
        """The next (channel, frame) from the broker; heartbeats skipped unless asked for."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while True:
            while True:
                if len(self.buffer) >= 7:
                    size = struct.unpack_from(">I", self.buffer, 3)[0]
                    if len(self.buffer) >= size + 8:
                        break
                self._fill(deadline)
            try:
                consumed, channel, value = frame.unmarshal(self.buffer)
            except UnmarshalingException as error:
                raise AssertionError(f"undecodable frame from the broker: {error}") from None
            self.buffer = self.buffer[consumed:]
            if skip_heartbeats and isinstance(value, heartbeat.Heartbeat):
                continue
            return channel, value

    def recv_raw(self, timeout_s: float | None = None) -> tuple[int, int, bytes]:
        """The next frame undecoded, as (frame type, channel, payload): for the bytes on the
        wire that a decoder would normalise (a header table's field types, say)."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while (
            len(self.buffer) < 7
            or len(self.buffer) < struct.unpack_from(">I", self.buffer, 3)[0] + 8
        ):
            self._fill(deadline)
        frame_type, channel, size = struct.unpack_from(">BHI", self.buffer)
        payload = self.buffer[7 : 7 + size]
        self.buffer = self.buffer[size + 8 :]
        return frame_type, channel, payload

    def expect(self, kind, timeout_s: float | None = None):
        channel, value = self.recv(timeout_s)
        assert isinstance(value, kind), (
            f"expected {kind.__name__}, got {value!r} on channel {channel}"
        )
        return channel, value

    def handshake(self, **login) -> None:
        """Run start/tune/open (`open_connection`'s arguments), expecting open-ok."""
        _, answer = self.open_connection(**login)
        assert isinstance(answer, commands.Connection.OpenOk), f"connection.open: {answer!r}"

    def open_connection(
        self,
        channel_max: int = 0,
        frame_max: int = 131072,
        heartbeat_s: int = 0,
        user: str = "guest",
        password: str = "guest",
        vhost: str = "/",
        mechanism: str = "PLAIN",
    ):
        """Run start/tune/open, asking for the given limits (0 = take the server's); returns
        the (channel, frame) that answers connection.open: open-ok, or a refusal's close."""
        self.send_bytes(PROTOCOL_HEADER)
        _, start = self.expect(commands.Connection.Start)
        self.server_properties = start.server_properties
        response = f"\0{user}\0{password}"
        self.send(
            0,
            commands.Connection.StartOk(
                client_properties={"product": "warren-compat-raw"},
                mechanism=mechanism,
                response=response,
            ),
        )
        _, self.tune = self.expect(commands.Connection.Tune)
        self.send(
            0,
            commands.Connection.TuneOk(
                channel_max=channel_max or self.tune.channel_max,
                frame_max=frame_max,
                heartbeat=heartbeat_s,
            ),
        )
        self.send(0, commands.Connection.Open(virtual_host=vhost))
        return self.recv()

    def open_channel(self, channel: int) -> None:
        self.send(channel, commands.Channel.Open())
        self.expect(commands.Channel.OpenOk)

    def publish_confirmed(
        self, channel: int, queue: str, bodies: list[bytes], timeout_s: float = 60.0
    ) -> None:
        """Publish persistent messages to `queue` (default exchange) on an open channel, all at
        once, and wait until every one is confirmed: pika's blocking channel would wait for
        each confirm before sending the next message."""
        self.send(channel, commands.Confirm.Select())
        self.expect(commands.Confirm.SelectOk)
        persistent = commands.Basic.Properties(delivery_mode=2)
        self.send_bytes(
            b"".join(
                frame.marshal(commands.Basic.Publish(exchange="", routing_key=queue), channel)
                + frame.marshal(header.ContentHeader(0, len(body), persistent), channel)
                + frame.marshal(content_body.ContentBody(body), channel)
                for body in bodies
            )
        )
        confirmed = 0
        while confirmed < len(bodies):
            _, ack = self.expect(commands.Basic.Ack, timeout_s)
            confirmed = ack.delivery_tag

    def expect_connection_close(self, timeout_s: float | None = None) -> commands.Connection.Close:
        """Wait for connection.close (skipping other frames), answer close-ok, return it."""
        while True:
            channel, value = self.recv(timeout_s)
            if isinstance(value, commands.Connection.Close):
                assert channel == 0
                self.send(0, commands.Connection.CloseOk())
                return value

    def expect_channel_close(self, channel: int) -> commands.Channel.Close:
        got, value = self.expect(commands.Channel.Close)
        assert got == channel
        self.send(channel, commands.Channel.CloseOk())
        return value

    def wait_closed(self, timeout_s: float) -> None:
        """Read (and drop) everything until the broker closes the socket; fail on timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self._fill(deadline)
            except (Closed, ConnectionResetError):
                return
            self.buffer = b""


def offered_mechanisms(host: str, port: int, tls: ssl.SSLContext | None = None) -> list[str]:
    """The SASL mechanisms of the broker's connection.start, in its order. With TLS 1.3 a
    client certificate the broker refuses shows as Closed here (the client's side of the
    handshake was done), else as ssl.SSLError."""
    with RawClient(host, port, tls=tls) as client:
        client.send_bytes(PROTOCOL_HEADER)
        _, start = client.expect(commands.Connection.Start)
    return start.mechanisms.split()


def raw_frame(frame_type: int, channel: int, payload: bytes, end: bytes = FRAME_END) -> bytes:
    """One frame with any type, channel, payload and end byte, valid or not."""
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + end

"""A minimal AMQP 0-9-1 client connection for the load generator, on ``asyncio.Protocol``.

It does just what a benchmark needs and nothing a broker could be slow to notice: the
handshake (PLAIN), synchronous methods one at a time per channel (pamqp, off the hot path),
and a hook per channel (``ChannelRole``) that sees every frame of that channel first, so the
publisher and consumer roles parse their own hot frames without building method objects.

Anything the broker closes (connection.close, channel.close, a server-sent basic.cancel, a
lost socket) fails the connection with a ``BenchError`` that carries the broker's reply code
and text, and every waiter and role hears about it: a benchmark stops at once instead of
hanging.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable
from typing import Any, Protocol

from pamqp import commands

import warrenmq
from warrenmq.amqp import frames

from . import wire

CLIENT_PROPERTIES: dict[str, Any] = {
    "product": "warren bench",
    "version": warrenmq.__version__,
    "platform": "Python/asyncio",
    "capabilities": {
        "authentication_failure_close": True,
        "basic.nack": True,
        "connection.blocked": True,
        "consumer_cancel_notify": True,
        "publisher_confirms": True,
    },
}
# What we ask for at tune time; the broker's own limits win when lower.
CHANNEL_MAX = 64
FRAME_BYTES_MAX = 131_072
CLOSE_TIMEOUT_S = 5.0
REPLY_SUCCESS = 200
_CONNECTION_CLOSE = commands.Connection.Close.index
_CONNECTION_CLOSE_OK = commands.Connection.CloseOk.index
_CONNECTION_BLOCKED = commands.Connection.Blocked.index
_CONNECTION_UNBLOCKED = commands.Connection.Unblocked.index
_CHANNEL_CLOSE = commands.Channel.Close.index
_BASIC_CANCEL = commands.Basic.Cancel.index
_BASIC_RETURN = commands.Basic.Return.index


class BenchError(Exception):
    """The benchmark cannot go on: the broker refused something or the connection broke."""

    def __init__(self, text: str, reply_code: int | None = None) -> None:
        super().__init__(text if reply_code is None else f"{reply_code} {text}")
        self.reply_code = reply_code


class ChannelRole(Protocol):
    """What a connection calls on the role (publisher, consumer) that owns a channel."""

    def frame(self, frame_type: int, payload: bytes) -> bool:
        """Handle a frame of this channel; False passes it to the connection's general path."""

    def read_done(self) -> None:
        """Every frame of one socket read has been handled (time to send acks, refill...)."""

    def writable(self) -> None:
        """The transport's write buffer drained below its low-water mark."""

    def fail(self, error: BenchError) -> None:
        """The connection or channel is gone; stop and report ``error``."""


def client_context(address: wire.BrokerAddress) -> ssl.SSLContext | None:
    """The TLS context of an amqps address (None for amqp): the broker verified against the
    URL's CA bundle, the client certificate presented when the URL names one."""
    if address.tls is None:
        return None
    files = dict(address.tls)
    context = ssl.create_default_context(cafile=files.get("cacertfile"))
    if "certfile" in files:
        context.load_cert_chain(files["certfile"], files.get("keyfile"))
    return context


class ClientConnection(asyncio.Protocol):
    """One AMQP connection: ``await ClientConnection.open(address)``, then channels and roles."""

    def __init__(self, address: wire.BrokerAddress) -> None:
        self.address = address
        self.frame_max = frames.FRAME_MIN_BYTES
        self.channel_max = 0
        self.heartbeat_s = 0
        self.blocked_count = 0
        self.returned_count = 0
        self.writing_paused = False
        self.error: BenchError | None = None
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._buffer = b""
        self._roles: dict[int, ChannelRole] = {}
        # One outstanding synchronous method per channel: (accepted reply ids, its future).
        self._waiters: dict[int, tuple[frozenset[int], asyncio.Future]] = {}
        self._heartbeat_timer: asyncio.TimerHandle | None = None
        self._next_channel = 1

    @classmethod
    async def open(cls, address: wire.BrokerAddress) -> ClientConnection:
        """Connect, log in with PLAIN, tune, and open the address's vhost."""
        loop = asyncio.get_running_loop()
        try:
            _, connection = await loop.create_connection(
                lambda: cls(address), address.host, address.port, ssl=client_context(address)
            )
        except OSError as error:
            raise BenchError(f"cannot connect to {address.display()}: {error}") from error
        try:
            await connection._handshake()
        except BaseException:
            connection.abort()
            raise
        return connection

    async def _handshake(self) -> None:
        start = self._expect(0, commands.Connection.Start)
        self.write(frames.PROTOCOL_HEADER)
        start_method = await start
        mechanisms = start_method.mechanisms.split()
        if "PLAIN" not in mechanisms:
            raise BenchError(f"broker offers no PLAIN login (mechanisms: {mechanisms})")
        tune = self._expect(0, commands.Connection.Tune)
        self.send_method(
            0,
            commands.Connection.StartOk(
                client_properties=CLIENT_PROPERTIES,
                mechanism="PLAIN",
                response=f"\0{self.address.username}\0{self.address.password}",
            ),
        )
        tune_method = await tune
        self.channel_max = min(tune_method.channel_max or CHANNEL_MAX, CHANNEL_MAX)
        self.frame_max = min(tune_method.frame_max or FRAME_BYTES_MAX, FRAME_BYTES_MAX)
        self.heartbeat_s = tune_method.heartbeat
        self.send_method(
            0,
            commands.Connection.TuneOk(
                channel_max=self.channel_max, frame_max=self.frame_max, heartbeat=self.heartbeat_s
            ),
        )
        await self.call(
            0, commands.Connection.Open(virtual_host=self.address.vhost), commands.Connection.OpenOk
        )
        if self.heartbeat_s:
            self._schedule_heartbeat()

    def _schedule_heartbeat(self) -> None:
        # Half the interval, as clients do: the broker drops a silent client after two.
        self._heartbeat_timer = self._loop.call_later(self.heartbeat_s / 2, self._send_heartbeat)

    def _send_heartbeat(self) -> None:
        if self._transport is None or self._transport.is_closing():
            return
        self._transport.write(frames.HEARTBEAT_FRAME)
        self._schedule_heartbeat()

    # -- channels and synchronous methods ------------------------------------------------

    async def open_channel(self) -> int:
        """Open the next free channel number and return it."""
        channel = self._next_channel
        if channel > self.channel_max:
            raise BenchError(f"channel_max {self.channel_max} reached")
        self._next_channel += 1
        await self.call(channel, commands.Channel.Open(), commands.Channel.OpenOk)
        return channel

    def attach(self, channel: int, role: ChannelRole) -> None:
        """Route the channel's frames to ``role`` first."""
        assert channel not in self._roles, channel
        self._roles[channel] = role

    def detach(self, channel: int) -> None:
        self._roles.pop(channel, None)

    async def call(self, channel: int, method: Any, *replies: type) -> Any:
        """Send a synchronous method and return the broker's reply (one of ``replies``)."""
        reply = self._expect(channel, *replies)
        self.send_method(channel, method)
        return await reply

    def _expect(self, channel: int, *replies: type) -> asyncio.Future:
        if self.error is not None:
            raise self.error
        assert channel not in self._waiters, f"channel {channel} already awaits a reply"
        future = self._loop.create_future()
        self._waiters[channel] = (frozenset(reply.index for reply in replies), future)
        return future

    def send_method(self, channel: int, method: Any) -> None:
        self.write(frames.encode_method(channel, method))

    def write(self, data: bytes) -> None:
        if self.error is not None:
            raise self.error
        assert self._transport is not None
        self._transport.write(data)

    async def close(self) -> None:
        """connection.close, then wait (bounded) for close-ok; safe to call after a failure."""
        if self._transport is None or self._transport.is_closing():
            return
        if self.error is None:
            try:
                await asyncio.wait_for(
                    self.call(
                        0,
                        commands.Connection.Close(
                            reply_code=REPLY_SUCCESS,
                            reply_text="bench done",
                            class_id=0,
                            method_id=0,
                        ),
                        commands.Connection.CloseOk,
                    ),
                    CLOSE_TIMEOUT_S,
                )
            except (TimeoutError, BenchError):
                pass
        self.abort()

    def abort(self) -> None:
        if self._heartbeat_timer is not None:
            self._heartbeat_timer.cancel()
        if self._transport is not None:
            self._transport.close()

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport

    def connection_lost(self, exc: Exception | None) -> None:
        if self._heartbeat_timer is not None:
            self._heartbeat_timer.cancel()
        reason = f": {exc}" if exc is not None else ""
        self._fail(BenchError(f"connection to {self.address.display()} lost{reason}"))

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        for role in list(self._roles.values()):
            role.writable()

    def data_received(self, data: bytes) -> None:
        if self.error is not None:
            return
        if self._buffer:
            data = self._buffer + data
        if data[:4] == b"AMQP":
            self._fail(BenchError(f"broker refused the protocol version, answering {data[:8]!r}"))
            return
        try:
            received, self._buffer = wire.split_frames(data, self.frame_max)
        except wire.FrameError as error:
            self._fail(BenchError(f"broker sent a malformed frame: {error}"))
            return
        roles = self._roles
        for frame_type, channel, payload in received:
            role = roles.get(channel)
            if role is not None and role.frame(frame_type, payload):
                continue
            self._general_frame(frame_type, channel, payload)
            if self.error is not None:
                return
        for role in list(roles.values()):
            role.read_done()

    def _general_frame(self, frame_type: int, channel: int, payload: bytes) -> None:
        if frame_type == frames.FRAME_HEARTBEAT:
            return
        if frame_type != frames.FRAME_METHOD:
            # Content of a basic.return or of a delivery on a channel without a consumer role.
            return
        identifier = wire.method_id(payload)
        waiter = self._waiters.get(channel)
        if waiter is not None and identifier in waiter[0]:
            del self._waiters[channel]
            try:
                method = frames.decode_method(identifier >> 16, identifier & 0xFFFF, payload[4:])
            except (KeyError, ValueError) as error:
                waiter[1].set_exception(BenchError(f"cannot decode the broker's reply: {error}"))
                return
            if not waiter[1].done():
                waiter[1].set_result(method)
            return
        if identifier == _CONNECTION_CLOSE:
            close = frames.decode_method(identifier >> 16, identifier & 0xFFFF, payload[4:])
            if self._transport is not None:
                self._transport.write(frames.encode_method(0, commands.Connection.CloseOk()))
            self._fail(
                BenchError(f"broker closed the connection: {close.reply_text}", close.reply_code)
            )
            self.abort()
        elif identifier == _CONNECTION_CLOSE_OK:
            self.abort()
        elif identifier == _CONNECTION_BLOCKED:
            self.blocked_count += 1
        elif identifier == _CONNECTION_UNBLOCKED:
            pass
        elif identifier == _CHANNEL_CLOSE:
            close = frames.decode_method(identifier >> 16, identifier & 0xFFFF, payload[4:])
            self._fail(
                BenchError(f"broker closed channel {channel}: {close.reply_text}", close.reply_code)
            )
            self.abort()
        elif identifier == _BASIC_CANCEL:
            self._fail(
                BenchError(f"broker cancelled the consumer on channel {channel} (queue deleted?)")
            )
            self.abort()
        elif identifier == _BASIC_RETURN:
            self.returned_count += 1
        else:
            self._fail(
                BenchError(
                    f"unexpected method {identifier >> 16}.{identifier & 0xFFFF} "
                    f"on channel {channel}"
                )
            )
            self.abort()

    def _fail(self, error: BenchError) -> None:
        if self.error is not None:
            return
        self.error = error
        waiters = list(self._waiters.values())
        self._waiters.clear()
        for _, future in waiters:
            if not future.done():
                future.set_exception(error)
        for role in list(self._roles.values()):
            role.fail(error)


async def close_all(connections: Iterable[ClientConnection]) -> None:
    """Close every connection, each bounded by CLOSE_TIMEOUT_S, in parallel."""
    await asyncio.gather(*(connection.close() for connection in connections))

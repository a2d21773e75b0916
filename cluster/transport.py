"""The inter-node transport: length-prefixed frames over TCP, between Raft nodes.

Each frame is a 4-byte big-endian payload length followed by the payload (for Raft, the bytes
of `messages.encode_message`). The frame codec (`encode_frame`, `FrameDecoder`) is sans-I/O;
`PeerTransport` is the asyncio shell around it.

Every node dials every peer and sends only on the connection it dialled; the connections a
node accepts only receive. So each ordered pair (src, dst) has exactly one TCP stream and
there is never a race over which of two crossing connections wins. A dialler that loses
its connection redials with exponential backoff and jitter. The set of peers may change at
runtime (`set_addresses`): members join, move and leave.

Both ends prove the cluster secret before any frame of Raft's crosses (`auth`): the listener
sends a fresh nonce, the dialler answers with its node id, its own nonce and its proof over
the listener's, and the listener's welcome is its proof over the dialler's nonce. Until
then a connection takes only handshake-sized frames, and one that has not proved itself
within `handshake_timeout_s` is closed; a dialler refused redials with its backoff. Without
this anyone who reaches the port could append to the metadata log (a user, a permission),
or read it. As on the forwarding link, a relaying man in the middle is not stopped: that
needs TLS.

Raft tolerates lost messages (it retries on heartbeats and timeouts), so the transport never
waits: a frame for a peer that is not connected, or whose socket buffer is over its bound,
is dropped and counted. That bounds memory when a peer is slow or gone, and keeps the host
loop from ever blocking on the network. Heartbeats go over the same TCP streams as appends:
a UDP side channel (asyncio-dgram) would save little on loopback and would reorder
heartbeats against appends, which the core would then have to reason about.
"""

from __future__ import annotations

import asyncio
import logging
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass

from . import auth

FRAME_HEADER = struct.Struct(">I")
FRAME_BYTES_MAX_DEFAULT = 64 << 20
_HELLO = struct.Struct(f">Q{auth.NONCE_BYTES}s{auth.PROOF_BYTES}s")
HANDSHAKE_FRAME_BYTES = _HELLO.size
"""The largest frame either end takes before the other has proved the secret."""

log = logging.getLogger("warrenmq.cluster.transport")


class FrameTooLarge(ValueError):
    """A peer announced a frame longer than the configured bound."""


def encode_frame(payload: bytes) -> bytes:
    return FRAME_HEADER.pack(len(payload)) + payload


class FrameDecoder:
    """Turns a byte stream into whole frames: feed it what the socket read, get payloads back."""

    __slots__ = ("_buffer", "frame_bytes_max")

    def __init__(self, frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT) -> None:
        assert frame_bytes_max > 0
        self._buffer = bytearray()
        self.frame_bytes_max = frame_bytes_max

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer)

    def feed(self, data: bytes) -> list[bytes]:
        """All frames completed by `data`, in order; a partial frame stays buffered."""
        buffer = self._buffer
        buffer += data
        frames: list[bytes] = []
        view = memoryview(buffer)
        position = 0
        end = len(buffer)
        header_size = FRAME_HEADER.size
        try:
            while end - position >= header_size:
                (length,) = FRAME_HEADER.unpack_from(view, position)
                if length > self.frame_bytes_max:
                    raise FrameTooLarge(f"frame of {length} bytes exceeds {self.frame_bytes_max}")
                if end - position - header_size < length:
                    break
                start = position + header_size
                frames.append(bytes(view[start : start + length]))
                position = start + length
        finally:
            view.release()
        if position:
            del buffer[:position]
        return frames


class _InboundProtocol(asyncio.Protocol):
    """An accepted connection: once the dialler proved the secret, decodes frames and hands
    each payload to the owner."""

    def __init__(self, owner: PeerTransport) -> None:
        self._owner = owner
        self._decoder = FrameDecoder(HANDSHAKE_FRAME_BYTES)
        self._transport: asyncio.Transport | None = None
        self._nonce = auth.nonce()
        self._proven = False
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._owner._inbound.add(transport)  # type: ignore[arg-type]
        transport.write(encode_frame(self._nonce))  # type: ignore[attr-defined]
        self._deadline = asyncio.get_running_loop().call_later(
            self._owner.handshake_timeout_s, self._refuse, "no hello in time"
        )

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._decoder.feed(data)
            on_frame = self._owner.on_frame
            for frame in frames:
                if self._proven:
                    on_frame(frame)
                elif not self._hello(frame):
                    return
        except ValueError:
            # A malformed frame or message means the stream is out of step; only a new
            # connection can resynchronise it.
            self._owner.stats.frames_rejected += 1
            assert self._transport is not None
            self._transport.abort()

    def _hello(self, frame: bytes) -> bool:
        owner = self._owner
        if len(frame) != _HELLO.size:
            self._refuse("no hello")
            return False
        peer, peer_nonce, mac = _HELLO.unpack(frame)
        if not auth.proof_valid(owner.secret, auth.RAFT_DIALLER, self._nonce, peer, mac):
            self._refuse(f"node {peer}'s hello does not prove the cluster secret")
            return False
        self._proven = True
        assert self._deadline is not None and self._transport is not None
        self._deadline.cancel()
        self._decoder.frame_bytes_max = owner.frame_bytes_max
        welcome = auth.proof(owner.secret, auth.RAFT_LISTENER, peer_nonce, owner.node_id)
        self._transport.write(encode_frame(welcome))
        return True

    def _refuse(self, reason: str) -> None:
        self._owner.stats.handshakes_refused += 1
        if self._transport is not None and not self._transport.is_closing():
            peer = self._transport.get_extra_info("peername")
            log.warning("raft connection from %s refused: %s", peer, reason)
            self._transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        if self._transport is not None:
            self._owner._inbound.discard(self._transport)


class _OutboundProtocol(asyncio.Protocol):
    """A dialled connection: proves the secret and checks the listener's proof, then is
    send-only; it tells its peer link when it is proven and when it dies."""

    def __init__(
        self,
        owner: PeerTransport,
        peer: int,
        proven: asyncio.Future[None],
        closed: asyncio.Future[None],
    ) -> None:
        self._owner = owner
        self._peer = peer
        self._proven = proven
        self._closed = closed
        self._decoder = FrameDecoder(HANDSHAKE_FRAME_BYTES)
        self._nonce = auth.nonce()
        self._transport: asyncio.Transport | None = None
        self._challenged = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        # Peers never answer on a connection we dialled, past the handshake; replies come on
        # their own dial.
        if self._proven.done():
            return
        assert self._transport is not None
        try:
            frames = self._decoder.feed(data)
        except ValueError:
            self._transport.abort()
            return
        owner = self._owner
        for frame in frames:
            if not self._challenged and len(frame) == auth.NONCE_BYTES:
                self._challenged = True
                mac = auth.proof(owner.secret, auth.RAFT_DIALLER, frame, owner.node_id)
                self._transport.write(encode_frame(_HELLO.pack(owner.node_id, self._nonce, mac)))
            elif self._challenged and auth.proof_valid(
                owner.secret, auth.RAFT_LISTENER, self._nonce, self._peer, frame
            ):
                self._proven.set_result(None)
                return
            else:
                owner.stats.handshakes_refused += 1
                log.warning(
                    "raft connection to node %d refused: it does not prove the cluster secret",
                    self._peer,
                )
                self._transport.abort()
                return

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._closed.done():
            self._closed.set_result(None)


@dataclass
class TransportStats:
    frames_sent: int = 0
    frames_dropped: int = 0
    frames_rejected: int = 0
    handshakes_refused: int = 0
    connects: int = 0


class PeerTransport:
    """Frames to and from the other nodes of one Raft group.

    `on_frame(payload)` is called for each frame received, in the order each peer sent them;
    it may raise ValueError to reject the connection the frame came on. `secret`: what every
    connection proves, both ways (empty proves only that both ends run this protocol).
    """

    def __init__(
        self,
        node_id: int,
        addresses: dict[int, tuple[str, int]],
        on_frame: Callable[[bytes], None],
        *,
        secret: str = "",
        handshake_timeout_s: float = 5.0,
        frame_bytes_max: int = FRAME_BYTES_MAX_DEFAULT,
        send_buffer_bytes_max: int = 32 << 20,
        backoff_s_min: float = 0.02,
        backoff_s_max: float = 1.0,
        rng: random.Random | None = None,
    ) -> None:
        assert node_id in addresses, "a node listens on its own entry of the address map"
        assert 0 < backoff_s_min <= backoff_s_max
        self.node_id = node_id
        self.addresses = dict(addresses)
        self.on_frame = on_frame
        self.secret = secret
        self.handshake_timeout_s = handshake_timeout_s
        self.frame_bytes_max = frame_bytes_max
        self.send_buffer_bytes_max = send_buffer_bytes_max
        self.backoff_s_min = backoff_s_min
        self.backoff_s_max = backoff_s_max
        self.stats = TransportStats()
        self._rng = rng if rng is not None else random.Random(node_id)
        self._server: asyncio.AbstractServer | None = None
        self._inbound: set[asyncio.Transport] = set()
        self._outbound: dict[int, asyncio.Transport] = {}
        self._pending: dict[int, list[bytes]] = {}
        self._pending_bytes: dict[int, int] = {}
        self._flush_scheduled = False
        self._dialers: dict[int, asyncio.Task[None]] = {}
        # peer -> the number of the connection dialled to it (stats.connects at the time)
        self._links: dict[int, int] = {}
        self._closing = False

    @property
    def listen_port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    def connected(self, peer: int) -> bool:
        return peer in self._outbound

    def link(self, peer: int) -> int | None:
        """The number of the live connection to `peer`, None if there is none. A frame
        queued on one connection was surely delivered or lost by the time another carries
        a different number."""
        return self._links.get(peer) if peer in self._outbound else None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        host, port = self.addresses[self.node_id]
        self._server = await loop.create_server(
            lambda: _InboundProtocol(self), host, port, reuse_address=True
        )
        for peer in self.addresses:
            if peer != self.node_id:
                self._dialers[peer] = loop.create_task(self._dial_forever(peer))

    def set_addresses(self, addresses: dict[int, tuple[str, int]]) -> None:
        """Dial exactly the peers of `addresses` from now on: a new one is dialled, a moved
        one redialled at its new address, and a dropped one's connection closes once what
        was queued for it is written. This node's own entry (its listener) stays."""
        addresses = {**addresses, self.node_id: self.addresses[self.node_id]}
        self.flush()
        started = self._server is not None and not self._closing
        for peer, address in addresses.items():
            if peer == self.node_id or self.addresses.get(peer) == address:
                continue
            self._stop_dialing(peer)
            self.addresses[peer] = address
            if started:
                self._dialers[peer] = asyncio.get_running_loop().create_task(
                    self._dial_forever(peer)
                )
        for peer in [p for p in self.addresses if p not in addresses]:
            self._stop_dialing(peer)
            del self.addresses[peer]

    def _stop_dialing(self, peer: int) -> None:
        task = self._dialers.pop(peer, None)
        if task is not None:
            task.cancel()
        # Close, not abort: the frames written to it still leave.
        transport = self._outbound.pop(peer, None)
        if transport is not None:
            transport.close()

    def send(self, dst: int, payload: bytes) -> bool:
        """Queue one frame for `dst`; False if it was dropped (peer down or backed up)."""
        transport = self._outbound.get(dst)
        if transport is None:
            self.stats.frames_dropped += 1
            return False
        queued = self._pending_bytes.get(dst, 0)
        if transport.get_write_buffer_size() + queued > self.send_buffer_bytes_max:
            self.stats.frames_dropped += 1
            return False
        self._pending.setdefault(dst, []).append(encode_frame(payload))
        self._pending_bytes[dst] = queued + len(payload) + FRAME_HEADER.size
        if not self._flush_scheduled:
            # One write per peer per loop iteration, however many frames the host queued.
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)
        return True

    def flush(self) -> None:
        self._flush_scheduled = False
        pending, self._pending = self._pending, {}
        self._pending_bytes.clear()
        for dst, frames in pending.items():
            transport = self._outbound.get(dst)
            if transport is None or transport.is_closing():
                self.stats.frames_dropped += len(frames)
                continue
            transport.write(b"".join(frames))
            self.stats.frames_sent += len(frames)

    async def _dial_forever(self, peer: int) -> None:
        loop = asyncio.get_running_loop()
        host, port = self.addresses[peer]
        backoff_s = self.backoff_s_min
        while not self._closing:
            proven: asyncio.Future[None] = loop.create_future()
            closed: asyncio.Future[None] = loop.create_future()
            try:
                transport, _ = await loop.create_connection(
                    lambda proven=proven, closed=closed: _OutboundProtocol(
                        self, peer, proven, closed
                    ),
                    host,
                    port,
                )
            except OSError:
                transport = None
            if transport is not None:
                try:
                    await asyncio.wait(
                        (proven, closed),
                        timeout=self.handshake_timeout_s,
                        return_when=asyncio.FIRST_COMPLETED,
                    )
                finally:
                    if not proven.done():
                        transport.abort()
            if not proven.done():
                # Unreachable or refused: redial after a backoff.
                await asyncio.sleep(backoff_s * (0.5 + self._rng.random()))
                backoff_s = min(backoff_s * 2, self.backoff_s_max)
                continue
            self.stats.connects += 1
            backoff_s = self.backoff_s_min
            self._outbound[peer] = transport  # type: ignore[assignment]
            self._links[peer] = self.stats.connects
            try:
                await closed
            finally:
                if self._outbound.get(peer) is transport:
                    del self._outbound[peer]
                transport.close()

    def drop_connections(self) -> None:
        """Abort every live connection (tests use this to simulate a network blip)."""
        for transport in list(self._outbound.values()) + list(self._inbound):
            transport.abort()

    async def close(self) -> None:
        self._closing = True
        dialers = list(self._dialers.values())
        for task in dialers:
            task.cancel()
        for task in dialers:
            try:
                await task
            except asyncio.CancelledError:
                pass
        self._dialers.clear()
        for transport in list(self._outbound.values()) + list(self._inbound):
            transport.abort()
        self._outbound.clear()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

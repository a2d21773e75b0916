"""One end of a link's stream: frames in, one coalesced write out per loop pass.

Both ends (`entry.EntryLink`, which dials, and `owner.OwnerLink`, which the owner's AMQP
listener hands the socket to) are this protocol with their own `received`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from warrenmq.cluster.transport import FrameDecoder, encode_frame

from . import wire

log = logging.getLogger("warrenmq.server.forward")


class LinkError(Exception):
    """The link to a node went down (or never came up) with work outstanding on it."""


class FramedLink(asyncio.Protocol):
    def __init__(self, frame_bytes_max: int) -> None:
        self.transport: asyncio.Transport | None = None
        self._decoder = FrameDecoder(frame_bytes_max)
        self._out: list[bytes] = []
        self._flush_scheduled = False
        self.writable = True
        """False while the socket's write buffer is over its high mark."""
        self.held = False
        """True while what is queued waits for the handshake to prove the other end."""
        self.closed = False

    # -- asyncio --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            for frame in self._decoder.feed(data):
                kind, fields = wire.decode(frame)
                self.received(kind, fields)
                if self.closed:
                    return
        except ValueError as error:
            # Out of step: only a new connection can resynchronise the stream.
            log.error("link %s: %s; closing it", self.name, error)
            self.abort()

    def pause_writing(self) -> None:
        self.writable = False

    def resume_writing(self) -> None:
        self.writable = True
        self.writable_again()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed:
            return
        self.closed = True
        self.lost(f"link to {self.name} lost" + (f": {exc}" if exc else ""))

    # -- for the two ends ---------------------------------------------------------------------

    @property
    def name(self) -> str:
        return "?"

    def received(self, kind: wire.Kind, fields: list[Any]) -> None:
        raise NotImplementedError

    def lost(self, reason: str) -> None:
        """The stream is gone: fail or return everything outstanding on it."""
        raise NotImplementedError

    def writable_again(self) -> None:
        """The socket drained below its low mark."""

    def send(self, kind: wire.Kind, *fields: Any) -> None:
        """Queue one message; everything queued in a loop pass goes out in one write."""
        if self.closed:
            return
        self._out.append(encode_frame(wire.encode(kind, *fields)))
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def send_now(self, kind: wire.Kind, *fields: Any) -> None:
        """Write one handshake message ahead of everything queued."""
        if self.transport is not None and not self.closed:
            self.transport.write(encode_frame(wire.encode(kind, *fields)))

    def flush(self) -> None:
        self._flush_scheduled = False
        if self.transport is None or self.closed or self.held:
            # Still connecting or proving: what is queued goes out once proven.
            return
        out, self._out = self._out, []
        if out:
            self.transport.write(b"".join(out))

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()
        else:
            self.connection_lost(None)

"""The AMQP protocol machine without sockets: frames built by hand, a connection past its
handshake, and feeding it bytes."""

from __future__ import annotations

import struct

from warrenmq.amqp import Connection, ConnectionConfig, testing

# Written out rather than taken from warrenmq.amqp.frames: a frame built by the codec under
# test could not catch that codec's mistakes.
FRAME_END = b"\xce"


def raw_frame(frame_type: int, channel: int, payload: bytes, end: bytes = FRAME_END) -> bytes:
    """One AMQP frame by hand (pamqp's frames are always valid): type, channel, size, end."""
    return struct.pack(">BHI", frame_type, channel, len(payload)) + payload + end


def connected(channels=(1,), **settings) -> Connection:
    """A Connection past its handshake (tuned as `settings` allow), with `channels` open."""
    conn = Connection(ConnectionConfig(**settings))
    testing.open_connection(
        conn,
        frame_max=settings.get("frame_bytes_max", 131072),
        channel_max=settings.get("channel_max", 2047),
    )
    for channel in channels:
        testing.open_channel(conn, channel)
    return conn


def feed(conn: Connection, *chunks: bytes, now: float = 1.0) -> list:
    """Hand `chunks` to the machine; return every event it has then."""
    for chunk in chunks:
        conn.receive_data(chunk, now)
    return testing.drain(conn)

"""Drive a ``Connection`` the way a client would, with frames built by pamqp.

For tests (ours and the broker's): the client side is pamqp, never this package's own codec,
so a bug in our codec cannot cancel itself out.
"""

from pamqp import body as pamqp_body
from pamqp import commands
from pamqp import frame as pamqp_frame
from pamqp import header as pamqp_header
from pamqp import heartbeat as pamqp_heartbeat

from . import events, frames

CLIENT_CAPABILITIES = {
    "authentication_failure_close": True,
    "basic.nack": True,
    "connection.blocked": True,
    "consumer_cancel_notify": True,
    "publisher_confirms": True,
}


def marshal(channel, *methods):
    """Bytes for pamqp frames (methods, headers, bodies, heartbeats) on one channel."""
    return b"".join(pamqp_frame.marshal(m, channel) for m in methods)


def parse(data):
    """[(channel, pamqp frame)] for every frame in ``data`` (which must hold whole frames)."""
    out = []
    offset = 0
    if data[:4] == b"AMQP":
        out.append((0, data[:8]))
        offset = 8
    while offset < len(data):
        consumed, channel, frame = pamqp_frame.unmarshal(data[offset:])
        out.append((channel, frame))
        offset += consumed
    return out


def drain(conn):
    """Every event the connection has for us now."""
    out = []
    while (event := conn.next_event()) is not None:
        out.append(event)
    return out


def start_ok(username="guest", password="guest", mechanism="PLAIN", capabilities=None):
    response = f"\0{username}\0{password}" if mechanism == "PLAIN" else ""
    properties = {"product": "test", "capabilities": capabilities or dict(CLIENT_CAPABILITIES)}
    return commands.Connection.StartOk(
        client_properties=properties, mechanism=mechanism, response=response
    )


def open_connection(
    conn, now=0.0, frame_max=131072, channel_max=2047, heartbeat=60, vhost="/", capabilities=None
):
    """Run the whole handshake, accepting login and vhost; returns the server's bytes."""
    conn.receive_data(frames.PROTOCOL_HEADER, now)
    conn.receive_data(marshal(0, start_ok(capabilities=capabilities)), now)
    requested = drain(conn)
    assert [type(e) for e in requested] == [events.AuthenticationRequested], requested
    conn.accept_login()
    conn.receive_data(
        marshal(
            0,
            commands.Connection.TuneOk(
                channel_max=channel_max, frame_max=frame_max, heartbeat=heartbeat
            ),
        ),
        now,
    )
    conn.receive_data(marshal(0, commands.Connection.Open(virtual_host=vhost)), now)
    requested = drain(conn)
    assert [type(e) for e in requested] == [events.VhostAccessRequested], requested
    conn.accept_vhost()
    return conn.data_to_send()


def open_channel(conn, channel, now=0.0):
    conn.receive_data(marshal(channel, commands.Channel.Open()), now)
    opened = drain(conn)
    assert opened == [events.ChannelOpened(channel)], opened
    return conn.data_to_send()


def publish(
    channel, exchange, routing_key, body, properties=None, frame_max=131072, mandatory=False
):
    """basic.publish + content header + body frames split at frame_max, built by pamqp."""
    chunk_bytes_max = frame_max - frames.FRAME_OVERHEAD_BYTES
    parts = [
        commands.Basic.Publish(exchange=exchange, routing_key=routing_key, mandatory=mandatory),
        pamqp_header.ContentHeader(
            body_size=len(body), properties=properties or commands.Basic.Properties()
        ),
    ]
    parts.extend(
        pamqp_body.ContentBody(body[i : i + chunk_bytes_max])
        for i in range(0, len(body), chunk_bytes_max)
    )
    return marshal(channel, *parts)


def heartbeat():
    return pamqp_heartbeat.Heartbeat.marshal()

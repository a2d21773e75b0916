"""Hostile input: random and mutated byte streams never raise out of the machine.

After a valid handshake, whatever the client sends either produces events, or a
channel.close with a soft code, or a connection.close with a hard (5xx) code. What the
machine writes back is always well-formed AMQP (pamqp parses it).
"""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands

from warrenmq.amqp import Connection, ConnectionConfig, events, replies, testing

EVENT_TYPES = (
    events.AuthenticationRequested,
    events.VhostAccessRequested,
    events.ChannelOpened,
    events.ChannelClosed,
    events.FlowChanged,
    events.MethodReceived,
    events.MessagePublished,
    events.Acked,
    events.Nacked,
    events.Rejected,
    events.ConnectionClosed,
)


def valid_session():
    """A realistic client stream after the handshake: channels, declares, publishes, acks."""
    return b"".join(
        [
            testing.marshal(1, commands.Channel.Open()),
            testing.marshal(2, commands.Channel.Open()),
            testing.marshal(
                1, commands.Queue.Declare(queue="jobs", durable=True, arguments={"x-max-length": 5})
            ),
            testing.marshal(1, commands.Confirm.Select()),
            testing.publish(
                1,
                "",
                "jobs",
                b"a" * 5000,
                commands.Basic.Properties(delivery_mode=2, headers={"k": "v"}),
                frame_max=4096,
            ),
            testing.publish(2, "amq.topic", "x.y", b"", None, frame_max=4096),
            testing.marshal(2, commands.Basic.Qos(prefetch_count=10)),
            testing.marshal(2, commands.Basic.Consume(queue="jobs", consumer_tag="c1")),
            testing.marshal(
                2,
                commands.Basic.Ack(delivery_tag=1, multiple=True),
                commands.Basic.Nack(delivery_tag=2),
                commands.Basic.Reject(delivery_tag=3),
            ),
            testing.marshal(2, commands.Channel.Flow(active=True)),
            testing.marshal(
                1, commands.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0)
            ),
            testing.heartbeat(),
            testing.marshal(
                0,
                commands.Connection.Close(
                    reply_code=200, reply_text="bye", class_id=0, method_id=0
                ),
            ),
        ]
    )


VALID = valid_session()


def opened():
    conn = Connection(ConnectionConfig(frame_bytes_max=4096, message_bytes_max=8000))
    testing.open_connection(conn, frame_max=4096, channel_max=8)
    return conn


def run(conn, pieces):
    """Feed the pieces; return (events, server frames). Any exception fails the test."""
    seen = []
    out = b""
    now = 1.0
    for piece in pieces:
        conn.receive_data(piece, now)
        while (event := conn.next_event()) is not None:
            seen.append(event)
        now += 1.0
        event = conn.tick(now)
        if event is not None:
            seen.append(event)
        out += conn.data_to_send()
    return seen, testing.parse(out)


def check(seen, sent):
    assert all(isinstance(e, EVENT_TYPES) for e in seen), seen
    closed = [e for e in seen if isinstance(e, events.ConnectionClosed)]
    assert len(closed) <= 1
    for _, frame in sent:
        if isinstance(frame, commands.Connection.Close):
            assert replies.is_hard(frame.reply_code), frame.reply_code
            assert 500 <= frame.reply_code < 600, frame.reply_code
            assert frame.reply_text.startswith(replies.CODE_NAMES[frame.reply_code])
        if isinstance(frame, commands.Channel.Close):
            assert frame.reply_code in replies.SOFT_CODES
    closes = [f for _, f in sent if isinstance(f, commands.Connection.Close)]
    assert len(closes) <= 1
    if closes:
        assert closed and closed[0].reply_code == closes[0].reply_code
    if closed and not closed[0].by_peer:
        assert seen[-1] is closed[0], "no event may follow the connection's end"


def split(data, cuts):
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0] + points, points + [len(data)], strict=True)]


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.binary(min_size=1, max_size=3000), cuts=st.lists(st.integers(0, 3000), max_size=6))
def test_random_bytes_after_handshake(data, cuts):
    conn = opened()
    check(*run(conn, split(data, cuts)))


@st.composite
def mutated(draw):
    data = bytearray(VALID)
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and data:
            data[at] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete" and data:
            del data[at : at + draw(st.integers(1, 16))]
        elif kind == "truncate":
            del data[at:]
    return bytes(data)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(data=mutated(), cuts=st.lists(st.integers(0, 20000), max_size=6))
def test_mutated_sessions_after_handshake(data, cuts):
    conn = opened()
    check(*run(conn, split(data, cuts)))


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(
    prefix=st.sampled_from([b"", b"AMQP\x00\x00\x09\x01"]),
    data=st.binary(max_size=600),
    cuts=st.lists(st.integers(0, 700), max_size=4),
)
def test_random_bytes_during_the_handshake(prefix, data, cuts):
    conn = Connection()
    seen = []
    sent = b""
    for piece in split(prefix + data, cuts):
        conn.receive_data(piece, 0.0)
        while (event := conn.next_event()) is not None:
            seen.append(event)
            if isinstance(event, events.AuthenticationRequested):
                conn.accept_login()
            elif isinstance(event, events.VhostAccessRequested):
                conn.refuse_vhost()
        sent += conn.data_to_send()
    assert all(isinstance(e, EVENT_TYPES) for e in seen)
    if sent[:4] == b"AMQP":
        assert sent == b"AMQP\x00\x00\x09\x01" and conn.finished
    else:
        for _, frame in testing.parse(sent):
            if isinstance(frame, commands.Connection.Close):
                assert frame.reply_code in (403, 530) or 500 <= frame.reply_code < 600


def test_the_unmutated_session_is_clean():
    conn = opened()
    seen, sent = run(conn, [VALID])
    check(seen, sent)
    assert [type(e).__name__ for e in seen] == [
        "ChannelOpened",
        "ChannelOpened",
        "MethodReceived",
        "MessagePublished",
        "MessagePublished",
        "MethodReceived",
        "MethodReceived",
        "Acked",
        "Nacked",
        "Rejected",
        "FlowChanged",
        "ChannelClosed",
        "ConnectionClosed",
    ]
    assert seen[-1].by_peer

"""Connection level: protocol header, capabilities, SASL, vhosts, tuning, heartbeats, framing."""

from __future__ import annotations

import socket
import struct
import time

import pika
import pytest
from pamqp import body, commands, frame, header
from pika_helpers import channel_error
from raw_client import PROTOCOL_HEADER, Closed, RawClient, raw_frame

import amqp

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
LOGIN_REFUSED = (
    "ACCESS_REFUSED - Login was refused using authentication mechanism {}. "
    "For details see the broker logfile."
)


def _py_amqp(broker, **kwargs) -> amqp.Connection:
    kwargs.setdefault("userid", "guest")
    kwargs.setdefault("password", "guest")
    kwargs.setdefault("connect_timeout", 5)
    conn = amqp.Connection(f"{broker.host}:{broker.port}", **kwargs)
    conn.connect()
    return conn


def test_capabilities_announced(broker):
    conn = _py_amqp(broker)
    try:
        capabilities = conn.server_properties["capabilities"]
        for name in CAPABILITIES:
            assert capabilities.get(name) is True, name
    finally:
        conn.close()


@pytest.mark.parametrize(
    "header",
    [b"HTTP/1.1", b"AMQP\x00\x00\x08\x00", b"AMQP\x00\x00\x0a\x00", b"AMQP\x03\x01\x00\x00"],
    ids=["http", "amqp-0-8-0", "amqp-0-10", "amqp-1.0-sasl"],
)
def test_unsupported_protocol_header_answered_with_ours(broker, header):
    with socket.create_connection((broker.host, broker.port), timeout=5) as sock:
        sock.sendall(header)
        reply = b""
        try:
            while data := sock.recv(64):
                reply += data
        except ConnectionResetError:
            # RabbitMQ closes with SO_LINGER 0 (an RST) once the header is out.
            pass
    assert reply == PROTOCOL_HEADER


def test_garbage_after_header_does_not_hurt_other_connections(broker, channel):
    with RawClient(broker.host, broker.port) as raw:
        raw.send_bytes(PROTOCOL_HEADER + b"\x08" * 64)
        raw.wait_closed(5)
    assert channel.queue_declare("", exclusive=True).method.queue


@pytest.mark.parametrize("mechanism", ["PLAIN", "AMQPLAIN"])
def test_login_with_each_mechanism(broker, mechanism):
    conn = _py_amqp(broker, login_method=mechanism)
    try:
        ch = conn.channel()
        queue, _, _ = ch.queue_declare("", exclusive=True)
        assert queue.startswith("amq.gen-")
    finally:
        conn.close()


@pytest.mark.parametrize("mechanism", ["PLAIN", "AMQPLAIN"])
@pytest.mark.parametrize("user,password", [("guest", "wrong"), ("nobody-here", "guest")])
def test_login_refused_closes_with_403(broker, mechanism, user, password):
    with pytest.raises(amqp.exceptions.AccessRefused) as refused:
        _py_amqp(broker, userid=user, password=password, login_method=mechanism)
    assert refused.value.reply_code == 403
    assert refused.value.reply_text == LOGIN_REFUSED.format(mechanism)


def test_login_refused_with_pika(broker):
    params = broker.params(credentials=pika.PlainCredentials("guest", "not-the-password"))
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as refused:
        pika.BlockingConnection(params)
    assert LOGIN_REFUSED.format("PLAIN") in str(refused.value)


def _expect_handshake_refused(raw: RawClient) -> None:
    """Before connection.open RabbitMQ may close without a word (after a 3 s pause that slows
    down guessing); a broker that does send connection.close must not let the client in."""
    try:
        channel, value = raw.recv(timeout_s=10)
    except (Closed, ConnectionResetError):
        return
    assert isinstance(value, commands.Connection.Close), value
    raw.wait_closed(10)


@pytest.mark.slow
def test_unknown_mechanism_refused(broker):
    with RawClient(broker.host, broker.port) as raw:
        raw.send_bytes(PROTOCOL_HEADER)
        raw.expect(commands.Connection.Start)
        raw.send(0, commands.Connection.StartOk(mechanism="CRAM-MD5", response="x"))
        _expect_handshake_refused(raw)


def test_guest_refused_from_a_remote_address(broker):
    # RabbitMQ's loopback_users default: guest may log in over loopback only.
    if broker.external_host is None:
        pytest.skip("the broker is not reachable on a non-loopback address here")
    with pytest.raises(amqp.exceptions.AccessRefused) as refused:
        conn = amqp.Connection(
            f"{broker.external_host}:{broker.port}",
            userid="guest",
            password="guest",
            login_method="PLAIN",
            connect_timeout=5,
        )
        conn.connect()
    assert refused.value.reply_code == 403
    assert refused.value.reply_text == LOGIN_REFUSED.format("PLAIN")


def test_other_users_may_log_in_remotely(seeded):
    from compat_harness import LIMITED_USER

    if seeded.external_host is None:
        pytest.skip("the broker is not reachable on a non-loopback address here")
    conn = amqp.Connection(
        f"{seeded.external_host}:{seeded.port}",
        userid=LIMITED_USER[0],
        password=LIMITED_USER[1],
        connect_timeout=5,
    )
    conn.connect()
    conn.close()


@pytest.fixture
def loopback_users(seeded):
    """Set loopback_users on the seeded broker for one test; RabbitMQ's default comes back."""
    if seeded.external_host is None:
        pytest.skip("the broker is not reachable on a non-loopback address here")
    yield seeded.set_loopback_users
    seeded.set_loopback_users(("guest",))


def _remote_login(broker, user: str, password: str) -> None:
    conn = amqp.Connection(
        f"{broker.external_host}:{broker.port}",
        userid=user,
        password=password,
        login_method="PLAIN",
        connect_timeout=5,
    )
    conn.connect()
    conn.close()


def test_loopback_users_names_who_may_log_in_from_loopback_only(seeded, loopback_users):
    from compat_harness import LIMITED_USER

    loopback_users(())
    _remote_login(seeded, "guest", "guest")
    loopback_users((LIMITED_USER[0],))
    _remote_login(seeded, "guest", "guest")
    with pytest.raises(amqp.exceptions.AccessRefused) as refused:
        _remote_login(seeded, *LIMITED_USER)
    assert refused.value.reply_code == 403
    assert refused.value.reply_text == LOGIN_REFUSED.format("PLAIN")
    pika.BlockingConnection(seeded.params(credentials=pika.PlainCredentials(*LIMITED_USER))).close()


def test_unknown_vhost_refused_with_530(broker):
    with pytest.raises(amqp.exceptions.NotAllowed) as refused:
        _py_amqp(broker, virtual_host="no-such-vhost")
    assert refused.value.reply_code == 530
    assert refused.value.reply_text == "NOT_ALLOWED - vhost no-such-vhost not found"


def test_vhost_without_permission_refused_with_530(seeded):
    from compat_harness import NOPERM_USER

    with pytest.raises(amqp.exceptions.NotAllowed) as refused:
        _py_amqp(seeded, userid=NOPERM_USER[0], password=NOPERM_USER[1])
    assert refused.value.reply_code == 530
    assert refused.value.reply_text == (
        f"NOT_ALLOWED - access to vhost '/' refused for user '{NOPERM_USER[0]}'"
    )


def test_second_vhost_isolates_entities(seeded, uid):
    from compat_harness import SEED_VHOST

    default = pika.BlockingConnection(seeded.params())
    other = pika.BlockingConnection(seeded.params(virtual_host=SEED_VHOST))
    try:
        other.channel().queue_declare(f"{uid}-q", auto_delete=True, arguments={})
        ch = default.channel()
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as missing:
            ch.queue_declare(f"{uid}-q", passive=True)
        assert missing.value.reply_code == 404
        assert missing.value.reply_text == f"NOT_FOUND - no queue '{uid}-q' in vhost '/'"
        other.channel().queue_delete(f"{uid}-q")
    finally:
        default.close()
        other.close()


def test_tune_negotiates_the_lower_limits(broker):
    with RawClient(broker.host, broker.port) as raw:
        raw.handshake(channel_max=0, frame_max=131072)
        assert raw.tune.channel_max == 2047
        assert raw.tune.frame_max == 131072
        assert raw.tune.heartbeat == 60
    conn = pika.BlockingConnection(broker.params(channel_max=7, frame_max=8192, heartbeat=0))
    try:
        assert (conn._impl.params.channel_max, conn._impl.params.frame_max) == (7, 8192)
        channels = [conn.channel() for _ in range(7)]
        channels[-1].basic_publish("", "nowhere", b"x" * 20000)
        channels[-1].queue_declare("", exclusive=True)
    finally:
        conn.close()


@pytest.mark.slow
def test_frame_max_below_minimum_refused(broker):
    with RawClient(broker.host, broker.port) as raw:
        raw.send_bytes(PROTOCOL_HEADER)
        raw.expect(commands.Connection.Start)
        raw.send(0, commands.Connection.StartOk(response="\0guest\0guest"))
        raw.expect(commands.Connection.Tune)
        raw.send(0, commands.Connection.TuneOk(channel_max=10, frame_max=1024, heartbeat=0))
        _expect_handshake_refused(raw)


def test_channel_above_channel_max_closes_connection(broker):
    # RabbitMQ counts open channels against channel_max, whatever their numbers.
    with RawClient(broker.host, broker.port) as raw:
        raw.handshake(channel_max=2)
        raw.open_channel(1)
        raw.open_channel(2)
        raw.send(3, commands.Channel.Open())
        close = raw.expect_connection_close()
    assert close.reply_code == 530
    assert close.reply_text == (
        "NOT_ALLOWED - number of channels opened (2) has reached the negotiated channel_max (2)"
    )


def test_channel_numbers_above_channel_max_open_while_the_count_allows(broker, uid):
    # rabbit_reader:create_channel/2 compares the count of open channels with channel_max,
    # never the channel number; clients' own test suites open channel 65535.
    with RawClient(broker.host, broker.port) as raw:
        raw.handshake()
        assert raw.tune.channel_max == 2047
        raw.open_channel(65535)
        raw.send(65535, commands.Queue.Declare(queue=f"{uid}-q", exclusive=True))
        channel, ok = raw.expect(commands.Queue.DeclareOk)
        assert (channel, ok.queue) == (65535, f"{uid}-q")
    with RawClient(broker.host, broker.port) as raw:
        raw.handshake(channel_max=2)
        raw.open_channel(7)
        raw.open_channel(65535)
        raw.send(3, commands.Channel.Open())
        close = raw.expect_connection_close()
    assert close.reply_code == 530
    assert close.reply_text == (
        "NOT_ALLOWED - number of channels opened (2) has reached the negotiated channel_max (2)"
    )


def test_frame_above_frame_max_closes_with_501(broker):
    with RawClient(broker.host, broker.port) as raw:
        raw.handshake(frame_max=4096)
        raw.open_channel(1)
        raw.send(1, commands.Basic.Publish(exchange="", routing_key="nowhere"))
        raw.send_bytes(
            raw_frame(2, 1, b"\x00\x3c\x00\x00" + (5000).to_bytes(8, "big") + b"\x00\x00")
        )
        raw.send_bytes(raw_frame(3, 1, b"x" * 5000))
        close = raw.expect_connection_close()
    assert close.reply_code == 501
    assert (
        close.reply_text == "FRAME_ERROR - type 3, all octets = <<>>: {frame_too_large,5000,4088}"
    )


def test_bad_frame_end_closes_with_501(broker, channel):
    with RawClient(broker.host, broker.port) as raw:
        raw.handshake()
        raw.send_bytes(raw_frame(1, 1, b"\x00\x14\x00\x0a\x00", end=b"\x00"))
        close = raw.expect_connection_close()
    assert close.reply_code == 501
    assert close.reply_text == (
        "FRAME_ERROR - type 1, all octets = <<0,20,0,10,0>>: {invalid_frame_end_marker,0}"
    )
    assert channel.queue_declare("", exclusive=True).method.queue


def test_unknown_frame_type_closes_with_501(broker):
    with RawClient(broker.host, broker.port) as raw:
        raw.handshake()
        raw.send_bytes(raw_frame(9, 0, b""))
        close = raw.expect_connection_close()
    assert close.reply_code == 501
    assert close.reply_text == "FRAME_ERROR - type 9, all octets = <<>>: unknown_frame"


def test_channel_error_closes_only_that_channel(broker, uid):
    with RawClient(broker.host, broker.port) as raw:
        raw.handshake()
        raw.open_channel(1)
        raw.open_channel(2)
        raw.send(1, commands.Queue.Declare(queue=f"{uid}-nope", passive=True))
        close = raw.expect_channel_close(1)
        assert (close.reply_code, close.reply_text) == (
            404,
            f"NOT_FOUND - no queue '{uid}-nope' in vhost '/'",
        )
        assert (close.class_id, close.method_id) == (50, 10)
        raw.send(2, commands.Queue.Declare(queue="", exclusive=True))
        raw.expect(commands.Queue.DeclareOk)
        raw.open_channel(1)
        raw.send(1, commands.Queue.Declare(queue="", exclusive=True))
        raw.expect(commands.Queue.DeclareOk)


def test_method_on_unopened_channel_is_504(broker):
    with RawClient(broker.host, broker.port) as raw:
        raw.handshake()
        raw.send(5, commands.Queue.Declare(queue="", exclusive=True))
        close = raw.expect_connection_close()
    assert close.reply_code == 504
    assert close.reply_text == "CHANNEL_ERROR - expected 'channel.open'"
    assert (close.class_id, close.method_id) == (50, 10)


def test_second_channel_open_is_504(broker):
    with RawClient(broker.host, broker.port) as raw:
        raw.handshake()
        raw.open_channel(1)
        raw.send(1, commands.Channel.Open())
        close = raw.expect_connection_close()
    assert close.reply_code == 504
    assert close.reply_text == "CHANNEL_ERROR - second 'channel.open' seen"


def test_content_without_method_is_505(broker):
    with RawClient(broker.host, broker.port) as raw:
        raw.handshake()
        raw.open_channel(1)
        raw.send_bytes(raw_frame(3, 1, b"body"))
        close = raw.expect_connection_close()
    assert close.reply_code == 505
    assert (
        close.reply_text == "UNEXPECTED_FRAME - expected method frame, got non method frame instead"
    )


def test_unknown_method_ends_only_that_connection(broker, channel):
    # RabbitMQ 3.10's reader crashes on an unknown method id and drops the socket without
    # connection.close; a broker that does close politely must say 540 NOT_IMPLEMENTED.
    with RawClient(broker.host, broker.port) as raw:
        raw.handshake()
        raw.open_channel(1)
        raw.send_bytes(raw_frame(1, 1, b"\x00\x3c\x03\xe7"))
        try:
            close = raw.expect_connection_close()
        except (Closed, ConnectionResetError):
            pass
        else:
            assert close.reply_code == 540
    assert channel.queue_declare("", exclusive=True).method.queue


def test_channel_flow_active_roundtrip(broker):
    with RawClient(broker.host, broker.port) as raw:
        raw.handshake()
        raw.open_channel(1)
        raw.send(1, commands.Channel.Flow(active=True))
        _, ok = raw.expect(commands.Channel.FlowOk)
        assert ok.active is True


def test_channel_flow_inactive_not_implemented(broker):
    with RawClient(broker.host, broker.port) as raw:
        raw.handshake()
        raw.open_channel(1)
        raw.send(1, commands.Channel.Flow(active=False))
        close = raw.expect_connection_close()
    assert (close.reply_code, close.reply_text) == (540, "NOT_IMPLEMENTED - active=false")
    assert (close.class_id, close.method_id) == (20, 20)


def test_immediate_publish_not_implemented(broker):
    with RawClient(broker.host, broker.port) as raw:
        raw.handshake()
        raw.open_channel(1)
        raw.send(1, commands.Basic.Publish(exchange="", routing_key="q", immediate=True))
        raw.send(1, header.ContentHeader(0, 1, commands.Basic.Properties()))
        raw.send(1, body.ContentBody(b"x"))
        close = raw.expect_connection_close()
    assert (close.reply_code, close.reply_text) == (540, "NOT_IMPLEMENTED - immediate=true")
    assert (close.class_id, close.method_id) == (60, 40)


def test_client_close_handshake(broker):
    with RawClient(broker.host, broker.port) as raw:
        raw.handshake()
        raw.open_channel(1)
        raw.send(
            1, commands.Channel.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
        )
        raw.expect(commands.Channel.CloseOk)
        raw.send(
            0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
        )
        raw.expect(commands.Connection.CloseOk)


def test_server_sends_heartbeats(broker):
    with RawClient(broker.host, broker.port) as raw:
        raw.handshake(heartbeat_s=1)
        started = time.monotonic()
        channel, value = raw.recv(timeout_s=4, skip_heartbeats=False)
        assert channel == 0 and type(value).__name__ == "Heartbeat"
        assert time.monotonic() - started < 3


@pytest.mark.slow
def test_silent_client_is_disconnected_after_missed_heartbeats(broker):
    with RawClient(broker.host, broker.port) as raw:
        raw.handshake(heartbeat_s=1)
        started = time.monotonic()
        raw.wait_closed(10)
        assert time.monotonic() - started < 6


def test_heartbeating_pika_client_stays_connected(broker):
    conn = pika.BlockingConnection(broker.params(heartbeat=1))
    try:
        for _ in range(6):
            conn.process_data_events(time_limit=0.5)
        assert conn.is_open
        conn.channel().queue_declare("", exclusive=True)
    finally:
        conn.close()


def test_closed_socket_mid_frame_leaves_broker_serving(broker, channel):
    raw = RawClient(broker.host, broker.port)
    raw.handshake()
    raw.send_bytes(raw_frame(1, 0, b"\x00\x0a")[:5])
    raw.close()
    assert channel.queue_declare("", exclusive=True).method.queue


def test_content_frames_of_different_channels_may_interleave(broker, uid):
    with RawClient(broker.host, broker.port) as raw:
        raw.handshake(frame_max=4096)
        raw.open_channel(1)
        raw.open_channel(2)
        raw.send(1, commands.Queue.Declare(queue=f"{uid}-q", exclusive=True))
        raw.expect(commands.Queue.DeclareOk)
        payloads = {1: b"a" * 10_000, 2: b"b" * 5_000}
        for channel in (1, 2):
            raw.send(channel, commands.Basic.Publish(exchange="", routing_key=f"{uid}-q"))
        for channel in (1, 2):
            raw.send(
                channel,
                header.ContentHeader(0, len(payloads[channel]), commands.Basic.Properties()),
            )
        chunk_bytes = 4096 - 8
        for offset in range(0, 10_000, chunk_bytes):
            for channel in (1, 2):
                piece = payloads[channel][offset : offset + chunk_bytes]
                if piece:
                    raw.send(channel, body.ContentBody(piece))
        # Channel 2's publish is routed asynchronously to channel 1's requests: poll.
        deadline = time.monotonic() + 5
        while True:
            raw.send(1, commands.Queue.Declare(queue=f"{uid}-q", passive=True))
            _, ok = raw.expect(commands.Queue.DeclareOk)
            if ok.message_count == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert ok.message_count == 2
        bodies = []
        for _ in range(2):
            raw.send(1, commands.Basic.Get(queue=f"{uid}-q", no_ack=True))
            _, get_ok = raw.expect(commands.Basic.GetOk)
            _, content = raw.expect(header.ContentHeader)
            received = b""
            while len(received) < content.body_size:
                _, piece = raw.expect(body.ContentBody)
                assert len(piece.value) <= 4096 - 8
                received += piece.value
            bodies.append(received)
        assert sorted(bodies) == sorted(payloads.values())


def _publish_then(*frames: bytes) -> bytes:
    """basic.publish on channel 1 followed by whatever frames a hostile client sends."""
    return frame.marshal(commands.Basic.Publish(exchange="", routing_key="x"), 1) + b"".join(frames)


def _content_header(class_id: int, size: int) -> bytes:
    return raw_frame(
        2, 1, class_id.to_bytes(2, "big") + b"\x00\x00" + size.to_bytes(8, "big") + b"\x00\x00"
    )


def _properties_header(properties: bytes) -> bytes:
    """A content header frame on channel 1 for an empty body, with raw property bytes."""
    return raw_frame(2, 1, struct.pack(">HHQ", 60, 0, 0) + properties)


def _table(raw: bytes) -> bytes:
    """A table (or long string) argument: its raw bytes after their 32-bit length."""
    return struct.pack(">I", len(raw)) + raw


def _headers(table: bytes) -> bytes:
    """Property bytes holding only a headers table, given as its raw bytes."""
    return struct.pack(">H", 0x2000) + _table(table)


def _declare_arguments(queue: str, table: bytes) -> bytes:
    """queue.declare's arguments (exclusive) with a raw arguments table."""
    name = queue.encode()
    return struct.pack(">HB", 0, len(name)) + name + b"\x04" + _table(table)


# Field tables rabbit_binary_parser:parse_table has no clause for.
_MALFORMED_TABLES = {
    "string-past-table": b"\x01aS" + struct.pack(">I", 50) + b"hi",
    "partial-entry-after-last": b"\x01aS" + struct.pack(">I", 2) + b"hi" + b"\x00",
    "unknown-type": b"\x01aZ\x00",
    "nested-table-past-its-end": b"\x01aF" + struct.pack(">I", 1) + b"\x00",
}


MALFORMED = {
    "header-of-other-class": (
        _publish_then(_content_header(50, 1)),
        505,
        "UNEXPECTED_FRAME - expected content header for class 60, got one for class 50 instead",
        (60, 40),
    ),
    "truncated-method": (
        raw_frame(1, 1, b"\x00\x32\x00\x0a\x00"),
        501,
        "FRAME_ERROR - cannot decode <<0>>",
        (50, 10),
    ),
    "channel-method-on-channel-0": (
        frame.marshal(commands.Basic.Publish(exchange="", routing_key="x"), 0),
        504,
        "CHANNEL_ERROR - unexpected method in connection state running",
        (60, 40),
    ),
    "heartbeat-on-channel-1": (
        raw_frame(8, 1, b""),
        505,
        "UNEXPECTED_FRAME - type 8, all octets = <<>>",
        (0, 0),
    ),
    "method-inside-content": (
        _publish_then(
            _content_header(60, 5),
            frame.marshal(commands.Queue.Declare(queue="", exclusive=True), 1),
        ),
        505,
        "UNEXPECTED_FRAME - expected content body, got non content body frame instead",
        (60, 40),
    ),
    "header-without-method": (
        _content_header(60, 5),
        505,
        "UNEXPECTED_FRAME - expected method frame, got non method frame instead",
        (0, 0),
    ),
    "connection-method-on-channel-1": (
        frame.marshal(commands.Connection.Open(virtual_host="/"), 1),
        503,
        "COMMAND_INVALID - unimplemented method",
        (10, 40),
    ),
    "bytes-after-the-last-argument": (
        raw_frame(1, 1, b"\x00\x32\x00\x0a" + _declare_arguments("x", b"") + b"\x00"),
        501,
        "FRAME_ERROR - cannot decode <<0,0,1,120,4,0,0,0,0,0>>",
        (50, 10),
    ),
    # RabbitMQ's channel process crashes decoding the headers; its reader closes with 541.
    "headers-string-past-its-table": (
        _publish_then(_properties_header(_headers(_MALFORMED_TABLES["string-past-table"]))),
        541,
        "INTERNAL_ERROR",
        (0, 0),
    ),
    "headers-partial-entry-after-last": (
        _publish_then(_properties_header(_headers(_MALFORMED_TABLES["partial-entry-after-last"]))),
        541,
        "INTERNAL_ERROR",
        (0, 0),
    ),
    "headers-table-past-the-properties": (
        _publish_then(_properties_header(struct.pack(">HI", 0x2000, 40) + b"\x01aS")),
        541,
        "INTERNAL_ERROR",
        (0, 0),
    ),
    # On channel 0 rabbit_reader:handle_method0 catches the parser's crash.
    "malformed-table-on-channel-0": (
        raw_frame(
            1,
            0,
            b"\x00\x0a\x00\x0b"
            + _table(_MALFORMED_TABLES["partial-entry-after-last"])
            + b"\x05PLAIN"
            + _table(b"\0guest\0guest")
            + b"\x05en_US",
        ),
        541,
        "INTERNAL_ERROR",
        (0, 0),
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_frames_close_the_connection(broker, channel, case):
    data, code, text, method = MALFORMED[case]
    with RawClient(broker.host, broker.port) as raw:
        raw.handshake()
        raw.open_channel(1)
        raw.send_bytes(data)
        close = raw.expect_connection_close()
    assert (close.reply_code, close.reply_text) == (code, text)
    assert (close.class_id, close.method_id) == method
    assert channel.queue_declare("", exclusive=True).method.queue


@pytest.mark.parametrize("case", sorted(_MALFORMED_TABLES))
def test_malformed_table_in_arguments_drops_the_connection_unannounced(broker, channel, uid, case):
    # RabbitMQ's reader process crashes in rabbit_binary_parser:parse_table: the socket
    # closes and no connection.close is sent.
    with RawClient(broker.host, broker.port) as raw:
        raw.handshake()
        raw.open_channel(1)
        arguments = _declare_arguments(f"{uid}-q", _MALFORMED_TABLES[case])
        raw.send_bytes(raw_frame(1, 1, b"\x00\x32\x00\x0a" + arguments))
        try:
            got = raw.recv()
        except (Closed, ConnectionResetError):
            got = None
        assert got is None, f"expected the socket to close, got {got}"
    code, _ = channel_error(channel.queue_declare, f"{uid}-q", passive=True)
    assert code == 404


def test_nowait_methods_get_no_reply(broker, uid):
    with RawClient(broker.host, broker.port) as raw:
        raw.handshake()
        raw.open_channel(1)
        for method in [
            commands.Exchange.Declare(
                exchange=f"{uid}-x", exchange_type="fanout", auto_delete=True, nowait=True
            ),
            commands.Queue.Declare(queue=f"{uid}-q", exclusive=True, nowait=True),
            commands.Queue.Bind(queue=f"{uid}-q", exchange=f"{uid}-x", nowait=True),
            commands.Basic.Qos(prefetch_count=10),
            commands.Basic.Consume(queue=f"{uid}-q", consumer_tag="c", no_ack=True, nowait=True),
            commands.Basic.Publish(exchange=f"{uid}-x", routing_key=""),
        ]:
            raw.send(1, method)
        raw.send(1, header.ContentHeader(0, 2, commands.Basic.Properties()))
        raw.send(1, body.ContentBody(b"hi"))
        # Only basic.qos answers; then the delivery proves declare, bind and consume happened.
        raw.expect(commands.Basic.QosOk)
        _, deliver = raw.expect(commands.Basic.Deliver)
        assert (deliver.consumer_tag, deliver.exchange) == ("c", f"{uid}-x")
        raw.expect(header.ContentHeader)
        _, content = raw.expect(body.ContentBody)
        assert content.value == b"hi"
        raw.send(1, commands.Basic.Cancel(consumer_tag="c", nowait=True))
        raw.send(1, commands.Queue.Delete(queue=f"{uid}-q", nowait=True))
        raw.send(1, commands.Exchange.Delete(exchange=f"{uid}-x", nowait=True))
        raw.send(1, commands.Queue.Declare(queue=f"{uid}-q", passive=True))
        close = raw.expect_channel_close(1)
        assert (close.reply_code, close.reply_text) == (
            404,
            f"NOT_FOUND - no queue '{uid}-q' in vhost '/'",
        )

"""Hostile clients against a running `warren serve`, over raw sockets.

Each test misbehaves in one way (wrong protocol headers, truncated, oversized and gigabyte
frames, garbage, malformed and deeply nested field tables, thousands of channels and of idle
connections, stalled handshakes, floods of declares, bindings, consumers and logins, half-sent
bodies on many channels) and checks that the offending connection got what RabbitMQ 3.10 sends
it. After every test the broker process is still alive, serves a well-behaved pika client (a
declare, a publish, a get), and its resident memory is under RSS_BYTES_MAX.

Memory bounds of the floods themselves (partial bodies held, transactions, a consumer that
never reads) are the memory alarm's and the write buffer bound's business, tested in
test_floods.py; here the broker must survive them and keep answering.
"""

from __future__ import annotations

import os
import random
import socket
import struct
import time
import uuid

import pytest
from hostile import RSS_BYTES_MAX, serves_a_good_client
from pamqp import commands, frame, header
from raw_amqp import PROTOCOL_HEADER, Closed, RawClient, raw_frame

from warrenmq.server.bench.loadgen import read_rss_bytes

TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def warren(tmp_path_factory):
    from brokers import WarrenProcess

    data = tmp_path_factory.mktemp("hostile")
    process = WarrenProcess(data / "data", log_path=data / "warren.log").start()
    yield process
    process.kill()


@pytest.fixture(autouse=True)
def still_serving(warren):
    yield
    assert warren.process.poll() is None, warren.log_since_start()[-3000:]
    serves_a_good_client(warren)
    assert read_rss_bytes(warren.process.pid) < RSS_BYTES_MAX


@pytest.fixture
def clients(warren):
    """A factory of raw clients, all closed after the test."""
    opened: list[RawClient] = []

    def connect() -> RawClient:
        client = RawClient("127.0.0.1", warren.port, timeout_s=TIMEOUT_S)
        opened.append(client)
        return client

    yield connect
    for client in opened:
        client.close()


def opened(clients, channels=(1,)) -> RawClient:
    client = clients()
    client.handshake()
    for number in channels:
        client.open_channel(number)
    return client


def closed_unannounced(client: RawClient) -> bool:
    """True when the broker closes the socket without a connection.close first."""
    try:
        while True:
            _, value = client.recv()
            if isinstance(value, commands.Connection.Close):
                return False
    except (Closed, ConnectionResetError):
        return True


# -- the handshake ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "first_bytes",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"AMQP\x00\x00\x08\x00",
        b"AMQP\x01\x01\x00\x0a",
        b"\x00" * 8,
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS ClientHello
    ],
)
def test_wrong_protocol_header_is_answered_with_ours_and_closed(clients, first_bytes):
    client = clients()
    client.send_bytes(first_bytes)
    client._fill(time.monotonic() + TIMEOUT_S)
    assert client.buffer.startswith(PROTOCOL_HEADER)
    client.buffer = b""
    client.wait_closed(TIMEOUT_S)


def test_garbage_before_the_handshake_ends_is_dropped_silently(clients):
    client = clients()
    client.send_bytes(PROTOCOL_HEADER)
    client.expect(commands.Connection.Start)
    client.send_bytes(os.urandom(4096))
    assert closed_unannounced(client)


@pytest.mark.parametrize(
    "addresses", [pytest.param(1, id="40"), pytest.param(25, id="1000", marks=pytest.mark.slow)]
)
def test_a_flood_of_logins_with_a_wrong_password_is_refused(warren, addresses):
    """40 pipelined logins from each of `addresses` addresses (127.0.0.2 on, never the good
    client's): an address's checks take turns and, after FAILURES_FREE failures, wait longer
    and longer (password_checks.py), so its flood ends in 403s first, then in handshake
    timeouts (closed without a close frame, as RabbitMQ's timeout closes); a connection
    never hangs, and the good client logs in meanwhile."""
    from warrenmq.server.metadata.password_checks import FAILURES_FREE

    socks = []
    for address in range(addresses):
        for _ in range(40):
            sock = socket.create_connection(
                ("127.0.0.1", warren.port),
                timeout=TIMEOUT_S,
                source_address=(f"127.0.0.{2 + address}", 0),
            )
            sock.sendall(
                PROTOCOL_HEADER
                + frame.marshal(
                    commands.Connection.StartOk(
                        client_properties={"capabilities": {"authentication_failure_close": True}},
                        mechanism="PLAIN",
                        response="\0guest\0wrong",
                    ),
                    0,
                )
            )
            socks.append(sock)
    serves_a_good_client(warren)
    refused = 0
    for sock in socks:
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
        # connection.start, then a connection.close of 403 ACCESS_REFUSED or none.
        if struct.pack(">HH", 10, 50) in data:
            assert struct.pack(">HHH", 10, 50, 403) in data
            refused += 1
        sock.close()
    assert refused >= FAILURES_FREE


@pytest.mark.slow
def test_stalled_handshakes_are_dropped_after_the_handshake_timeout(warren, clients):
    stalled = []
    for index in range(300):
        client = clients()
        # Nothing, half a protocol header, or a header and then silence.
        client.send_bytes([b"", b"AMQ", PROTOCOL_HEADER][index % 3])
        stalled.append(client)
    serves_a_good_client(warren)
    for client in stalled:
        client.wait_closed(60)  # 10 s after accept, as RabbitMQ's handshake_timeout


def test_thousands_of_idle_connections(warren):
    socks = []
    try:
        for _ in range(3000):
            sock = socket.create_connection(("127.0.0.1", warren.port), timeout=TIMEOUT_S)
            sock.sendall(PROTOCOL_HEADER)
            socks.append(sock)
        serves_a_good_client(warren)
        assert read_rss_bytes(warren.process.pid) < RSS_BYTES_MAX
    finally:
        for sock in socks:
            sock.close()


# -- frames ----------------------------------------------------------------------------------


def test_frame_declaring_gigabytes_is_refused_before_it_is_read(clients):
    client = opened(clients)
    client.send_bytes(struct.pack(">BHI", 3, 1, 0xFFFFFFF0) + b"x" * 1000)
    close = client.expect_connection_close()
    assert close.reply_code == 501
    assert close.reply_text == (
        "FRAME_ERROR - type 3, all octets = <<>>: {frame_too_large,4294967280,131064}"
    )


def test_frame_at_frame_max_is_read_and_one_byte_over_it_refused(clients):
    # RabbitMQ lets a payload reach frame_max itself (its fudge of 8 for clients that count
    # the frame's overhead wrongly) and refuses one byte more.
    client = opened(clients)
    client.send_bytes(raw_frame(3, 1, b"\x00" * 131072))
    close = client.expect_connection_close()
    assert close.reply_code == 505  # read whole: a body with no method before it
    client = opened(clients)
    client.send_bytes(raw_frame(3, 1, b"\x00" * 131073))
    close = client.expect_connection_close()
    assert close.reply_code == 501
    assert close.reply_text.endswith(": {frame_too_large,131073,131064}")


def test_truncated_frames_then_a_closed_socket(warren, clients):
    for cut in (1, 6, 7, 20):
        client = opened(clients)
        whole = frame.marshal(commands.Queue.Declare(queue="truncated"), 1)
        client.send_bytes(whole[:cut])
        client.close()
    serves_a_good_client(warren)


def test_bad_frame_end_and_unknown_frame_type(clients):
    client = opened(clients)
    client.send_bytes(raw_frame(1, 1, struct.pack(">HH", 20, 10) + b"\x00", end=b"\x00"))
    close = client.expect_connection_close()
    assert close.reply_code == 501 and "invalid_frame_end_marker,0" in close.reply_text
    client = opened(clients)
    client.send_bytes(raw_frame(9, 1, b"hello"))
    close = client.expect_connection_close()
    assert close.reply_text == 'FRAME_ERROR - type 9, all octets = <<"hello">>: unknown_frame'


def test_garbage_after_the_handshake(clients):
    rng = random.Random(15)
    for _ in range(20):
        client = opened(clients)
        client.send_bytes(bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 5000))))
        try:
            while True:
                _, value = client.recv(TIMEOUT_S)
                if isinstance(value, commands.Connection.Close):
                    # A hard error, as RabbitMQ answers garbage: a 5xx code.
                    assert value.reply_code >= 500
                    break
        except (Closed, ConnectionResetError, TimeoutError):
            # Garbage that reads as the start of a large frame waits for the rest of it.
            pass


# -- field tables ----------------------------------------------------------------------------


def _declare_with_table(table: bytes) -> bytes:
    """queue.declare on channel 1 with `table` (length included) as its arguments."""
    arguments = (
        struct.pack(">H", 0)
        + bytes([9])
        + b"malformed"
        + bytes([0])  # passive, durable, exclusive, auto-delete, no-wait
        + table
    )
    return raw_frame(1, 1, struct.pack(">HH", 50, 10) + arguments)


@pytest.mark.parametrize(
    "table",
    [
        struct.pack(">I", 3) + b"\x01kS",  # a value cut off
        struct.pack(">I", 4) + b"\x01kZ\x00",  # an unknown field type
        struct.pack(">I", 7) + b"\x01kS" + struct.pack(">I", 0xFFFFFF00),  # a 4 GB string
    ],
)
def test_malformed_field_table_drops_the_connection_unannounced(clients, table):
    client = opened(clients)
    client.send_bytes(_declare_with_table(table))
    # RabbitMQ's reader crashes on such a table: the socket closes without connection.close.
    assert closed_unannounced(client)


def test_table_longer_than_the_method_is_a_frame_error(clients):
    client = opened(clients)
    client.send_bytes(_declare_with_table(struct.pack(">I", 0xFFFFFF00) + b"\x01k"))
    close = client.expect_connection_close()
    # The arguments do not match queue.declare's pattern at all: RabbitMQ cannot decode them.
    assert close.reply_code == 501
    assert close.reply_text.startswith("FRAME_ERROR - cannot decode <<")
    assert (close.class_id, close.method_id) == (50, 10)


def _nested_table(depth: int) -> bytes:
    """A table holding a table holding ... `depth` levels, with its length prefix."""
    table = b""
    for _ in range(depth):
        table = b"\x01nF" + struct.pack(">I", len(table)) + table
    return struct.pack(">I", len(table)) + table


def test_headers_nested_deeper_than_the_bound_are_a_frame_error(clients):
    # RabbitMQ takes any depth (its parser recurses); Warren refuses beyond
    # field_table.TABLE_DEPTH_MAX, which consumers' client libraries could not parse.
    for depth, refused in (
        (32, False),
        (33, True),
        (15_000, True),
    ):  # 15,000 levels fill most of a frame
        client = opened(clients)
        properties = struct.pack(">H", 0x2000) + _nested_table(depth)
        client.send(1, commands.Basic.Publish(exchange="", routing_key="nowhere"))
        client.send_bytes(raw_frame(2, 1, struct.pack(">HHQ", 60, 0, 0) + properties))
        client.send(1, commands.Basic.Qos(prefetch_count=1))
        if not refused:
            client.expect(commands.Basic.QosOk)
            continue
        close = client.expect_connection_close()
        assert close.reply_code == 501, close.reply_text
        assert "nested too deep" in close.reply_text


def test_arguments_nested_deeper_than_the_bound_are_a_frame_error(clients):
    client = opened(clients)
    client.send_bytes(_declare_with_table(_nested_table(15_000)))
    close = client.expect_connection_close()
    assert close.reply_code == 501, close.reply_text
    assert (close.class_id, close.method_id) == (50, 10)


# -- many of everything ----------------------------------------------------------------------


def test_thousands_of_channels_up_to_channel_max_and_one_more(clients):
    client = clients()
    client.handshake()
    channel_max = client.tune.channel_max
    client.send_bytes(
        b"".join(frame.marshal(commands.Channel.Open(), n) for n in range(1, channel_max + 1))
    )
    for _ in range(channel_max):
        client.expect(commands.Channel.OpenOk)
    client.send(channel_max + 1, commands.Channel.Open())
    close = client.expect_connection_close()
    assert close.reply_code == 530
    assert close.reply_text == (
        f"NOT_ALLOWED - number of channels opened ({channel_max}) has reached the negotiated "
        f"channel_max ({channel_max})"
    )


def test_flood_of_declares_bindings_and_consumers(clients):
    client = opened(clients)
    prefix = uuid.uuid4().hex[:8]
    count = 3000
    flood = []
    for index in range(count):
        queue = f"flood-{prefix}-{index}"
        flood.append(frame.marshal(commands.Queue.Declare(queue=queue, exclusive=True), 1))
        flood.append(
            frame.marshal(
                commands.Queue.Bind(queue=queue, exchange="amq.topic", routing_key=queue), 1
            )
        )
        flood.append(frame.marshal(commands.Basic.Consume(queue=queue, consumer_tag=queue), 1))
    client.send_bytes(b"".join(flood))
    for _ in range(count):
        client.expect(commands.Queue.DeclareOk)
        client.expect(commands.Queue.BindOk)
        client.expect(commands.Basic.ConsumeOk)


def test_half_sent_bodies_on_many_channels(warren, clients):
    client = clients()
    client.handshake()
    channels = range(1, 501)
    for number in channels:
        client.send(number, commands.Channel.Open())
    for _ in channels:
        client.expect(commands.Channel.OpenOk)
    partial = []
    for number in channels:
        partial.append(
            frame.marshal(commands.Basic.Publish(exchange="", routing_key="nowhere"), number)
        )
        partial.append(
            frame.marshal(header.ContentHeader(0, 100_000, commands.Basic.Properties()), number)
        )
        partial.append(raw_frame(3, number, b"x" * 1000))
    client.send_bytes(b"".join(partial))
    serves_a_good_client(warren)
    # The same connection still answers on a channel of its own.
    client.open_channel(600)

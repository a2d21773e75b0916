"""Connection handshake, close handshakes, heartbeats and timeouts of the sans-I/O machine."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import commands, encode

from warrenmq.amqp import (
    Connection,
    ConnectionConfig,
    ConnectionState,
    IllegalTransition,
    events,
    frames,
    testing,
)

RABBIT_CAPABILITIES = {
    "publisher_confirms",
    "exchange_exchange_bindings",
    "basic.nack",
    "consumer_cancel_notify",
    "connection.blocked",
    "consumer_priorities",
    "authentication_failure_close",
    "per_consumer_qos",
    "direct_reply_to",
}


def started(config=None, capabilities=None, mechanism="PLAIN", username="guest", password="guest"):
    conn = Connection(config, now=0.0)
    conn.receive_data(frames.PROTOCOL_HEADER, 0.0)
    assert conn.next_event() is None
    conn.receive_data(
        testing.marshal(
            0,
            testing.start_ok(
                username=username, password=password, mechanism=mechanism, capabilities=capabilities
            ),
        ),
        0.0,
    )
    return conn


def only_frame(data):
    parsed = testing.parse(data)
    assert len(parsed) == 1, parsed
    return parsed[0]


def test_full_handshake_offers_rabbitmq_capabilities_and_negotiates():
    conn = Connection(ConnectionConfig(frame_bytes_max=65536, channel_max=100, heartbeat_s=30))
    conn.receive_data(frames.PROTOCOL_HEADER, 0.0)
    assert conn.next_event() is None
    channel, start = only_frame(conn.data_to_send())
    assert channel == 0 and isinstance(start, commands.Connection.Start)
    assert (start.version_major, start.version_minor) == (0, 9)
    assert start.mechanisms == "PLAIN AMQPLAIN" and start.locales == "en_US"
    capabilities = start.server_properties["capabilities"]
    assert set(capabilities) == RABBIT_CAPABILITIES and all(capabilities.values())

    conn.receive_data(testing.marshal(0, testing.start_ok("alice", "s3cret")), 0.0)
    event = conn.next_event()
    assert isinstance(event, events.AuthenticationRequested)
    assert (event.mechanism, event.username, event.password) == ("PLAIN", "alice", "s3cret")
    assert conn.state is ConnectionState.AUTHENTICATING
    conn.accept_login()
    _, tune = only_frame(conn.data_to_send())
    assert (tune.frame_max, tune.channel_max, tune.heartbeat) == (65536, 100, 30)

    conn.receive_data(
        testing.marshal(
            0, commands.Connection.TuneOk(channel_max=50, frame_max=32768, heartbeat=10)
        ),
        0.0,
    )
    conn.receive_data(testing.marshal(0, commands.Connection.Open(virtual_host="prod")), 0.0)
    event = conn.next_event()
    assert event == events.VhostAccessRequested("prod", "alice")
    conn.accept_vhost()
    _, open_ok = only_frame(conn.data_to_send())
    assert isinstance(open_ok, commands.Connection.OpenOk)
    assert conn.state is ConnectionState.OPEN
    assert (conn.frame_bytes_max, conn.channel_max, conn.heartbeat_s) == (32768, 50, 10)
    assert conn.vhost == "prod" and conn.username == "alice"


def test_amqplain_login():
    conn = Connection()
    conn.receive_data(frames.PROTOCOL_HEADER, 0.0)
    # AMQPLAIN's response is a field table without its 4-byte length prefix.
    response = encode.field_table({"LOGIN": "bob", "PASSWORD": "pw"})[4:].decode()
    start_ok = commands.Connection.StartOk(
        client_properties={}, mechanism="AMQPLAIN", response=response
    )
    conn.receive_data(testing.marshal(0, start_ok), 0.0)
    event = conn.next_event()
    assert (event.mechanism, event.username, event.password) == ("AMQPLAIN", "bob", "pw")


def test_input_split_at_every_byte_gives_the_same_events():
    whole = frames.PROTOCOL_HEADER + testing.marshal(0, testing.start_ok("u", "p"))
    conn = Connection()
    for i in range(len(whole)):
        conn.receive_data(whole[i : i + 1], 0.0)
        if i < len(whole) - 1:
            assert conn.next_event() is None
    assert conn.next_event() == events.AuthenticationRequested(
        "PLAIN", "u", "p", testing.start_ok("u", "p").client_properties
    )


@pytest.mark.parametrize(
    "header",
    [
        b"AMQP\x00\x00\x09\x00",
        b"AMQP\x01\x01\x00\x0a",
        b"AMQP\x03\x01\x00\x00",
        b"GET / HTTP/1.1\r\n",
    ],
)
def test_other_protocol_headers_get_ours_and_a_close(header):
    conn = Connection()
    conn.receive_data(header, 0.0)
    event = conn.next_event()
    assert isinstance(event, events.ConnectionClosed) and event.reply_code == 0
    assert conn.data_to_send() == b"AMQP\x00\x00\x09\x01"
    assert conn.finished
    conn.receive_data(b"more", 0.0)
    assert conn.next_event() is None


def test_refused_login_with_authentication_failure_close_sends_403():
    conn = started()
    conn.data_to_send()
    conn.next_event()
    conn.refuse_login()
    _, close = only_frame(conn.data_to_send())
    assert isinstance(close, commands.Connection.Close)
    assert close.reply_code == 403
    assert close.reply_text == (
        "ACCESS_REFUSED - Login was refused using authentication "
        "mechanism PLAIN. For details see the broker logfile."
    )
    event = conn.next_event()
    assert isinstance(event, events.ConnectionClosed) and event.reply_code == 403
    assert conn.state is ConnectionState.CLOSING
    conn.receive_data(testing.marshal(0, commands.Connection.CloseOk()), 1.0)
    assert conn.next_event() is None and conn.finished


def test_refused_login_without_the_capability_closes_silently():
    conn = started(capabilities={"basic.nack": True})
    conn.data_to_send()
    conn.next_event()
    conn.refuse_login()
    assert conn.data_to_send() == b""
    assert isinstance(conn.next_event(), events.ConnectionClosed)
    assert conn.finished


def test_refused_vhost_is_530_with_connection_open_ids():
    conn = started()
    conn.next_event()
    conn.accept_login()
    conn.receive_data(
        testing.marshal(0, commands.Connection.TuneOk(channel_max=10, frame_max=8192, heartbeat=0)),
        0.0,
    )
    conn.receive_data(testing.marshal(0, commands.Connection.Open(virtual_host="secret")), 0.0)
    assert isinstance(conn.next_event(), events.VhostAccessRequested)
    conn.data_to_send()
    conn.refuse_vhost()
    _, close = only_frame(conn.data_to_send())
    assert (close.reply_code, close.class_id, close.method_id) == (530, 10, 40)
    assert close.reply_text == "NOT_ALLOWED - access to vhost 'secret' refused for user 'guest'"


@pytest.mark.parametrize(
    "tune_ok, text",
    [
        (
            dict(frame_max=1000, channel_max=10, heartbeat=0),
            "NOT_ALLOWED - negotiated frame_max = 1000 is lower "
            "than the minimum allowed value (4096)",
        ),
        (
            dict(frame_max=0, channel_max=10, heartbeat=0),
            "NOT_ALLOWED - negotiated frame_max = 0 is higher than "
            "the maximum allowed value (131072)",
        ),
        (
            dict(frame_max=200000, channel_max=10, heartbeat=0),
            "NOT_ALLOWED - negotiated frame_max = 200000 is higher than the maximum allowed value "
            "(131072)",
        ),
        (
            dict(frame_max=4096, channel_max=0, heartbeat=0),
            "NOT_ALLOWED - negotiated channel_max = 0 (no limit) "
            "is higher than the maximum allowed "
            "value (2047)",
        ),
    ],
)
def test_tune_ok_outside_the_offer_is_530(tune_ok, text):
    conn = started()
    conn.next_event()
    conn.accept_login()
    conn.data_to_send()
    conn.receive_data(testing.marshal(0, commands.Connection.TuneOk(**tune_ok)), 0.0)
    event = conn.next_event()
    assert isinstance(event, events.ConnectionClosed)
    _, close = only_frame(conn.data_to_send())
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        530,
        text,
        10,
        30,
    )


def test_unknown_mechanism_and_malformed_plain_close_silently_as_rabbitmq():
    conn = started(mechanism="EXTERNAL")
    event = conn.next_event()
    assert event.reply_code == 503 and "unknown authentication mechanism 'EXTERNAL'" in (
        event.reply_text
    )
    assert conn.finished
    conn = Connection()
    conn.receive_data(frames.PROTOCOL_HEADER, 0.0)
    bad = commands.Connection.StartOk(
        client_properties={}, mechanism="PLAIN", response="guest\0guest"
    )
    conn.receive_data(testing.marshal(0, bad), 0.0)
    event = conn.next_event()
    assert event.reply_code == 502
    assert event.reply_text == (
        "SYNTAX_ERROR - response <<103,117,101,115,116,0,103,117,101,115,116>> invalid"
    )
    assert conn.finished


def test_client_close_gets_close_ok_and_one_event():
    conn = Connection()
    testing.open_connection(conn)
    testing.open_channel(conn, 1)
    conn.receive_data(
        testing.marshal(
            0, commands.Connection.Close(reply_code=200, reply_text="bye", class_id=0, method_id=0)
        ),
        1.0,
    )
    assert conn.next_event() == events.ConnectionClosed(200, "bye", True)
    _, close_ok = only_frame(conn.data_to_send())
    assert isinstance(close_ok, commands.Connection.CloseOk)
    assert conn.finished and not conn.channel_is_open(1)
    assert conn.next_event() is None


def test_broker_close_drops_everything_but_close_ok():
    conn = Connection()
    testing.open_connection(conn)
    testing.open_channel(conn, 1)
    conn.close()
    _, close = only_frame(conn.data_to_send())
    assert (close.reply_code, close.reply_text) == (
        320,
        "CONNECTION_FORCED - broker forced connection closure",
    )
    assert conn.next_event() == events.ConnectionClosed(
        320, "CONNECTION_FORCED - broker forced connection closure", False
    )
    conn.receive_data(
        testing.publish(1, "", "q", b"x")
        + testing.marshal(1, commands.Queue.Declare(queue="q"))
        + testing.marshal(
            0,
            commands.Connection.Close(
                reply_code=200, reply_text="crossing", class_id=0, method_id=0
            ),
        ),
        1.0,
    )
    assert conn.next_event() is None
    _, close_ok = only_frame(conn.data_to_send())
    assert isinstance(close_ok, commands.Connection.CloseOk)
    assert conn.state is ConnectionState.CLOSING
    conn.receive_data(testing.marshal(0, commands.Connection.CloseOk()), 1.0)
    assert conn.next_event() is None and conn.finished


def test_heartbeats_are_sent_and_a_silent_client_is_dropped():
    conn = Connection()
    testing.open_connection(conn, now=0.0, heartbeat=10)
    assert conn.next_tick_at() == 5.0
    assert conn.tick(4.9) is None and conn.data_to_send() == b""
    assert conn.tick(5.0) is None
    assert conn.data_to_send() == frames.HEARTBEAT_FRAME
    conn.receive_data(testing.heartbeat(), 12.0)
    assert conn.next_event() is None
    assert conn.tick(17.0) is None
    assert conn.data_to_send() == frames.HEARTBEAT_FRAME
    assert conn.next_tick_at() == 22.0
    event = conn.tick(32.0)
    assert event == events.ConnectionClosed(0, "missed heartbeats from client, timeout: 10s", False)
    assert conn.finished and conn.data_to_send() == b""


def test_traffic_we_send_postpones_our_heartbeat():
    conn = Connection()
    testing.open_connection(conn, now=0.0, heartbeat=10)
    testing.open_channel(conn, 1, now=3.0)
    conn.tick(4.0)
    assert conn.tick(5.0) is None
    assert conn.data_to_send() == b""
    assert conn.tick(9.0) is None
    assert conn.data_to_send() == frames.HEARTBEAT_FRAME


def test_heartbeat_zero_disables_timers():
    conn = Connection()
    testing.open_connection(conn, heartbeat=0)
    assert conn.next_tick_at() is None
    assert conn.tick(10_000.0) is None and not conn.finished


def test_handshake_and_closing_timeouts():
    conn = started()
    assert conn.next_tick_at() == 10.0
    assert conn.tick(9.0) is None
    assert conn.tick(10.0) == events.ConnectionClosed(0, "handshake timeout", False)
    assert conn.finished
    conn = Connection()
    testing.open_connection(conn, now=0.0, heartbeat=0)
    conn.receive_data(b"\x01\x00\x00\x00\x00\x00\x00\x00", 1.0)
    assert isinstance(conn.next_event(), events.ConnectionClosed)
    assert conn.state is ConnectionState.CLOSED


def test_close_ok_wait_times_out():
    conn = Connection()
    testing.open_connection(conn, now=0.0, heartbeat=0)
    conn.close()
    assert conn.next_tick_at() == 30.0
    assert conn.tick(29.0) is None and not conn.finished
    assert conn.tick(30.0) is None and conn.finished


def test_close_ok_wait_is_the_heartbeat_when_shorter():
    conn = Connection()
    testing.open_connection(conn, now=0.0, heartbeat=10)
    conn.close()
    assert conn.next_tick_at() == 10.0
    assert conn.tick(10.0) is None and conn.finished


def test_close_ok_wait_during_the_handshake_is_rabbitmqs_normal_timeout():
    """A refused tune-ok is closed after 3 s without close-ok, as RabbitMQ 3.10 does."""
    conn = started()
    conn.next_event()
    conn.accept_login()
    conn.data_to_send()
    conn.receive_data(
        testing.marshal(0, commands.Connection.TuneOk(frame_max=1024, channel_max=10, heartbeat=0)),
        1.0,
    )
    assert isinstance(conn.next_event(), events.ConnectionClosed)
    assert conn.next_tick_at() == 4.0
    assert conn.tick(3.9) is None and not conn.finished
    assert conn.tick(4.0) is None and conn.finished


def test_blocked_is_sent_only_to_clients_that_asked():
    conn = Connection()
    testing.open_connection(conn)
    assert conn.block("low on memory")
    _, blocked = only_frame(conn.data_to_send())
    assert isinstance(blocked, commands.Connection.Blocked) and blocked.reason == "low on memory"
    assert conn.unblock()
    conn = Connection()
    testing.open_connection(conn, capabilities={"basic.nack": True})
    assert not conn.block("low on memory") and conn.data_to_send() == b""


def test_broker_answers_out_of_turn_are_named_errors():
    conn = Connection()
    with pytest.raises(IllegalTransition):
        conn.accept_login()
    with pytest.raises(IllegalTransition):
        conn.refuse_vhost()
    testing.open_connection(conn)
    with pytest.raises(IllegalTransition):
        conn.accept_vhost()


def test_update_secret_reaches_the_broker():
    conn = Connection()
    testing.open_connection(conn)
    conn.receive_data(
        testing.marshal(0, commands.Connection.UpdateSecret(new_secret="tok", reason="refresh")),
        0.0,
    )
    event = conn.next_event()
    assert event.channel == 0 and isinstance(event.method, commands.Connection.UpdateSecret)
    assert conn.send_method(0, commands.Connection.UpdateSecretOk())


@settings(max_examples=60)
@given(
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
    body=st.binary(max_size=300),
)
def test_any_split_of_the_byte_stream_gives_the_same_events(cuts, body):
    stream = frames.PROTOCOL_HEADER + testing.marshal(0, testing.start_ok())
    after_login = (
        testing.marshal(0, commands.Connection.TuneOk(channel_max=10, frame_max=4096, heartbeat=0))
        + testing.marshal(0, commands.Connection.Open(virtual_host="/"))
        + testing.marshal(1, commands.Channel.Open())
        + testing.publish(1, "amq.direct", "k", body, frame_max=4096)
    )

    def run(pieces_before, pieces_after):
        conn = Connection()
        seen = []
        for piece in pieces_before:
            conn.receive_data(piece, 0.0)
            seen += testing.drain(conn)
        conn.accept_login()
        for piece in pieces_after:
            conn.receive_data(piece, 0.0)
            new = testing.drain(conn)
            seen += new
            if any(isinstance(e, events.VhostAccessRequested) for e in new):
                conn.accept_vhost()
                seen += testing.drain(conn)
        return seen

    def split(data):
        points = sorted({c % (len(data) + 1) for c in cuts})
        return [data[a:b] for a, b in zip([0] + points, points + [len(data)], strict=True)]

    expected = run([stream], [after_login])
    assert run(split(stream), split(after_login)) == expected
    assert expected[-1].body == body


def test_amqplain_response_that_is_not_a_table_closes_silently():
    # pamqp alone would read the stray byte as an empty key and log guest in.
    conn = Connection()
    conn.receive_data(frames.PROTOCOL_HEADER, 0.0)
    response = encode.field_table({"LOGIN": "guest", "PASSWORD": "guest"})[4:] + b"\x00"
    conn.receive_data(
        testing.marshal(
            0,
            commands.Connection.StartOk(
                client_properties={}, mechanism="AMQPLAIN", response=response.decode()
            ),
        ),
        0.0,
    )
    event = conn.next_event()
    assert isinstance(event, events.ConnectionClosed) and event.reply_code == 0
    assert event.reply_text == "malformed field table: field table entry is truncated"
    assert conn.finished


@pytest.mark.parametrize(
    "table, text",
    [
        ({"LOGIN": "bob"}, "is missing LOGIN or PASSWORD field"),
        ({"LOGIN": "bob", "PASSWORD": 5}, "uses unsupported type for LOGIN or PASSWORD field"),
    ],
)
def test_malformed_amqplain_is_a_silent_502(table, text):
    conn = Connection()
    conn.receive_data(frames.PROTOCOL_HEADER, 0.0)
    response = encode.field_table(table)[4:].decode()
    conn.receive_data(
        testing.marshal(
            0,
            commands.Connection.StartOk(
                client_properties={}, mechanism="AMQPLAIN", response=response
            ),
        ),
        0.0,
    )
    event = conn.next_event()
    assert event.reply_code == 502 and text in event.reply_text
    assert conn.finished
    assert [type(f) for _, f in testing.parse(conn.data_to_send())] == [commands.Connection.Start]

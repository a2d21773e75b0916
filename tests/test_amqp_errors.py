"""Every protocol error path, with RabbitMQ's reply code, text and failing-method ids."""

import struct

import pytest
from pamqp import body as pamqp_body
from pamqp import commands
from pamqp import header as pamqp_header
from protocol import connected, feed, raw_frame

from warrenmq.amqp import (
    AMQPConnectionError,
    ChannelError,
    Connection,
    ConnectionState,
    events,
    frames,
    replies,
    testing,
)


def connection_close(conn, data):
    """Feed data; expect exactly one connection.close; return (code, text, class, method)."""
    conn.receive_data(data, 1.0)
    got = testing.drain(conn)
    assert len(got) == 1 and isinstance(got[0], events.ConnectionClosed), got
    parsed = testing.parse(conn.data_to_send())
    closes = [f for _, f in parsed if isinstance(f, commands.Connection.Close)]
    assert len(closes) == 1, parsed
    close = closes[0]
    assert (got[0].reply_code, got[0].reply_text) == (close.reply_code, close.reply_text)
    return close.reply_code, close.reply_text, close.class_id, close.method_id


def channel_close(conn, data, channel=1):
    conn.receive_data(data, 1.0)
    got = testing.drain(conn)
    assert got and isinstance(got[-1], events.ChannelClosed), got
    [(number, close)] = testing.parse(conn.data_to_send())
    assert number == channel and isinstance(close, commands.Channel.Close)
    assert conn.state is ConnectionState.OPEN
    return close.reply_code, close.reply_text, close.class_id, close.method_id


# -- frame level -------------------------------------------------------------------------------


def test_bad_frame_end_is_fatal_501():
    conn = connected()
    data = raw_frame(1, 1, struct.pack(">HHQB", 60, 80, 1, 0), end=b"\x00")
    assert connection_close(conn, data + testing.heartbeat()) == (
        501,
        "FRAME_ERROR - type 1, all octets = <<0,60,0,80,0,0,0,0,0,0,0,1,0>>: "
        "{invalid_frame_end_marker,0}",
        0,
        0,
    )
    assert conn.finished


def test_bad_frame_end_with_a_long_payload_shows_the_first_16_octets():
    conn = connected()
    code, text, _, _ = connection_close(conn, raw_frame(3, 1, b"a" * 40, end=b"\xcf"))
    assert text == (
        'FRAME_ERROR - type 3, first 16 octets = <<"aaaaaaaaaaaaaaaa">>: '
        "{invalid_frame_end_marker,207}"
    )


def test_frame_larger_than_negotiated_frame_max_is_fatal_501():
    conn = connected(frame_bytes_max=8192)
    header = struct.pack(">BHI", 3, 1, 9000)
    assert connection_close(conn, header) == (
        501,
        "FRAME_ERROR - type 3, all octets = <<>>: {frame_too_large,9000,8184}",
        0,
        0,
    )
    assert conn.finished


def test_frame_max_applies_before_tune_ok_too():
    conn = Connection()
    conn.receive_data(b"AMQP\x00\x00\x09\x01" + struct.pack(">BHI", 1, 0, 5000), 0.0)
    event = testing.drain(conn)[-1]
    assert event.reply_code == 501 and "{frame_too_large,5000,4088}" in event.reply_text
    assert conn.finished


@pytest.mark.parametrize(
    "frame_type, channel, payload, text",
    [
        (9, 0, b"", "FRAME_ERROR - type 9, all octets = <<>>: unknown_frame"),
        (8, 0, b"x", 'FRAME_ERROR - type 8, all octets = <<"x">>: unknown_frame'),
        (1, 1, b"\x00\x3c", "FRAME_ERROR - type 1, all octets = <<0,60>>: unknown_frame"),
        (2, 1, b"\x00\x3c\x00", "FRAME_ERROR - type 2, all octets = <<0,60,0>>: unknown_frame"),
    ],
)
def test_malformed_frames_are_501_unknown_frame(frame_type, channel, payload, text):
    conn = connected()
    assert connection_close(conn, raw_frame(frame_type, channel, payload)) == (501, text, 0, 0)


def test_heartbeat_on_a_channel_and_content_on_channel_0_are_505():
    conn = connected()
    assert connection_close(conn, raw_frame(8, 1, b"")) == (
        505,
        "UNEXPECTED_FRAME - type 8, all octets = <<>>",
        0,
        0,
    )
    conn = connected()
    assert connection_close(conn, raw_frame(3, 0, b"body")) == (
        505,
        'UNEXPECTED_FRAME - type 3, all octets = <<"body">>',
        0,
        0,
    )


# -- content assembly ------------------------------------------------------------------------


def test_content_header_without_a_method_is_505():
    conn = connected()
    header = testing.marshal(1, pamqp_header.ContentHeader(body_size=1))
    assert connection_close(conn, header) == (
        505,
        "UNEXPECTED_FRAME - expected method frame, got non method frame instead",
        0,
        0,
    )


def test_body_without_a_header_is_505():
    conn = connected()
    data = testing.marshal(
        1, commands.Basic.Publish(exchange="", routing_key="q"), pamqp_body.ContentBody(b"x")
    )
    assert connection_close(conn, data) == (
        505,
        "UNEXPECTED_FRAME - expected content header for class 60, got non content header "
        "frame instead",
        60,
        40,
    )


def test_method_while_a_body_is_expected_is_505():
    conn = connected()
    data = testing.marshal(
        1,
        commands.Basic.Publish(exchange="", routing_key="q"),
        pamqp_header.ContentHeader(body_size=10),
        commands.Basic.Ack(delivery_tag=1),
    )
    assert connection_close(conn, data) == (
        505,
        "UNEXPECTED_FRAME - expected content body, got non content body frame instead",
        60,
        40,
    )


def test_channel_close_while_a_header_is_expected_is_505():
    conn = connected()
    data = testing.marshal(
        1,
        commands.Basic.Publish(exchange="", routing_key="q"),
        commands.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0),
    )
    code, text, _, _ = connection_close(conn, data)
    assert (code, text) == (
        505,
        "UNEXPECTED_FRAME - expected content header for class 60, "
        "got non content header frame instead",
    )


def test_header_for_another_class_is_505():
    conn = connected()
    publish = testing.marshal(1, commands.Basic.Publish(exchange="", routing_key="q"))
    header = raw_frame(2, 1, struct.pack(">HHQH", 50, 0, 1, 0))
    assert connection_close(conn, publish + header) == (
        505,
        "UNEXPECTED_FRAME - expected content header for class 60, got one for class 50 instead",
        60,
        40,
    )


def test_body_frame_beyond_the_announced_size_is_501():
    conn = connected()
    data = testing.marshal(
        1,
        commands.Basic.Publish(exchange="", routing_key="q"),
        pamqp_header.ContentHeader(body_size=3),
        pamqp_body.ContentBody(b"four"),
    )
    assert connection_close(conn, data) == (
        501,
        "FRAME_ERROR - content body frame exceeds remaining content size",
        60,
        40,
    )


def header_table(table):
    """Property bytes with only the headers flag, holding ``table`` as its raw bytes."""
    return struct.pack(">HI", 0x2000, len(table)) + table


# Field tables rabbit_binary_parser:parse_table has no clause for.
MALFORMED_TABLES = {
    "string-past-table": b"\x01aS" + struct.pack(">I", 50) + b"hi",
    "partial-entry-after-last": b"\x01aS" + struct.pack(">I", 2) + b"hi" + b"\x00",
    "unknown-type": b"\x01aZ\x00",
    "nested-past-table": b"\x01aF" + struct.pack(">I", 1) + b"\x00",
    "array-unknown-type": b"\x01aA" + struct.pack(">I", 1) + b"Z",
}


PROPERTIES_THAT_DO_NOT_PARSE = {
    # content-type flag set, but the shortstr claims 200 bytes that are not there.
    "shortstr-past-end": struct.pack(">H", 0x8000) + b"\xc8abc",
    "bytes-after-last-property": struct.pack(">HB", 0x1000, 2) + b"zz",
    "headers-past-end": struct.pack(">HI", 0x2000, 40) + b"\x01aS",
    **{f"headers-{case}": header_table(table) for case, table in MALFORMED_TABLES.items()},
}


@pytest.mark.parametrize(
    "properties",
    list(PROPERTIES_THAT_DO_NOT_PARSE.values()),
    ids=list(PROPERTIES_THAT_DO_NOT_PARSE),
)
def test_property_bytes_that_do_not_parse_are_a_bare_541(properties):
    # RabbitMQ's channel process crashes decoding them; its reader closes with 541.
    conn = connected()
    publish = testing.marshal(1, commands.Basic.Publish(exchange="", routing_key="q"))
    header = raw_frame(2, 1, struct.pack(">HHQ", 60, 0, 0) + properties)
    assert connection_close(conn, publish + header) == (541, "INTERNAL_ERROR", 0, 0)


def test_property_bytes_refused_though_they_parse_are_501():
    conn = connected()
    publish = testing.marshal(1, commands.Basic.Publish(exchange="", routing_key="q"))
    header = raw_frame(2, 1, struct.pack(">HHQH", 60, 0, 0, 0x8000) + b"\x02\xff\xfe")
    assert connection_close(conn, publish + header) == (
        501,
        "FRAME_ERROR - Malformed UTF-8 in shortstr",
        60,
        40,
    )


def test_message_over_the_size_limit_closes_the_channel_with_406():
    conn = connected(channels=(1, 2), message_bytes_max=1000)
    data = testing.publish(1, "", "q", b"x" * 1001) + testing.publish(2, "", "q", b"ok")
    conn.receive_data(data, 1.0)
    got = testing.drain(conn)
    assert got[0] == events.ChannelClosed(
        1,
        406,
        "PRECONDITION_FAILED - message size 1001 is larger than configured max size 1000",
        False,
    )
    assert got[1].channel == 2 and got[1].body == b"ok"
    [(number, close)] = testing.parse(conn.data_to_send())
    assert (number, close.reply_code, close.class_id, close.method_id) == (1, 406, 60, 40)


def test_immediate_publish_is_540():
    conn = connected()
    data = testing.marshal(1, commands.Basic.Publish(exchange="", routing_key="q", immediate=True))
    assert connection_close(conn, data) == (540, "NOT_IMPLEMENTED - immediate=true", 60, 40)


# -- methods ---------------------------------------------------------------------------------


def test_undecodable_method_arguments_are_501_with_the_method_ids():
    conn = connected()
    data = raw_frame(1, 1, struct.pack(">HH", 60, 10) + b"\x01")
    assert connection_close(conn, data) == (501, "FRAME_ERROR - cannot decode <<1>>", 60, 10)
    conn = connected()
    data = raw_frame(1, 1, struct.pack(">HH", 60, 80) + b"\x01\x02")
    assert connection_close(conn, data) == (501, "FRAME_ERROR - cannot decode <<1,2>>", 60, 80)


def declare_payload(table, trailing=b""):
    """queue.declare ids and arguments for queue "q", exclusive, with ``table`` as its
    arguments table's raw bytes."""
    return (
        struct.pack(">HHHB", 50, 10, 0, 1)
        + b"q"
        + b"\x04"
        + struct.pack(">I", len(table))
        + table
        + trailing
    )


@pytest.mark.parametrize("table", list(MALFORMED_TABLES.values()), ids=list(MALFORMED_TABLES))
def test_malformed_table_in_method_arguments_drops_the_connection_unannounced(table):
    # RabbitMQ's reader process crashes in parse_table: the socket closes, nothing is sent.
    conn = connected(channels=(1, 2))
    conn.receive_data(
        raw_frame(1, 1, declare_payload(table))
        + testing.marshal(2, commands.Basic.Qos(prefetch_count=1)),
        1.0,
    )
    [event] = testing.drain(conn)
    assert isinstance(event, events.ConnectionClosed) and event.reply_code == 0
    assert event.reply_text.startswith("malformed field table: ") and not event.by_peer
    assert conn.finished and conn.data_to_send() == b""


def test_method_arguments_must_end_with_their_last_field():
    good = declare_payload(b"\x01aS" + struct.pack(">I", 2) + b"hi")
    conn = connected()
    [event] = feed(conn, raw_frame(1, 1, good))
    assert event.method.arguments == {"a": "hi"}
    conn = connected()
    code, text, class_id, method_id = connection_close(conn, raw_frame(1, 1, good + b"\x00"))
    assert (code, class_id, method_id) == (501, 50, 10)
    decoded = ",".join(map(str, good[4:] + b"\x00"))
    assert text == f"FRAME_ERROR - cannot decode <<{decoded}>>"


@pytest.mark.filterwarnings("ignore:This command is deprecated:DeprecationWarning")
def test_the_strict_argument_check_takes_every_method_pamqp_encodes():
    samples = {
        "shortstr": "x",
        "longstr": "y",
        "table": {"k": "v", "n": {"a": [1, "s"]}},
        "bit": True,
        "octet": 1,
        "short": 2,
        "long": 3,
        "longlong": 4,
    }
    for index, kind in commands.INDEX_MAPPING.items():
        method = kind()
        for name in kind.__slots__:
            if getattr(method, name) is None:
                setattr(method, name, samples[kind.amqp_type(name)])
        arguments = testing.marshal(1, method)[11:-1]
        decoded = frames.decode_method(index >> 16, index & 0xFFFF, arguments)
        assert [getattr(decoded, name) for name in kind.__slots__] == [
            getattr(method, name) for name in kind.__slots__
        ], kind.name


def start_ok_with_client_properties(table):
    return raw_frame(
        1,
        0,
        struct.pack(">HHI", 10, 11, len(table))
        + table
        + b"\x05PLAIN"
        + struct.pack(">I", 12)
        + b"\0guest\0guest"
        + b"\x05en_US",
    )


def test_malformed_client_properties_close_the_handshake_silently():
    conn = Connection()
    start_ok = start_ok_with_client_properties(MALFORMED_TABLES["partial-entry-after-last"])
    conn.receive_data(b"AMQP\x00\x00\x09\x01" + start_ok, 0.0)
    [event] = testing.drain(conn)
    assert event.reply_code == 0 and event.reply_text.startswith("malformed field table: ")
    assert conn.finished
    assert [type(f) for _, f in testing.parse(conn.data_to_send())] == [commands.Connection.Start]


def test_malformed_table_on_channel_0_of_an_open_connection_is_a_bare_541():
    conn = connected()
    start_ok = start_ok_with_client_properties(MALFORMED_TABLES["partial-entry-after-last"])
    assert connection_close(conn, start_ok) == (541, "INTERNAL_ERROR", 0, 0)


def test_unknown_method_is_540():
    conn = connected()
    data = raw_frame(1, 1, struct.pack(">HH", 60, 99))
    assert connection_close(conn, data) == (540, "NOT_IMPLEMENTED - unknown method {60,99}", 60, 99)


def test_method_on_a_channel_that_is_not_open_is_504():
    conn = connected(channels=())
    data = testing.marshal(5, commands.Basic.Qos(prefetch_count=10))
    assert connection_close(conn, data) == (504, "CHANNEL_ERROR - expected 'channel.open'", 60, 10)


def test_second_channel_open_is_504():
    conn = connected()
    assert connection_close(conn, testing.marshal(1, commands.Channel.Open())) == (
        504,
        "CHANNEL_ERROR - second 'channel.open' seen",
        20,
        10,
    )


def test_server_only_methods_from_the_client_are_503():
    conn = connected()
    data = testing.marshal(
        1, commands.Basic.Deliver(consumer_tag="c", delivery_tag=1, exchange="", routing_key="q")
    )
    assert connection_close(conn, data) == (503, "COMMAND_INVALID - unimplemented method", 60, 60)
    conn = connected()
    data = testing.marshal(1, commands.Channel.CloseOk())
    assert connection_close(conn, data)[:2] == (503, "COMMAND_INVALID - unimplemented method")


def test_wrong_method_on_channel_0_is_504_with_the_state_name():
    conn = connected()
    data = testing.marshal(
        0, commands.Connection.TuneOk(channel_max=1, frame_max=4096, heartbeat=0)
    )
    assert connection_close(conn, data) == (
        504,
        "CHANNEL_ERROR - unexpected method in connection state running",
        10,
        31,
    )
    conn = connected()
    data = testing.marshal(0, commands.Basic.Qos())
    assert connection_close(conn, data)[:2] == (
        504,
        "CHANNEL_ERROR - unexpected method in connection state running",
    )


def test_wrong_method_while_opening_gets_a_close():
    conn = Connection()
    conn.receive_data(b"AMQP\x00\x00\x09\x01" + testing.marshal(0, testing.start_ok()), 0.0)
    testing.drain(conn)
    conn.accept_login()
    conn.receive_data(
        testing.marshal(0, commands.Connection.TuneOk(channel_max=10, frame_max=4096, heartbeat=0)),
        0.0,
    )
    conn.data_to_send()
    assert connection_close(
        conn,
        testing.marshal(0, commands.Connection.TuneOk(channel_max=10, frame_max=4096, heartbeat=0)),
    ) == (504, "CHANNEL_ERROR - unexpected method in connection state opening", 10, 31)


def test_frames_on_channels_before_open_close_silently():
    conn = Connection()
    conn.receive_data(b"AMQP\x00\x00\x09\x01" + testing.marshal(1, commands.Channel.Open()), 0.0)
    [event] = testing.drain(conn)
    assert event.reply_code == 505 and conn.finished
    assert [type(f) for _, f in testing.parse(conn.data_to_send())[1:]] == []


# -- channel limits --------------------------------------------------------------------------


def test_channel_max_is_enforced_by_count_only():
    conn = connected(channels=(1, 2), channel_max=2)
    assert connection_close(conn, testing.marshal(3, commands.Channel.Open())) == (
        530,
        "NOT_ALLOWED - number of channels opened (2) has reached the negotiated channel_max (2)",
        0,
        0,
    )
    # As rabbit_reader:create_channel/2: numbers above channel_max open while the count allows.
    conn = connected(channels=(65535,), channel_max=2)
    conn.receive_data(testing.marshal(7, commands.Channel.Open()), 1.0)
    assert testing.drain(conn) == [events.ChannelOpened(7)]
    assert conn.channel_is_open(65535) and conn.channel_is_open(7)
    assert connection_close(conn, testing.marshal(3, commands.Channel.Open())) == (
        530,
        "NOT_ALLOWED - number of channels opened (2) has reached the negotiated channel_max (2)",
        0,
        0,
    )


# -- after close ------------------------------------------------------------------------------


def test_after_a_connection_error_nothing_more_is_processed():
    conn = connected()
    data = (
        testing.marshal(1, commands.Channel.Open())
        + testing.publish(1, "", "q", b"never")
        + testing.marshal(2, commands.Channel.Open())
    )
    code, _, _, _ = connection_close(conn, data)
    assert code == 504
    assert conn.state is ConnectionState.CLOSING
    conn.receive_data(testing.publish(1, "", "q", b"never"), 2.0)
    assert testing.drain(conn) == [] and conn.data_to_send() == b""


def test_other_connections_are_unaffected():
    healthy = connected()
    broken = connected()
    connection_close(broken, raw_frame(9, 0, b""))
    healthy.receive_data(testing.publish(1, "", "q", b"fine"), 1.0)
    [event] = testing.drain(healthy)
    assert event.body == b"fine"


# -- the reply module --------------------------------------------------------------------------


def test_reply_texts_and_error_types():
    assert replies.format_reply_text(404, "no queue 'x' in vhost '/'") == (
        "NOT_FOUND - no queue 'x' in vhost '/'"
    )
    long = replies.format_reply_text(406, "é" * 300)
    assert len(long.encode()) <= 255 and long.startswith("PRECONDITION_FAILED - éé")
    assert isinstance(replies.protocol_error(405, "locked"), ChannelError)
    assert isinstance(replies.protocol_error(530, "no"), AMQPConnectionError)
    assert replies.is_hard(504) and replies.is_hard(540) and not replies.is_hard(403)
    with pytest.raises(AssertionError):
        ChannelError(501, "frame errors are hard")
    error = ChannelError(406, "unknown delivery tag 3", 60, 80)
    assert str(error) == "PRECONDITION_FAILED - unknown delivery tag 3 (class 60, method 80)"


def test_broker_raised_error_takes_the_last_method_ids():
    conn = connected()
    testing.drain(conn)
    conn.receive_data(testing.marshal(1, commands.Basic.Ack(delivery_tag=9)), 1.0)
    [ack] = testing.drain(conn)
    conn.fail(
        ChannelError(replies.PRECONDITION_FAILED, f"unknown delivery tag {ack.delivery_tag}"), 1
    )
    [(_, close)] = testing.parse(conn.data_to_send())
    assert (close.reply_code, close.reply_text, close.class_id, close.method_id) == (
        406,
        "PRECONDITION_FAILED - unknown delivery tag 9",
        60,
        80,
    )

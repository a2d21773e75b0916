"""Channels: lifecycle, publish assembly, confirms, flow, acks, broker-raised channel errors."""

import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import body as pamqp_body
from pamqp import commands
from pamqp import header as pamqp_header
from protocol import connected, feed, raw_frame

from warrenmq.amqp import ChannelError, events, fastpath, replies, testing


def sent(conn):
    return testing.parse(conn.data_to_send())


def test_channel_open_close_by_client_and_number_reuse():
    conn = connected(channels=())
    assert feed(conn, testing.marshal(3, commands.Channel.Open())) == [events.ChannelOpened(3)]
    [(channel, open_ok)] = sent(conn)
    assert channel == 3 and isinstance(open_ok, commands.Channel.OpenOk)
    close = commands.Channel.Close(reply_code=200, reply_text="done", class_id=0, method_id=0)
    assert feed(conn, testing.marshal(3, close)) == [events.ChannelClosed(3, 200, "done", True)]
    [(channel, close_ok)] = sent(conn)
    assert channel == 3 and isinstance(close_ok, commands.Channel.CloseOk)
    assert not conn.channel_is_open(3)
    assert feed(conn, testing.marshal(3, commands.Channel.Open())) == [events.ChannelOpened(3)]


def test_publish_event_carries_property_bytes_verbatim():
    conn = connected()
    properties = commands.Basic.Properties(
        content_type="application/json",
        headers={"a": 1, "b": "x"},
        delivery_mode=2,
        priority=7,
        expiration="60000",
        user_id="guest",
        message_id="m1",
    )
    [event] = feed(
        conn, testing.publish(1, "amq.topic", "a.b", b'{"k": 1}', properties, mandatory=True)
    )
    assert isinstance(event, events.MessagePublished)
    assert (event.exchange, event.routing_key, event.mandatory) == ("amq.topic", "a.b", True)
    assert event.properties == properties.marshal()
    assert event.body == b'{"k": 1}'
    assert (event.delivery_mode, event.priority, event.expiration, event.user_id) == (
        2,
        7,
        "60000",
        "guest",
    )
    assert event.confirm_tag == 0


def test_empty_body_needs_no_body_frame():
    conn = connected()
    [event] = feed(conn, testing.publish(1, "", "q", b""))
    assert event.body == b"" and event.properties == b"\x00\x00"


@settings(max_examples=80)
@given(
    body=st.binary(max_size=20000),
    frame_max=st.integers(min_value=4096, max_value=9000),
    cut=st.integers(min_value=0, max_value=30000),
)
def test_multi_frame_bodies_are_joined(body, frame_max, cut):
    conn = connected(frame_bytes_max=frame_max)
    data = testing.publish(1, "ex", "rk", body, frame_max=frame_max)
    cut %= len(data) + 1
    [event] = feed(conn, data[:cut], data[cut:])
    assert event.body == body and event.exchange == "ex"


def test_publishes_on_two_channels_interleave():
    conn = connected(channels=(1, 2), frame_bytes_max=4096)
    one = testing.publish(1, "", "a", b"1" * 10000, frame_max=4096)
    two = testing.publish(2, "", "b", b"2" * 5000, frame_max=4096)
    frames_one, frames_two = testing.parse(one), testing.parse(two)
    interleaved = []
    for i in range(max(len(frames_one), len(frames_two))):
        for parsed in (frames_one, frames_two):
            if i < len(parsed):
                interleaved.append(testing.marshal(*parsed[i]))
    published = feed(conn, b"".join(interleaved))
    assert sorted((e.channel, e.routing_key, len(e.body)) for e in published) == [
        (1, "a", 10000),
        (2, "b", 5000),
    ]


def test_confirm_mode_numbers_publishes_and_confirms_encode():
    conn = connected()
    assert feed(conn, testing.marshal(1, commands.Confirm.Select())) == []
    [(_, select_ok)] = sent(conn)
    assert isinstance(select_ok, commands.Confirm.SelectOk)
    published = feed(conn, *(testing.publish(1, "", "q", b"m") for _ in range(3)))
    assert [e.confirm_tag for e in published] == [1, 2, 3]
    assert conn.confirm(1, 3, multiple=True)
    assert conn.confirm(1, 4, nack=True)
    [(_, ack), (_, nack)] = sent(conn)
    assert isinstance(ack, commands.Basic.Ack) and (ack.delivery_tag, ack.multiple) == (3, True)
    assert isinstance(nack, commands.Basic.Nack) and nack.delivery_tag == 4
    assert not nack.multiple and not nack.requeue


def test_confirm_select_nowait_sends_nothing():
    conn = connected()
    feed(conn, testing.marshal(1, commands.Confirm.Select(nowait=True)))
    assert conn.data_to_send() == b""
    [event] = feed(conn, testing.publish(1, "", "q", b""))
    assert event.confirm_tag == 1


def test_tx_and_confirm_do_not_mix():
    conn = connected(channels=(1, 2))
    [event] = feed(conn, testing.marshal(1, commands.Tx.Select()))
    assert isinstance(event.method, commands.Tx.Select)
    [closed] = feed(conn, testing.marshal(1, commands.Confirm.Select()))
    assert closed == events.ChannelClosed(
        1, 406, "PRECONDITION_FAILED - cannot switch from tx to confirm mode", False
    )
    [(_, close)] = sent(conn)
    assert (close.reply_code, close.class_id, close.method_id) == (406, 85, 10)
    feed(conn, testing.marshal(2, commands.Confirm.Select()))
    [closed] = feed(conn, testing.marshal(2, commands.Tx.Select()))
    assert closed.reply_text == "PRECONDITION_FAILED - cannot switch from confirm to tx mode"


def test_flow_active_is_acknowledged_and_inactive_is_540_as_in_rabbitmq():
    conn = connected()
    assert feed(conn, testing.marshal(1, commands.Channel.Flow(active=True))) == [
        events.FlowChanged(1, True)
    ]
    [(_, flow_ok)] = sent(conn)
    assert isinstance(flow_ok, commands.Channel.FlowOk) and flow_ok.active is True
    [closed] = feed(conn, testing.marshal(1, commands.Channel.Flow(active=False)))
    assert closed == events.ConnectionClosed(540, "NOT_IMPLEMENTED - active=false", False)
    [(_, close)] = sent(conn)
    assert (close.reply_code, close.class_id, close.method_id) == (540, 20, 20)


def test_ack_nack_reject_events():
    conn = connected()
    got = feed(
        conn,
        testing.marshal(
            1,
            commands.Basic.Ack(delivery_tag=5, multiple=True),
            commands.Basic.Nack(delivery_tag=6, multiple=False, requeue=True),
            commands.Basic.Reject(delivery_tag=7, requeue=False),
        ),
    )
    assert got == [
        events.Acked(1, 5, True),
        events.Nacked(1, 6, False, True),
        events.Rejected(1, 7, False),
    ]


def test_other_methods_reach_the_broker_as_pamqp_objects():
    conn = connected()
    [event] = feed(
        conn,
        testing.marshal(
            1, commands.Queue.Declare(queue="jobs", durable=True, arguments={"x-max-length": 10})
        ),
    )
    assert event.channel == 1 and isinstance(event.method, commands.Queue.Declare)
    assert event.method.queue == "jobs" and event.method.arguments == {"x-max-length": 10}
    assert conn.send_method(
        1, commands.Queue.DeclareOk(queue="jobs", message_count=0, consumer_count=0)
    )
    [(_, declare_ok)] = sent(conn)
    assert declare_ok.queue == "jobs"


def test_replies_carrying_names_pamqp_refuses_go_out_on_open_channels_only():
    conn = connected()
    assert conn.declare_ok(1, "café", 3, 1)
    assert conn.consume_ok(1, "tag (1) \N{RABBIT}")
    assert conn.cancel_ok(1, "tag (1) \N{RABBIT}")
    [(_, declare_ok), (_, consume_ok), (_, cancel_ok)] = sent(conn)
    assert (declare_ok.queue, declare_ok.message_count, declare_ok.consumer_count) == ("café", 3, 1)
    assert consume_ok.consumer_tag == cancel_ok.consumer_tag == "tag (1) \N{RABBIT}"
    assert not conn.declare_ok(2, "café", 0, 0)
    assert not conn.consume_ok(2, "t") and not conn.cancel_ok(2, "t")
    assert conn.data_to_send() == b""


def test_broker_channel_error_closes_only_that_channel_and_drops_what_follows():
    conn = connected(channels=(1, 2))
    conn.receive_data(
        testing.marshal(1, commands.Queue.Declare(queue="missing", passive=True))
        + testing.publish(1, "", "q", b"dropped")
        + testing.marshal(1, commands.Queue.Declare(queue="dropped too"))
        + testing.publish(2, "", "q", b"kept"),
        1.0,
    )
    declare = conn.next_event()
    assert isinstance(declare.method, commands.Queue.Declare)
    conn.fail(ChannelError(replies.NOT_FOUND, "no queue 'missing' in vhost '/'"), 1)
    assert conn.next_event() == events.ChannelClosed(
        1, 404, "NOT_FOUND - no queue 'missing' in vhost '/'", False
    )
    kept = conn.next_event()
    assert (kept.channel, kept.body) == (2, b"kept")
    assert conn.next_event() is None
    [(channel, close)] = sent(conn)
    assert channel == 1 and (close.reply_code, close.class_id, close.method_id) == (404, 50, 10)
    assert close.reply_text == "NOT_FOUND - no queue 'missing' in vhost '/'"
    assert not conn.deliver(1, "c", 1, False, "", "q", b"\x00\x00", b"x")
    # A crossing channel.close is answered; close-ok frees the number for reuse.
    feed(
        conn,
        testing.marshal(
            1, commands.Channel.Close(reply_code=200, reply_text="", class_id=0, method_id=0)
        ),
    )
    [(_, close_ok)] = sent(conn)
    assert isinstance(close_ok, commands.Channel.CloseOk)
    assert feed(conn, testing.marshal(1, commands.Channel.Open())) == []
    assert feed(conn, testing.marshal(1, commands.Channel.CloseOk())) == []
    assert feed(conn, testing.marshal(1, commands.Channel.Open())) == [events.ChannelOpened(1)]


def test_broker_connection_error_from_a_channel_closes_the_connection():
    conn = connected()
    [event] = feed(
        conn, testing.marshal(1, commands.Exchange.Declare(exchange="x", exchange_type="bogus"))
    )
    conn.fail(replies.protocol_error(replies.COMMAND_INVALID, "unknown exchange type 'bogus'"), 1)
    [(channel, close)] = sent(conn)
    assert channel == 0 and (close.reply_code, close.class_id, close.method_id) == (503, 40, 10)
    assert close.reply_text == "COMMAND_INVALID - unknown exchange type 'bogus'"
    assert isinstance(conn.next_event(), events.ConnectionClosed)


def test_delivery_round_trips_through_a_client_parser():
    conn = connected(frame_bytes_max=4096)
    properties = commands.Basic.Properties(
        content_type="text/plain", delivery_mode=2, headers={"x-id": 9}
    )
    [published] = feed(
        conn, testing.publish(1, "ex", "rk", b"b" * 9000, properties, frame_max=4096)
    )
    assert conn.deliver(
        1,
        "ctag-1",
        42,
        True,
        published.exchange,
        published.routing_key,
        published.properties,
        published.body,
    )
    parsed = sent(conn)
    deliver, header = parsed[0][1], parsed[1][1]
    assert isinstance(deliver, commands.Basic.Deliver)
    assert (deliver.consumer_tag, deliver.delivery_tag, deliver.redelivered) == ("ctag-1", 42, True)
    assert (deliver.exchange, deliver.routing_key) == ("ex", "rk")
    assert isinstance(header, pamqp_header.ContentHeader) and header.body_size == 9000
    assert header.properties == properties
    bodies = [f for _, f in parsed[2:]]
    assert all(isinstance(b, pamqp_body.ContentBody) for b in bodies)
    assert all(len(b.value) <= 4096 - 8 for b in bodies)
    assert b"".join(b.value for b in bodies) == published.body


def test_a_large_delivered_body_is_a_part_of_its_own_until_written():
    """The broker writes such parts without joining them (transport.writelines): the body
    object itself is handed over, and the parts make the same bytes as data_to_send."""
    body = b"b" * 16384
    messages = [fastpath.Delivery(b"", b"q", b"\x00\x00", body)] * 2
    parts_conn, bytes_conn = connected(), connected()
    for conn in (parts_conn, bytes_conn):
        conn.deliver_many(1, "ctag", 1, messages)
    parts = parts_conn.parts_to_send()
    assert sum(part is body for part in parts) == 2
    assert b"".join(parts) == bytes_conn.data_to_send()
    assert parts_conn.parts_to_send() == () and parts_conn.data_to_send() == b""


def test_get_ok_and_return_are_sent_with_content():
    conn = connected()
    assert conn.get_ok(1, 7, False, "", "q", 3, b"\x00\x00", b"payload")
    assert conn.basic_return(1, replies.NO_ROUTE, "", "ex", "nowhere", b"\x00\x00", b"p")
    parsed = sent(conn)
    get_ok, returned = parsed[0][1], parsed[3][1]
    assert (get_ok.delivery_tag, get_ok.message_count, parsed[2][1].value) == (7, 3, b"payload")
    assert (returned.reply_code, returned.reply_text) == (312, "NO_ROUTE")
    assert returned.routing_key == "nowhere"


def test_empty_body_frames_are_not_held():
    """A client can send zero-length body frames without end while a body is due: they add
    nothing, so the assembler must keep nothing for them (tracemalloc sees no growth)."""
    conn = connected()
    feed(
        conn,
        testing.marshal(1, commands.Basic.Publish(exchange="", routing_key="q")),
        testing.marshal(1, pamqp_header.ContentHeader(0, 5, commands.Basic.Properties())),
    )
    empties = raw_frame(3, 1, b"") * 100_000
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for _ in range(2):
            assert feed(conn, empties) == []
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # A reference kept per frame would be 1.6 MB.
    assert after - before < 256 << 10
    [event] = feed(conn, raw_frame(3, 1, b"hello"))
    assert event.body == b"hello"


def test_a_channel_the_broker_refuses_gets_no_open_ok():
    asked = []

    def refusal(username):
        asked.append(username)
        return "limit reached" if len(asked) > 1 else None

    conn = connected(channels=(), channel_refusal=refusal)
    assert feed(conn, testing.marshal(1, commands.Channel.Open())) == [events.ChannelOpened(1)]
    conn.data_to_send()
    assert feed(conn, testing.marshal(2, commands.Channel.Open()))[-1] == events.ConnectionClosed(
        530, "NOT_ALLOWED - limit reached", False
    )
    [(channel, close)] = sent(conn)
    assert channel == 0 and isinstance(close, commands.Connection.Close)
    assert (close.reply_code, close.class_id, close.method_id) == (530, 0, 0)
    assert asked == ["guest", "guest"]


def test_parsing_stops_after_each_content_frame_while_asked():
    conn = connected()
    conn.stop_at_content(True)
    publish = testing.marshal(1, commands.Basic.Publish(exchange="", routing_key="q"))
    header = testing.marshal(1, pamqp_header.ContentHeader(0, 4, commands.Basic.Properties()))
    qos = testing.marshal(1, commands.Basic.Qos(prefetch_count=1))
    body = raw_frame(3, 1, b"ab") + raw_frame(3, 1, b"cd")
    assert feed(conn, publish + header + body + qos) == []
    assert conn.stopped_at_content, "stopped after the header, the body unread"
    assert testing.drain(conn) == []
    conn.stop_at_content(False)
    conn.stop_at_content(True)
    assert testing.drain(conn) == [] and conn.stopped_at_content, "and after a body frame"
    conn.stop_at_content(False)
    published, qos_received = testing.drain(conn)
    assert published.body == b"abcd" and isinstance(qos_received.method, commands.Basic.Qos)

    conn.stop_at_content(True)
    empty = testing.marshal(1, pamqp_header.ContentHeader(0, 0, commands.Basic.Properties()))
    [published] = feed(conn, publish + empty + qos)
    assert published.body == b"" and conn.stopped_at_content, "a header is a whole empty message"
    assert testing.drain(conn) == []

"""The broker against an unmodified client (pika): every channel method and its error paths.

The broker runs in-process on its own event-loop thread, on a free port, with a temporary
data directory; each test uses its own queue and exchange names.
"""

from __future__ import annotations

import time
import uuid

import pika
import pika.exceptions
import pytest
from brokers import ThreadBroker


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    running = ThreadBroker(tmp_path_factory.mktemp("broker")).start()
    yield running
    running.stop()


@pytest.fixture
def conn(broker):
    connection = broker.connect()
    yield connection
    if connection.is_open:
        connection.close()


def name(prefix="q"):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def drain(channel, queue, count, timeout_s=5.0, ack=True):
    got = []
    deadline = time.monotonic() + timeout_s
    for method, properties, body in channel.consume(queue, inactivity_timeout=0.2):
        if method is None:
            if len(got) >= count or time.monotonic() > deadline:
                break
            continue
        got.append((method, properties, body))
        if ack:
            channel.basic_ack(method.delivery_tag)
        if len(got) >= count:
            break
    channel.cancel()
    return got


def pump(connection, until, timeout_s=3.0):
    """Run pika's I/O until `until()` holds (pika flushes publishes lazily) or time runs out."""
    deadline = time.monotonic() + timeout_s
    while not until() and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.05)
    return until()


def closed_with(excinfo):
    return excinfo.value.args[0], excinfo.value.args[1]


# -- publish, consume, confirms ----------------------------------------------------------------


def test_confirmed_publish_then_consume_in_order_with_properties(conn):
    ch = conn.channel()
    ch.confirm_delivery()
    q = ch.queue_declare(name(), durable=True).method.queue
    properties = pika.BasicProperties(
        delivery_mode=2, content_type="text/plain", headers={"k": "v", "n": 7}, message_id="m1"
    )
    for i in range(50):
        ch.basic_publish("", q, b"body-%d" % i, properties)
    assert ch.queue_declare(q, passive=True).method.message_count == 50
    got = drain(ch, q, 50)
    assert [body for _, _, body in got] == [b"body-%d" % i for i in range(50)]
    assert got[0][1].headers == {"k": "v", "n": 7}
    assert got[0][1].content_type == "text/plain"
    assert got[0][1].message_id == "m1"
    assert not got[0][0].redelivered


def test_large_body_spans_frames(conn):
    ch = conn.channel()
    q = ch.queue_declare(name(), exclusive=True).method.queue
    body = bytes(range(256)) * 2000
    ch.basic_publish("", q, body)
    method, _, got = drain(ch, q, 1)[0]
    assert got == body


def test_get_and_get_empty_and_message_count(conn):
    ch = conn.channel()
    q = ch.queue_declare(name(), exclusive=True).method.queue
    assert ch.basic_get(q) == (None, None, None)
    for i in range(3):
        ch.basic_publish("", q, b"%d" % i)
    method, _, body = ch.basic_get(q)
    assert body == b"0" and method.message_count == 2
    ch.basic_ack(method.delivery_tag)
    method, _, body = ch.basic_get(q, auto_ack=True)
    assert body == b"1"


def test_mandatory_unroutable_is_returned_with_312(conn):
    ch = conn.channel()
    returned = []
    ch.add_on_return_callback(lambda *args: returned.append(args))
    ch.basic_publish("amq.direct", name("nowhere"), b"lost", mandatory=True)
    pump(conn, lambda: returned)
    assert len(returned) == 1
    _, method, _, body = returned[0]
    assert (method.reply_code, method.reply_text) == (312, "NO_ROUTE")
    assert body == b"lost"


def test_confirm_mode_with_mandatory_unroutable_raises_in_pika(conn):
    ch = conn.channel()
    ch.confirm_delivery()
    with pytest.raises(pika.exceptions.UnroutableError):
        ch.basic_publish("amq.direct", name("nowhere"), b"lost", mandatory=True)


def test_publish_to_missing_exchange_is_404(conn):
    ch = conn.channel()
    ch.basic_publish("no-such-exchange", "k", b"x")
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        ch.queue_declare(name(), exclusive=True)
    assert closed_with(excinfo) == (404, "NOT_FOUND - no exchange 'no-such-exchange' in vhost '/'")


# -- acks ----------------------------------------------------------------------------------------


def test_unknown_delivery_tag_is_406(conn):
    ch = conn.channel()
    ch.basic_ack(99)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        ch.queue_declare(name(), exclusive=True)
    assert closed_with(excinfo) == (406, "PRECONDITION_FAILED - unknown delivery tag 99")


def test_double_ack_is_406(conn):
    ch = conn.channel()
    q = ch.queue_declare(name(), exclusive=True).method.queue
    ch.basic_publish("", q, b"x")
    method, _, _ = ch.basic_get(q)
    ch.basic_ack(method.delivery_tag)
    ch.basic_ack(method.delivery_tag)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        ch.queue_declare(q, passive=True)
    assert closed_with(excinfo) == (406, "PRECONDITION_FAILED - unknown delivery tag 1")


def test_nack_requeue_redelivers_and_reject_drops(conn):
    ch = conn.channel()
    q = ch.queue_declare(name(), exclusive=True).method.queue
    for i in range(3):
        ch.basic_publish("", q, b"%d" % i)
    first, _, _ = ch.basic_get(q)
    second, _, _ = ch.basic_get(q)
    ch.basic_nack(second.delivery_tag, multiple=True, requeue=True)
    method, _, body = ch.basic_get(q)
    assert body == b"0" and method.redelivered
    ch.basic_reject(method.delivery_tag, requeue=False)
    method, _, body = ch.basic_get(q)
    assert body == b"1" and method.redelivered
    ch.basic_ack(method.delivery_tag)
    method, _, body = ch.basic_get(q)
    assert body == b"2" and not method.redelivered
    ch.basic_ack(method.delivery_tag)
    assert ch.queue_declare(q, passive=True).method.message_count == 0


def test_multiple_ack_settles_everything_up_to_the_tag(conn):
    ch = conn.channel()
    q = ch.queue_declare(name(), exclusive=True).method.queue
    for i in range(5):
        ch.basic_publish("", q, b"%d" % i)
    tags = [ch.basic_get(q)[0].delivery_tag for _ in range(5)]
    ch.basic_ack(tags[3], multiple=True)
    ch.basic_recover(requeue=True)
    method, _, body = ch.basic_get(q, auto_ack=True)
    assert body == b"4" and method.redelivered
    assert ch.basic_get(q) == (None, None, None)


def test_closing_a_channel_requeues_its_unacked(conn):
    ch = conn.channel()
    q = ch.queue_declare(name(), exclusive=True).method.queue
    ch.basic_publish("", q, b"x")
    other = conn.channel()
    method, _, _ = other.basic_get(q)
    assert method is not None
    other.close()
    method, _, body = ch.basic_get(q, auto_ack=True)
    assert body == b"x" and method.redelivered


# -- qos and consumers -----------------------------------------------------------------------------


def test_prefetch_limits_unacked_deliveries(conn):
    ch = conn.channel()
    q = ch.queue_declare(name(), exclusive=True).method.queue
    for i in range(10):
        ch.basic_publish("", q, b"%d" % i)
    ch.basic_qos(prefetch_count=3)
    got = []
    ch.basic_consume(q, lambda c, m, p, b: got.append(m))
    pump(conn, lambda: len(got) >= 3)
    conn.process_data_events(time_limit=0.3)
    assert len(got) == 3
    ch.basic_ack(got[-1].delivery_tag, multiple=True)
    pump(conn, lambda: len(got) >= 6)
    conn.process_data_events(time_limit=0.3)
    assert len(got) == 6


def test_a_single_consumer_gets_every_message_in_order_with_consecutive_tags(conn):
    """One consumer is served a slice at a time; what it sees must not differ from one
    delivery per message: order, tags, prefetch, redeliveries first, auto-ack."""
    ch = conn.channel()
    q = ch.queue_declare(name(), exclusive=True).method.queue
    count = 2500  # more than one dispatch pass (1024)
    for i in range(count):
        ch.basic_publish("", q, b"%d" % i)
    ch.basic_qos(prefetch_count=1500)
    got = []
    tag = ch.basic_consume(q, lambda c, m, p, b: got.append((m.delivery_tag, m.redelivered, b)))
    assert pump(conn, lambda: len(got) >= 1500)
    conn.process_data_events(time_limit=0.3)
    assert [t for t, _, _ in got] == list(range(1, 1501))
    assert [b for _, _, b in got] == [b"%d" % i for i in range(1500)]
    ch.basic_nack(got[9][0], multiple=True, requeue=True)
    assert pump(conn, lambda: len(got) >= 1510)
    conn.process_data_events(time_limit=0.3)
    assert got[1500:] == [(1501 + i, True, b"%d" % i) for i in range(10)]
    ch.basic_cancel(tag)
    ch.basic_ack(0, multiple=True)
    rest = []
    ch.basic_consume(q, lambda c, m, p, b: rest.append((m.delivery_tag, b)), auto_ack=True)
    assert pump(conn, lambda: len(rest) >= count - 1500)
    assert rest == [(1511 + i, b"%d" % (1500 + i)) for i in range(count - 1500)]


def test_global_prefetch_is_shared_by_the_channel_consumers(conn):
    ch = conn.channel()
    q1 = ch.queue_declare(name(), exclusive=True).method.queue
    q2 = ch.queue_declare(name(), exclusive=True).method.queue
    for _ in range(5):
        ch.basic_publish("", q1, b"a")
        ch.basic_publish("", q2, b"b")
    ch.basic_qos(prefetch_count=4, global_qos=True)
    got = []
    ch.basic_consume(q1, lambda c, m, p, b: got.append(b))
    ch.basic_consume(q2, lambda c, m, p, b: got.append(b))
    pump(conn, lambda: len(got) >= 4)
    conn.process_data_events(time_limit=0.3)
    assert len(got) == 4


def test_consumer_priorities_serve_the_highest_first(conn):
    ch = conn.channel()
    q = ch.queue_declare(name(), exclusive=True).method.queue
    low, high = [], []
    ch.basic_consume(
        q, lambda c, m, p, b: low.append(b), auto_ack=True, arguments={"x-priority": 1}
    )
    ch.basic_consume(
        q, lambda c, m, p, b: high.append(b), auto_ack=True, arguments={"x-priority": 10}
    )
    for i in range(20):
        ch.basic_publish("", q, b"%d" % i)
    pump(conn, lambda: len(high) + len(low) >= 20)
    assert len(high) == 20 and not low


def test_round_robin_between_equal_consumers(conn):
    ch = conn.channel()
    q = ch.queue_declare(name(), exclusive=True).method.queue
    a, b = [], []
    ch.basic_consume(q, lambda c, m, p, body: a.append(body), auto_ack=True)
    ch.basic_consume(q, lambda c, m, p, body: b.append(body), auto_ack=True)
    for i in range(10):
        ch.basic_publish("", q, b"%d" % i)
    pump(conn, lambda: len(a) + len(b) >= 10)
    assert len(a) == 5 and len(b) == 5


def test_single_active_consumer_gets_everything_until_it_goes(conn):
    ch = conn.channel()
    q = ch.queue_declare(
        name(), exclusive=True, arguments={"x-single-active-consumer": True}
    ).method.queue
    first, second = [], []
    tag = ch.basic_consume(q, lambda c, m, p, b: first.append(b), auto_ack=True)
    ch.basic_consume(q, lambda c, m, p, b: second.append(b), auto_ack=True)
    for i in range(6):
        ch.basic_publish("", q, b"%d" % i)
    pump(conn, lambda: len(first) >= 6)
    assert len(first) == 6 and not second
    ch.basic_cancel(tag)
    ch.basic_publish("", q, b"next")
    pump(conn, lambda: second)
    assert second == [b"next"]


def test_exclusive_consumer_refuses_others_with_403(conn):
    ch = conn.channel()
    q = ch.queue_declare(name(), exclusive=True).method.queue
    ch.basic_consume(q, lambda *args: None, exclusive=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        ch.basic_consume(q, lambda *args: None)
    assert closed_with(excinfo) == (
        403,
        f"ACCESS_REFUSED - queue '{q}' in vhost '/' in exclusive use",
    )


def test_reused_consumer_tag_is_530(conn):
    ch = conn.channel()
    q = ch.queue_declare(name(), exclusive=True).method.queue
    ch.basic_consume(q, lambda *args: None, consumer_tag="tag")
    with pytest.raises(pika.exceptions.DuplicateConsumerTag):
        ch.basic_consume(q, lambda *args: None, consumer_tag="tag")


def test_server_generated_consumer_tag(conn):
    ch = conn.channel()
    q = ch.queue_declare(name(), exclusive=True).method.queue
    tag = ch.basic_consume(q, lambda *args: None)
    assert tag.startswith("ctag") or tag.startswith("amq.ctag-")


def test_deleting_a_queue_cancels_its_consumers(conn):
    ch = conn.channel()
    q = ch.queue_declare(name()).method.queue
    cancelled = []
    ch.add_on_cancel_callback(lambda method: cancelled.append(method.method.consumer_tag))
    tag = ch.basic_consume(q, lambda *args: None)
    other = conn.channel()
    assert other.queue_delete(q).method.message_count == 0
    pump(conn, lambda: cancelled)
    assert cancelled == [tag]


def test_channel_flow_active_false_is_540_as_in_rabbitmq(broker):
    connection = broker.connect()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as excinfo:
        connection.channel().flow(False)
    assert excinfo.value.args == (540, "NOT_IMPLEMENTED - active=false")


# -- queues ----------------------------------------------------------------------------------------


def test_server_named_queue(conn):
    ch = conn.channel()
    q = ch.queue_declare("", exclusive=True).method.queue
    assert q.startswith("amq.gen-") and len(q) == len("amq.gen-") + 22


def test_passive_declare_of_missing_queue_is_404(conn):
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        ch.queue_declare("missing-queue", passive=True)
    assert closed_with(excinfo) == (404, "NOT_FOUND - no queue 'missing-queue' in vhost '/'")


@pytest.mark.parametrize(
    "suffix", ["café", "a%b", "star*", "paren(1)", "tab\there", "rabbit-\N{RABBIT}"]
)
def test_any_utf8_name_is_declared_consumed_and_deleted(broker, conn, suffix):
    queue = f"{name()}-{suffix}"
    ch = conn.channel()
    assert ch.queue_declare(queue, durable=True).method.queue == queue
    assert broker.broker.store.state.queue("/", queue).durable
    ch.basic_publish("", queue, b"x")
    tag = ch.basic_consume(queue, lambda *args: None, consumer_tag=f"ctag-{suffix}")
    assert tag == f"ctag-{suffix}"
    ch.basic_cancel(tag)
    ok = ch.queue_declare(queue, passive=True).method
    assert (ok.queue, ok.consumer_count) == (queue, 0)
    ch.queue_delete(queue)
    assert broker.broker.store.state.queue("/", queue) is None


def test_reserved_queue_name_is_403(conn):
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        ch.queue_declare("amq.mine")
    assert closed_with(excinfo) == (
        403,
        "ACCESS_REFUSED - queue name 'amq.mine' contains reserved prefix 'amq.*'",
    )


def test_redeclare_with_other_arguments_is_406(conn):
    ch = conn.channel()
    q = name()
    ch.queue_declare(q, arguments={"x-max-length": 10}, auto_delete=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        ch.queue_declare(q, arguments={"x-max-length": 20}, auto_delete=True)
    assert closed_with(excinfo) == (
        406,
        f"PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue '{q}' in vhost "
        "'/': received '20' but current is '10'",
    )


def test_invalid_queue_argument_is_406(conn):
    ch = conn.channel()
    q = name()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        ch.queue_declare(q, arguments={"x-message-ttl": -1})
    assert closed_with(excinfo) == (
        406,
        f"PRECONDITION_FAILED - invalid arg 'x-message-ttl' for queue '{q}' in vhost '/': "
        "{value_negative,-1}",
    )


@pytest.mark.warren_only
def test_unknown_queue_types_are_refused_and_streams_accepted(conn):
    ch = conn.channel()
    q = name()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        ch.queue_declare(q, durable=True, arguments={"x-queue-type": "streamx"})
    assert closed_with(excinfo) == (
        406,
        f"PRECONDITION_FAILED - invalid arg 'x-queue-type' for queue '{q}' in vhost '/': "
        "\"unsupported queue type 'streamx'\"",
    )
    ch = conn.channel()
    assert ch.queue_declare(q, durable=True, arguments={"x-queue-type": "stream"}).method.queue == q
    ch.queue_delete(q)


def test_quorum_and_classic_types_are_accepted(conn):
    ch = conn.channel()
    ch.confirm_delivery()
    q = ch.queue_declare(name(), durable=True, arguments={"x-queue-type": "quorum"}).method.queue
    ch.basic_publish("", q, b"x", pika.BasicProperties(delivery_mode=2))
    method, _, body = ch.basic_get(q, auto_ack=True)
    assert body == b"x"
    ch.queue_delete(q)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        ch.queue_declare(name(), durable=False, arguments={"x-queue-type": "quorum"})
    assert excinfo.value.args[0] == 406


def test_exclusive_queue_is_locked_to_its_connection(broker, conn):
    ch = conn.channel()
    q = ch.queue_declare(name(), exclusive=True).method.queue
    other = broker.connect()
    try:
        with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
            other.channel().basic_consume(q, lambda *args: None)
        assert excinfo.value.args[0] == 405
        assert (
            "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue"
            in excinfo.value.args[1]
        )
    finally:
        other.close()
    conn.close()
    probe = broker.connect()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        probe.channel().queue_declare(q, passive=True)
    assert excinfo.value.args[0] == 404
    probe.close()


def test_auto_delete_queue_goes_with_its_last_consumer(conn):
    ch = conn.channel()
    q = ch.queue_declare(name(), auto_delete=True).method.queue
    tag = ch.basic_consume(q, lambda *args: None)
    ch.basic_cancel(tag)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        ch.queue_declare(q, passive=True)
    assert excinfo.value.args[0] == 404


def test_purge_and_delete_if_empty_and_if_unused(conn):
    ch = conn.channel()
    q = ch.queue_declare(name()).method.queue
    for _ in range(4):
        ch.basic_publish("", q, b"x")
    ch.queue_declare(q, passive=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        ch.queue_delete(q, if_empty=True)
    assert closed_with(excinfo) == (
        406,
        f"PRECONDITION_FAILED - queue '{q}' in vhost '/' not empty",
    )
    ch = conn.channel()
    assert ch.queue_purge(q).method.message_count == 4
    ch.basic_consume(q, lambda *args: None)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        conn.channel().queue_delete(q, if_unused=True)
    assert closed_with(excinfo) == (406, f"PRECONDITION_FAILED - queue '{q}' in vhost '/' in use")
    assert conn.channel().queue_delete(q).method.message_count == 0


def test_message_ttl_drops_expired_messages_at_the_head(conn):
    ch = conn.channel()
    q = ch.queue_declare(name(), exclusive=True, arguments={"x-message-ttl": 100}).method.queue
    ch.basic_publish("", q, b"old")
    assert ch.queue_declare(q, passive=True).method.message_count == 1
    time.sleep(0.3)
    # Expired at the head by the queue's own timer: the count drops without a get.
    assert ch.queue_declare(q, passive=True).method.message_count == 0
    ch.basic_publish("", q, b"fresh")
    method, _, body = ch.basic_get(q, auto_ack=True)
    assert body == b"fresh"
    assert ch.basic_get(q) == (None, None, None)


def wait_committed(broker, queue, timeout_s=3.0):
    """True once the queue's engine has nothing left waiting for a commit."""

    async def committed():
        return not broker.broker.vhosts["/"].queues[queue].engine.needs_commit

    deadline = time.monotonic() + timeout_s
    while not broker.call(committed()):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.parametrize("way", ["no-ack get", "purge", "message ttl"])
def test_messages_removed_without_a_consumer_are_committed(broker, conn, way):
    """A no-ack get, a purge and an expiry ack messages outside any consumer's dispatch; the
    broker still commits those acks (a crash must not bring the messages back)."""
    ch = conn.channel()
    ch.confirm_delivery()
    arguments = {"x-message-ttl": 50} if way == "message ttl" else {}
    q = ch.queue_declare(name(), durable=True, arguments=arguments).method.queue
    for _ in range(3):
        ch.basic_publish("", q, b"x", pika.BasicProperties(delivery_mode=2))
    assert wait_committed(broker, q)
    if way == "no-ack get":
        assert ch.basic_get(q, auto_ack=True)[2] == b"x"
    elif way == "purge":
        assert ch.queue_purge(q).method.message_count == 3
    else:
        time.sleep(0.2)
        assert ch.queue_declare(q, passive=True).method.message_count == 0
    assert wait_committed(broker, q)
    ch.queue_delete(q)


def test_per_message_expiration(conn):
    ch = conn.channel()
    q = ch.queue_declare(name(), exclusive=True).method.queue
    ch.basic_publish("", q, b"short", pika.BasicProperties(expiration="50"))
    ch.basic_publish("", q, b"long", pika.BasicProperties(expiration="60000"))
    time.sleep(0.2)
    assert ch.basic_get(q, auto_ack=True)[2] == b"long"
    ch.basic_publish("", q, b"x", pika.BasicProperties(expiration="soon"))
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        ch.queue_declare(q, passive=True)
    assert closed_with(excinfo) == (
        406,
        "PRECONDITION_FAILED - invalid expiration 'soon': no_integer",
    )


def test_priority_queue_serves_the_highest_level_first(conn):
    ch = conn.channel()
    q = ch.queue_declare(name(), exclusive=True, arguments={"x-max-priority": 5}).method.queue
    for body, priority in [
        (b"low", 1),
        (b"none", None),
        (b"high", 5),
        (b"mid", 3),
        (b"over", 9),
        (b"mid2", 3),
    ]:
        ch.basic_publish("", q, body, pika.BasicProperties(priority=priority))
    assert ch.queue_declare(q, passive=True).method.message_count == 6
    first, _, body = ch.basic_get(q)
    assert body == b"high"
    ch.basic_nack(first.delivery_tag, requeue=True)
    got = [ch.basic_get(q, auto_ack=True)[2] for _ in range(6)]
    assert got == [b"high", b"over", b"mid", b"mid2", b"low", b"none"]


def test_max_length_drops_from_the_head(conn):
    ch = conn.channel()
    q = ch.queue_declare(name(), exclusive=True, arguments={"x-max-length": 3}).method.queue
    for i in range(10):
        ch.basic_publish("", q, b"%d" % i)
    assert ch.queue_declare(q, passive=True).method.message_count == 3
    assert [ch.basic_get(q, auto_ack=True)[2] for _ in range(3)] == [b"7", b"8", b"9"]


def test_reject_publish_overflow_nacks_the_refused_messages(conn):
    ch = conn.channel()
    ch.confirm_delivery()
    q = ch.queue_declare(
        name(), exclusive=True, arguments={"x-max-length": 2, "x-overflow": "reject-publish"}
    ).method.queue
    ch.basic_publish("", q, b"1")
    ch.basic_publish("", q, b"2")
    with pytest.raises(pika.exceptions.NackError):
        ch.basic_publish("", q, b"3")
    assert ch.queue_declare(q, passive=True).method.message_count == 2
    ch.basic_get(q, auto_ack=True)
    ch.basic_publish("", q, b"4")
    assert [ch.basic_get(q, auto_ack=True)[2] for _ in range(2)] == [b"2", b"4"]


def test_max_length_bytes_counts_ready_bodies(conn):
    ch = conn.channel()
    q = ch.queue_declare(name(), exclusive=True, arguments={"x-max-length-bytes": 10}).method.queue
    for body in (b"aaaa", b"bbbb", b"cccc"):
        ch.basic_publish("", q, body)
    assert ch.queue_declare(q, passive=True).method.message_count == 2
    method, _, body = ch.basic_get(q)
    assert body == b"bbbb"
    # In flight it does not count; back in the queue it does again.
    ch.basic_publish("", q, b"dd")
    ch.basic_nack(method.delivery_tag, requeue=True)
    ch.basic_publish("", q, b"e")
    got = [ch.basic_get(q, auto_ack=True)[2] for _ in range(3)]
    assert got == [b"cccc", b"dd", b"e"]


def test_x_expires_deletes_an_unused_queue(conn):
    ch = conn.channel()
    q = ch.queue_declare(name(), arguments={"x-expires": 300}).method.queue
    tag = ch.basic_consume(q, lambda *args: None)
    time.sleep(0.5)
    assert ch.queue_declare(q, passive=True).method.consumer_count == 1
    ch.basic_cancel(tag)
    time.sleep(0.6)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        ch.queue_declare(q, passive=True)
    assert excinfo.value.args[0] == 404


# -- exchanges and bindings ------------------------------------------------------------------------


def test_topic_fanout_headers_and_exchange_to_exchange_routing(conn):
    ch = conn.channel()
    topic, fanout, headers = name("t"), name("f"), name("h")
    ch.exchange_declare(topic, "topic")
    ch.exchange_declare(fanout, "fanout", auto_delete=True)
    ch.exchange_declare(headers, "headers", auto_delete=True)
    qt = ch.queue_declare("", exclusive=True).method.queue
    qf = ch.queue_declare("", exclusive=True).method.queue
    qh = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(qt, topic, "a.*.c")
    ch.queue_bind(qf, fanout)
    ch.queue_bind(qh, headers, arguments={"x-match": "all", "kind": "x"})
    ch.exchange_bind(fanout, topic, "#")
    ch.basic_publish(topic, "a.b.c", b"1")
    ch.basic_publish(topic, "z", b"2")
    ch.basic_publish(headers, "", b"3", pika.BasicProperties(headers={"kind": "x"}))
    ch.basic_publish(headers, "", b"4", pika.BasicProperties(headers={"kind": "y"}))
    assert [b for _, _, b in drain(ch, qt, 1)] == [b"1"]
    assert sorted(b for _, _, b in drain(ch, qf, 2)) == [b"1", b"2"]
    assert [b for _, _, b in drain(ch, qh, 1)] == [b"3"]
    ch.exchange_unbind(fanout, topic, "#")
    ch.queue_unbind(qt, topic, "a.*.c")
    ch.basic_publish(topic, "a.b.c", b"5")
    conn.process_data_events(time_limit=0.2)
    assert ch.queue_declare(qt, passive=True).method.message_count == 0
    assert ch.queue_declare(qf, passive=True).method.message_count == 0
    ch.exchange_delete(topic)


def test_cc_and_bcc_headers_add_routing_keys_and_bcc_is_removed(conn):
    ch = conn.channel()
    qa = ch.queue_declare(name(), exclusive=True).method.queue
    qb = ch.queue_declare(name(), exclusive=True).method.queue
    qc = ch.queue_declare(name(), exclusive=True).method.queue
    ch.basic_publish("", qa, b"x", pika.BasicProperties(headers={"CC": [qb], "BCC": [qc]}))
    for queue in (qa, qb, qc):
        method, properties, body = ch.basic_get(queue, auto_ack=True)
        assert body == b"x"
        assert properties.headers == {"CC": [qb]}


def test_alternate_exchange_takes_unroutable_messages(conn):
    ch = conn.channel()
    main, alternate = name("main"), name("ae")
    ch.exchange_declare(alternate, "fanout", auto_delete=True)
    ch.exchange_declare(
        main, "direct", auto_delete=True, arguments={"alternate-exchange": alternate}
    )
    q = ch.queue_declare("", exclusive=True).method.queue
    ch.queue_bind(q, alternate)
    ch.basic_publish(main, "nothing-bound", b"x")
    assert [b for _, _, b in drain(ch, q, 1)] == [b"x"]


def test_exchange_errors(conn):
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        ch.exchange_declare("missing-exchange", passive=True)
    assert closed_with(excinfo) == (404, "NOT_FOUND - no exchange 'missing-exchange' in vhost '/'")
    ch = conn.channel()
    x = name("x")
    ch.exchange_declare(x, "direct", auto_delete=True)
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        ch.exchange_declare(x, "fanout", auto_delete=True)
    assert closed_with(excinfo) == (
        406,
        f"PRECONDITION_FAILED - inequivalent arg 'type' for exchange '{x}' in vhost '/': "
        "received 'fanout' but current is 'direct'",
    )
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        ch.exchange_declare("amq.mine", "direct")
    assert excinfo.value.args[0] == 403


def test_unknown_exchange_type_closes_the_connection_with_503(broker):
    connection = broker.connect()
    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as excinfo:
        connection.channel().exchange_declare(name("x"), "no-such-type")
    assert excinfo.value.args == (503, "COMMAND_INVALID - unknown exchange type 'no-such-type'")


# -- transactions ----------------------------------------------------------------------------------


def test_tx_commit_publishes_and_rollback_discards(conn):
    ch = conn.channel()
    q = ch.queue_declare(name(), exclusive=True).method.queue
    ch.tx_select()
    ch.basic_publish("", q, b"kept")
    ch.basic_publish("", q, b"kept2")
    assert ch.queue_declare(q, passive=True).method.message_count == 0
    ch.tx_commit()
    assert ch.queue_declare(q, passive=True).method.message_count == 2
    ch.basic_publish("", q, b"dropped")
    ch.tx_rollback()
    assert ch.queue_declare(q, passive=True).method.message_count == 2
    first, _, body = ch.basic_get(q)
    assert body == b"kept"
    ch.basic_ack(first.delivery_tag)
    ch.tx_rollback()
    # The rolled-back ack left the delivery unacked: acking it again is no unknown tag.
    ch.basic_ack(first.delivery_tag)
    ch.tx_commit()
    method, _, body = ch.basic_get(q, auto_ack=True)
    assert body == b"kept2"
    assert ch.queue_declare(q, passive=True).method.message_count == 0


def test_tx_commit_outside_a_transaction_is_406(conn):
    ch = conn.channel()
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        ch.tx_commit()
    assert closed_with(excinfo) == (406, "PRECONDITION_FAILED - channel is not transactional")


# -- direct reply-to -------------------------------------------------------------------------------


def test_direct_reply_to_round_trip(conn):
    server = conn.channel()
    client = conn.channel()
    rpc = server.queue_declare(name(), exclusive=True).method.queue
    replies = []
    client.basic_consume(
        "amq.rabbitmq.reply-to", lambda c, m, p, b: replies.append(b), auto_ack=True
    )
    client.basic_publish("", rpc, b"ping", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
    method, properties, body = server.basic_get(rpc, auto_ack=True)
    assert properties.reply_to.startswith("amq.rabbitmq.reply-to.")
    server.basic_publish("", properties.reply_to, b"pong")
    pump(conn, lambda: replies)
    assert replies == [b"pong"]


def test_reply_to_without_reply_consumer_is_406(conn):
    ch = conn.channel()
    ch.basic_publish("", "anything", b"x", pika.BasicProperties(reply_to="amq.rabbitmq.reply-to"))
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        ch.queue_declare(name(), exclusive=True)
    assert closed_with(excinfo) == (406, "PRECONDITION_FAILED - fast reply consumer does not exist")


# -- connections -----------------------------------------------------------------------------------


def test_wrong_password_is_refused_with_403(broker):
    with pytest.raises(pika.exceptions.ProbableAuthenticationError) as excinfo:
        pika.BlockingConnection(
            pika.ConnectionParameters(
                "127.0.0.1",
                broker.port,
                credentials=pika.PlainCredentials("guest", "wrong"),
                connection_attempts=1,
            )
        )
    assert "ACCESS_REFUSED" in str(excinfo.value)


def test_unknown_vhost_is_refused_with_530(broker):
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as excinfo:
        pika.BlockingConnection(
            pika.ConnectionParameters(
                "127.0.0.1", broker.port, virtual_host="no-such-vhost", connection_attempts=1
            )
        )
    assert "NOT_ALLOWED - vhost no-such-vhost not found" in str(excinfo.value)


def test_guest_is_refused_from_a_non_loopback_address(broker):
    async def check():
        return (
            await broker.broker.authenticate("guest", "guest", "10.1.2.3", "PLAIN"),
            await broker.broker.authenticate("guest", "guest", "127.0.0.1", "PLAIN"),
        )

    remote, local = broker.call(check())
    assert remote is None and local is not None


def test_loopback_users_setting_is_who_may_log_in_from_loopback_only(tmp_path, start_broker):
    from warrenmq.server.metadata import commands as metadata_commands
    from warrenmq.server.metadata import passwords

    running = start_broker(tmp_path, loopback_users=("bob",))
    broker = running.broker
    running.call(
        broker.store.apply(
            metadata_commands.AddUser("bob", passwords.hash_password("pw", log2_n=2))
        )
    )
    running.call(broker.store.apply(metadata_commands.SetPermissions("bob", "/", ".*", ".*", ".*")))

    async def login(user, password, host):
        return await broker.authenticate(user, password, host, "PLAIN") is not None

    assert running.call(login("guest", "guest", "10.1.2.3"))
    assert not running.call(login("bob", "pw", "10.1.2.3"))
    assert running.call(login("bob", "pw", "127.0.0.1"))
    local = running.connect(credentials=pika.PlainCredentials("bob", "pw"))
    local.close()


def test_bad_protocol_header_gets_ours_and_a_close(broker):
    import socket

    with socket.create_connection(("127.0.0.1", broker.port), timeout=2) as sock:
        sock.sendall(b"AMQP\x01\x01\x00\x0a")
        assert sock.recv(8) == b"AMQP\x00\x00\x09\x01"
        assert sock.recv(8) == b""


def test_a_hostile_frame_closes_only_its_connection(broker, conn):
    import socket

    with socket.create_connection(("127.0.0.1", broker.port), timeout=2) as sock:
        sock.sendall(b"AMQP\x00\x00\x09\x01")
        sock.recv(4096)
        sock.sendall(b"\x01\x00\x00\xff\xff\xff\xff" + b"x" * 64)
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline and sock.recv(4096):
            pass
    ch = conn.channel()
    assert ch.queue_declare(name(), exclusive=True).method.queue


def test_a_silent_client_is_dropped_after_two_heartbeat_intervals(broker):
    import socket

    from pamqp import commands

    from warrenmq.amqp import testing

    with socket.create_connection(("127.0.0.1", broker.port), timeout=5) as sock:
        sock.sendall(b"AMQP\x00\x00\x09\x01")
        sock.recv(4096)
        sock.sendall(testing.marshal(0, testing.start_ok()))
        sock.recv(4096)
        sock.sendall(
            testing.marshal(
                0, commands.Connection.TuneOk(channel_max=10, frame_max=131072, heartbeat=1)
            )
        )
        sock.sendall(testing.marshal(0, commands.Connection.Open(virtual_host="/")))
        started = time.monotonic()
        received = b""
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                break
            received += chunk
        elapsed = time.monotonic() - started
    assert 1.5 <= elapsed <= 4.0
    # Our heartbeats went out meanwhile (every half interval), then no close frame: dropped.
    assert testing.heartbeat() in received


def test_restart_keeps_durable_queues_with_their_levels_and_limits(tmp_path, start_broker):
    first = start_broker(tmp_path)
    connection = first.connect()
    ch = connection.channel()
    ch.confirm_delivery()
    ch.queue_declare("prio", durable=True, arguments={"x-max-priority": 3})
    ch.queue_declare("plain", durable=True, arguments={"x-max-length": 2})
    for body, priority in [(b"a", 0), (b"b", 3), (b"c", 1)]:
        ch.basic_publish("", "prio", body, pika.BasicProperties(priority=priority, delivery_mode=2))
    for body in (b"1", b"2", b"3"):
        ch.basic_publish("", "plain", body, pika.BasicProperties(delivery_mode=2))
    connection.close()
    first.stop()
    second = start_broker(tmp_path)
    connection = second.connect()
    ch = connection.channel()
    assert [ch.basic_get("prio", auto_ack=True)[2] for _ in range(3)] == [b"b", b"c", b"a"]
    assert [ch.basic_get("plain", auto_ack=True)[2] for _ in range(2)] == [b"2", b"3"]
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as excinfo:
        ch.queue_declare("plain", durable=True, arguments={"x-max-length": 5})
    assert excinfo.value.args[0] == 406
    connection.close()

"""`warren bench` load generator: its frames against pamqp and the broker's encoders, its latency
statistics against exact percentiles, its roles' bookkeeping, and whole runs against a broker.

The whole-run tests use a small in-process broker built on Warren's sans-I/O protocol machine
(``warrenmq.amqp.Connection``) with a toy queue, so they need nothing else running. One runs
against a real `warren serve` started on a free port, and one against any broker that
``WARREN_BENCH_URL`` (or ``WARREN_REFERENCE_URL``) names, RabbitMQ included.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import time
from types import SimpleNamespace

import pytest
from http_api import HttpApi
from hypothesis import given, settings
from hypothesis import strategies as st
from loop_thread import LoopThread
from pamqp import commands
from pamqp import frame as pamqp_frame

from warrenmq.amqp import Connection, ConnectionConfig, events, fastpath, frames, testing
from warrenmq.server import cli
from warrenmq.server.bench import loadgen, roles, wire
from warrenmq.server.bench import stats as loadgen_stats
from warrenmq.server.bench.client import BenchError, ClientConnection
from warrenmq.server.bench.roles import Consumer, ConsumerTally, Publisher

shortstr = st.text(max_size=40).filter(lambda s: len(s.encode()) <= 255)
exchange_name = st.from_regex(r"[a-zA-Z0-9_.:-]{0,40}", fullmatch=True)


# -- frames ------------------------------------------------------------------------------


@settings(max_examples=150)
@given(
    exchange=exchange_name,
    routing_key=shortstr,
    mandatory=st.booleans(),
    body=st.binary(max_size=9000),
    frame_max=st.sampled_from([4096, 5000, 131072]),
    persistent=st.booleans(),
    channel=st.integers(1, 2047),
)
def test_publish_template_matches_pamqp(
    exchange, routing_key, mandatory, body, frame_max, persistent, channel
):
    template = wire.PublishTemplate(
        channel,
        exchange,
        routing_key,
        len(body),
        frame_max,
        mandatory=mandatory,
        property_bytes=wire.PERSISTENT_PROPERTIES if persistent else wire.TRANSIENT_PROPERTIES,
    )
    expected = testing.publish(
        channel,
        exchange,
        routing_key,
        body,
        commands.Basic.Properties(delivery_mode=2 if persistent else 1),
        frame_max=frame_max,
        mandatory=mandatory,
    )
    assert template.frame(body) == expected


def test_publish_template_refuses_a_body_of_another_size():
    template = wire.PublishTemplate(1, "", "q", 64, 131072)
    with pytest.raises(ValueError):
        template.frame(bytes(63))
    with pytest.raises(ValueError):
        wire.PublishTemplate(1, "", "q" * 256, 64, 131072)
    with pytest.raises(ValueError):
        wire.PublishTemplate(1, "", "q", 64, 4095)


@given(channel=st.integers(0, 65535), tag=st.integers(0, 2**63 - 1), multiple=st.booleans())
def test_ack_frame_matches_pamqp(channel, tag, multiple):
    assert wire.encode_ack(channel, tag, multiple) == pamqp_frame.marshal(
        commands.Basic.Ack(delivery_tag=tag, multiple=multiple), channel
    )


@given(tag=st.integers(0, 2**63 - 1), multiple=st.booleans(), nack=st.booleans())
def test_confirm_decoding_matches_the_broker_encoder(tag, multiple, nack):
    frame = (fastpath.encode_nack if nack else fastpath.encode_ack)(1, tag, multiple)
    received, rest = wire.split_frames(frame, 131072)
    assert rest == b""
    [(frame_type, channel, payload)] = received
    assert (frame_type, channel) == (frames.FRAME_METHOD, 1)
    assert wire.method_id(payload) == (wire.BASIC_NACK_ID if nack else wire.BASIC_ACK_ID)
    assert wire.decode_confirm(payload) == (tag, multiple)


@settings(max_examples=100)
@given(
    consumer_tag=shortstr,
    tag=st.integers(1, 2**63 - 1),
    redelivered=st.booleans(),
    exchange=exchange_name,
    routing_key=shortstr,
    body=st.binary(max_size=300),
)
def test_deliver_decoding_matches_the_broker_encoder(
    consumer_tag, tag, redelivered, exchange, routing_key, body
):
    data = fastpath.encode_deliver(
        5,
        consumer_tag,
        tag,
        redelivered,
        exchange,
        routing_key,
        wire.PERSISTENT_PROPERTIES,
        body,
        4096,
    )
    received, rest = wire.split_frames(data, 4096)
    assert rest == b""
    method, header = received[0][2], received[1][2]
    assert wire.method_id(method) == wire.BASIC_DELIVER_ID
    assert wire.decode_deliver_tag(method) == tag
    assert wire.decode_body_size(header) == len(body)
    assert b"".join(payload for _, _, payload in received[2:]) == body


@settings(max_examples=100)
@given(
    bodies=st.lists(st.binary(max_size=5000), min_size=1, max_size=5),
    cuts=st.lists(st.integers(1, 400), max_size=30),
)
def test_split_frames_reassembles_any_chunking(bodies, cuts):
    data = b"".join(testing.publish(3, "", "q", body, frame_max=4096) for body in bodies)
    whole, rest = wire.split_frames(data, 4096)
    assert rest == b""
    got, buffer, position = [], b"", 0
    for cut in cuts + [len(data)]:
        buffer += data[position : position + cut]
        position += cut
        frames_now, buffer = wire.split_frames(buffer, 4096)
        got.extend(frames_now)
    assert got == whole
    assert b"".join(p for t, _, p in got if t == frames.FRAME_BODY) == b"".join(bodies)


def test_split_frames_refuses_garbage():
    frame = wire.encode_ack(1, 7, False)
    with pytest.raises(wire.FrameError, match="end marker"):
        wire.split_frames(frame[:-1] + b"\x00", 4096)
    oversized = frames.HEADER.pack(frames.FRAME_BODY, 1, 5000) + bytes(5000) + b"\xce"
    with pytest.raises(wire.FrameError, match="exceeds frame_max"):
        wire.split_frames(oversized, 4096)
    # An incomplete frame is kept, not an error.
    assert wire.split_frames(frame[:-1], 4096) == ([], frame[:-1])


def test_stamped_body_round_trip():
    body = wire.stamped_body(bytes(56), 123_456_789_012)
    assert len(body) == 64
    assert wire.body_timestamp_ns(body) == 123_456_789_012


@pytest.mark.parametrize(
    "url, expected",
    [
        ("amqp://guest:guest@127.0.0.1:5673/%2F", ("127.0.0.1", 5673, "guest", "guest", "/")),
        ("amqp://u%40x:p%3Aw@host/vh%2Fa", ("host", 5672, "u@x", "p:w", "vh/a")),
        ("amqp://host", ("host", 5672, "guest", "guest", "/")),
        ("amqp://host/", ("host", 5672, "guest", "guest", "/")),
        ("amqp://", ("localhost", 5672, "guest", "guest", "/")),
        ("amqp://a:b@[::1]:1234/v", ("::1", 1234, "a", "b", "v")),
    ],
)
def test_parse_url(url, expected):
    address = wire.parse_url(url)
    assert (
        address.host,
        address.port,
        address.username,
        address.password,
        address.vhost,
    ) == expected
    assert "guest:guest" not in address.display() and "p:w" not in address.display()


def test_parse_amqps_url():
    address = wire.parse_url(
        "amqps://host/?cacertfile=%2Ftmp%2Fca.pem&certfile=c.pem&keyfile=k.pem"
    )
    assert (address.host, address.port, address.vhost) == ("host", 5671, "/")
    assert address.tls == (
        ("cacertfile", "/tmp/ca.pem"),
        ("certfile", "c.pem"),
        ("keyfile", "k.pem"),
    )
    assert address.display() == "amqps://guest@host:5671/%2F"
    assert wire.parse_url("amqps://host:5999").tls == ()
    assert wire.parse_url("amqp://host").tls is None


@pytest.mark.parametrize(
    "url",
    [
        "amqps://host/?heartbeat=5",
        "http://host/",
        "amqp://host:99999/",
        "amqp://host/?heartbeat=5",
        "amqp://host/?cacertfile=ca.pem",
    ],
)
def test_parse_url_refuses(url):
    with pytest.raises(ValueError):
        wire.parse_url(url)


# -- latency statistics --------------------------------------------------------------------


def exact_percentile(values, percent):
    ordered = sorted(values)
    return ordered[max(1, math.ceil(len(ordered) * percent / 100)) - 1]


@given(
    values=st.lists(st.integers(0, 10**10), min_size=1, max_size=300),
    percent=st.sampled_from([1, 50, 90, 99, 99.9, 100]),
)
def test_histogram_percentile_is_within_one_bucket_of_exact(values, percent):
    histogram = loadgen_stats.LatencyHistogram()
    for value in values:
        histogram.record(value)
    exact = exact_percentile(values, percent)
    got = histogram.percentile_us(percent)
    assert exact <= got <= max(exact + exact / 64, exact)
    assert histogram.count == len(values)
    assert (histogram.min_us, histogram.max_us) == (min(values), max(values))


@given(value=st.integers(0, loadgen_stats.VALUE_US_MAX))
def test_bucket_bounds(value):
    index = loadgen_stats.bucket_index(value)
    assert 0 <= index < loadgen_stats.BUCKET_COUNT
    assert value <= loadgen_stats.bucket_highest_us(index)
    if index:
        assert loadgen_stats.bucket_highest_us(index - 1) < value


@given(
    first=st.lists(st.integers(0, 10**7), max_size=50),
    second=st.lists(st.integers(0, 10**7), max_size=50),
)
def test_histogram_merge_equals_recording_both(first, second):
    merged, both, other = (loadgen_stats.LatencyHistogram() for _ in range(3))
    for value in first:
        merged.record(value)
        both.record(value)
    for value in second:
        other.record(value)
        both.record(value)
    merged.merge(other)
    assert merged.counts == both.counts
    assert (merged.count, merged.sum_us, merged.min_us, merged.max_us) == (
        both.count,
        both.sum_us,
        both.min_us,
        both.max_us,
    )


def test_histogram_weights_clamps_and_summarises():
    histogram = loadgen_stats.LatencyHistogram()
    assert histogram.summary_ms()["latency_ms_p99"] is None
    histogram.record(1000, times=99)
    histogram.record(50_000)
    histogram.record(-5)
    histogram.record(loadgen_stats.VALUE_US_MAX + 1)
    assert histogram.count == 102 and histogram.clamped == 1 and histogram.min_us == 0
    assert 1000 <= histogram.percentile_us(50) <= 1000 + 1000 // 64  # one bucket's width
    summary = histogram.summary_ms()
    assert summary["latency_ms_p50"] == round(histogram.percentile_us(50) / 1000, 3)
    assert summary["latency_ms_max"] == round(loadgen_stats.VALUE_US_MAX / 1000, 3)
    with pytest.raises(ValueError):
        histogram.percentile_us(0)


# -- roles, driven frame by frame ----------------------------------------------------------


class FakeConnection:
    """What a role uses of ClientConnection: attach/detach, write, and the two flags."""

    def __init__(self):
        self.written = []
        self.writing_paused = False
        self.error = None
        self.roles = {}

    def attach(self, channel, role):
        self.roles[channel] = role

    def detach(self, channel):
        self.roles.pop(channel, None)

    def write(self, data):
        self.written.append(data)


def feed(role, data):
    received, rest = wire.split_frames(data, 131072)
    assert rest == b""
    for frame_type, _, payload in received:
        assert role.frame(frame_type, payload)
    role.read_done()


def published_count(connection, template):
    one = len(template.frame(bytes(template.body_bytes)))
    total = sum(len(chunk) for chunk in connection.written)
    assert total % one == 0
    return total // one


def test_publisher_keeps_its_window_and_counts_confirms():
    async def scenario():
        connection = FakeConnection()
        template = wire.PublishTemplate(1, "", "q", 64, 131072)
        publisher = Publisher(connection, 1, template, messages=25, window=10)
        publisher.start()
        assert published_count(connection, template) == 10
        feed(publisher, fastpath.encode_ack(1, 2, False))  # out of order: 2 before 1
        assert publisher.confirmed == 1 and published_count(connection, template) == 11
        feed(publisher, fastpath.encode_ack(1, 1, False))
        assert publisher.confirmed == 2 and published_count(connection, template) == 12
        feed(publisher, fastpath.encode_nack(1, 6, True))
        assert publisher.confirmed == 6 and publisher.nacked == 4
        assert published_count(connection, template) == 16
        feed(publisher, fastpath.encode_ack(1, 16, True))
        assert published_count(connection, template) == 25
        assert not publisher.done.done()
        feed(publisher, fastpath.encode_ack(1, 25, True))
        assert publisher.done.done() and publisher.confirmed == 25 and publisher.nacked == 4
        assert publisher.histogram.count == 25
        assert 1 not in connection.roles

    asyncio.run(scenario())


def test_publisher_fails_on_a_confirm_beyond_what_it_sent():
    async def scenario():
        publisher = Publisher(
            FakeConnection(), 1, wire.PublishTemplate(1, "", "q", 8, 4096), messages=5, window=2
        )
        publisher.start()
        publisher.frame(frames.FRAME_METHOD, fastpath.encode_ack(1, 3, False)[7:-1])
        with pytest.raises(BenchError, match="confirmed tag 3"):
            await publisher.done

    asyncio.run(scenario())


def test_publisher_paces_itself_at_its_rate(monkeypatch):
    # The publisher reads its clock, which the test moves: what is due is then exact, where
    # a real sleep on a busy machine would let any number of timer ticks pass.
    now_ns = [10**9]
    monkeypatch.setattr(roles, "time", SimpleNamespace(monotonic_ns=lambda: now_ns[0]))

    async def ticks():
        """Let the publisher's 1 ms timer run a few times."""
        await asyncio.sleep(0.01)

    async def scenario():
        connection = FakeConnection()
        template = wire.PublishTemplate(1, "", "q", 16, 4096)
        publisher = Publisher(
            connection, 1, template, messages=1000, window=1000, rate_per_s=2000, stamp=True
        )
        publisher.start()
        assert publisher.published == 1  # the schedule's first message is due at once
        now_ns[0] += 100_000_000
        await ticks()
        # 2000/s for 0.1 s is 200 more, and no more however often the timer fires.
        assert publisher.published == 201
        await ticks()
        assert publisher.published == 201
        stamps = [wire.body_timestamp_ns(bytes(chunk[-17:-1])) for chunk in connection.written]
        assert stamps == sorted(stamps) and stamps[0] > 0
        assert publisher.behind_max <= 1  # never held back: no window or paused writes here
        publisher.fail(BenchError("stop"))

        # A window that confirms never reopen holds the schedule back, and that shows.
        held = Publisher(
            FakeConnection(), 1, template, messages=1000, window=10, rate_per_s=10_000, stamp=True
        )
        held.start()
        now_ns[0] += 50_000_000
        await ticks()
        # 501 due by 50 ms at 10,000/s; the window let 10 go.
        assert held.published == 10 and held.behind_max == 491, held.behind_max
        held.fail(BenchError("stop"))

    asyncio.run(scenario())


def test_consumer_records_latency_and_acks_in_batches():
    async def scenario():
        connection = FakeConnection()
        tally = ConsumerTally(expected=7)
        consumer = Consumer(connection, 2, tally, ack_every=3, warmup=1)
        consumer.attach()
        sent_ns = time.monotonic_ns() - 5_000_000  # sent 5 ms ago
        body = wire.stamped_body(bytes(8), sent_ns)

        def deliver(tag, redelivered=False, payload=body):
            return fastpath.encode_deliver(
                2, "ctag", tag, redelivered, "", "q", wire.PERSISTENT_PROPERTIES, payload, 4096
            )

        feed(consumer, deliver(1) + deliver(2))
        assert tally.received == 2 and connection.written == []
        feed(consumer, deliver(3, redelivered=True))
        assert connection.written == [wire.encode_ack(2, 3, True)]
        # A big body over several frames, and an empty one that carries no stamp.
        big = wire.stamped_body(bytes(9000), sent_ns)
        feed(consumer, deliver(4, payload=big) + deliver(5, payload=b""))
        feed(consumer, deliver(6) + deliver(7))
        assert tally.done.done() and tally.received == 7
        assert connection.written[-1] == wire.encode_ack(2, 7, True)
        assert tally.redelivered == 1 and tally.unstamped == 1
        assert tally.histogram.count == 5  # 7 less the warm-up one and the unstamped one
        assert 5000 <= tally.histogram.min_us < 5_000_000

    asyncio.run(scenario())


def test_consumer_rejects_every_nth_and_never_acks_a_rejected_tag():
    async def scenario():
        connection = FakeConnection()
        tally = ConsumerTally(expected=4)
        consumer = Consumer(connection, 2, tally, ack_every=2, reject_every=2)
        consumer.attach()
        body = wire.stamped_body(bytes(8), time.monotonic_ns())

        def deliver(tag):
            return fastpath.encode_deliver(
                2, "ctag", tag, False, "", "q", wire.PERSISTENT_PROPERTIES, body, 4096
            )

        feed(consumer, deliver(1) + deliver(2))
        assert connection.written == [wire.encode_reject(2, 2), wire.encode_ack(2, 1, True)]
        feed(consumer, deliver(3) + deliver(4))
        assert connection.written[2:] == [wire.encode_reject(2, 4), wire.encode_ack(2, 3, True)]
        assert tally.rejected == 2 and tally.done.done()
        consumer.flush_acks()
        assert len(connection.written) == 4

    asyncio.run(scenario())


# -- whole runs against a broker ------------------------------------------------------------


class ToyBroker:
    """Just enough broker for the load generator, on Warren's AMQP connection machine.

    One shared FIFO per queue name, confirms as one ``multiple`` ack per read, deliveries
    round-robin within each consumer's prefetch.
    """

    def __init__(self):
        self.queues: dict[str, list[bytes]] = {}
        self.consumers: dict[str, list] = {}
        self.published = 0
        self.confirming = True
        self.server = None

    async def start(self):
        self.server = await asyncio.get_running_loop().create_server(
            lambda: ToyConnection(self), "127.0.0.1", 0
        )
        return f"amqp://guest:guest@127.0.0.1:{self.server.sockets[0].getsockname()[1]}/%2F"

    async def stop(self):
        self.server.close()
        await self.server.wait_closed()

    def dispatch(self, queue):
        ready = self.queues[queue]
        for consumer in self.consumers.get(queue, []):
            while ready and consumer.has_credit():
                consumer.send(ready.pop(0))


class ToyConsumer:
    def __init__(self, connection, channel, tag, prefetch):
        self.connection, self.channel, self.tag, self.prefetch = connection, channel, tag, prefetch
        self.unacked: list[int] = []
        self.next_tag = 1

    def has_credit(self):
        return not self.prefetch or len(self.unacked) < self.prefetch

    def send(self, body):
        self.unacked.append(self.next_tag)
        self.connection.machine.deliver(
            self.channel, self.tag, self.next_tag, False, "", "q", wire.PERSISTENT_PROPERTIES, body
        )
        self.next_tag += 1
        self.connection.flush()


class ToyConnection(asyncio.Protocol):
    def __init__(self, broker):
        self.broker = broker
        self.machine = Connection(ConnectionConfig(heartbeat_s=0), now=time.monotonic())
        self.prefetch = {}
        self.consumers = {}

    def connection_made(self, transport):
        self.transport = transport

    def connection_lost(self, exc):
        for consumers in self.broker.consumers.values():
            consumers[:] = [c for c in consumers if c.connection is not self]

    def flush(self):
        data = self.machine.data_to_send()
        if data:
            self.transport.write(data)
        if self.machine.finished:
            self.transport.close()

    def data_received(self, data):
        machine = self.machine
        machine.receive_data(data, time.monotonic())
        confirms = {}
        touched = set()
        while (event := machine.next_event()) is not None:
            if isinstance(event, events.AuthenticationRequested):
                machine.accept_login()
            elif isinstance(event, events.VhostAccessRequested):
                machine.accept_vhost()
            elif isinstance(event, events.MessagePublished):
                self.broker.queues[event.routing_key].append(event.body)
                self.broker.published += 1
                confirms[event.channel] = event.confirm_tag
                touched.add(event.routing_key)
            elif isinstance(event, events.Acked):
                consumer = self.consumers[event.channel]
                consumer.unacked = [t for t in consumer.unacked if t > event.delivery_tag]
                touched.update(self.broker.consumers)
            elif isinstance(event, events.MethodReceived):
                self.method(event.channel, event.method)
        for channel, tag in confirms.items():
            if self.broker.confirming:
                machine.confirm(channel, tag, multiple=True)
        self.flush()
        for queue in touched:
            self.broker.dispatch(queue)

    def method(self, channel, method):
        queues, send = self.broker.queues, self.machine.send_method
        if isinstance(method, commands.Queue.Declare):
            queues.setdefault(method.queue, [])
            send(channel, commands.Queue.DeclareOk(method.queue, len(queues[method.queue]), 0))
        elif isinstance(method, commands.Queue.Purge):
            count, queues[method.queue][:] = len(queues[method.queue]), []
            send(channel, commands.Queue.PurgeOk(count))
        elif isinstance(method, commands.Queue.Delete):
            self.broker.consumers.pop(method.queue, None)
            send(channel, commands.Queue.DeleteOk(len(queues.pop(method.queue, []))))
        elif isinstance(method, commands.Basic.Qos):
            self.prefetch[channel] = method.prefetch_count
            send(channel, commands.Basic.QosOk())
        elif isinstance(method, commands.Basic.Consume):
            consumer = ToyConsumer(self, channel, f"ctag-{channel}", self.prefetch.get(channel, 0))
            self.consumers[channel] = consumer
            self.broker.consumers.setdefault(method.queue, []).append(consumer)
            send(channel, commands.Basic.ConsumeOk(consumer.tag))
        else:
            raise AssertionError(f"the toy broker does not do {method}")


def run_against_toy(options, pid=None):
    async def scenario():
        broker = ToyBroker()
        url = await broker.start()
        try:
            return await loadgen.run_bench(
                options, url, compare_url=url, pid=pid, compare_pid=pid
            ), broker
        finally:
            await broker.stop()

    return asyncio.run(scenario())


def test_publish_scenario_against_the_toy_broker_with_compare():
    options = loadgen.Options(
        scenario="publish", queue="bench-q", messages=3000, window=100, publishers=2
    )
    result, broker = run_against_toy(options)
    assert broker.published == 6000 and broker.queues == {}  # both runs, queue deleted after
    assert set(result) == {"scenario", "target", "compare", "ratio"}
    for report in (result["target"], result["compare"]):
        assert report["published"] == report["confirmed"] == 3000
        assert report["nacked"] == 0 and report["msgs_per_s"] > 0
        assert report["confirm_latency_ms_p99"] >= report["confirm_latency_ms_p50"] >= 0
    assert result["ratio"]["msgs_per_s"] == pytest.approx(
        result["target"]["msgs_per_s"] / result["compare"]["msgs_per_s"], rel=1e-2
    )


def test_median_report_keeps_the_median_run_whole():
    reports = [
        {
            "msgs_per_s": rate,
            "confirm_latency_ms_p50": rate / 10,
            "confirm_latency_ms_p99": 1.0,
            "seconds": 100 / rate,
        }
        for rate in (30, 10, 20, 40)
    ]
    chosen = loadgen.median_report("publish", reports)
    assert chosen["msgs_per_s"] == 20 and chosen["seconds"] == 5  # lower median, its own figures
    assert [run["msgs_per_s"] for run in chosen["runs"]] == [30, 10, 20, 40]
    assert loadgen.median_report("publish", reports[:1]) == reports[0]
    by_latency = loadgen.median_report("publish", reports, key="confirm_latency_ms_p50")
    assert by_latency["confirm_latency_ms_p50"] == 2.0


def test_runs_alternate_and_report_medians():
    async def scenario():
        broker = ToyBroker()
        url = await broker.start()
        try:
            options = loadgen.Options(scenario="publish", queue="q", messages=300, window=30)
            return await loadgen.run_bench(options, url, compare_url=url, runs=3), broker
        finally:
            await broker.stop()

    result, broker = asyncio.run(scenario())
    assert broker.published == 6 * 300
    assert len(result["target"]["runs"]) == len(result["compare"]["runs"]) == 3
    assert (
        result["target"]["msgs_per_s"]
        == sorted(run["msgs_per_s"] for run in result["target"]["runs"])[1]
    )


def test_e2e_scenario_against_the_toy_broker():
    options = loadgen.Options(
        scenario="e2e",
        queue="bench-q",
        messages=2000,
        window=200,
        prefetch=50,
        multi_ack_every=20,
        consumers=2,
        rate_per_s=20_000,
    )
    result, _ = run_against_toy(options)
    report = result["target"]
    assert report["received"] == report["published"] == 2000
    assert report["unstamped"] == 0 and report["redelivered"] == 0
    assert 0 <= report["latency_ms_p50"] <= report["latency_ms_p99"] < 1000
    assert report["rate_per_s"] == 20_000 and report["seconds"] >= 0.05
    assert report["publisher_behind_ms_max"] >= 0


def test_memory_scenario_reports_rss_growth():
    options = loadgen.Options(scenario="memory", queue="bench-q", messages=500, settle_s=0)
    result, _ = run_against_toy(options, pid=os.getpid())
    report = result["target"]
    assert report["ready"] == 500 and report["pid"] == os.getpid()
    assert report["rss_mb_after"] > 0 and "rss_mb_growth" in result["ratio"]


def test_an_unreachable_broker_is_a_bench_error():
    options = loadgen.Options(scenario="publish", queue="q", messages=1)

    async def scenario():
        server = await asyncio.get_running_loop().create_server(asyncio.Protocol, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        await loadgen.run_scenario(f"amqp://127.0.0.1:{port}/", options)

    with pytest.raises(BenchError, match="cannot connect"):
        asyncio.run(scenario())


def test_a_stalled_broker_times_out_with_progress_and_the_queue_is_deleted():
    options = loadgen.Options(
        scenario="publish", queue="stalled", messages=500, window=100, timeout_s=0.5
    )

    async def scenario():
        broker = ToyBroker()
        broker.confirming = False
        url = await broker.start()
        try:
            with pytest.raises(BenchError, match="published 100, confirmed 0"):
                await loadgen.run_scenario(url, options)
            await asyncio.sleep(0.05)
            assert broker.queues == {}
        finally:
            await broker.stop()

    asyncio.run(scenario())


def test_options_are_checked():
    with pytest.raises(ValueError, match="multi-ack-every"):
        loadgen.Options(scenario="e2e", queue="q", prefetch=10, multi_ack_every=11)
    with pytest.raises(ValueError, match="timestamp"):
        loadgen.Options(scenario="e2e", queue="q", size_bytes=4)
    with pytest.raises(ValueError, match="queue type"):
        loadgen.Options(scenario="publish", queue="q", queue_type="streams")
    with pytest.raises(ValueError, match="replay reads a stream"):
        loadgen.Options(scenario="replay", queue="q", queue_type="classic")
    with pytest.raises(ValueError, match="needs a prefetch"):
        loadgen.Options(scenario="replay", queue="q", queue_type="stream", prefetch=0)
    with pytest.raises(ValueError, match="one replay consumer"):
        loadgen.Options(
            scenario="replay", queue="q", queue_type="stream", consumers=2, start="middle"
        )
    with pytest.raises(ValueError, match="start must be"):
        loadgen.Options(scenario="replay", queue="q", queue_type="stream", start="last")
    with pytest.raises(ValueError, match="consumers must be 1..64"):
        loadgen.Options(scenario="e2e", queue="q", consumers=65)
    assert loadgen.Options(scenario="replay", queue="q", queue_type="stream", consumers=10_000)
    with pytest.raises(ValueError, match="consumers must be 1..10000"):
        loadgen.Options(scenario="replay", queue="q", queue_type="stream", consumers=10_001)


def test_cli_prints_json(capsys):
    # The CLI runs its own loop, so the toy broker runs in a thread beside it.
    runner = LoopThread(asyncio.new_event_loop).start()
    broker = ToyBroker()
    url = runner.call(broker.start())
    try:
        status = loadgen.main(["publish", "--url", url, "--messages", "200", "--window", "50"])
    finally:
        runner.call(broker.stop())
        runner.stop()
    report = json.loads(capsys.readouterr().out)
    assert status == 0 and report["confirmed"] == 200 and report["scenario"] == "publish"


@pytest.fixture
def warren_url(warren_process):
    return warren_process.start().url


def test_small_runs_against_warren(warren_url):
    publish = loadgen.Options(
        scenario="publish", queue="bench-publish", messages=3000, window=300, timeout_s=60
    )
    e2e = loadgen.Options(
        scenario="e2e",
        queue="bench-e2e",
        messages=3000,
        window=300,
        prefetch=100,
        multi_ack_every=50,
        timeout_s=60,
    )

    async def scenario():
        return (
            await loadgen.run_scenario(warren_url, publish),
            await loadgen.run_scenario(warren_url, e2e),
        )

    published, end_to_end = asyncio.run(scenario())
    assert published["confirmed"] == 3000 and published["nacked"] == 0
    assert end_to_end["received"] == 3000 and end_to_end["redelivered"] == 0
    assert end_to_end["latency_ms_p99"] >= end_to_end["latency_ms_p50"] > 0


def test_e2e_with_rejects_ends_once_the_dead_letter_queue_holds_them(warren_url):
    """`--reject-every 10`: a tenth of the deliveries rejected into QUEUE.dlq; the run counts
    until they are all there, and deletes both queues."""
    options = loadgen.Options(
        scenario="e2e",
        queue="bench-rejects",
        messages=3000,
        window=300,
        prefetch=100,
        multi_ack_every=50,
        reject_every=10,
        timeout_s=60,
    )
    report = asyncio.run(loadgen.run_scenario(warren_url, options))
    assert report["received"] == 3000 and report["dead_lettered"] == 300
    assert report["reject_every"] == 10

    async def exists(queue: str) -> bool:
        connection = await ClientConnection.open(wire.parse_url(warren_url))
        try:
            channel = await connection.open_channel()
            await connection.call(
                channel, commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk
            )
            return True
        except BenchError:
            return False
        finally:
            await connection.close()

    assert not asyncio.run(exists("bench-rejects"))
    assert not asyncio.run(exists("bench-rejects.dlq"))


def test_a_stream_replays_to_several_consumers_at_once(warren_url):
    replay = loadgen.Options(
        scenario="replay",
        queue="bench-replay",
        queue_type="stream",
        messages=3000,
        window=300,
        consumers=3,
        prefetch=100,
        multi_ack_every=50,
        timeout_s=60,
    )
    report = asyncio.run(loadgen.run_scenario(warren_url, replay))
    assert report["received"] == 9000 and report["first_delivery_ms"] > 0
    assert report["msgs_per_s"] > 0 and report["fill_msgs_per_s"] > 0


def test_more_replay_consumers_than_connections_share_them_and_rss_is_sampled(warren_process):
    url = warren_process.start().url
    replay = loadgen.Options(
        scenario="replay",
        queue="bench-replay-many",
        queue_type="stream",
        messages=200,
        window=100,
        consumers=loadgen.CONNECTIONS_MAX + 6,
        prefetch=100,
        multi_ack_every=50,
        timeout_s=60,
    )
    report = asyncio.run(loadgen.run_scenario(url, replay, warren_process.process.pid))
    assert report["received"] == 200 * (loadgen.CONNECTIONS_MAX + 6)
    assert report["rss_mb_peak"] >= report["rss_mb_before_consumers"] > 0


def test_a_seek_starts_at_the_middle_of_the_fill(warren_url):
    # Paced over about three seconds, as AMQP timestamps are whole seconds.
    seek = loadgen.Options(
        scenario="replay",
        queue="bench-seek",
        queue_type="stream",
        messages=300,
        window=10,
        rate_per_s=100,
        prefetch=100,
        multi_ack_every=50,
        timeout_s=60,
        start="middle",
    )
    report = asyncio.run(loadgen.run_scenario(warren_url, seek))
    assert report["received"] >= 1 and report["first_delivery_ms"] > 0
    assert 0 < report["seek_to_s"] <= report["fill_s"]
    # The first message at or after the middle second: never one from the first half.
    assert 0.3 <= report["first_message_fill_fraction"] <= 1


async def ready_at(url: str, queue: str) -> int:
    """The queue's ready count, asked on a connection of its own."""
    connection = await ClientConnection.open(wire.parse_url(url))
    try:
        channel = await connection.open_channel()
        return await loadgen.ready_count(connection, channel, queue)
    finally:
        await connection.close()


def test_a_memory_run_holding_every_other_delivery_acks_exactly_the_rest(warren_process):
    url = warren_process.start().url
    held = loadgen.Options(
        scenario="memory",
        queue="bench-held",
        messages=200,
        window=50,
        settle_s=0.2,
        hold_every=2,
        keep_queue=True,
        timeout_s=60,
    )
    report = asyncio.run(loadgen.run_scenario(url, held, warren_process.process.pid))
    assert (report["ready"], report["unacked"], report["ready_after_consume"]) == (200, 100, 0)
    assert report["rss_mb_held"] > 0 and "rss_mb_growth_held" in report

    # The consumer's connection is gone: what it held, and only that, is back.
    assert asyncio.run(ready_at(url, "bench-held")) == 100
    with pytest.raises(ValueError, match="--hold-every"):
        loadgen.Options(scenario="e2e", queue="q", hold_every=2)


def test_an_e2e_run_beside_a_polling_console_lists_the_idle_queues(warren_process):
    url = warren_process.start().url
    watched = loadgen.Options(
        scenario="e2e",
        queue="bench-watched",
        messages=3000,
        window=100,
        prefetch=100,
        multi_ack_every=50,
        rate_per_s=3000,
        idle_queues=20,
        poll_api=warren_process.management_url,
        poll_every_s=0.1,
        timeout_s=60,
    )
    # The console's page of 5 and the whole list both count the measured queue and the idle
    # ones (no dead-letter queue is asked for).
    for page_size in (5, 0):
        paged = dataclasses.replace(watched, poll_page_size=page_size)
        report = asyncio.run(loadgen.run_scenario(url, paged))
        assert report["received"] == 3000 and report["api_polls"] >= 2
        assert report["api_queues_listed"] == 21
        assert 0 < report["api_poll_ms_p50"] <= report["api_poll_ms_max"]

    # Every idle queue is gone after the run (once, all but a few were left behind).
    for index in (0, 19):
        with pytest.raises(BenchError, match="NOT_FOUND|404"):
            asyncio.run(ready_at(url, f"bench-watched-idle-{index}"))
    with pytest.raises(ValueError, match="--poll-api"):
        loadgen.Options(scenario="publish", queue="q", poll_api="http://127.0.0.1:1")


def test_a_cold_replay_drops_the_page_cache_between_the_fill_and_the_reads(
    warren_url, tmp_path, monkeypatch
):
    control = tmp_path / "drop_caches"
    control.write_text("0\n")
    monkeypatch.setattr(loadgen, "DROP_CACHES", str(control))
    cold = loadgen.Options(
        scenario="replay",
        queue="bench-cold",
        queue_type="stream",
        messages=50,
        window=10,
        prefetch=100,
        multi_ack_every=50,
        timeout_s=60,
        cold=True,
    )
    report = asyncio.run(loadgen.run_scenario(warren_url, cold))
    assert report["received"] == 50
    assert control.read_text() == "3\n"
    with pytest.raises(ValueError, match="--cold"):
        loadgen.Options(scenario="e2e", queue="q", cold=True)


REAL_BROKER_URL = os.environ.get("WARREN_BENCH_URL") or os.environ.get("WARREN_REFERENCE_URL")


@pytest.mark.skipif(
    not REAL_BROKER_URL,
    reason="set WARREN_BENCH_URL or WARREN_REFERENCE_URL to a broker to run this",
)
@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_small_runs_against_a_real_broker(queue_type):
    for scenario in ("publish", "e2e"):
        options = loadgen.Options(
            scenario=scenario,
            queue=f"warren-bench-test-{queue_type}",
            queue_type=queue_type,
            messages=2000,
            window=200,
            prefetch=100,
            multi_ack_every=50,
            timeout_s=60,
        )
        report = asyncio.run(loadgen.run_scenario(REAL_BROKER_URL, options))
        assert report["confirmed"] == 2000 and report["nacked"] == 0
        if scenario == "e2e":
            assert report["received"] == 2000 and report["latency_ms_p99"] is not None


def test_topic_bench_posts_and_reads_every_record_back(start_broker, tmp_path, capsys):
    broker = start_broker(tmp_path / "data")
    url = broker.management_url
    for partitions in ("0", "3"):
        status = cli.main(
            [
                "bench",
                "topic",
                "--url",
                url,
                "--records",
                "1500",
                "--batch",
                "400",
                "--clients",
                "3",
                "--size",
                "50",
                "--partitions",
                partitions,
            ]
        )
        report = json.loads(capsys.readouterr().out)
        assert status == 0, report
        assert report["read_back"] == 1500 and report["partitions"] == max(1, int(partitions))
        assert report["post_records_per_s"] > 0 and report["get_mb_per_s"] > 0
    # The bench deleted its topics.
    assert not [q for q in HttpApi(url).get("/api/queues").json if "bench-topic" in q["name"]]
    status = cli.main(["bench", "topic", "--url", url, "--batch", "10001"])
    assert status == 1 and "at most 10000" in json.loads(capsys.readouterr().out)["error"]

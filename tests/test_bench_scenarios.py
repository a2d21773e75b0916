"""The load generator's scenarios of issue 16 (queues, fanout, connections, steady, drain, and
publish/e2e with 1 KiB and 16 KiB bodies), each run tiny against Warren; and the rate
generator's schedule, walked through with a clock the test holds."""

from __future__ import annotations

import argparse
import asyncio
import json
from types import SimpleNamespace

import pika
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_loadgen import FakeConnection

from warrenmq.server.bench import loadgen, roles, wire
from warrenmq.server.bench.pacing import RateSchedule
from warrenmq.server.bench.roles import Publisher

# -- the rate schedule, without sleeping -----------------------------------------------------


def test_a_schedule_says_what_is_due_at_each_moment():
    start_ns = 5_000_000_000
    schedule = RateSchedule(rate_per_s=1000, total=10, start_ns=start_ns)
    assert schedule.due(start_ns - 1) == 0
    assert schedule.due(start_ns) == 1  # the first message is due at once
    assert schedule.due(start_ns + 999_999) == 1
    assert schedule.due(start_ns + 1_000_000) == 2
    assert schedule.due(start_ns + 4_500_000) == 5
    assert schedule.due(start_ns + 10**12) == 10  # never more than the total
    assert [schedule.due_ns(index) - start_ns for index in (0, 1, 9)] == [0, 1_000_000, 9_000_000]
    # Sent 3.25 ms after it was due; early or on time is no lag.
    assert schedule.lag_ns(2, start_ns + 5_250_000) == 3_250_000
    assert schedule.lag_ns(2, start_ns) == 0


def test_a_publisher_at_20_per_second_sleeps_until_its_next_message():
    """What a paced publisher does with the schedule: send what is due, sleep until the next."""
    now_ns = 0
    schedule = RateSchedule(rate_per_s=20, total=100, start_ns=now_ns)
    sent = 0
    wakes = 0
    while sent < schedule.total:
        due = schedule.due(now_ns)
        assert due == sent + 1  # woken exactly when one more is due, never early or in bulk
        sent = due
        if sent < schedule.total:
            now_ns = max(now_ns + 1_000_000, schedule.due_ns(sent))
            wakes += 1
    assert wakes == 99 and now_ns == 99 * 50_000_000


@given(
    rate=st.floats(0.5, 2_000_000, allow_nan=False),
    total=st.integers(1, 10**6),
    start_ns=st.integers(0, 10**15),
    index=st.integers(0, 10**6 - 1),
)
def test_due_and_due_ns_agree_for_any_rate(rate, total, start_ns, index):
    schedule = RateSchedule(rate, total, start_ns)
    index %= total
    at = schedule.due_ns(index)
    assert schedule.due(at) >= index + 1  # due at its time...
    assert schedule.due(at - 1) <= index  # ...and not a nanosecond before
    assert schedule.lag_ns(index, at) == 0


def test_a_schedule_refuses_nonsense():
    with pytest.raises(ValueError):
        RateSchedule(0, 10, 0)
    with pytest.raises(ValueError):
        RateSchedule(10, 0, 0)


def test_a_publisher_records_how_late_its_writes_went_out(monkeypatch):
    now_ns = [10**9]
    monkeypatch.setattr(roles, "time", SimpleNamespace(monotonic_ns=lambda: now_ns[0]))

    async def scenario():
        template = wire.PublishTemplate(1, "", "q", 16, 4096)
        publisher = Publisher(
            FakeConnection(), 1, template, messages=100, window=100, rate_per_s=1000, stamp=True
        )
        publisher.start()  # message 0, on time
        now_ns[0] += 10_000_000  # woken 10 ms in: messages 1..10 are due
        publisher.writable()
        assert publisher.published == 11
        # One write of ten messages, the first of them 9 ms late: all counted at that.
        assert publisher.lag_histogram.count == 11
        assert publisher.lag_histogram.max_us == 9000 and publisher.lag_histogram.min_us == 0
        publisher.fail(loadgen.BenchError("stop"))

    asyncio.run(scenario())


def test_writes_of_large_bodies_stay_within_the_write_bound():
    async def scenario():
        connection = FakeConnection()
        template = wire.PublishTemplate(1, "", "q", 16384, 131072)
        publisher = Publisher(connection, 1, template, messages=1000, window=1000)
        publisher.start()
        assert publisher.published == 1000
        message_bytes = len(template.frame(bytes(16384)))
        assert all(len(chunk) <= roles.WRITE_BYTES_MAX for chunk in connection.written)
        assert sum(len(chunk) for chunk in connection.written) == 1000 * message_bytes
        publisher.fail(loadgen.BenchError("stop"))

    asyncio.run(scenario())


# -- options -------------------------------------------------------------------------------


def test_scenario_options_are_checked():
    with pytest.raises(ValueError, match="consumer per queue"):
        loadgen.Options(scenario="fanout", queue="q", queue_count=3, consumers=2)
    with pytest.raises(ValueError, match="publisher per queue"):
        loadgen.Options(scenario="queues", queue="q", queue_count=3, consumers=3, publishers=2)
    with pytest.raises(ValueError, match="several queues"):
        loadgen.Options(scenario="e2e", queue="q", queue_count=2)
    with pytest.raises(ValueError, match="rate"):
        loadgen.Options(scenario="steady", queue="q")
    with pytest.raises(ValueError, match="publishers must be 1..64"):
        loadgen.Options(scenario="e2e", queue="q", publishers=65)
    assert loadgen.Options(scenario="connections", queue="q", publishers=5000, rate_per_s=1e5)


# -- tiny runs against Warren ------------------------------------------------------------------


@pytest.fixture(scope="module")
def warren(tmp_path_factory):
    from brokers import WarrenProcess

    process = WarrenProcess(tmp_path_factory.mktemp("warren")).start()
    yield process
    process.kill()


def run(url, **fields):
    options = loadgen.Options(queue=f"bench-{fields['scenario']}", timeout_s=60, **fields)
    return asyncio.run(loadgen.run_scenario(url, options))


def assert_gone(warren, queues=(), exchanges=()):
    """The run deleted what it declared (a passive declare of it is refused)."""
    connection = warren.connect()
    try:
        for name in queues:
            with pytest.raises(pika.exceptions.ChannelClosedByBroker):
                connection.channel().queue_declare(name, passive=True)
        for name in exchanges:
            with pytest.raises(pika.exceptions.ChannelClosedByBroker):
                connection.channel().exchange_declare(name, passive=True)
    finally:
        connection.close()


def assert_latencies(report, prefix="latency"):
    assert 0 < report[f"{prefix}_ms_p50"] <= report[f"{prefix}_ms_p99"]


def test_queues_runs_a_publisher_and_a_consumer_on_each_queue(warren):
    report = run(
        warren.url,
        scenario="queues",
        queue_count=3,
        publishers=3,
        consumers=3,
        messages=900,
        window=100,
        prefetch=100,
        multi_ack_every=50,
    )
    assert report["queue_count"] == 3 and report["publishers"] == report["consumers"] == 3
    assert report["published"] == report["confirmed"] == report["received"] == 900
    assert report["nacked"] == report["redelivered"] == report["unstamped"] == 0
    assert report["msgs_per_s"] > 0
    assert_latencies(report)
    assert_gone(warren, [f"bench-queues-{index}" for index in range(3)])


def test_fanout_delivers_every_message_to_every_bound_queue(warren):
    report = run(
        warren.url,
        scenario="fanout",
        queue_count=3,
        consumers=3,
        messages=300,
        window=100,
        prefetch=100,
        multi_ack_every=50,
    )
    assert report["published"] == report["confirmed"] == 300
    assert report["received"] == 900
    assert report["publish_msgs_per_s"] > 0 and report["msgs_per_s"] > 0
    assert_latencies(report)
    assert_gone(warren, [f"bench-fanout-{index}" for index in range(3)], ["bench-fanout.fanout"])


def test_connections_publish_at_their_rate_with_confirms(warren):
    # 40 connections at 20 msgs/s for half a second: 400 messages.
    report = run(
        warren.url,
        scenario="connections",
        publishers=40,
        rate_per_s=800,
        messages=400,
        window=10,
        prefetch=100,
        multi_ack_every=50,
    )
    assert report["publishers"] == 40
    assert report["published"] == report["confirmed"] == report["received"] == 400
    assert_latencies(report, "confirm_latency")
    assert report["confirm_latency_ms_p999"] >= report["confirm_latency_ms_p99"]
    assert report["rate_achieved_msgs_per_s"] > 0
    assert report["generator_lag_ms_p99"] >= 0 and isinstance(report["rate_achieved"], bool)
    assert_gone(warren, ["bench-connections"])


def test_steady_reports_latency_at_its_rate_and_whether_it_kept_it(warren):
    report = run(
        warren.url,
        scenario="steady",
        rate_per_s=1000,
        messages=500,
        prefetch=100,
        multi_ack_every=10,
        lag_ms_max=1000,
    )
    assert report["published"] == report["received"] == 500
    assert_latencies(report)
    assert report["latency_ms_p999"] >= report["latency_ms_p99"]
    # Half a second of schedule cannot be sent faster than the schedule.
    assert report["seconds"] >= 0.49 and report["rate_achieved_msgs_per_s"] <= 1001
    assert report["rate_achieved"] is True  # with a second of lag allowed
    assert report["generator_lag_ms_max"] >= report["generator_lag_ms_p99"] >= 0


def test_drain_fills_a_backlog_then_one_consumer_takes_it(warren):
    report = run(
        warren.url,
        scenario="drain",
        messages=3000,
        publishers=2,
        window=300,
        prefetch=200,
        multi_ack_every=100,
    )
    assert report["published"] == report["backlog"] == report["received"] == 3000
    assert report["nacked"] == report["redelivered"] == 0
    assert report["msgs_per_s"] > 0 and report["fill_msgs_per_s"] > 0
    assert_gone(warren, ["bench-drain"])


@pytest.mark.parametrize("size", [1024, 16384])
def test_large_bodies_are_split_at_the_brokers_frame_max(start_broker, tmp_path, size):
    """A 16 KiB body against a frame_max of 4096 crosses five body frames each way."""
    broker = start_broker(tmp_path / "data", frame_bytes_max=4096)
    url = f"amqp://guest:guest@127.0.0.1:{broker.port}/%2F"
    published = run(url, scenario="publish", size_bytes=size, messages=300, window=50)
    assert published["published"] == published["confirmed"] == 300
    assert published["mb_per_s"] > 0
    e2e = run(
        url,
        scenario="e2e",
        size_bytes=size,
        messages=300,
        window=50,
        prefetch=50,
        multi_ack_every=10,
    )
    assert e2e["received"] == 300 and e2e["unstamped"] == 0
    assert_latencies(e2e)


def test_the_cli_compares_a_new_scenario_and_prints_its_ratios(warren, capsys):
    status = loadgen.main(
        [
            "fanout",
            "--url",
            warren.url,
            "--compare",
            warren.url,
            "--queues",
            "2",
            "--messages",
            "200",
            "--runs",
            "3",
        ]
    )
    result = json.loads(capsys.readouterr().out)
    assert status == 0 and set(result["ratio"]) == set(loadgen.HEADLINES["fanout"])
    assert len(result["target"]["runs"]) == 3
    assert result["target"]["received"] == result["compare"]["received"] == 400
    assert all(value > 0 for value in result["ratio"].values())


def test_the_cli_runs_a_paced_scenario_for_its_seconds(warren, capsys):
    status = loadgen.main(
        [
            "connections",
            "--url",
            warren.url,
            "--connections",
            "5",
            "--rate-per-connection",
            "40",
            "--seconds",
            "0.5",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert status == 0 and report["messages"] == 100 and report["rate_per_s"] == 200
    assert report["confirmed"] == 100


def test_queue_arguments_reach_the_declared_queue(warren, capsys):
    """--queue-argument x-max-length=50 (an integer): the kept queue holds 50 of the 100."""
    status = loadgen.main(
        [
            "publish",
            "--url",
            warren.url,
            "--queue",
            "bench-arguments",
            "--keep-queue",
            "--messages",
            "100",
            "--queue-argument",
            "x-max-length=50",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert status == 0 and report["queue_arguments"] == {"x-max-length": 50}
    connection = warren.connect()
    try:
        channel = connection.channel()
        kept = channel.queue_declare("bench-arguments", passive=True)
        assert kept.method.message_count == 50
        channel.queue_delete("bench-arguments")
    finally:
        connection.close()


def test_queue_arguments_are_x_arguments_and_not_the_queue_type():
    assert loadgen.queue_argument("x-quorum-initial-group-size=3") == (
        "x-quorum-initial-group-size",
        3,
    )
    assert loadgen.queue_argument("x-queue-leader-locator=balanced") == (
        "x-queue-leader-locator",
        "balanced",
    )
    with pytest.raises(argparse.ArgumentTypeError):
        loadgen.queue_argument("x-max-length")
    for key in ("x-queue-type", "max-length"):
        with pytest.raises(ValueError, match="x- arguments other than --queue-type"):
            loadgen.Options(scenario="publish", queue="q", queue_arguments={key: 1})


def test_the_bench_raises_its_open_files_limit_to_the_hard_one():
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        if hard != resource.RLIM_INFINITY and hard > 64:
            resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        loadgen.raise_open_files_limit(10)
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (hard, hard)
        if hard != resource.RLIM_INFINITY:
            with pytest.raises(loadgen.BenchError, match="open files"):
                loadgen.raise_open_files_limit(hard + 1)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

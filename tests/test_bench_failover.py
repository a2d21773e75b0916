"""The failover measurement (server/bench/failover.py): the figure from timelines made up
here, and the publisher against a broker in this process that stays up, or that goes."""

from __future__ import annotations

import asyncio

from ports import free_port

from warrenmq.server.bench import failover
from warrenmq.server.bench.failover import ConfirmTimeline, failover_report, resumed_after

MS = 1_000_000
KILL_NS = 1000 * MS


def timeline_of(writes=(), confirms=(), breaks=()) -> ConfirmTimeline:
    return ConfirmTimeline(list(writes), list(confirms), list(breaks))


def test_confirms_of_messages_sent_before_the_kill_are_not_a_resumption():
    timeline = timeline_of(
        writes=[(900 * MS, 1, 1, 10), (1010 * MS, 1, 11, 12)],
        # Tag 10 (sent before the kill) confirmed after it: the old leader had it.
        confirms=[(950 * MS, 1, 5, True, True), (1005 * MS, 1, 10, True, True)],
    )
    assert resumed_after(timeline, KILL_NS) is None
    timeline.confirms.append((1400 * MS, 1, 11, False, True))
    assert resumed_after(timeline, KILL_NS) == 400 * MS


def test_a_nack_is_no_resumption():
    timeline = timeline_of(
        writes=[(900 * MS, 1, 1, 10), (1010 * MS, 1, 11, 20)],
        confirms=[(1200 * MS, 1, 20, True, False), (1700 * MS, 1, 20, True, True)],
    )
    assert resumed_after(timeline, KILL_NS) == 700 * MS


def test_confirms_resume_on_the_channel_opened_after_a_break():
    """The first channel's messages after the kill are never confirmed; the publisher's next
    channel (tags from 1 again) is, and a multiple ack covering its first tag counts."""
    timeline = timeline_of(
        writes=[
            (900 * MS, 1, 1, 10),
            (1001 * MS, 1, 11, 15),
            (1002 * MS, 1, 16, 18),
            (2500 * MS, 2, 1, 3),
            (2600 * MS, 2, 4, 9),
        ],
        confirms=[(990 * MS, 1, 10, True, True), (3250 * MS, 2, 3, True, True)],
        breaks=[(2400 * MS, "connection lost")],
    )
    assert resumed_after(timeline, KILL_NS) == 2250 * MS
    report = failover_report(timeline, 0, KILL_NS, 3300 * MS, 30.0)
    assert report["failover_ms"] == 2250.0
    assert report["verdict"] == "confirms resumed 2250 ms after the kill"
    assert (report["ack_frames_before_kill"], report["ack_frames_after_kill"]) == (1, 1)
    assert report["breaks_after_kill"] == 1
    assert report["first_break_after_kill"] == "connection lost"


def test_a_broker_that_never_resumes_is_reported_so():
    timeline = timeline_of(
        writes=[(900 * MS, 1, 1, 10), (1001 * MS, 1, 11, 15)],
        confirms=[(990 * MS, 1, 10, True, True), (1100 * MS, 1, 15, True, False)],
    )
    report = failover_report(timeline, 0, KILL_NS, 31_000 * MS, 30.0)
    assert report["failover_ms"] is None
    assert report["verdict"] == "no confirms resumed within 30 s"
    assert report["nack_frames_after_kill"] == 1
    assert failover_report(timeline_of(), 0, KILL_NS, 2 * KILL_NS, 30.0)["verdict"] == (
        "no confirms before the kill: nothing to measure"
    )


def declared(broker, queue: str) -> None:
    connection = broker.connect()
    connection.channel().queue_declare(queue, durable=True)
    connection.close()


def test_the_publisher_goes_on_through_the_next_url_and_confirms_resume(start_broker, tmp_path):
    """No node down, the first URL refusing connections: the publisher moves to the second,
    and confirms of messages sent after the 'kill' (which does nothing) come at once."""
    broker = start_broker(tmp_path)
    declared(broker, "failover-up")
    refused = f"amqp://guest:guest@127.0.0.1:{free_port()}/%2F"
    report = asyncio.run(
        failover.measure_failover(
            [refused, f"amqp://guest:guest@127.0.0.1:{broker.port}/%2F"],
            "failover-up",
            lambda: None,
            rate_per_s=500,
            before_s=0.5,
            resume_s_max=10,
        )
    )
    assert report["ack_frames_before_kill"] > 0
    assert report["failover_ms"] is not None and report["failover_ms"] < 10_000
    assert report["verdict"].startswith("confirms resumed")
    connection = broker.connect()
    ready = connection.channel().queue_declare("failover-up", passive=True).method.message_count
    connection.close()
    assert ready > 0


def test_a_broker_that_goes_for_good_gives_a_verdict_not_an_error(start_broker, tmp_path):
    broker = start_broker(tmp_path)
    declared(broker, "failover-down")
    report = asyncio.run(
        failover.measure_failover(
            [f"amqp://guest:guest@127.0.0.1:{broker.port}/%2F"],
            "failover-down",
            broker.stop,
            rate_per_s=500,
            before_s=0.5,
            resume_s_max=1.5,
        )
    )
    assert report["ack_frames_before_kill"] > 0
    assert report["failover_ms"] is None
    assert report["verdict"] == "no confirms resumed within 1.5 s"
    assert report["breaks_after_kill"] >= 1

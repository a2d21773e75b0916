"""The issue's three floods, small, against `warren serve` with an absolute memory watermark,
its RSS sampled throughout (`warren bench flood` runs them at full size): half-sent bodies
on eight channels, a transaction never committed, and a consumer without prefetch that never
reads its socket, on a backlog larger than the watermark. The broker's RSS stays under the
watermark plus MARGIN_BYTES, and once the flooding client is gone (reset: its close would wait
behind the flood the broker no longer reads) a well-behaved client is served again.

MARGIN_BYTES covers what arrives between two memory samples (every resource_check_interval_ms,
100 ms, and every RESOURCE_CHECK_READ_BYTES of input, 8 MiB) before the alarm blocks, and
the write buffer bound of the consumer's connection."""

from __future__ import annotations

import pytest
from hostile import serves_a_good_client

from warrenmq.server.bench import flood, wire

MIB = 1 << 20
WATERMARK_BYTES = 200_000_000
MARGIN_BYTES = 64 * MIB
SIZES = flood.FloodSizes(
    channels=8,
    body_bytes=24 * MIB,
    message_bytes=MIB,
    messages=256,
    backlog_bytes=256 * MIB,
    stall_s=1.0,
    hold_s=0.5,
    timeout_s=60.0,
)


@pytest.fixture(scope="module")
def warren(tmp_path_factory):
    from brokers import WarrenProcess

    data = tmp_path_factory.mktemp("floods")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WARREN_MEMORY_HIGH_WATERMARK_BYTES", str(WATERMARK_BYTES))
        process = WarrenProcess(data / "data", log_path=data / "warren.log").start()
    yield process
    process.kill()


def run(warren, scenario: str) -> flood.FloodReport:
    address = wire.parse_url(f"amqp://guest:guest@127.0.0.1:{warren.port}/%2F")
    report = flood.FLOODS[scenario](address, warren.process.pid, WATERMARK_BYTES, SIZES)
    assert warren.process.poll() is None, warren.log_since_start()[-3000:]
    assert report.rss_peak_bytes < WATERMARK_BYTES + MARGIN_BYTES, report
    serves_a_good_client(warren)
    return report


def test_half_sent_bodies_on_eight_channels_are_blocked_by_the_alarm(warren):
    report = run(warren, "partial-bodies")
    assert report.stalled and report.blocked_notice, report
    assert report.sent_bytes < SIZES.channels * SIZES.body_bytes


def test_a_transaction_never_committed_is_blocked_by_the_alarm(warren):
    report = run(warren, "transaction")
    assert report.stalled and report.blocked_notice, report
    assert report.sent_bytes < SIZES.messages * SIZES.message_bytes


def test_a_consumer_that_never_reads_gets_no_more_than_the_write_buffer_bound(warren):
    report = run(warren, "slow-consumer")
    assert report.detail["backlog_messages"] * SIZES.message_bytes > WATERMARK_BYTES

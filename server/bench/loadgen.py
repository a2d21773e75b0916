"""`warren bench publish|e2e|queues|fanout|connections|steady|drain|replay|memory`: a load
generator for any AMQP 0-9-1 broker, like PerfTest.

Scenarios (each declares its own durable queue, ``x-queue-type`` classic, quorum or stream,
purges it (a stream is deleted and declared again instead: streams refuse purges), and deletes
it at the end unless ``--keep-queue``):

* ``publish`` — publishers with confirms, at most ``--window`` unconfirmed each, send
  ``--messages`` persistent messages of ``--size`` bytes; reports msgs/s from the first
  publish to the last confirm, and the publish-to-confirm latency.
* ``e2e`` — the same publishers (optionally paced at ``--rate`` msgs/s in total) plus
  consumers with prefetch ``--prefetch`` that ack with ``multiple`` every
  ``--multi-ack-every`` deliveries; reports msgs/s received and the end-to-end latency from
  the send timestamp carried in each body.
* ``queues`` — e2e over ``--queues`` N queues at once, each with its own publisher and
  consumer; reports the total msgs/s received and the end-to-end latency over all of them.
* ``fanout`` — one publisher to a durable fanout exchange bound to N queues, each with a
  consumer; reports msgs/s published and msgs/s delivered (N deliveries per message).
* ``connections`` — ``--connections`` C publisher connections (opened ``OPEN_PARALLEL`` at a
  time, their schedules staggered) each publishing ``--rate-per-connection`` msgs/s with
  confirms for ``--seconds``, and a consumer emptying the queue; reports the publish-to-confirm
  latency (p50/p99/p99.9) and the rate achieved.
* ``steady`` — e2e at a fixed ``--rate`` for ``--seconds``: the end-to-end latency at that rate.
* ``drain`` — fills the queue with a backlog of ``--messages`` (``--publishers`` at once),
  then one consumer (prefetch ``--prefetch``) takes all of it with acks; reports the drain's
  msgs/s from basic.consume to the last delivery.

A paced run (``--rate``, ``connections``, ``steady``) also reports how late its generator
sent against the schedule (``generator_lag_ms_*``, see pacing.py), the rate it achieved, and
``rate_achieved``: false when the p99 lag exceeds ``--lag-ms-max``, so a client that could not
keep up says so rather than reporting the lower latency of a lighter load.
* ``replay`` — fills a stream (``--queue-type stream``) with ``--messages`` confirmed
  messages, then ``--consumers`` consumers at once read all of it from ``x-stream-offset:
  first`` (prefetch ``--prefetch``, acks as credit); reports msgs/s received in total and the
  time from the first basic.consume to the first delivery. With ``--pid`` it also samples the
  broker's resident memory while the consumers read (``--consumers`` up to 10,000, spread over
  at most 64 connections, a channel each). ``--start middle`` seeks instead: one consumer
  starts at the AMQP timestamp halfway through the fill and stops at its first delivery;
  reports the time to it and where in the fill that message was published (0..1).
  ``--cold`` drops the kernel's page cache between the fill and the reads (root only), so
  the reads come from disk.
* ``memory`` — fills the queue with ``--messages`` ready messages and reports how much the
  broker's resident memory grew (``--pid``, read from /proc, so the broker must run on this
  machine). ``--hold-every N`` then consumes the queue with one consumer that leaves every
  Nth delivery unacknowledged, and reports the resident memory with those held.

``--compare URL`` runs the same scenario against a second broker right after the first, in the
same process, and prints both reports and their ratio (first / second) for the headline
figures. ``--runs N`` repeats the scenario N times (alternating with the compared broker) and
reports each side's median run. Output is one JSON document on stdout; on failure it has an
``error`` key and the exit status is 1.

The client is built to stay out of the way: hand-built frames written in runs (one
``transport.write`` per window refill), one clock read per socket read, no per-message
objects; everything shares one uvloop event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import os
import secrets
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from pamqp import commands

from . import wire
from .api_poller import ApiPoller
from .client import BenchError, ClientConnection, close_all
from .roles import Consumer, ConsumerTally, Publisher
from .stats import LatencyHistogram

QUEUE_TYPES = ("classic", "quorum", "stream")
WINDOW_MAX = 1_000_000
CONNECTIONS_MAX = 64
CONSUMERS_MAX = 10_000
REPLAY_STARTS = ("first", "middle")
RSS_SAMPLE_S = 0.2
PREFETCH_MAX = 65_535  # basic.qos prefetch-count is a short
BODY_BYTES_MAX = 128 << 20
_MB = 1_000_000
DEAD_LETTER_POLL_S = 0.01
IDLE_QUEUES_MAX = 100_000
QUEUES_MAX = CONNECTIONS_MAX
"""queues and fanout: queues at once, each with a consumer connection of its own at least."""
PUBLISHERS_MANY_MAX = 10_000
"""connections: publisher connections (the rest keep CONNECTIONS_MAX)."""
OPEN_PARALLEL = 16
"""Publisher connections opened at a time: a thousand at once would overflow the broker's
accept backlog and time the handshakes of a SYN flood, not of a broker."""
LAG_MS_MAX = 5.0
# Scenarios whose consumers time each message from the send stamp at the front of its body.
STAMPED = ("e2e", "queues", "fanout", "connections", "steady")
# Scenarios that publish on a schedule and need a rate.
PACED = ("connections", "steady")
# The figures `--compare` divides, per scenario.
HEADLINES = {
    "publish": ("msgs_per_s", "confirm_latency_ms_p50", "confirm_latency_ms_p99"),
    "e2e": ("msgs_per_s", "latency_ms_p50", "latency_ms_p99"),
    "memory": ("rss_mb_growth", "rss_mb_growth_held"),
    "replay": ("msgs_per_s", "first_delivery_ms", "rss_mb_peak_growth"),
    "queues": ("msgs_per_s", "latency_ms_p50", "latency_ms_p99"),
    "fanout": ("msgs_per_s", "publish_msgs_per_s", "latency_ms_p50", "latency_ms_p99"),
    # At a set rate the throughput is the schedule's: the latency is what varies (and the
    # first headline picks the median run).
    "connections": (
        "confirm_latency_ms_p99",
        "confirm_latency_ms_p50",
        "confirm_latency_ms_p999",
        "rate_achieved_msgs_per_s",
    ),
    "steady": ("latency_ms_p99", "latency_ms_p50", "latency_ms_p999"),
    "drain": ("msgs_per_s", "fill_msgs_per_s"),
}


@dataclass(frozen=True)
class Options:
    """One scenario's parameters, the same for the broker under test and the compared one."""

    scenario: str
    queue: str
    queue_type: str = "classic"
    queue_arguments: dict[str, int | str] = field(default_factory=dict)
    """More x- arguments of the declared queues (x-quorum-initial-group-size...)."""
    size_bytes: int = 64
    messages: int = 100_000
    window: int = 1000
    publishers: int = 1
    consumers: int = 1
    prefetch: int = 1000
    multi_ack_every: int = 500
    reject_every: int = 0
    """e2e: reject every Nth delivery to a dead-letter queue (0: none)."""
    rate_per_s: float | None = None
    warmup: int = 0
    settle_s: float = 2.0
    keep_queue: bool = False
    timeout_s: float = 600.0
    start: str = "first"
    """replay: read from the first offset, or seek to the time halfway through the fill."""
    cold: bool = False
    """replay: drop the kernel's page cache between the fill and the reads."""
    hold_every: int = 0
    """memory: after the fill, one consumer takes every message and leaves every Nth
    unacknowledged (0: no consumer)."""
    idle_queues: int = 0
    """Durable queues declared beside the measured one for the run (for the API to list)."""
    poll_api: str | None = None
    """e2e: the broker's management API, polled for /api/queues while the scenario runs."""
    poll_every_s: float = 1.0
    poll_page_size: int = 100
    """The page of /api/queues the poll asks for, as the console pages it (0: every queue)."""
    queue_count: int = 1
    """queues and fanout: the queues measured at once (QUEUE-0, QUEUE-1...; QUEUE alone
    for 1)."""
    lag_ms_max: float = LAG_MS_MAX
    """A paced run achieved its rate when its generator's p99 lag stayed within this."""

    def __post_init__(self) -> None:
        if self.scenario not in HEADLINES:
            raise ValueError(f"unknown scenario {self.scenario!r}")
        if not 1 <= self.queue_count <= QUEUES_MAX:
            raise ValueError(f"queues must be 1..{QUEUES_MAX}")
        if self.queue_count > 1 and self.scenario not in ("queues", "fanout"):
            raise ValueError("several queues at once are the queues and fanout scenarios")
        # Every queue needs a consumer, and in `queues` a publisher, or the run never ends.
        if self.scenario in ("queues", "fanout") and self.consumers < self.queue_count:
            raise ValueError("a consumer per queue at least: consumers >= queues")
        if self.scenario == "queues" and self.publishers < self.queue_count:
            raise ValueError("a publisher per queue at least: publishers >= queues")
        if self.scenario in PACED and self.rate_per_s is None:
            raise ValueError(f"{self.scenario} publishes at a rate: give one")
        if self.lag_ms_max <= 0:
            raise ValueError("lag-ms-max must be positive")
        if self.reject_every and self.scenario != "e2e":
            raise ValueError("--reject-every rejects in the e2e scenario")
        if self.queue_type not in QUEUE_TYPES:
            raise ValueError(f"queue type must be one of {QUEUE_TYPES}, got {self.queue_type!r}")
        for key in self.queue_arguments:
            if not key.startswith("x-") or key == "x-queue-type":
                raise ValueError(f"queue arguments are x- arguments other than --queue-type: {key}")
        if self.scenario == "replay" and self.queue_type != "stream":
            raise ValueError("replay reads a stream: --queue-type stream")
        if self.start not in REPLAY_STARTS:
            raise ValueError(f"start must be one of {REPLAY_STARTS}, got {self.start!r}")
        if self.start == "middle" and (self.scenario != "replay" or self.consumers != 1):
            raise ValueError("--start middle seeks with one replay consumer")
        if self.cold and self.scenario != "replay":
            raise ValueError("--cold reads a replay from disk")
        if self.hold_every and (self.scenario != "memory" or self.hold_every < 2):
            raise ValueError("--hold-every N (N >= 2) holds deliveries in the memory scenario")
        if self.poll_api is not None and (self.scenario != "e2e" or self.poll_every_s <= 0):
            raise ValueError("--poll-api polls the API in the e2e scenario, every > 0 s")
        if not 0 <= self.poll_page_size <= 500:
            raise ValueError("--poll-page-size is 0 (every queue) or a page of 1 to 500")
        if not 0 <= self.idle_queues <= IDLE_QUEUES_MAX:
            raise ValueError(f"idle queues must be 0..{IDLE_QUEUES_MAX}")
        if self.start == "middle" and self.size_bytes < wire.TIMESTAMP_BYTES:
            raise ValueError(f"a seek needs --size >= {wire.TIMESTAMP_BYTES} for the timestamp")
        if self.queue_type == "stream" and self.prefetch == 0:
            raise ValueError("a stream consumer needs a prefetch")
        if not 0 <= self.size_bytes <= BODY_BYTES_MAX:
            raise ValueError(f"size must be 0..{BODY_BYTES_MAX} bytes, got {self.size_bytes}")
        if self.scenario in STAMPED and self.size_bytes < wire.TIMESTAMP_BYTES:
            raise ValueError(
                f"{self.scenario} needs --size >= {wire.TIMESTAMP_BYTES} for the timestamp"
            )
        if self.messages < 1 or not 1 <= self.window <= WINDOW_MAX:
            raise ValueError(f"need messages >= 1 and window 1..{WINDOW_MAX}")
        publishers_max = PUBLISHERS_MANY_MAX if self.scenario == "connections" else CONNECTIONS_MAX
        if not 1 <= self.publishers <= publishers_max:
            raise ValueError(f"publishers must be 1..{publishers_max}")
        # A replay's consumers share connections, a channel each.
        consumers_max = CONSUMERS_MAX if self.scenario == "replay" else CONNECTIONS_MAX
        if not 1 <= self.consumers <= consumers_max:
            raise ValueError(f"consumers must be 1..{consumers_max}")
        if self.publishers > self.messages:
            raise ValueError("more publishers than messages")
        if not 0 <= self.prefetch <= PREFETCH_MAX:
            raise ValueError(f"prefetch must be 0..{PREFETCH_MAX} (0: unlimited)")
        if self.multi_ack_every < 1 or (self.prefetch and self.multi_ack_every > self.prefetch):
            # Acking less often than the prefetch allows would stall the consumer for good.
            raise ValueError("multi-ack-every must be 1..prefetch")
        if self.reject_every < 0 or self.reject_every == 1:
            raise ValueError("reject-every must be 0 (none) or at least 2")
        if self.reject_every and self.queue_type == "stream":
            raise ValueError("a stream refuses rejects: no --reject-every on a stream")
        if self.rate_per_s is not None and self.rate_per_s <= 0:
            raise ValueError("rate must be positive")
        if self.warmup < 0 or self.warmup >= self.messages:
            raise ValueError("warmup must be 0..messages-1")
        if self.settle_s < 0 or self.timeout_s <= 0:
            raise ValueError("settle must be >= 0 s and timeout > 0 s")


@dataclass
class _Run:
    """What one scenario run has opened and started, for cleanup and for a timeout's report."""

    connections: list[ClientConnection] = field(default_factory=list)
    publishers: list[Publisher] = field(default_factory=list)
    tally: ConsumerTally | None = None

    def progress(self) -> str:
        published = sum(publisher.published for publisher in self.publishers)
        confirmed = sum(publisher.confirmed for publisher in self.publishers)
        text = f"published {published}, confirmed {confirmed}"
        if self.tally is not None:
            text += f", received {self.tally.received}"
        return text


def read_rss_bytes(pid: int) -> int:
    """Resident set size of a local process, from /proc/PID/status."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    value, unit = line.split()[1:3]
                    assert unit == "kB", line
                    return int(value) * 1024
    except OSError as error:
        raise BenchError(f"cannot read the memory of pid {pid}: {error}") from error
    raise BenchError(f"/proc/{pid}/status has no VmRSS (a kernel thread or a zombie?)")


class RssPeak:
    """The highest resident memory of a local process, sampled every `interval_s` in a
    thread (so also while the caller blocks) until stopped; as a context manager, stopped
    on exit."""

    def __init__(self, pid: int, interval_s: float = RSS_SAMPLE_S) -> None:
        self.pid = pid
        self.before = read_rss_bytes(pid)
        self.peak = self.before
        self._interval_s = interval_s
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stopped.wait(self._interval_s):
            try:
                self.peak = max(self.peak, read_rss_bytes(self.pid))
            except BenchError:
                return

    def stop(self) -> int:
        """Stop sampling, after a last sample; the peak."""
        if not self._stopped.is_set():
            self._stopped.set()
            self._thread.join()
            try:
                self.peak = max(self.peak, read_rss_bytes(self.pid))
            except BenchError:
                pass
        return self.peak

    def __enter__(self) -> RssPeak:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def _split(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` near-equal positive shares."""
    share, extra = divmod(total, parts)
    return [share + (1 if index < extra else 0) for index in range(parts)]


def dead_letter_queue(options: Options) -> str | None:
    return f"{options.queue}.dlq" if options.reject_every else None


def measured_queues(options: Options) -> list[str]:
    """The queues the scenario publishes to and consumes from."""
    if options.queue_count == 1:
        return [options.queue]
    return [f"{options.queue}-{index}" for index in range(options.queue_count)]


def fanout_exchange(options: Options) -> str | None:
    return f"{options.queue}.fanout" if options.scenario == "fanout" else None


def _scenario_exchanges(options: Options) -> list[str]:
    exchange = fanout_exchange(options)
    return [] if exchange is None else [exchange]


def _scenario_queues(options: Options) -> list[str]:
    """Every queue the scenario declares, for the cleanup."""
    dead_letters = dead_letter_queue(options)
    return [*measured_queues(options), *([dead_letters] if dead_letters else [])]


def raise_open_files_limit(needed: int) -> None:
    """Raise this process's soft limit on open files to the hard one (a thousand connections
    need a thousand descriptors); a BenchError when even that is below ``needed``."""
    try:
        import resource
    except ImportError:  # Windows: no such limit to raise
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard != resource.RLIM_INFINITY and needed > hard:
        raise BenchError(f"{needed} connections need more open files than the limit {hard}")


async def _declare(connection: ClientConnection, channel: int, options: Options) -> None:
    arguments: dict[str, Any] = {"x-queue-type": options.queue_type, **options.queue_arguments}
    dead_letters = dead_letter_queue(options)
    queues = measured_queues(options)
    if dead_letters is not None:
        await connection.call(
            channel,
            commands.Queue.Declare(queue=dead_letters, durable=True, arguments=dict(arguments)),
            commands.Queue.DeclareOk,
        )
        arguments["x-dead-letter-exchange"] = ""
        arguments["x-dead-letter-routing-key"] = dead_letters
    for queue in queues:
        if options.queue_type == "stream":
            await connection.call(
                channel, commands.Queue.Delete(queue=queue), commands.Queue.DeleteOk
            )
        await connection.call(
            channel,
            commands.Queue.Declare(queue=queue, durable=True, arguments=arguments),
            commands.Queue.DeclareOk,
        )
    # A stream refuses purges: it was deleted and declared again instead.
    if options.queue_type != "stream":
        for queue in _scenario_queues(options):
            await connection.call(
                channel, commands.Queue.Purge(queue=queue), commands.Queue.PurgeOk
            )
    exchange = fanout_exchange(options)
    if exchange is not None:
        await connection.call(
            channel,
            commands.Exchange.Declare(exchange=exchange, exchange_type="fanout", durable=True),
            commands.Exchange.DeclareOk,
        )
        for queue in queues:
            await connection.call(
                channel,
                commands.Queue.Bind(queue=queue, exchange=exchange),
                commands.Queue.BindOk,
            )


async def ready_count(connection: ClientConnection, channel: int, queue: str) -> int:
    declare_ok = await connection.call(
        channel, commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk
    )
    return declare_ok.message_count


async def _start_publishers(
    address: wire.BrokerAddress, options: Options, stamp: bool, run: _Run
) -> list[Publisher]:
    """Open the publishers' connections, ``OPEN_PARALLEL`` at a time; each publishes its
    share of the messages (at its share of the rate) to its queue, round-robin, or to the
    fanout exchange."""
    shares = _split(options.messages, options.publishers)
    queues = measured_queues(options)
    exchange = fanout_exchange(options)

    async def open_publisher(index: int) -> Publisher:
        connection = await ClientConnection.open(address)
        run.connections.append(connection)
        channel = await connection.open_channel()
        await connection.call(channel, commands.Confirm.Select(), commands.Confirm.SelectOk)
        if exchange is None:
            target, routing_key = "", queues[index % len(queues)]
        else:
            target, routing_key = exchange, ""
        template = wire.PublishTemplate(
            channel, target, routing_key, options.size_bytes, connection.frame_max
        )
        share = shares[index]
        rate = None if options.rate_per_s is None else options.rate_per_s * share / options.messages
        return Publisher(
            connection, channel, template, share, options.window, rate_per_s=rate, stamp=stamp
        )

    for first in range(0, options.publishers, OPEN_PARALLEL):
        indexes = range(first, min(first + OPEN_PARALLEL, options.publishers))
        # Every open of the wave ends before a failure is raised, so each connection made
        # is in run.connections for the cleanup.
        opened = await asyncio.gather(
            *(open_publisher(index) for index in indexes), return_exceptions=True
        )
        for result in opened:
            if isinstance(result, BaseException):
                raise result
            run.publishers.append(result)
    return run.publishers


def _start_all(publishers: list[Publisher]) -> None:
    """Start the publishers; paced ones spread evenly over one period of their schedule, so
    a thousand publishers at 20 msgs/s do not all send in the same millisecond."""
    loop = asyncio.get_running_loop()
    for index, publisher in enumerate(publishers):
        if publisher.rate_per_s is None or index == 0:
            publisher.start()
        else:
            loop.call_later(index / len(publishers) / publisher.rate_per_s, publisher.start)


def _publish_report(run: _Run, options: Options) -> dict:
    publishers = run.publishers
    histogram = LatencyHistogram()
    for publisher in publishers:
        histogram.merge(publisher.histogram)
    start_ns = min(publisher.start_ns for publisher in publishers)
    end_ns = max(publisher.done.result() for publisher in publishers)
    seconds = max((end_ns - start_ns) / 1e9, 1e-9)
    published = sum(publisher.published for publisher in publishers)
    confirm = {
        f"confirm_{key}" if key.startswith("latency") else "confirmed": value
        for key, value in histogram.summary_ms().items()
    }
    report = {
        "seconds": round(seconds, 3),
        "published": published,
        "nacked": sum(publisher.nacked for publisher in publishers),
        "publish_msgs_per_s": round(published / seconds, 1),
        **confirm,
        "blocked": sum(connection.blocked_count for connection in run.connections),
    }
    if options.rate_per_s is not None:
        report.update(_pacing_report(publishers, options))
    return report


def _pacing_report(publishers: list[Publisher], options: Options) -> dict[str, Any]:
    """How well the paced publishers kept their schedules."""
    assert options.rate_per_s is not None
    lag = LatencyHistogram()
    for publisher in publishers:
        lag.merge(publisher.lag_histogram)
    lag_ms = {
        key.replace("latency", "generator_lag"): value
        for key, value in lag.summary_ms().items()
        if key in ("latency_ms_p50", "latency_ms_p99", "latency_ms_max")
    }
    published = sum(publisher.published for publisher in publishers)
    # Staggered over one period, the schedules' first and last messages are (published - 1)
    # periods of the whole rate apart.
    span_ns = max(publisher.last_write_ns for publisher in publishers) - min(
        publisher.start_ns for publisher in publishers
    )
    achieved = (published - 1) * 1e9 / span_ns if span_ns > 0 else None
    lag_p99 = lag_ms["generator_lag_ms_p99"]
    return {
        "publisher_behind_ms_max": round(
            max(1000 * publisher.behind_max / publisher.rate_per_s for publisher in publishers), 3
        ),
        **lag_ms,
        "rate_achieved_msgs_per_s": None if achieved is None else round(achieved, 1),
        "rate_achieved": lag_p99 is not None and lag_p99 <= options.lag_ms_max,
    }


async def _run_publish(address: wire.BrokerAddress, options: Options, run: _Run) -> dict[str, Any]:
    publishers = await _start_publishers(address, options, False, run)
    _start_all(publishers)
    await asyncio.gather(*(publisher.done for publisher in publishers))
    report = _publish_report(run, options)
    report["msgs_per_s"] = report["publish_msgs_per_s"]
    report["mb_per_s"] = round(report["msgs_per_s"] * options.size_bytes / _MB, 3)
    return report


async def _run_e2e(address: wire.BrokerAddress, options: Options, run: _Run) -> dict[str, Any]:
    queues = measured_queues(options)
    # A fanout delivers each message to every queue.
    copies = len(queues) if fanout_exchange(options) is not None else 1
    tally = run.tally = ConsumerTally(options.messages * copies)
    consumers = []
    for index in range(options.consumers):
        connection = await ClientConnection.open(address)
        run.connections.append(connection)
        channel = await connection.open_channel()
        await connection.call(
            channel, commands.Basic.Qos(prefetch_count=options.prefetch), commands.Basic.QosOk
        )
        consumer = Consumer(
            connection,
            channel,
            tally,
            options.multi_ack_every,
            options.warmup,
            options.reject_every,
        )
        consumer.attach()
        await connection.call(
            channel,
            commands.Basic.Consume(queue=queues[index % len(queues)]),
            commands.Basic.ConsumeOk,
        )
        consumers.append(consumer)
    poller = None
    if options.poll_api is not None:
        poller = ApiPoller(
            options.poll_api,
            address.username,
            address.password,
            options.poll_every_s,
            options.poll_page_size,
        )
        poller.start()
    publishers = await _start_publishers(address, options, True, run)
    _start_all(publishers)
    await asyncio.gather(tally.done, *(publisher.done for publisher in publishers))
    for consumer in consumers:
        consumer.flush_acks()
    polled = await poller.stop() if poller is not None else {}
    end_ns = tally.done.result()
    dead_letters = dead_letter_queue(options)
    if dead_letters is not None:
        # Done once the dead-letter queue holds every rejected message too.
        channel = await run.connections[0].open_channel()
        while await ready_count(run.connections[0], channel, dead_letters) < tally.rejected:
            await asyncio.sleep(DEAD_LETTER_POLL_S)
        end_ns = time.monotonic_ns()
    report = _publish_report(run, options)
    start_ns = min(publisher.start_ns for publisher in publishers)
    seconds = max((end_ns - start_ns) / 1e9, 1e-9)
    report.update(
        {
            "seconds": round(seconds, 3),
            "received": tally.received,
            "redelivered": tally.redelivered,
            "dead_lettered": tally.rejected,
            "unstamped": tally.unstamped,
            "msgs_per_s": round(tally.received / seconds, 1),
            **{key: value for key, value in tally.histogram.summary_ms().items() if key != "count"},
            **polled,
        }
    )
    return report


async def _run_drain(
    address: wire.BrokerAddress,
    options: Options,
    run: _Run,
    admin: ClientConnection,
    admin_channel: int,
) -> dict[str, Any]:
    """Fill the queue with the whole backlog, confirmed; then time one consumer taking it."""
    publishers = await _start_publishers(address, options, False, run)
    _start_all(publishers)
    await asyncio.gather(*(publisher.done for publisher in publishers))
    filled = _publish_report(run, options)
    backlog = await ready_count(admin, admin_channel, options.queue)
    tally = run.tally = ConsumerTally(options.messages)
    connection = await ClientConnection.open(address)
    run.connections.append(connection)
    channel = await connection.open_channel()
    await connection.call(
        channel, commands.Basic.Qos(prefetch_count=options.prefetch), commands.Basic.QosOk
    )
    consumer = Consumer(connection, channel, tally, options.multi_ack_every)
    consumer.attach()
    start_ns = time.monotonic_ns()
    await connection.call(
        channel, commands.Basic.Consume(queue=options.queue), commands.Basic.ConsumeOk
    )
    end_ns = await tally.done
    consumer.flush_acks()
    seconds = max((end_ns - start_ns) / 1e9, 1e-9)
    return {
        "fill_seconds": filled["seconds"],
        "fill_msgs_per_s": filled["publish_msgs_per_s"],
        "published": filled["published"],
        "nacked": filled["nacked"],
        "backlog": backlog,
        "seconds": round(seconds, 3),
        "received": tally.received,
        "redelivered": tally.redelivered,
        "msgs_per_s": round(tally.received / seconds, 1),
    }


DROP_CACHES = "/proc/sys/vm/drop_caches"


def drop_page_cache() -> None:
    """Write back dirty pages, then have the kernel drop its clean page cache (root only), so
    the brokers read the stream from disk as after a reboot."""
    os.sync()
    with open(DROP_CACHES, "w") as control:
        control.write("3\n")


async def _run_replay(
    address: wire.BrokerAddress, options: Options, run: _Run, pid: int | None
) -> dict[str, Any]:
    seek = options.start == "middle"
    fill_start_s = time.time()
    publishers = await _start_publishers(address, options, seek, run)
    _start_all(publishers)
    await asyncio.gather(*(publisher.done for publisher in publishers))
    fill_end_s = time.time()
    filled = _publish_report(run, options)
    if options.cold:
        await asyncio.to_thread(drop_page_cache)
    run.tally = tally = ConsumerTally(1 if seek else options.messages * options.consumers)
    connections = []
    for _ in range(min(options.consumers, CONNECTIONS_MAX)):
        connection = await ClientConnection.open(address)
        run.connections.append(connection)
        connections.append(connection)
    readers = []
    for index in range(options.consumers):
        connection = connections[index % len(connections)]
        channel = await connection.open_channel()
        await connection.call(
            channel, commands.Basic.Qos(prefetch_count=options.prefetch), commands.Basic.QosOk
        )
        consumer = Consumer(connection, channel, tally, options.multi_ack_every)
        consumer.attach()
        readers.append((connection, channel, consumer))
    if seek:
        # AMQP timestamps are whole seconds: the first second that starts in the fill's
        # second half.
        middle_s = math.ceil((fill_start_s + fill_end_s) / 2)
        start: Any = datetime.datetime.fromtimestamp(middle_s, datetime.UTC)
    else:
        start = "first"
    rss_peak = RssPeak(pid) if pid is not None else None
    start_ns = time.monotonic_ns()
    for connection, channel, _ in readers:
        await connection.call(
            channel,
            commands.Basic.Consume(queue=options.queue, arguments={"x-stream-offset": start}),
            commands.Basic.ConsumeOk,
        )
    try:
        end_ns = await tally.done
    finally:
        if rss_peak is not None:
            rss_peak.stop()
    for _, _, consumer in readers:
        consumer.flush_acks()
    seconds = max((end_ns - start_ns) / 1e9, 1e-9)
    assert tally.first_ns is not None
    report: dict[str, Any] = {
        "fill_msgs_per_s": filled["publish_msgs_per_s"],
        "seconds": round(seconds, 3),
        "received": tally.received,
        "msgs_per_s": round(tally.received / seconds, 1),
        "first_delivery_ms": round((tally.first_ns - start_ns) / 1e6, 3),
    }
    if seek:
        fill_ns = max(publisher.done.result() for publisher in publishers) - min(
            publisher.start_ns for publisher in publishers
        )
        first_stamp_ns = tally.first_stamp_ns
        report["seek_to_s"] = round(middle_s - fill_start_s, 3)
        report["fill_s"] = round(fill_end_s - fill_start_s, 3)
        if first_stamp_ns:
            fill_start_ns = min(publisher.start_ns for publisher in publishers)
            report["first_message_fill_fraction"] = round(
                (first_stamp_ns - fill_start_ns) / max(fill_ns, 1), 4
            )
        del report["msgs_per_s"]
    if rss_peak is not None:
        report.update(
            {
                "rss_mb_before_consumers": round(rss_peak.before / _MB, 1),
                "rss_mb_peak": round(rss_peak.peak / _MB, 1),
                "rss_mb_peak_growth": round((rss_peak.peak - rss_peak.before) / _MB, 1),
            }
        )
    return report


async def _run_memory(
    address: wire.BrokerAddress,
    options: Options,
    run: _Run,
    admin: ClientConnection,
    channel: int,
    pid: int | None,
) -> dict[str, Any]:
    await asyncio.sleep(options.settle_s)
    rss_before = read_rss_bytes(pid) if pid is not None else None
    publishers = await _start_publishers(address, options, False, run)
    _start_all(publishers)
    await asyncio.gather(*(publisher.done for publisher in publishers))
    report = _publish_report(run, options)
    await asyncio.sleep(options.settle_s)
    report["ready"] = await ready_count(admin, channel, options.queue)
    if rss_before is not None:
        assert pid is not None
        rss_after = read_rss_bytes(pid)
        report.update(
            {
                "pid": pid,
                "rss_mb_before": round(rss_before / _MB, 1),
                "rss_mb_after": round(rss_after / _MB, 1),
                "rss_mb_growth": round((rss_after - rss_before) / _MB, 1),
                "rss_bytes_per_message": round((rss_after - rss_before) / options.messages, 1),
            }
        )
    if options.hold_every:
        report.update(await _hold_deliveries(address, options, run, admin, channel))
        if rss_before is not None:
            rss_held = read_rss_bytes(pid)
            report["rss_mb_held"] = round(rss_held / _MB, 1)
            report["rss_mb_growth_held"] = round((rss_held - rss_before) / _MB, 1)
    return report


async def _hold_deliveries(
    address: wire.BrokerAddress,
    options: Options,
    run: _Run,
    admin: ClientConnection,
    admin_channel: int,
) -> dict[str, Any]:
    """One consumer without a prefetch limit takes the whole queue, acking all but every
    `hold_every`th delivery; returns the settle time after the last delivery arrived."""
    tally = run.tally = ConsumerTally(options.messages)
    connection = await ClientConnection.open(address)
    run.connections.append(connection)
    channel = await connection.open_channel()
    await connection.call(channel, commands.Basic.Qos(prefetch_count=0), commands.Basic.QosOk)
    consumer = Consumer(connection, channel, tally, 1, hold_every=options.hold_every)
    consumer.attach()
    await connection.call(
        channel, commands.Basic.Consume(queue=options.queue), commands.Basic.ConsumeOk
    )
    await tally.done
    # The acks are sent; a passive declare on another connection orders nothing, so give
    # the broker the settle time to apply them before reading its memory.
    await asyncio.sleep(options.settle_s)
    return {
        "unacked": tally.held,
        "ready_after_consume": await ready_count(admin, admin_channel, options.queue),
    }


async def run_scenario(url: str, options: Options, pid: int | None = None) -> dict[str, Any]:
    """Run one scenario against one broker; a report dict (raises BenchError on failure)."""
    address = wire.parse_url(url)
    run = _Run()
    admin: ClientConnection | None = None
    declared = False
    idle_queues = _idle_queue_names(options)
    idle_declared = False

    async def body() -> dict[str, Any]:
        nonlocal admin, declared, idle_declared
        admin = await ClientConnection.open(address)
        channel = await admin.open_channel()
        await _declare(admin, channel, options)
        declared = True
        idle_declared = bool(idle_queues)
        for name in idle_queues:
            await admin.call(
                channel, commands.Queue.Declare(queue=name, durable=True), commands.Queue.DeclareOk
            )
        if options.scenario == "publish":
            report = await _run_publish(address, options, run)
        elif options.scenario in STAMPED:
            report = await _run_e2e(address, options, run)
        elif options.scenario == "drain":
            report = await _run_drain(address, options, run, admin, channel)
        elif options.scenario == "replay":
            report = await _run_replay(address, options, run, pid)
        else:
            report = await _run_memory(address, options, run, admin, channel, pid)
        # The idle queues are the run's scaffolding: gone even with --keep-queue.
        for name in idle_queues:
            await admin.call(channel, commands.Queue.Delete(queue=name), commands.Queue.DeleteOk)
        idle_declared = False
        if not options.keep_queue:
            await _delete(admin, channel, _scenario_queues(options), _scenario_exchanges(options))
            declared = False
        return report

    # The admin connection, the publishers and the consumers, and a few for the process.
    raise_open_files_limit(options.publishers + options.consumers + 16)
    cpu_start_s, wall_start_s = time.process_time(), time.perf_counter()
    try:
        report = await asyncio.wait_for(body(), options.timeout_s)
    except TimeoutError:
        raise BenchError(
            f"{options.scenario} against {address.display()} did not finish "
            f"within {options.timeout_s} s ({run.progress()})"
        ) from None
    finally:
        await close_all(run.connections)
        if admin is not None:
            left: list[str] = idle_queues if idle_declared else []
            exchanges: list[str] = []
            if declared and not options.keep_queue:
                left = [*_scenario_queues(options), *left]
                exchanges = _scenario_exchanges(options)
            if (left or exchanges) and admin.error is None:
                await _delete_quietly(admin, left, exchanges)
            await admin.close()
    # The client's own CPU share over the run: near 100 % means it, not the broker, set the pace.
    report["client_cpu_percent"] = round(
        100 * (time.process_time() - cpu_start_s) / (time.perf_counter() - wall_start_s), 1
    )
    return {"url": address.display(), **_shown_options(options), **report}


# Options that mean something for each scenario (the rest are left out of its report).
_PUBLISHING = (
    "scenario",
    "queue",
    "queue_type",
    "queue_arguments",
    "size_bytes",
    "messages",
    "window",
    "publishers",
)
_CONSUMING = ("consumers", "prefetch", "multi_ack_every")
_PACED = ("rate_per_s", "lag_ms_max")
_SCENARIO_OPTIONS = {
    "publish": _PUBLISHING,
    "e2e": (
        *_PUBLISHING,
        *_CONSUMING,
        "reject_every",
        "rate_per_s",
        "warmup",
        "idle_queues",
        "poll_api",
        "poll_every_s",
        "poll_page_size",
    ),
    "replay": (*_PUBLISHING, *_CONSUMING, "start"),
    "memory": (*_PUBLISHING, "settle_s", "hold_every"),
    "queues": (*_PUBLISHING, "queue_count", *_CONSUMING),
    "fanout": (*_PUBLISHING, "queue_count", *_CONSUMING),
    "connections": (*_PUBLISHING, *_CONSUMING, *_PACED),
    "steady": (*_PUBLISHING, *_CONSUMING, *_PACED, "warmup"),
    "drain": (*_PUBLISHING, "prefetch", "multi_ack_every"),
}


def _shown_options(options: Options) -> dict[str, Any]:
    values = asdict(options)
    return {key: values[key] for key in _SCENARIO_OPTIONS[options.scenario]}


def _idle_queue_names(options: Options) -> list[str]:
    return [f"{options.queue}-idle-{index}" for index in range(options.idle_queues)]


async def _delete(
    admin: ClientConnection, channel: int, queues: list[str], exchanges: list[str]
) -> None:
    for queue in queues:
        await admin.call(channel, commands.Queue.Delete(queue=queue), commands.Queue.DeleteOk)
    for exchange in exchanges:
        await admin.call(
            channel, commands.Exchange.Delete(exchange=exchange), commands.Exchange.DeleteOk
        )


async def _delete_quietly(admin: ClientConnection, queues: list[str], exchanges: list[str]) -> None:
    """Best-effort cleanup after a failed run: one fresh channel, a bounded wait each."""
    try:
        channel = await admin.open_channel()
        await asyncio.wait_for(
            _delete(admin, channel, queues, exchanges), 10 * (len(queues) + len(exchanges))
        )
    except (TimeoutError, BenchError):
        pass


def ratios(
    scenario: str, target: dict[str, Any], compared: dict[str, Any]
) -> dict[str, float | None]:
    """target / compared for the scenario's headline figures (None where undefined)."""
    out: dict[str, float | None] = {}
    for key in HEADLINES[scenario]:
        mine, theirs = target.get(key), compared.get(key)
        out[key] = (
            round(mine / theirs, 3)
            if isinstance(mine, (int, float)) and isinstance(theirs, (int, float)) and theirs
            else None
        )
    return out


RUNS_MAX = 99


def median_report(
    scenario: str, reports: list[dict[str, Any]], key: str | None = None
) -> dict[str, Any]:
    """The run whose ``key`` figure (default: the first headline) is the median.

    The lower of the two middle runs is taken for an even count. A whole run is kept rather
    than a median per figure, so the figures of the report stay consistent with each other;
    every run's headline figures are listed beside it.
    """
    assert reports
    if len(reports) == 1:
        return reports[0]
    key = key or HEADLINES[scenario][0]
    ordered = sorted(reports, key=lambda report: report.get(key) or 0)
    chosen = dict(ordered[(len(ordered) - 1) // 2])
    chosen["runs"] = [
        {name: report.get(name) for name in HEADLINES[scenario]} for report in reports
    ]
    return chosen


async def run_bench(
    options: Options,
    url: str,
    compare_url: str | None = None,
    pid: int | None = None,
    compare_pid: int | None = None,
    runs: int = 1,
) -> dict[str, Any]:
    """The scenario against ``url`` and, when given, ``compare_url``, ``runs`` times each.

    Runs alternate between the two brokers, so a slow spell of a shared machine hits both;
    with several runs each side reports its median run.
    """
    if not 1 <= runs <= RUNS_MAX:
        raise ValueError(f"runs must be 1..{RUNS_MAX}")
    targets, compared = [], []
    for _ in range(runs):
        targets.append(await run_scenario(url, options, pid))
        if compare_url is not None:
            compared.append(await run_scenario(compare_url, options, compare_pid))
    # At a set rate every run has the same throughput: the latency is what varies (the paced
    # scenarios' first headline is a latency already).
    key = "latency_ms_p99" if options.scenario == "e2e" and options.rate_per_s else None
    target = median_report(options.scenario, targets, key)
    if compare_url is None:
        return target
    other = median_report(options.scenario, compared, key)
    return {
        "scenario": options.scenario,
        "target": target,
        "compare": other,
        "ratio": ratios(options.scenario, target, other),
    }


def run_loop(main: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    try:
        import uvloop
    except ImportError:  # Windows: the default loop is slower but correct
        return asyncio.run(main())
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main())


def _options_from_args(args: argparse.Namespace) -> Options:
    prefetch = getattr(args, "prefetch", 1000)
    ack_every = getattr(args, "multi_ack_every", None)
    if ack_every is None:
        ack_every = max(1, prefetch // 2) if prefetch else 100
    queue = args.queue or f"warren-bench-{args.scenario}-{os.getpid()}-{secrets.token_hex(3)}"
    queue_count = getattr(args, "queues", 1)
    # `queues` has a publisher and a consumer per queue, `fanout` a consumer per queue.
    publishers = getattr(args, "publishers", None) or getattr(args, "connections", queue_count)
    consumers = getattr(args, "consumers", None) or queue_count
    rate = getattr(args, "rate", None)
    if args.scenario == "connections":
        rate = args.rate_per_connection * args.connections
    messages = getattr(args, "messages", None)
    if messages is None:  # paced for a duration
        if rate is None or rate * args.seconds < 1:
            raise ValueError("the rate times the seconds must come to at least one message")
        messages = round(rate * args.seconds)
    return Options(
        scenario=args.scenario,
        queue=queue,
        queue_type=args.queue_type,
        queue_arguments=dict(args.queue_argument),
        size_bytes=args.size,
        messages=messages,
        window=args.window,
        publishers=publishers,
        consumers=consumers,
        prefetch=prefetch,
        multi_ack_every=ack_every,
        reject_every=getattr(args, "reject_every", 0),
        rate_per_s=rate,
        warmup=getattr(args, "warmup", 0),
        settle_s=getattr(args, "settle", 2.0),
        keep_queue=args.keep_queue,
        timeout_s=args.timeout,
        start=getattr(args, "start", "first"),
        cold=getattr(args, "cold", False),
        hold_every=getattr(args, "hold_every", 0),
        idle_queues=getattr(args, "idle_queues", 0),
        poll_api=getattr(args, "poll_api", None),
        poll_every_s=getattr(args, "poll_every", 1.0),
        poll_page_size=getattr(args, "poll_page_size", 100),
        queue_count=queue_count,
        lag_ms_max=getattr(args, "lag_ms_max", LAG_MS_MAX),
    )


def _handle(args: argparse.Namespace) -> int:
    try:
        options = _options_from_args(args)
        if options.poll_api is not None and args.compare is not None:
            raise ValueError("--poll-api watches the --url broker: run it without --compare")
        result = run_loop(
            lambda: run_bench(
                options,
                args.url,
                args.compare,
                getattr(args, "pid", None),
                getattr(args, "compare_pid", None),
                args.runs,
            )
        )
    except (BenchError, ValueError) as error:
        print(json.dumps({"scenario": args.scenario, "error": str(error)}, indent=2))
        return 1
    print(json.dumps(result, indent=2))
    return 0


def queue_argument(text: str) -> tuple[str, int | str]:
    """``KEY=VALUE`` from the command line: the value an integer when it reads as one."""
    key, equals, value = text.partition("=")
    if not equals or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, int(value)
    except ValueError:
        return key, value


def _common_arguments(
    parser: argparse.ArgumentParser, messages: int | None, publishers: bool = True
) -> None:
    """The options every scenario has; ``messages`` None: it runs for ``--seconds`` instead,
    ``publishers`` False: it sets its own publisher connections."""
    parser.add_argument(
        "--url",
        default=wire.DEFAULT_URL,
        help=f"broker to measure (default {wire.DEFAULT_URL.replace('%', '%%')})",
    )
    parser.add_argument(
        "--compare",
        metavar="URL",
        help="run the same scenario against this broker too and print the ratio",
    )
    parser.add_argument("--queue", help="queue name (default: a fresh warren-bench-… name)")
    parser.add_argument(
        "--queue-type",
        choices=QUEUE_TYPES,
        default="classic",
        help="x-queue-type of the durable queue (default classic)",
    )
    parser.add_argument(
        "--queue-argument",
        type=queue_argument,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another x- argument of the declared queue, an integer where VALUE is one "
        "(repeatable; e.g. x-quorum-initial-group-size=3)",
    )
    parser.add_argument("--size", type=int, default=64, help="message body bytes (default 64)")
    if messages is not None:
        parser.add_argument(
            "--messages",
            type=int,
            default=messages,
            help=f"messages to publish in total (default {messages})",
        )
    parser.add_argument(
        "--window",
        type=int,
        default=1000,
        help="unconfirmed messages allowed per publisher (default 1000)",
    )
    if publishers:
        parser.add_argument(
            "--publishers", type=int, default=1, help="publisher connections (default 1)"
        )
    parser.add_argument(
        "--runs",
        type=int,
        default=1,
        help="repeat the scenario (alternating with --compare) and report the "
        "median run (default 1)",
    )
    parser.add_argument(
        "--keep-queue", action="store_true", help="leave the queue (and any messages) on the broker"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="give up on a broker after this many seconds (default 600)",
    )


def _consumer_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--prefetch",
        type=int,
        default=1000,
        help="basic.qos prefetch-count per consumer (default 1000, 0: unlimited)",
    )
    parser.add_argument(
        "--multi-ack-every",
        type=int,
        help="ack (multiple) every K deliveries (default: prefetch / 2)",
    )


def _paced_arguments(parser: argparse.ArgumentParser, seconds: float) -> None:
    parser.add_argument(
        "--seconds",
        type=float,
        default=seconds,
        help=f"how long to publish at the rate (default {seconds:g})",
    )
    parser.add_argument(
        "--lag-ms-max",
        type=float,
        default=LAG_MS_MAX,
        help="the rate counts as achieved while the generator's p99 lag behind its schedule "
        f"stays within this (default {LAG_MS_MAX:g} ms)",
    )


def _pid_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pid", type=int, help="the broker's process id (on this machine)")
    parser.add_argument("--compare-pid", type=int, help="the compared broker's process id")


def register(targets: Any) -> None:
    """Add `publish`, `e2e`, `replay`, `memory`, `queues`, `fanout`, `connections`, `steady`
    and `drain` to `warren bench`."""
    publish = targets.add_parser(
        "publish", help="confirmed publish throughput of persistent messages to a durable queue"
    )
    _common_arguments(publish, 100_000)
    publish.set_defaults(handler=_handle, scenario="publish")

    e2e = targets.add_parser(
        "e2e", help="publish with confirms and consume with acks: msgs/s and end-to-end latency"
    )
    _common_arguments(e2e, 100_000)
    e2e.add_argument("--consumers", type=int, default=1, help="consumer connections (default 1)")
    _consumer_arguments(e2e)
    e2e.add_argument(
        "--reject-every",
        type=int,
        default=0,
        help="reject (no requeue) every Nth delivery into a dead-letter queue, QUEUE.dlq "
        "(default 0: none)",
    )
    e2e.add_argument(
        "--poll-api",
        metavar="HTTP_URL",
        help="GET this management API's /api/queues every --poll-every seconds during the "
        "run, as a web console does (the --url broker's; not with --compare)",
    )
    e2e.add_argument(
        "--poll-every", type=float, default=1.0, help="seconds between polls (default 1)"
    )
    e2e.add_argument(
        "--poll-page-size",
        type=int,
        default=100,
        help="the page of /api/queues each poll asks for, as the console pages it "
        "(default 100; 0: the whole list)",
    )
    e2e.add_argument(
        "--idle-queues",
        type=int,
        default=0,
        metavar="N",
        help="declare N more durable queues for the run (for the API to list), deleted after",
    )
    e2e.add_argument(
        "--rate",
        type=float,
        help="publish at this steady total rate in msgs/s (default: as fast as possible)",
    )
    e2e.add_argument(
        "--warmup",
        type=int,
        default=0,
        help="leave the first M deliveries out of the latency figures",
    )
    e2e.set_defaults(handler=_handle, scenario="e2e")

    replay = targets.add_parser(
        "replay", help="fill a stream, then consumers read all of it from the first offset"
    )
    _common_arguments(replay, 1_000_000)
    replay.set_defaults(queue_type="stream")
    replay.add_argument(
        "--consumers",
        type=int,
        default=1,
        help=f"consumers, a channel each on at most {CONNECTIONS_MAX} connections (default 1)",
    )
    replay.add_argument(
        "--prefetch", type=int, default=1000, help="basic.qos prefetch-count (default 1000)"
    )
    replay.add_argument(
        "--multi-ack-every",
        type=int,
        help="ack (multiple) every K deliveries (default: prefetch / 2)",
    )
    replay.add_argument(
        "--start",
        choices=REPLAY_STARTS,
        default="first",
        help="first: read everything; middle: seek one consumer to the time halfway through "
        "the fill and time its first delivery (default first)",
    )
    replay.add_argument(
        "--cold",
        action="store_true",
        help=f"drop the page cache after the fill (writes {DROP_CACHES}: root), so reads "
        "come from disk",
    )
    _pid_arguments(replay)
    replay.set_defaults(handler=_handle, scenario="replay")

    memory = targets.add_parser(
        "memory", help="fill a queue with ready messages and report the broker's RSS growth"
    )
    _common_arguments(memory, 1_000_000)
    _pid_arguments(memory)
    memory.add_argument(
        "--settle",
        type=float,
        default=2.0,
        help="seconds to wait before each RSS reading (default 2)",
    )
    memory.add_argument(
        "--hold-every",
        type=int,
        default=0,
        metavar="N",
        help="then one consumer takes every message, leaves every Nth unacknowledged and "
        "acks the rest; reports the RSS with those held (N >= 2)",
    )
    memory.set_defaults(handler=_handle, scenario="memory")

    queues = targets.add_parser(
        "queues",
        help="N queues at once, each with a confirmed publisher and an acking consumer: "
        "total msgs/s and end-to-end latency",
    )
    _common_arguments(queues, 100_000, publishers=False)
    queues.add_argument("--queues", type=int, default=10, help="queues (default 10)")
    _consumer_arguments(queues)
    queues.set_defaults(handler=_handle, scenario="queues")

    fanout = targets.add_parser(
        "fanout",
        help="a confirmed publisher to a fanout exchange bound to N queues, a consumer each: "
        "msgs/s published and delivered",
    )
    _common_arguments(fanout, 100_000)
    fanout.add_argument("--queues", type=int, default=10, help="bound queues (default 10)")
    _consumer_arguments(fanout)
    fanout.set_defaults(handler=_handle, scenario="fanout")

    connections = targets.add_parser(
        "connections",
        help="C connections each publishing R msgs/s with confirms: confirm latency "
        "p50/p99/p99.9 and the rate achieved",
    )
    _common_arguments(connections, None, publishers=False)
    connections.add_argument(
        "--connections", type=int, default=1000, help="publisher connections (default 1000)"
    )
    connections.add_argument(
        "--rate-per-connection",
        type=float,
        default=20.0,
        help="msgs/s each connection publishes (default 20)",
    )
    connections.add_argument(
        "--consumers", type=int, default=1, help="consumers emptying the queue (default 1)"
    )
    _consumer_arguments(connections)
    _paced_arguments(connections, 30.0)
    connections.set_defaults(handler=_handle, scenario="connections")

    steady = targets.add_parser(
        "steady",
        help="publish at a fixed rate with confirms while a consumer acks: end-to-end "
        "latency p50/p99/p99.9 at that rate",
    )
    _common_arguments(steady, None)
    steady.add_argument(
        "--rate", type=float, default=10_000.0, help="msgs/s in total (default 10000)"
    )
    steady.add_argument("--consumers", type=int, default=1, help="consumer connections (default 1)")
    steady.add_argument(
        "--warmup",
        type=int,
        default=0,
        help="leave the first M deliveries out of the latency figures",
    )
    _consumer_arguments(steady)
    _paced_arguments(steady, 10.0)
    steady.set_defaults(handler=_handle, scenario="steady")

    drain = targets.add_parser(
        "drain",
        help="fill a durable queue with a backlog, then one consumer takes it all with acks: "
        "drain msgs/s",
    )
    _common_arguments(drain, 10_000_000)
    _consumer_arguments(drain)
    drain.set_defaults(handler=_handle, scenario="drain")


def main(argv: list[str] | None = None) -> int:
    """`python -m warrenmq.server.bench.loadgen SCENARIO ...`, the same as `warren bench
    SCENARIO`.
    """
    parser = argparse.ArgumentParser(prog="warren bench")
    register(parser.add_subparsers(dest="target", metavar="SCENARIO", required=True))
    args = parser.parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())

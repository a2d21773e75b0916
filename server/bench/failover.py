"""Failover time: how long confirms stop when the node leading a queue is killed.

A publisher with confirms sends at a steady rate to the queue through a node that survives;
after ``before_s`` the caller's ``kill`` runs (SIGKILL of the leader's node), and the
measurement is the time from that kill to the first ``basic.ack`` of a message published
after it: confirms have resumed on a surviving node. Confirms of messages published before
the kill do not count, since a dying leader may have confirmed them already. When the
publisher's connection or channel breaks (the broker closes it, or the socket goes), it
connects again, to the next of its URLs in turn, and carries on there, a new channel's tags
counted apart ("epochs").

Everything the publisher saw goes into a ``ConfirmTimeline`` (each write's tags and time,
each confirm, each break), and the figure comes from the timeline alone (``resumed_after``),
so it can be checked against a timeline made up in a test. A broker that never resumes
within ``resume_s_max`` is reported so ("no confirms resumed within 30 s"), not as a
failure of the benchmark.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pamqp import commands

from warrenmq.amqp import frames

from . import wire
from .client import BenchError, ClientConnection
from .roles import Publisher

CONNECT_TIMEOUT_S = 5.0
RECONNECT_PAUSE_S = 0.1
WAIT_POLL_S = 0.1
PUBLISH_SECONDS_MAX = 3600


@dataclass
class ConfirmTimeline:
    """What a failover publisher saw, each list in the order (and time) it happened."""

    writes: list[tuple[int, int, int, int]] = field(default_factory=list)
    """(monotonic ns, epoch, first tag, last tag) of each write of messages."""
    confirms: list[tuple[int, int, int, bool, bool]] = field(default_factory=list)
    """(monotonic ns, epoch, tag, multiple, ack) of each basic.ack (True) or basic.nack."""
    breaks: list[tuple[int, str]] = field(default_factory=list)
    """(monotonic ns, why) each time a connection could not be made or went."""

    def acked_between(self, start_ns: int, end_ns: int) -> int:
        """basic.ack frames (one may confirm many messages) received in [start_ns, end_ns)."""
        times = [confirm[0] for confirm in self.confirms if confirm[4]]
        return bisect.bisect_left(times, end_ns) - bisect.bisect_left(times, start_ns)


def resumed_after(timeline: ConfirmTimeline, kill_ns: int) -> int | None:
    """Nanoseconds from ``kill_ns`` to the first ack of a message published at or after it
    (on any channel), or None if there is none yet."""
    writes = timeline.writes
    # Epochs follow one another in time: the first write of each after the kill is found by
    # bisecting on the epoch, not by walking every write (this is polled while waiting).
    first_tag_after: dict[int, int] = {}
    index = bisect.bisect_left(writes, (kill_ns,))
    while index < len(writes):
        _, epoch, first_tag, _ = writes[index]
        first_tag_after[epoch] = first_tag
        index = bisect.bisect_right(writes, epoch, lo=index, key=_epoch)
    start = bisect.bisect_left(timeline.confirms, (kill_ns,))
    for confirm_ns, epoch, tag, _, ack in timeline.confirms[start:]:
        if ack and epoch in first_tag_after and tag >= first_tag_after[epoch]:
            return confirm_ns - kill_ns
    return None


def _epoch(write: tuple[int, int, int, int]) -> int:
    return write[1]


class TimelinePublisher(Publisher):
    """A paced ``Publisher`` that also writes its writes and confirms into a timeline."""

    def __init__(self, timeline: ConfirmTimeline, epoch: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeline = timeline
        self.epoch = epoch

    def _refill(self, now_ns: int) -> None:
        before = self.published
        super()._refill(now_ns)
        if self.published > before:
            self.timeline.writes.append((now_ns, self.epoch, before + 1, self.published))

    def frame(self, frame_type: int, payload: bytes) -> bool:
        if frame_type == frames.FRAME_METHOD:
            identifier = wire.method_id(payload)
            if identifier in (wire.BASIC_ACK_ID, wire.BASIC_NACK_ID):
                tag, multiple = wire.decode_confirm(payload)
                confirm = (time.monotonic_ns(), self.epoch, tag, multiple)
                self.timeline.confirms.append((*confirm, identifier == wire.BASIC_ACK_ID))
        return super().frame(frame_type, payload)


async def publish_through(
    urls: list[str],
    queue: str,
    rate_per_s: float,
    window: int,
    size_bytes: int,
    timeline: ConfirmTimeline,
    stop: asyncio.Event,
) -> None:
    """Publish to ``queue`` through the first of ``urls`` that answers until ``stop``; when
    the connection breaks, go on through the next."""
    epoch = 0
    while not stop.is_set():
        url = urls[epoch % len(urls)]
        epoch += 1
        connection: ClientConnection | None = None
        try:
            connection = await asyncio.wait_for(
                ClientConnection.open(wire.parse_url(url)), CONNECT_TIMEOUT_S
            )
            channel = await connection.open_channel()
            await connection.call(channel, commands.Confirm.Select(), commands.Confirm.SelectOk)
            template = wire.PublishTemplate(channel, "", queue, size_bytes, connection.frame_max)
            publisher = TimelinePublisher(
                timeline,
                epoch,
                connection,
                channel,
                template,
                round(rate_per_s * PUBLISH_SECONDS_MAX),
                window,
                rate_per_s=rate_per_s,
            )
            publisher.start()
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait([publisher.done, stopped], return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            if not publisher.done.done():
                publisher.fail(BenchError("stopped"))
            error = publisher.done.exception()
            if error is not None and not stop.is_set():
                raise error
        except (BenchError, TimeoutError) as error:
            timeline.breaks.append((time.monotonic_ns(), f"{url}: {error or 'timed out'}"))
            await asyncio.sleep(RECONNECT_PAUSE_S)
        finally:
            if connection is not None:
                await connection.close()


async def measure_failover(
    urls: list[str],
    queue: str,
    kill: Callable[[], None],
    rate_per_s: float = 1000.0,
    window: int = 10_000,
    size_bytes: int = 64,
    before_s: float = 3.0,
    resume_s_max: float = 30.0,
) -> dict[str, Any]:
    """Publish through ``urls`` (nodes that survive), ``kill`` after ``before_s``, and report
    how long until confirms resumed (at most ``resume_s_max`` is waited)."""
    timeline = ConfirmTimeline()
    stop = asyncio.Event()
    publishing = asyncio.create_task(
        publish_through(urls, queue, rate_per_s, window, size_bytes, timeline, stop)
    )
    start_ns = time.monotonic_ns()
    try:
        await asyncio.sleep(before_s)
        kill_ns = time.monotonic_ns()
        # A blocking kill (it waits for the process to be gone) off the loop, so confirms are
        # read and timed meanwhile.
        await asyncio.to_thread(kill)
        deadline_ns = kill_ns + int(resume_s_max * 1e9)
        while resumed_after(timeline, kill_ns) is None and time.monotonic_ns() < deadline_ns:
            await asyncio.sleep(WAIT_POLL_S)
        end_ns = time.monotonic_ns()
    finally:
        stop.set()
        await publishing
    return failover_report(timeline, start_ns, kill_ns, end_ns, resume_s_max)


def failover_report(
    timeline: ConfirmTimeline, start_ns: int, kill_ns: int, end_ns: int, resume_s_max: float
) -> dict[str, Any]:
    """The figures of one failover run, from its timeline."""
    resumed_ns = resumed_after(timeline, kill_ns)
    acked_before = timeline.acked_between(start_ns, kill_ns)
    if acked_before == 0:
        verdict = "no confirms before the kill: nothing to measure"
    elif resumed_ns is None:
        verdict = f"no confirms resumed within {resume_s_max:g} s"
    else:
        verdict = f"confirms resumed {resumed_ns / 1e6:.0f} ms after the kill"
    breaks_after = [why for when, why in timeline.breaks if when >= kill_ns]
    return {
        "failover_ms": None if resumed_ns is None else round(resumed_ns / 1e6, 1),
        "verdict": verdict,
        "ack_frames_before_kill": acked_before,
        "ack_frames_after_kill": timeline.acked_between(kill_ns, end_ns + 1),
        "nack_frames_after_kill": sum(
            1 for confirm in timeline.confirms if confirm[0] >= kill_ns and not confirm[4]
        ),
        "breaks_after_kill": len(breaks_after),
        "first_break_after_kill": breaks_after[0] if breaks_after else None,
    }

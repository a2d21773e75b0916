"""The load generator's two roles on a channel: a confirming publisher and an acking consumer.

Both see their channel's frames before the connection does (``ChannelRole``) and parse only
the bytes they need: a confirm's delivery tag and multiple bit; a delivery's tag, its body
size and the send timestamp at the front of its body. Neither reads the clock per message:
one clock read per socket read serves every frame in it, since they all arrived together.

The publisher keeps at most ``window`` messages unconfirmed, writes every message it may send
in runs of identical bytes (the messages of one write share their send timestamp; a write
stays under ``WRITE_BYTES_MAX``), and with a rate paces itself against a ``RateSchedule``,
waking when its next message is due but at most every ``RATE_TICK_S`` (open loop: when
confirms hold it back, it catches up afterwards rather than silently sending less, and how
late each write went out is recorded).
"""

from __future__ import annotations

import asyncio
import collections
import time

from warrenmq.amqp import frames

from . import wire
from .client import BenchError, ClientConnection
from .pacing import RateSchedule
from .stats import LatencyHistogram

WRITE_MESSAGES_MAX = 4096  # messages per transport.write
WRITE_BYTES_MAX = 1 << 20  # and bytes: a run of 16 KiB messages stays one MiB, not 64
RATE_TICK_S = 0.001


class Publisher:
    """Publishes ``messages`` messages from a template with publisher confirms.

    Call after confirm.select on the channel; ``start()`` begins, ``done`` resolves with the
    monotonic time (ns) of the last confirm. Confirm latency (publish to confirm) is recorded in
    ``histogram`` per write: a write's messages count once their highest tag is confirmed.
    """

    def __init__(
        self,
        connection: ClientConnection,
        channel: int,
        template: wire.PublishTemplate,
        messages: int,
        window: int,
        rate_per_s: float | None = None,
        stamp: bool = False,
    ) -> None:
        if messages < 1 or window < 1:
            raise ValueError(f"messages ({messages}) and window ({window}) must be positive")
        if rate_per_s is not None and rate_per_s <= 0:
            raise ValueError(f"rate must be positive, got {rate_per_s}")
        if stamp and template.body_bytes < wire.TIMESTAMP_BYTES:
            raise ValueError(f"a stamped body needs at least {wire.TIMESTAMP_BYTES} bytes")
        self.connection = connection
        self.channel = channel
        self.messages = messages
        self.window = window
        self.rate_per_s = rate_per_s
        self.histogram = LatencyHistogram()
        self.published = 0
        self.nacked = 0
        # With a rate: the furthest the publisher fell behind its schedule (window full or
        # writes paused), in messages. Stamps carry the actual send time, so a broker that
        # holds confirms back shows here rather than in the latency figures.
        self.behind_max = 0
        # With a rate: how late against the schedule each write went out, counted for every
        # message of the write at its first (latest) message's lag.
        self.lag_histogram = LatencyHistogram()
        self.start_ns = 0
        self.last_write_ns = 0
        self.done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._template = template
        self._stamp = stamp
        self._padding = bytes(template.body_bytes - wire.TIMESTAMP_BYTES) if stamp else b""
        self._fixed_message = b"" if stamp else template.frame(bytes(template.body_bytes))
        message_bytes = len(self._fixed_message or template.frame(bytes(template.body_bytes)))
        self._write_messages_max = max(1, min(WRITE_MESSAGES_MAX, WRITE_BYTES_MAX // message_bytes))
        self._schedule: RateSchedule | None = None
        # Confirmed tags: every tag <= _floor, plus the few single confirms above it.
        self._floor = 0
        self._above: set[int] = set()
        # Writes not wholly confirmed yet: (first tag, last tag, send time ns); at most `window`.
        self._writes: collections.deque[tuple[int, int, int]] = collections.deque()
        self._timer: asyncio.TimerHandle | None = None

    @property
    def confirmed(self) -> int:
        return self._floor + len(self._above)

    def start(self) -> None:
        if self.connection.error is not None:
            # A start put off (staggered) past the connection's end.
            self.fail(self.connection.error)
            return
        self.connection.attach(self.channel, self)
        self.start_ns = time.monotonic_ns()
        if self.rate_per_s is not None:
            self._schedule = RateSchedule(self.rate_per_s, self.messages, self.start_ns)
        self._refill(self.start_ns)
        if self._schedule is not None:
            self._schedule_tick(self.start_ns)

    def _schedule_tick(self, now_ns: int) -> None:
        assert self._schedule is not None
        if self.published >= self.messages:
            return
        wait_s = max(RATE_TICK_S, (self._schedule.due_ns(self.published) - now_ns) / 1e9)
        self._timer = asyncio.get_running_loop().call_later(wait_s, self._tick)

    def _tick(self) -> None:
        self._timer = None
        if self.done.done():
            return
        now_ns = time.monotonic_ns()
        self._refill(now_ns)
        self._schedule_tick(now_ns)

    def _refill(self, now_ns: int) -> None:
        if self.connection.writing_paused or self.connection.error is not None:
            return
        count = min(self.window - (self.published - self.confirmed), self.messages - self.published)
        due = 0
        schedule = self._schedule
        if schedule is not None:
            due = schedule.due(now_ns)
            count = min(count, due - self.published)
        while count > 0:
            batch = min(count, self._write_messages_max)
            if self._stamp:
                message = self._template.frame(wire.stamped_body(self._padding, now_ns))
            else:
                message = self._fixed_message
            if schedule is not None:
                self.lag_histogram.record(schedule.lag_ns(self.published, now_ns) // 1000, batch)
            self.connection.write(message * batch)
            self.last_write_ns = now_ns
            self._writes.append((self.published + 1, self.published + batch, now_ns))
            self.published += batch
            count -= batch
            if self.connection.writing_paused:
                break
        if due - self.published > self.behind_max:
            self.behind_max = due - self.published

    def frame(self, frame_type: int, payload: bytes) -> bool:
        if frame_type != frames.FRAME_METHOD:
            return False
        identifier = wire.method_id(payload)
        if identifier != wire.BASIC_ACK_ID and identifier != wire.BASIC_NACK_ID:
            return False
        tag, multiple = wire.decode_confirm(payload)
        if tag > self.published or (multiple and tag == 0):
            self.fail(BenchError(f"broker confirmed tag {tag}, only {self.published} published"))
            return True
        before = self.confirmed
        if multiple:
            if tag > self._floor:
                self._floor = tag
                self._above = {above for above in self._above if above > tag}
        elif tag == self._floor + 1:
            self._floor = tag
            while self._floor + 1 in self._above:
                self._floor += 1
                self._above.discard(self._floor)
        elif tag > self._floor:
            self._above.add(tag)
        if identifier == wire.BASIC_NACK_ID:
            self.nacked += self.confirmed - before
        return True

    def read_done(self) -> None:
        if self.done.done():
            return
        now_ns = time.monotonic_ns()
        writes = self._writes
        while writes and writes[0][1] <= self._floor:
            first, last, sent_ns = writes.popleft()
            self.histogram.record((now_ns - sent_ns) // 1000, last - first + 1)
        if self.confirmed >= self.messages:
            self._finish(now_ns)
            return
        self._refill(now_ns)

    def writable(self) -> None:
        if not self.done.done():
            self._refill(time.monotonic_ns())

    def _finish(self, now_ns: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self.connection.detach(self.channel)
        self.done.set_result(now_ns)

    def fail(self, error: BenchError) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if not self.done.done():
            self.done.set_exception(error)


class ConsumerTally:
    """What every consumer of one run adds to: messages received, their latency, completion."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.received = 0
        self.unstamped = 0
        self.redelivered = 0
        self.rejected = 0
        self.held = 0
        """Deliveries a consumer left unacknowledged on purpose (``hold_every``)."""
        self.histogram = LatencyHistogram()
        self.first_ns: int | None = None
        self.first_stamp_ns = 0
        """The send stamp of the first message received (0: unstamped)."""
        self.done: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    def fail(self, error: BenchError) -> None:
        if not self.done.done():
            self.done.set_exception(error)


class Consumer:
    """Consumes with manual acks: one ``basic.ack multiple`` per ``ack_every`` deliveries,
    and with ``reject_every`` N, a ``basic.reject`` (no requeue) of every Nth delivery. With
    ``hold_every`` N it leaves every Nth delivery unacknowledged and acks each other one
    alone (a multiple ack would take the held ones too).

    End-to-end latency is the time from the publisher's stamp to the socket read that carried
    the message's last body frame, recorded when at least ``warmup`` messages have arrived.
    """

    def __init__(
        self,
        connection: ClientConnection,
        channel: int,
        tally: ConsumerTally,
        ack_every: int,
        warmup: int = 0,
        reject_every: int = 0,
        hold_every: int = 0,
    ) -> None:
        if ack_every < 1:
            raise ValueError(f"ack_every must be positive, got {ack_every}")
        self.connection = connection
        self.channel = channel
        self.tally = tally
        self.ack_every = ack_every
        self.warmup = warmup
        self.reject_every = reject_every
        self.hold_every = hold_every
        self._last_tag = 0
        self._acked_tag = 0
        self._unacked = 0
        self._body_left = 0
        self._body_first = False
        self._stamp_ns = 0
        self._complete: list[int] = []  # stamps of messages completed in this read (0: none)

    def attach(self) -> None:
        self.connection.attach(self.channel, self)

    def frame(self, frame_type: int, payload: bytes) -> bool:
        if frame_type == frames.FRAME_BODY:
            if self._body_first:
                self._body_first = False
                if len(payload) >= wire.TIMESTAMP_BYTES:
                    self._stamp_ns = wire.body_timestamp_ns(payload)
            self._body_left -= len(payload)
            if self._body_left <= 0:
                self._complete.append(self._stamp_ns)
            return True
        if frame_type == frames.FRAME_HEADER:
            self._body_left = wire.decode_body_size(payload)
            self._body_first = True
            self._stamp_ns = 0
            if self._body_left == 0:
                self._complete.append(0)
            return True
        if frame_type == frames.FRAME_METHOD and wire.method_id(payload) == wire.BASIC_DELIVER_ID:
            tag = wire.decode_deliver_tag(payload)
            if payload[13 + payload[4]] & 1:  # the redelivered bit after tag length + tag
                self.tally.redelivered += 1
            if self.reject_every and tag % self.reject_every == 0:
                # Settled now: the next multiple ack names a later tag and passes over it.
                self.connection.write(wire.encode_reject(self.channel, tag))
                self.tally.rejected += 1
            elif self.hold_every:
                if tag % self.hold_every == 0:
                    self.tally.held += 1
                else:
                    self.connection.write(wire.encode_ack(self.channel, tag, False))
            else:
                self._last_tag = tag
            return True
        return False

    def read_done(self) -> None:
        complete = self._complete
        if not complete:
            return
        tally = self.tally
        now_ns = time.monotonic_ns()
        if tally.first_ns is None:
            tally.first_ns = now_ns
            tally.first_stamp_ns = complete[0]
        record = tally.histogram.record
        warm_from = self.warmup - tally.received
        for index, stamp_ns in enumerate(complete):
            if not stamp_ns:
                tally.unstamped += 1
            elif index >= warm_from:
                record((now_ns - stamp_ns) // 1000)
        tally.received += len(complete)
        self._unacked += len(complete)
        complete.clear()
        if self._unacked >= self.ack_every or tally.received >= tally.expected:
            self.flush_acks()
        if tally.received >= tally.expected and not tally.done.done():
            tally.done.set_result(now_ns)

    def flush_acks(self) -> None:
        """Ack everything delivered so far with one multiple ack."""
        if self._unacked and self.connection.error is None:
            # Unless every delivery since the last ack was rejected (settled already).
            if self._last_tag > self._acked_tag:
                self.connection.write(wire.encode_ack(self.channel, self._last_tag, True))
                self._acked_tag = self._last_tag
            self._unacked = 0

    def writable(self) -> None:
        pass

    def fail(self, error: BenchError) -> None:
        self.tally.fail(error)

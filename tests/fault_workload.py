"""The fault tests' clients (aio-pika), each writing what it did and saw into a history for
`history_checker`.

Queues: publishers send unique ids with confirms, one at a time, to a random node (so work is
forwarded to the queue's leader as often as not) and record each outcome; consumers take them
with manual acks and prefetch, in one of three manners — `stay` (one consumer for the run,
replaced only when its connection is lost), `cancel` (cancels and consumes again every few
seconds), `reconnect` (closes its connection and opens one to another node every few
seconds). With dead-lettering on, consumers reject every `REJECT_EVERY`-th message without
requeue, into the queue's dead-letter queue. After the faults heal, `drain` empties every
queue.

Streams: publishers as above (to a stream, or a super stream's exchange); readers subscribe to
each partition from an offset, and after a reconnect from the one after the last they read;
consumer-group members consume the super stream with `x-consumer-group`.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable

import aio_pika
from aio_pika.abc import AbstractIncomingMessage
from history_checker import (
    CONFIRMED,
    NACKED,
    UNKNOWN,
    Consume,
    GroupAck,
    GroupDelivery,
    Publish,
    QueueHistory,
    Reject,
    SessionEnd,
    StreamHistory,
    StreamPublish,
    StreamRead,
)

CONFIRM_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 5.0
RETRY_S = 0.5
CHURN_S = 3.0
"""How often a `cancel` or `reconnect` consumer does so."""
PREFETCH = 20
REJECT_EVERY = 5
DRAIN_IDLE_S = 2.0
DRAIN_TIMEOUT_S = 60.0
CONSUMER_MANNERS = ("stay", "cancel", "reconnect")

# What a client sees of a cluster in trouble: refused or lost connections, closed channels,
# and timeouts where a node does not answer.
CLIENT_ERRORS = (aio_pika.exceptions.AMQPError, OSError, asyncio.TimeoutError, RuntimeError)


def is_dead_letter(message_id: str) -> bool:
    return int(message_id.rpartition("-")[2]) % REJECT_EVERY == 0


async def connect(url: str) -> aio_pika.abc.AbstractConnection:
    return await asyncio.wait_for(aio_pika.connect(url), CONNECT_TIMEOUT_S)


class Clients:
    """The workload's tasks and the urls they pick nodes from; `stop` ends them."""

    def __init__(self, urls: Callable[[], list[str]], rng: random.Random) -> None:
        self.urls = urls
        self.rng = rng
        self.stopping = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []
        self.publish_log: list[tuple[float, str, str, str]] = []
        """(wall-clock time, id, node url, outcome) of each publish: to find a lost message
        in the nodes' logs."""

    def url(self) -> str:
        return self.rng.choice(self.urls())

    def run(self, job) -> None:
        self.tasks.append(asyncio.ensure_future(job))

    async def stop(self) -> None:
        self.stopping.set()
        await asyncio.gather(*self.tasks)
        self.tasks.clear()
        self.stopping.clear()

    async def connection(self, url: str | None = None) -> aio_pika.abc.AbstractConnection | None:
        """A connection to `url` or a random node; None, after a pause, if it could not be
        opened."""
        try:
            return await connect(url or self.url())
        except CLIENT_ERRORS:
            await self.pause(RETRY_S)
            return None

    async def pause(self, seconds: float) -> bool:
        """Wait `seconds` or until stopped; whether stopped."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)
        return self.stopping.is_set()

    def _record(
        self,
        record: Callable[[str, int, str], None],
        url: str,
        message_id: str,
        seq: int,
        outcome: str,
    ) -> None:
        self.publish_log.append((time.time(), message_id, url, outcome))
        record(message_id, seq, outcome)

    async def publish(
        self,
        name: str,
        exchange: str,
        routing_key: Callable[[str], str],
        record: Callable[[str, int, str], None],
    ) -> None:
        """Publish `name-0`, `name-1`, … one at a time until stopped; `record(id, seq,
        outcome)` for each."""
        seq = 0
        while not self.stopping.is_set():
            url = self.url()
            connection = await self.connection(url)
            if connection is None:
                continue
            try:
                channel = await connection.channel(publisher_confirms=True)
                target = await channel.get_exchange(exchange, ensure=False)
                while not self.stopping.is_set():
                    message_id = f"{name}-{seq}"
                    seq += 1
                    body = aio_pika.Message(
                        message_id.encode(),
                        message_id=message_id,
                        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    )
                    try:
                        await asyncio.wait_for(
                            target.publish(body, routing_key(message_id)), CONFIRM_TIMEOUT_S
                        )
                    except aio_pika.exceptions.DeliveryError:
                        self._record(record, url, message_id, seq, NACKED)
                        continue
                    except CLIENT_ERRORS:
                        self._record(record, url, message_id, seq, UNKNOWN)
                        break
                    self._record(record, url, message_id, seq, CONFIRMED)
            except CLIENT_ERRORS:
                pass
            finally:
                await _close(connection)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def _close(connection: aio_pika.abc.AbstractConnection) -> None:
    with contextlib.suppress(*CLIENT_ERRORS):
        await asyncio.wait_for(connection.close(), CONNECT_TIMEOUT_S)


class QueueWorkload(Clients):
    def __init__(
        self,
        urls: Callable[[], list[str]],
        rng: random.Random,
        queues: list[str],
        dead_letter_queues: dict[str, str],
    ) -> None:
        super().__init__(urls, rng)
        self.queues = queues
        self.history = QueueHistory(dead_letter_queues=dict(dead_letter_queues))

    def start(self, publishers_per_queue: int, manners: tuple[str, ...]) -> None:
        for queue in self.queues:
            for number in range(publishers_per_queue):
                self.run(self.publish_to(f"{queue}.p{number}", queue))
            for manner in manners:
                self.run(self.consume(f"{queue}.{manner}", queue, manner))
        for queue in set(self.history.dead_letter_queues.values()):
            self.run(self.consume(f"{queue}.stay", queue, "stay"))

    def publish_to(self, name: str, queue: str):
        def record(message_id: str, seq: int, outcome: str) -> None:
            self.history.publishes.append(Publish(queue, message_id, outcome))

        return self.publish(name, "", lambda _: queue, record)

    def _handler(self, name: str, queue: str, last_delivery: list[float]):
        rejecting = queue in self.history.dead_letter_queues

        async def on_message(message: AbstractIncomingMessage) -> None:
            message_id = message.message_id or ""
            last_delivery[0] = time.monotonic()
            self.history.consumes.append(Consume(queue, message_id, message.redelivered, name))
            with contextlib.suppress(*CLIENT_ERRORS):
                if rejecting and is_dead_letter(message_id):
                    self.history.rejects.append(Reject(queue, message_id, name))
                    await message.reject(requeue=False)
                else:
                    await message.ack()

        return on_message

    async def consume(
        self, name: str, queue: str, manner: str, last_delivery: list[float] | None = None
    ) -> None:
        last_delivery = last_delivery if last_delivery is not None else [0.0]
        on_message = self._handler(name, queue, last_delivery)
        while not self.stopping.is_set():
            connection = await self.connection()
            if connection is None:
                continue
            try:
                channel = await connection.channel()
                await channel.set_qos(prefetch_count=PREFETCH)
                source = await channel.get_queue(queue, ensure=False)
                while not self.stopping.is_set() and not connection.is_closed:
                    tag = await source.consume(on_message)
                    if manner == "stay":
                        while not (self.stopping.is_set() or connection.is_closed):
                            await self.pause(0.2)
                    else:
                        await self.pause(CHURN_S)
                    if manner != "cancel" or connection.is_closed:
                        break
                    await asyncio.wait_for(source.cancel(tag), CONNECT_TIMEOUT_S)
            except CLIENT_ERRORS:
                await self.pause(RETRY_S)
            finally:
                await _close(connection)

    async def drain(self) -> None:
        """Once the faults healed and the workload stopped: consume every queue (dead-letter
        queues last) until it has no ready message and is quiet."""
        order = [q for q in self.queues] + sorted(set(self.history.dead_letter_queues.values()))
        for queue in order:
            last_delivery = [time.monotonic()]
            self.run(self.consume(f"{queue}.drain", queue, "stay", last_delivery))
            deadline_s = time.monotonic() + DRAIN_TIMEOUT_S
            while time.monotonic() < deadline_s:
                await asyncio.sleep(0.5)
                quiet = time.monotonic() - last_delivery[0] > DRAIN_IDLE_S
                if quiet and await self.depth(queue) == 0:
                    break
            await self.stop()

    async def depth(self, queue: str) -> int:
        """Ready messages in `queue`, asked of each node until one answers."""
        for url in self.urls():
            try:
                connection = await connect(url)
            except CLIENT_ERRORS:
                continue
            try:
                channel = await connection.channel()
                declared = await channel.declare_queue(queue, passive=True)
                return declared.declaration_result.message_count
            except CLIENT_ERRORS:
                continue
            finally:
                await _close(connection)
        raise AssertionError(f"no node told the depth of {queue}")


class StreamWorkload(Clients):
    """Publishers to `stream` (a stream, or a super stream's exchange whose partitions are
    `partitions`), a reader per partition that reconnects every few seconds, and, for a
    super stream, members of one consumer group."""

    def __init__(
        self,
        urls: Callable[[], list[str]],
        rng: random.Random,
        stream: str,
        partitions: list[str],
        super_stream: bool,
    ) -> None:
        super().__init__(urls, rng)
        self.stream = stream
        self.partitions = partitions
        self.super_stream = super_stream
        self.history = StreamHistory()
        self._subscriptions = 0
        self._sessions = 0

    def start(self, publishers: int, group_members: int) -> None:
        for number in range(publishers):
            self.run(self.publish_to(f"{self.stream}.p{number}"))
        for partition in self.partitions:
            self.run(self.read(f"{partition}.reader", partition, [time.monotonic()], CHURN_S))
        for number in range(group_members):
            self.run(self.member(f"{self.stream}.m{number}"))

    def publish_to(self, name: str):
        def record(message_id: str, seq: int, outcome: str) -> None:
            publish = StreamPublish(self.stream, message_id, name, seq, outcome)
            self.history.publishes.append(publish)

        if self.super_stream:
            return self.publish(name, self.stream, lambda message_id: message_id, record)
        return self.publish(name, "", lambda _: self.stream, record)

    async def read(
        self, name: str, partition: str, last_delivery: list[float], session_s: float
    ) -> None:
        """Subscribe to `partition` from offset 0, again after each session of `session_s`
        (or a lost connection) from the offset after the last one read."""
        next_offset = 0
        while not self.stopping.is_set():
            self._subscriptions += 1
            subscription, from_offset = self._subscriptions, next_offset

            async def on_message(
                message: AbstractIncomingMessage,
                subscription: int = subscription,
                from_offset: int = from_offset,
            ) -> None:
                nonlocal next_offset
                offset = int(message.headers["x-stream-offset"])
                last_delivery[0] = time.monotonic()
                self.history.reads.append(
                    StreamRead(
                        partition,
                        offset,
                        message.message_id or "",
                        name,
                        subscription,
                        from_offset,
                    )
                )
                next_offset = offset + 1
                with contextlib.suppress(*CLIENT_ERRORS):
                    await message.ack()

            await self._session(partition, {"x-stream-offset": from_offset}, on_message, session_s)

    async def member(self, name: str) -> None:
        """A member of group `g` on the super stream, acking each delivery at once, leaving
        and joining again every few seconds (or after a lost connection)."""
        while not self.stopping.is_set():
            self._sessions += 1
            session = self._sessions
            heard_s = [time.monotonic()]

            async def on_message(
                message: AbstractIncomingMessage, session: int = session, heard_s=heard_s
            ) -> None:
                heard_s[0] = now_s = time.monotonic()
                partition = _text(message.headers["x-stream-partition"])
                offset = int(message.headers["x-stream-offset"])
                self.history.group_deliveries.append(
                    GroupDelivery("g", partition, offset, name, session, now_s)
                )
                self.history.group_acks.append(
                    GroupAck("g", partition, offset, name, session, time.monotonic())
                )
                with contextlib.suppress(*CLIENT_ERRORS):
                    await message.ack()

            closed_s = await self._session(
                self.stream, {"x-consumer-group": "g"}, on_message, CHURN_S * 2
            )
            self.history.session_ends.append(
                SessionEnd(name, session, closed_s if closed_s is not None else heard_s[0])
            )

    async def _session(self, queue, arguments, on_message, session_s: float) -> float | None:
        """Consume `queue` with `arguments` for `session_s` on a connection to a random node;
        when it began to close, or None if the connection was lost first."""
        connection = await self.connection()
        if connection is None:
            return None
        closed_s = None
        try:
            channel = await connection.channel()
            await channel.set_qos(prefetch_count=PREFETCH)
            source = await channel.get_queue(queue, ensure=False)
            await source.consume(on_message, arguments=arguments)
            deadline_s = time.monotonic() + session_s
            while not (self.stopping.is_set() or connection.is_closed):
                if time.monotonic() > deadline_s:
                    break
                await self.pause(0.2)
            if not connection.is_closed:
                closed_s = time.monotonic()
        except CLIENT_ERRORS:
            await self.pause(RETRY_S)
        finally:
            await _close(connection)
        return closed_s

    async def read_all(self) -> None:
        """Once the faults healed: read every partition from offset 0 to its quiet end."""
        readers = []
        for partition in self.partitions:
            last_delivery = [time.monotonic()]
            readers.append(last_delivery)
            self.run(self.read(f"{partition}.final", partition, last_delivery, DRAIN_TIMEOUT_S))
        deadline_s = time.monotonic() + DRAIN_TIMEOUT_S
        while time.monotonic() < deadline_s:
            await asyncio.sleep(0.5)
            if all(time.monotonic() - last[0] > DRAIN_IDLE_S for last in readers):
                break
        await self.stop()

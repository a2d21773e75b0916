"""`warren bench flood`: a broker's resident memory under the floods a hostile client can send.

Three floods, each against a broker with a memory high watermark, with the broker's RSS
sampled (from /proc, so the broker runs on this machine) from before the flood until its
connections close:

* ``partial-bodies`` — one connection, `--channels` channels, each sending a basic.publish
  whose content header announces `--body-bytes` and then body frames, round-robin, never
  the last byte. The memory alarm must block the connection (rabbit_reader blocks it at a
  content frame) before the bodies outgrow the watermark.
* ``transaction`` — tx.select, then `--messages` publishes of `--message-bytes`, never
  committed: the transaction holds them, and the alarm must block the publisher.
* ``slow-consumer`` — a backlog of `--backlog-bytes` in `--message-bytes` messages is
  published (and confirmed) first; then a consumer with basic.qos 0 consumes and never reads
  its socket. Deliveries must stop at the connection's write buffer bound.

A flood client writes with a non-blocking socket and takes the broker having read nothing
for `--stall` seconds as the broker having stopped reading it. The report (JSON) has, per
flood, the RSS before, the peak and the watermark, the bytes the client sent and whether it
stalled (was blocked) or got connection.blocked.

Without ``--url`` it starts ``warren serve`` itself with the watermark
``--watermark-bytes`` (default 300 MB)::

    warren bench flood partial-bodies             # 8 channels x 95 MiB
    warren bench flood all --watermark-bytes 300000000
    warren bench flood transaction --url amqp://guest:guest@127.0.0.1:5672/%2F --pid 1234
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import struct
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pamqp import commands, frame, header, heartbeat
from pamqp.exceptions import UnmarshalingException

from . import wire
from .client import BenchError
from .delayed import LocalWarren
from .loadgen import RssPeak

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_END = b"\xce"
MIB = 1 << 20
SAMPLE_S = 0.01
READ_BYTES = 1 << 20
# Frames are sent in runs of about this many bytes: large enough to keep the socket full,
# small enough that a stall is seen within one run.
RUN_BYTES = 1 << 20
SCENARIOS = ("partial-bodies", "transaction", "slow-consumer")


class FloodClient:
    """A blocking AMQP 0-9-1 client that sends whatever frames it is given and notices when
    the broker stops reading them."""

    def __init__(self, address: wire.BrokerAddress, timeout_s: float) -> None:
        if address.tls is not None:
            raise BenchError("the flood client speaks plain AMQP only")
        self.sock = socket.create_connection((address.host, address.port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.timeout_s = timeout_s
        self.buffer = b""
        self.blocked = False
        """connection.blocked arrived."""
        self.frame_max = 0
        self._handshake(address)

    def close(self) -> None:
        """Reset the connection: a close would queue its FIN behind the unread flood, which
        a blocked connection's broker never sees."""
        if self.sock.fileno() != -1:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()

    def _handshake(self, address: wire.BrokerAddress) -> None:
        self.sock.sendall(PROTOCOL_HEADER)
        self.expect(commands.Connection.Start)
        self.send(
            0,
            commands.Connection.StartOk(
                client_properties={"capabilities": {"connection.blocked": True}},
                mechanism="PLAIN",
                response=f"\0{address.username}\0{address.password}",
            ),
        )
        tune = self.expect(commands.Connection.Tune)
        self.frame_max = tune.frame_max
        # No heartbeats: a client the broker blocks must not be dropped for silence.
        self.send(
            0,
            commands.Connection.TuneOk(
                channel_max=tune.channel_max, frame_max=tune.frame_max, heartbeat=0
            ),
        )
        self.send(0, commands.Connection.Open(virtual_host=address.vhost))
        self.expect(commands.Connection.OpenOk)

    def send(self, channel: int, value: Any) -> None:
        self.sock.sendall(frame.marshal(value, channel))

    def call(self, channel: int, method: Any, answer: type) -> Any:
        self.send(channel, method)
        return self.expect(answer)

    def expect(self, kind: type) -> Any:
        """The next frame (heartbeats and connection.blocked/unblocked noted and skipped)."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            value = self._next_frame(deadline)
            if isinstance(value, heartbeat.Heartbeat):
                continue
            if isinstance(value, commands.Connection.Blocked):
                self.blocked = True
                continue
            if isinstance(value, commands.Connection.Unblocked):
                continue
            if not isinstance(value, kind):
                raise BenchError(f"expected {kind.__name__}, got {value!r}")
            return value

    def _next_frame(self, deadline: float) -> Any:
        while len(self.buffer) < 7 or len(self.buffer) < _frame_bytes(self.buffer):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BenchError("no answer from the broker in time")
            self.sock.settimeout(remaining)
            data = self.sock.recv(READ_BYTES)
            if not data:
                raise BenchError("the broker closed the connection")
            self.buffer += data
        try:
            consumed, _, value = frame.unmarshal(self.buffer)
        except UnmarshalingException as error:
            raise BenchError(f"undecodable frame from the broker: {error}") from None
        self.buffer = self.buffer[consumed:]
        return value

    def note_blocked(self) -> None:
        """Read what the broker sent without waiting: a connection.blocked sets `blocked`."""
        self.sock.setblocking(False)
        try:
            while True:
                data = self.sock.recv(READ_BYTES)
                if not data:
                    break
                self.buffer += data
        except BlockingIOError:
            pass
        finally:
            self.sock.settimeout(self.timeout_s)
        while len(self.buffer) >= 7 and len(self.buffer) >= _frame_bytes(self.buffer):
            consumed, _, value = frame.unmarshal(self.buffer)
            self.buffer = self.buffer[consumed:]
            if isinstance(value, commands.Connection.Blocked):
                self.blocked = True

    def flood(self, runs: Iterator[bytes], stall_s: float) -> tuple[int, bool]:
        """Send every run of frames until the broker reads nothing for `stall_s`; returns
        the bytes sent and whether it stalled."""
        sent = 0
        self.sock.setblocking(False)
        try:
            for run in runs:
                view = memoryview(run)
                while view:
                    _, writable, _ = select.select([], [self.sock], [], stall_s)
                    if not writable:
                        return sent, True
                    count = self.sock.send(view)
                    sent += count
                    view = view[count:]
            return sent, False
        finally:
            self.sock.settimeout(self.timeout_s)


def _frame_bytes(buffer: bytes) -> int:
    return struct.unpack_from(">I", buffer, 3)[0] + 8


def body_frame(channel: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", 3, channel, len(payload)) + payload + FRAME_END


def content(channel: int, routing_key: str, body_bytes: int) -> bytes:
    """basic.publish to the default exchange and a content header announcing `body_bytes`."""
    return frame.marshal(
        commands.Basic.Publish(exchange="", routing_key=routing_key), channel
    ) + frame.marshal(header.ContentHeader(0, body_bytes, commands.Basic.Properties()), channel)


def message(channel: int, routing_key: str, body: bytes, frame_max: int) -> bytes:
    """A whole publish, its body cut to fit `frame_max`."""
    step = frame_max - 8
    return content(channel, routing_key, len(body)) + b"".join(
        body_frame(channel, body[start : start + step]) for start in range(0, len(body), step)
    )


@dataclass
class FloodReport:
    scenario: str
    watermark_bytes: int
    rss_before_bytes: int
    rss_peak_bytes: int
    sent_bytes: int
    """What the flood client wrote (the kernel's socket buffers hold some of it)."""
    stalled: bool
    """The broker stopped reading the flood before it was all sent."""
    blocked_notice: bool
    """connection.blocked arrived."""
    detail: dict[str, Any]

    @property
    def over_watermark_bytes(self) -> int:
        return self.rss_peak_bytes - self.watermark_bytes


@dataclass(frozen=True)
class FloodSizes:
    channels: int = 8
    body_bytes: int = 95 * MIB
    message_bytes: int = MIB
    messages: int = 5000
    backlog_bytes: int = 960 * MIB
    stall_s: float = 2.0
    hold_s: float = 2.0
    """How long a stalled flood's connection stays open, still sampled, before it closes."""
    timeout_s: float = 120.0


def _flooded(
    scenario: str,
    client: FloodClient,
    runs: Iterator[bytes],
    pid: int,
    watermark_bytes: int,
    sizes: FloodSizes,
    detail: dict[str, Any],
) -> FloodReport:
    """Send the flood with the broker's RSS sampled, hold the connection for `hold_s`, reset
    it, and sample `hold_s` more (what the broker frees once the client is gone)."""
    with RssPeak(pid, SAMPLE_S) as sampler:
        sent, stalled = client.flood(runs, sizes.stall_s)
        time.sleep(sizes.hold_s)
        client.note_blocked()
        client.close()
        time.sleep(sizes.hold_s)
    return FloodReport(
        scenario,
        watermark_bytes,
        sampler.before,
        sampler.peak,
        sent,
        stalled,
        client.blocked,
        detail,
    )


def partial_bodies(
    address: wire.BrokerAddress, pid: int, watermark_bytes: int, sizes: FloodSizes
) -> FloodReport:
    client = FloodClient(address, sizes.timeout_s)
    try:
        channels = range(1, sizes.channels + 1)
        for number in channels:
            client.call(number, commands.Channel.Open(), commands.Channel.OpenOk)
        chunk = b"x" * (client.frame_max - 8)

        def runs() -> Iterator[bytes]:
            yield b"".join(content(n, "flood-nowhere", sizes.body_bytes) for n in channels)
            left = sizes.body_bytes - 1  # never the last byte
            while left:
                size = min(left, len(chunk))
                frames = b"".join(body_frame(n, chunk[:size]) for n in channels)
                yield frames
                left -= size

        detail = {"channels": sizes.channels, "body_bytes": sizes.body_bytes}
        return _flooded("partial-bodies", client, runs(), pid, watermark_bytes, sizes, detail)
    finally:
        client.close()


def transaction(
    address: wire.BrokerAddress, pid: int, watermark_bytes: int, sizes: FloodSizes
) -> FloodReport:
    client = FloodClient(address, sizes.timeout_s)
    try:
        client.call(1, commands.Channel.Open(), commands.Channel.OpenOk)
        queue = f"flood-tx-{time.monotonic_ns()}"
        client.call(
            1, commands.Queue.Declare(queue=queue, exclusive=True), commands.Queue.DeclareOk
        )
        client.call(1, commands.Tx.Select(), commands.Tx.SelectOk)
        one = message(1, queue, b"t" * sizes.message_bytes, client.frame_max)
        per_run = max(1, RUN_BYTES // len(one))

        def runs() -> Iterator[bytes]:
            left = sizes.messages
            while left:
                count = min(left, per_run)
                yield one * count
                left -= count

        detail = {"message_bytes": sizes.message_bytes, "messages": sizes.messages}
        return _flooded("transaction", client, runs(), pid, watermark_bytes, sizes, detail)
    finally:
        client.close()


def slow_consumer(
    address: wire.BrokerAddress, pid: int, watermark_bytes: int, sizes: FloodSizes
) -> FloodReport:
    queue = f"flood-backlog-{time.monotonic_ns()}"
    count = max(1, sizes.backlog_bytes // sizes.message_bytes)
    publisher = FloodClient(address, sizes.timeout_s)
    try:
        publisher.call(1, commands.Channel.Open(), commands.Channel.OpenOk)
        publisher.call(1, commands.Queue.Declare(queue=queue), commands.Queue.DeclareOk)
        publisher.call(1, commands.Confirm.Select(), commands.Confirm.SelectOk)
        one = message(1, queue, b"c" * sizes.message_bytes, publisher.frame_max)
        window = max(1, (8 * MIB) // len(one))
        confirmed = 0
        backlog_started = time.monotonic()
        while confirmed < count:
            target = min(count, confirmed + window)
            publisher.sock.sendall(one * (target - confirmed))
            while confirmed < target:
                confirmed = max(confirmed, publisher.expect(commands.Basic.Ack).delivery_tag)
        backlog_s = time.monotonic() - backlog_started
        consumer = FloodClient(address, sizes.timeout_s)
        try:
            with RssPeak(pid, SAMPLE_S) as sampler:
                consumer.call(1, commands.Channel.Open(), commands.Channel.OpenOk)
                consumer.call(1, commands.Basic.Qos(prefetch_count=0), commands.Basic.QosOk)
                consumer.send(1, commands.Basic.Consume(queue=queue, consumer_tag="never-reads"))
                # Never read from here on: the broker may only fill its own write buffer and
                # the kernel's socket buffers.
                time.sleep(sizes.stall_s + sizes.hold_s)
                consumer.close()
                time.sleep(sizes.hold_s)
        finally:
            consumer.close()
        publisher.call(1, commands.Queue.Delete(queue=queue), commands.Queue.DeleteOk)
        return FloodReport(
            "slow-consumer",
            watermark_bytes,
            sampler.before,
            sampler.peak,
            count * len(one),
            False,
            publisher.blocked,
            {
                "message_bytes": sizes.message_bytes,
                "backlog_messages": count,
                "backlog_publish_s": round(backlog_s, 1),
            },
        )
    finally:
        publisher.close()


FLOODS: dict[str, Callable[[wire.BrokerAddress, int, int, FloodSizes], FloodReport]] = {
    "partial-bodies": partial_bodies,
    "transaction": transaction,
    "slow-consumer": slow_consumer,
}


def run(
    scenarios: tuple[str, ...], url: str, pid: int, watermark_bytes: int, sizes: FloodSizes
) -> list[dict[str, Any]]:
    address = wire.parse_url(url)
    reports = []
    for scenario in scenarios:
        report = FLOODS[scenario](address, pid, watermark_bytes, sizes)
        reports.append(
            {**asdict(report), "rss_peak_over_watermark_bytes": report.over_watermark_bytes}
        )
    return reports


def _main(args: argparse.Namespace) -> int:
    scenarios = SCENARIOS if args.scenario == "all" else (args.scenario,)
    sizes = FloodSizes(
        channels=args.channels,
        body_bytes=args.body_bytes,
        message_bytes=args.message_bytes,
        messages=args.messages,
        backlog_bytes=args.backlog_bytes,
        stall_s=args.stall,
        hold_s=args.hold,
    )
    try:
        if args.url is not None:
            if args.pid is None:
                raise BenchError("--url needs --pid: the broker's process, to read its memory")
            reports = run(scenarios, args.url, args.pid, args.watermark_bytes, sizes)
        else:
            with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
                warren = LocalWarren(
                    Path(scratch) / "data",
                    {"WARREN_MEMORY_HIGH_WATERMARK_BYTES": str(args.watermark_bytes)},
                )
                try:
                    warren.start()
                    assert warren.process is not None
                    reports = run(
                        scenarios, warren.url, warren.process.pid, args.watermark_bytes, sizes
                    )
                finally:
                    warren.stop()
    except (BenchError, OSError) as error:
        print(json.dumps({"scenario": args.scenario, "error": str(error)}, indent=2))
        return 1
    print(json.dumps(reports, indent=2))
    return 0


def register(targets: Any) -> None:
    parser = targets.add_parser(
        "flood", help="the broker's peak RSS under hostile floods, against its memory watermark"
    )
    parser.add_argument("scenario", choices=(*SCENARIOS, "all"))
    parser.add_argument(
        "--watermark-bytes",
        type=int,
        default=300_000_000,
        help="the started broker's memory_high_watermark_bytes (with --url: the running "
        "broker's, for the report) (default 300 MB)",
    )
    parser.add_argument("--channels", type=int, default=8, help="partial-bodies: channels")
    parser.add_argument(
        "--body-bytes", type=int, default=95 * MIB, help="partial-bodies: announced body size"
    )
    parser.add_argument(
        "--message-bytes", type=int, default=MIB, help="transaction, slow-consumer: body size"
    )
    parser.add_argument(
        "--messages", type=int, default=5000, help="transaction: publishes never committed"
    )
    parser.add_argument(
        "--backlog-bytes", type=int, default=960 * MIB, help="slow-consumer: the backlog"
    )
    parser.add_argument(
        "--stall", type=float, default=2.0, help="seconds without progress that count as blocked"
    )
    parser.add_argument(
        "--hold", type=float, default=2.0, help="seconds a flood's connection stays open after"
    )
    parser.add_argument("--url", help="a running broker (default: start `warren serve`)")
    parser.add_argument("--pid", type=int, help="with --url: the broker's process id")
    parser.add_argument("--dir", help="where to put the started broker's data directory")
    parser.set_defaults(handler=_main)

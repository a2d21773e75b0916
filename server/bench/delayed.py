"""`warren bench delayed`: what holding delayed messages costs a broker in resident memory.

Declares a durable `x-delayed-message` exchange (direct) bound to a durable queue, publishes
`--messages` persistent messages of `--size` bytes with `x-delay` `--delay-ms` (default an
hour: none is due during the run) with publisher confirms, and reports how much the broker's
RSS grew (read from /proc, so the broker runs on this machine) once it settled; with
`--restart`, also the RSS and the time of a restart that recovers them all.

Without `--url`, it starts `warren serve` itself on a temporary data directory (and stops it
at the end), so one command measures Warren:

    warren bench delayed                      # 1,000,000 messages held for an hour
    warren bench delayed --restart --messages 200000
    warren bench delayed --url amqp://guest:guest@127.0.0.1:5672/%2F --pid 1234

The queue is expected to stay empty: a message routed during the run is reported as `routed`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pamqp import commands

from warrenmq.amqp import frames

from . import wire
from .client import BenchError, ClientConnection, close_all
from .loadgen import read_rss_bytes
from .roles import Publisher

_MB = 1_000_000
_LISTENING = re.compile(r"Warren listening on [^:]+:(\d+)")
_START_S_MAX = 600.0


class LocalWarren:
    """`warren serve` on 127.0.0.1, a port it picks and `data_dir`; `settings` are WARREN_*
    variables for its environment."""

    def __init__(self, data_dir: Path, settings: Mapping[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.settings = dict(settings or {})
        self.process: subprocess.Popen[str] | None = None
        self.port = 0

    def start(self) -> float:
        """Start and wait for the listening line; returns the seconds that took."""
        started = time.monotonic()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "warrenmq.server.cli",
                "serve",
                "--port",
                "0",
                "--bind",
                "127.0.0.1",
                "--data-dir",
                str(self.data_dir),
                "--log-level",
                "warning",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, **self.settings},
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        match = _LISTENING.search(line)
        if match is None:
            self.stop()
            raise BenchError(f"warren serve did not start: {line!r}")
        self.port = int(match.group(1))
        return time.monotonic() - started

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(_START_S_MAX)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


async def _hold(url: str, args: argparse.Namespace, names: tuple[str, str]) -> dict[str, Any]:
    """Declare, publish every message with confirms; the publish figures."""
    exchange, queue = names
    address = wire.parse_url(url)
    connection = await ClientConnection.open(address)
    try:
        channel = await connection.open_channel()
        await connection.call(
            channel,
            commands.Exchange.Declare(
                exchange=exchange,
                exchange_type="x-delayed-message",
                durable=True,
                arguments={"x-delayed-type": "direct"},
            ),
            commands.Exchange.DeclareOk,
        )
        await connection.call(
            channel, commands.Queue.Declare(queue=queue, durable=True), commands.Queue.DeclareOk
        )
        await connection.call(
            channel,
            commands.Queue.Bind(queue=queue, exchange=exchange, routing_key=queue),
            commands.Queue.BindOk,
        )
        await connection.call(channel, commands.Confirm.Select(), commands.Confirm.SelectOk)
        properties = frames.encode_properties(
            commands.Basic.Properties(delivery_mode=2, headers={"x-delay": args.delay_ms})
        )
        template = wire.PublishTemplate(
            channel, exchange, queue, args.size, connection.frame_max, property_bytes=properties
        )
        publisher = Publisher(connection, channel, template, args.messages, args.window)
        publisher.start()
        end_ns = await publisher.done
        seconds = (end_ns - publisher.start_ns) / 1e9
        return {
            "published": publisher.published,
            "nacked": publisher.nacked,
            "publish_msgs_per_s": round(publisher.published / seconds),
        }
    finally:
        await close_all([connection])


async def _routed(url: str, queue: str) -> int:
    connection = await ClientConnection.open(wire.parse_url(url))
    try:
        channel = await connection.open_channel()
        declare_ok = await connection.call(
            channel, commands.Queue.Declare(queue=queue, passive=True), commands.Queue.DeclareOk
        )
        return declare_ok.message_count
    finally:
        await close_all([connection])


async def _clean_up(url: str, names: tuple[str, str]) -> None:
    exchange, queue = names
    connection = await ClientConnection.open(wire.parse_url(url))
    try:
        channel = await connection.open_channel()
        await connection.call(
            channel, commands.Exchange.Delete(exchange=exchange), commands.Exchange.DeleteOk
        )
        await connection.call(channel, commands.Queue.Delete(queue=queue), commands.Queue.DeleteOk)
    finally:
        await close_all([connection])


def _rss_mb(pid: int) -> float:
    return round(read_rss_bytes(pid) / _MB, 1)


def run(args: argparse.Namespace, url: str, pid: int, warren: LocalWarren | None) -> dict[str, Any]:
    suffix = secrets.token_hex(3)
    names = (f"warren-bench-delayed-x-{suffix}", f"warren-bench-delayed-q-{suffix}")
    time.sleep(args.settle)
    report: dict[str, Any] = {
        "messages": args.messages,
        "size_bytes": args.size,
        "delay_ms": args.delay_ms,
        "pid": pid,
        "rss_mb_before": _rss_mb(pid),
    }
    report.update(asyncio.run(_hold(url, args, names)))
    time.sleep(args.settle)
    report["rss_mb_after"] = _rss_mb(pid)
    report["rss_mb_growth"] = round(report["rss_mb_after"] - report["rss_mb_before"], 1)
    report["rss_bytes_per_message"] = round(
        report["rss_mb_growth"] * _MB / max(args.messages, 1), 1
    )
    report["routed"] = asyncio.run(_routed(url, names[1]))
    if args.restart and warren is not None:
        warren.stop()
        report["restart_s"] = round(warren.start(), 2)
        assert warren.process is not None
        url, pid = warren.url, warren.process.pid
        time.sleep(args.settle)
        report["rss_mb_after_restart"] = _rss_mb(pid)
    if not args.keep:
        asyncio.run(_clean_up(url, names))
    return report


def _main(args: argparse.Namespace) -> int:
    try:
        if args.url is not None:
            if args.pid is None:
                raise BenchError("--url needs --pid: the broker's process, to read its memory")
            if args.restart:
                raise BenchError("--restart restarts only a broker the bench started")
            report = run(args, args.url, args.pid, None)
        else:
            with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
                warren = LocalWarren(Path(scratch) / "data")
                try:
                    warren.start()
                    assert warren.process is not None
                    report = run(args, warren.url, warren.process.pid, warren)
                finally:
                    warren.stop()
    except BenchError as error:
        print(json.dumps({"scenario": "delayed", "error": str(error)}, indent=2))
        return 1
    print(json.dumps(report, indent=2))
    return 0


def register(targets: Any) -> None:
    parser = targets.add_parser(
        "delayed", help="RSS growth of a broker holding messages in an x-delayed-message exchange"
    )
    parser.add_argument("--messages", type=int, default=1_000_000, help="messages to hold")
    parser.add_argument("--size", type=int, default=64, help="message body bytes (default 64)")
    parser.add_argument(
        "--delay-ms", type=int, default=3_600_000, help="x-delay of every message (default 1 h)"
    )
    parser.add_argument(
        "--window", type=int, default=1000, help="unconfirmed messages allowed (default 1000)"
    )
    parser.add_argument(
        "--settle", type=float, default=3.0, help="seconds to wait before each RSS reading"
    )
    parser.add_argument(
        "--restart", action="store_true", help="restart the broker and measure it again"
    )
    parser.add_argument("--keep", action="store_true", help="leave the exchange and queue")
    parser.add_argument("--url", help="a running broker (default: start `warren serve`)")
    parser.add_argument("--pid", type=int, help="with --url: the broker's process id")
    parser.add_argument("--dir", help="where to put the started broker's data directory")
    parser.set_defaults(handler=_main)

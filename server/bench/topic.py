"""`warren bench topic`: the topic API's throughput over HTTP, each way.

Creates a topic (a stream, or with `--partitions P` a super stream), then `--clients` HTTP
clients POST `--records` records of `--size` bytes in batches of `--batch` (each POST
answered once its records are fsynced), then read them all back with GETs of up to
`--batch` records (the partitions' offset ranges split among the clients). Reports
records/s and MB/s (of values) each way, the POSTs' latency, and checks every record came
back. The topic is deleted at the end unless `--keep`.

    warren bench topic --url http://127.0.0.1:15672 --records 200000 --batch 1000 --clients 4

Values go as `--format` base64 (default) or string (ASCII); on a super stream each record
has a key (`k<n>`), routed by the super stream exchange.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import secrets
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from warrenmq.server import api_client

_MB = 1_000_000
FORMATS = ("base64", "string")
REQUEST_TIMEOUT_S = 120


class TopicBenchError(Exception):
    pass


class _Topic:
    """The bench's topic through the management API (created and deleted synchronously)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.name = f"warren-bench-topic-{secrets.token_hex(3)}"

    def create(self) -> None:
        args = self.args
        if args.partitions:
            body: dict[str, Any] = {"partitions": args.partitions}
            api_client.request_json(
                args, "PUT", "api", "super-streams", args.vhost, self.name, body=body
            )
        else:
            body = {"durable": True, "arguments": {"x-queue-type": "stream"}}
            api_client.request_json(args, "PUT", "api", "queues", args.vhost, self.name, body=body)

    def delete(self) -> None:
        kind = "super-streams" if self.args.partitions else "queues"
        api_client.request_json(self.args, "DELETE", "api", kind, self.args.vhost, self.name)


def _batches(args: argparse.Namespace) -> list[bytes]:
    """Every POST's body, built before the clock starts."""
    if args.format == "string":
        value = "x" * args.size
    else:
        value = base64.b64encode(bytes(n % 256 for n in range(args.size))).decode()
    bodies = []
    for first in range(0, args.records, args.batch):
        count = min(args.batch, args.records - first)
        records = [
            {"key": f"k{first + n}", "value": value} if args.partitions else {"value": value}
            for n in range(count)
        ]
        bodies.append(json.dumps({"value_format": args.format, "records": records}).encode())
    return bodies


async def _in_turn(clients: int, work: list[Any], run: Callable[[Any], Awaitable[None]]) -> None:
    """`run` each item of `work`, `clients` at a time."""
    items = iter(work)

    async def client() -> None:
        for item in items:
            await run(item)

    await asyncio.gather(*(client() for _ in range(clients)))


async def _measure(args: argparse.Namespace, topic: str) -> dict[str, Any]:
    base = args.url.rstrip("/")
    target = f"{base}/topics/{urllib.parse.quote(topic, safe='')}/messages"
    vhost = {"vhost": args.vhost}
    token = base64.b64encode(f"{args.user}:{args.password}".encode()).decode()
    login = {"Authorization": f"Basic {token}"}
    connector = aiohttp.TCPConnector(limit=args.clients)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    bodies = _batches(args)
    latencies_ms: list[float] = []
    ends: dict[int, int] = {}
    async with aiohttp.ClientSession(
        headers=login, connector=connector, timeout=timeout
    ) as session:

        async def post(body: bytes) -> None:
            sent = time.monotonic()
            async with session.post(
                target, data=body, params=vhost, headers={"Content-Type": "application/json"}
            ) as response:
                reply = await response.read()
                if response.status != 200:
                    raise TopicBenchError(f"POST: {response.status} {reply[:200]!r}")
            latencies_ms.append((time.monotonic() - sent) * 1000)
            for placed in json.loads(reply)["offsets"]:
                partition = placed["partition"]
                ends[partition] = max(ends.get(partition, 0), placed["offset"] + 1)

        started = time.monotonic()
        await _in_turn(args.clients, bodies, post)
        posted_s = time.monotonic() - started

        ranges = []
        for partition, end in sorted(ends.items()):
            step = max(args.batch, -(-end // args.clients))
            ranges += [(partition, start, min(start + step, end)) for start in range(0, end, step)]
        read_counts: list[int] = []

        async def get(span: tuple[int, int, int]) -> None:
            partition, offset, end = span
            while offset < end:
                query = {
                    **vhost,
                    "partition": str(partition),
                    "offset": str(offset),
                    "limit": str(min(args.batch, end - offset)),
                    "value_format": args.format,
                }
                async with session.get(target, params=query) as response:
                    reply = await response.read()
                    if response.status != 200:
                        raise TopicBenchError(f"GET: {response.status} {reply[:200]!r}")
                read = json.loads(reply)
                if not read["records"]:
                    raise TopicBenchError(f"GET: partition {partition} ends at {offset} < {end}")
                read_counts.append(len(read["records"]))
                offset = read["next_offset"]

        started = time.monotonic()
        await _in_turn(args.clients, ranges, get)
        read_s = time.monotonic() - started
    megabytes = args.records * args.size / _MB
    latencies_ms.sort()
    return {
        "read_back": sum(read_counts),
        "post_records_per_s": round(args.records / posted_s),
        "post_mb_per_s": round(megabytes / posted_s, 1),
        "post_latency_ms_p50": round(latencies_ms[len(latencies_ms) // 2], 1),
        "post_latency_ms_max": round(latencies_ms[-1], 1),
        "get_records_per_s": round(args.records / read_s),
        "get_mb_per_s": round(megabytes / read_s, 1),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Create the topic, measure, delete it (unless --keep); the report."""
    for option in ("records", "batch", "size", "clients"):
        if getattr(args, option) < 1:
            raise TopicBenchError(f"--{option} must be at least 1")
    if args.batch > 10_000:
        raise TopicBenchError("--batch must be at most 10000 (a POST's and a GET's bound)")
    report: dict[str, Any] = {
        "scenario": "topic",
        "records": args.records,
        "size_bytes": args.size,
        "batch": args.batch,
        "clients": args.clients,
        "partitions": args.partitions or 1,
        "format": args.format,
    }
    topic = _Topic(args)
    topic.create()
    try:
        report.update(asyncio.run(_measure(args, topic.name)))
    finally:
        if not args.keep:
            topic.delete()
    if report["read_back"] != args.records:
        raise TopicBenchError(f"read {report['read_back']} of {args.records} records back")
    return report


def _main(args: argparse.Namespace) -> int:
    try:
        report = run(args)
    except (TopicBenchError, api_client.CliError, aiohttp.ClientError) as error:
        print(json.dumps({"scenario": "topic", "error": str(error)}, indent=2))
        return 1
    print(json.dumps(report, indent=2))
    return 0


def register(targets: Any) -> None:
    parser = targets.add_parser(
        "topic", help="the topic API over HTTP: records/s and MB/s posted and read back"
    )
    parser.add_argument("--records", type=int, default=100_000, help="records to post")
    parser.add_argument("--size", type=int, default=100, help="value bytes (default 100)")
    parser.add_argument(
        "--batch", type=int, default=1000, help="records per POST and per GET (default 1000)"
    )
    parser.add_argument("--clients", type=int, default=4, help="concurrent HTTP clients")
    parser.add_argument(
        "--partitions", type=int, default=0, help="a super stream of P partitions (0: a stream)"
    )
    parser.add_argument("--format", choices=FORMATS, default="base64", help="how values travel")
    parser.add_argument("--keep", action="store_true", help="leave the topic")
    api_client.add_connection_arguments(parser)
    parser.set_defaults(handler=_main)

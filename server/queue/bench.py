"""`warren bench queue`: throughput of the durable queue engine alone, without networking.

Each tick appends a batch of small persistent-sized messages, takes them and acks them, as a
broker does per event-loop tick. Three runs: without a commit per tick (only the delivered mark's
refresh fsyncs), with
a group commit every tick (what publisher confirms wait for), and a backlog drained from disk.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from .log_queue import LogQueue

PROPERTIES = b"\x10\x00\x02"  # delivery-mode only: persistent


def _records(count: int, body_bytes: int) -> list[tuple[bytes, bytes, bytes, bytes]]:
    body = b"x" * body_bytes
    return [(b"", b"bench", PROPERTIES, body)] * count


async def _ticks(
    queue: LogQueue, messages: int, batch: int, body_bytes: int, commit: bool
) -> dict[str, Any]:
    records = _records(batch, body_bytes)
    ticks = messages // batch
    start = time.perf_counter()
    for _ in range(ticks):
        queue.append(records)
        taken = queue.take_many(batch)
        if len(taken) < batch:
            await queue.commit()
            taken += queue.take_many(batch - len(taken))
        queue.ack_many([message.offset for message in taken])
        if commit:
            await queue.commit()
    await queue.commit()
    seconds = time.perf_counter() - start
    assert queue.ready_count == 0 and queue.unacked_count == 0
    return {
        "messages": ticks * batch,
        "seconds": round(seconds, 3),
        "msgs_per_s": round(ticks * batch / seconds),
    }


async def _backlog(queue: LogQueue, messages: int, batch: int, body_bytes: int) -> dict[str, Any]:
    records = _records(batch, body_bytes)
    start = time.perf_counter()
    for _ in range(messages // batch):
        queue.append(records)
    await queue.commit()
    filled = time.perf_counter()
    drained = 0
    while True:
        taken = queue.take_many(batch)
        if not taken:
            if queue.ready_count == 0:
                break
            await queue.commit()
            continue
        queue.ack_many([message.offset for message in taken])
        drained += len(taken)
    await queue.commit()
    end = time.perf_counter()
    return {
        "messages": drained,
        "append_msgs_per_s": round(drained / (filled - start)),
        "drain_msgs_per_s": round(drained / (end - filled)),
    }


async def _run(directory: Path, messages: int, batch: int, body_bytes: int) -> dict[str, Any]:
    report: dict[str, Any] = {"batch": batch, "body_bytes": body_bytes}
    for name, commit in (("no_commit", False), ("commit_every_tick", True)):
        queue = LogQueue.open(directory / name)
        try:
            count = messages if not commit else max(batch, messages // 10)
            report[name] = await _ticks(queue, count, batch, body_bytes, commit)
        finally:
            queue.delete()
    queue = LogQueue.open(directory / "backlog")
    try:
        report["backlog"] = await _backlog(queue, messages, batch, body_bytes)
    finally:
        queue.delete()
    return report


def run(directory: str | None, messages: int, batch: int, body_bytes: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        return asyncio.run(_run(Path(scratch), messages, batch, body_bytes))


def _main(args: argparse.Namespace) -> int:
    print(
        json.dumps(
            run(args.dir, args.messages, args.batch, args.body_bytes), indent=2, sort_keys=True
        )
    )
    return 0


def register(targets: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = targets.add_parser(
        "queue", help="append/take/ack throughput of the durable queue engine"
    )
    parser.add_argument("--dir", help="scratch directory (default: a temporary one)")
    parser.add_argument("--messages", type=int, default=1_000_000, help="messages per run")
    parser.add_argument("--batch", type=int, default=100, help="messages per tick")
    parser.add_argument("--body-bytes", type=int, default=64, help="message body size")
    parser.set_defaults(handler=_main)

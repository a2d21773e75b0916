"""`warren bench redrive`: how fast a broker's redrive task moves dead letters back.

Declares a source queue whose messages expire at once (`x-message-ttl` 0) into a dead-letter
queue, publishes `--messages` persistent messages of `--size` bytes to it with confirms (each
dies `expired`), waits until the dead-letter queue holds them all, then starts a redrive of
that queue to a third queue through the management API (`POST /api/dlq/V/Q/redrive`) and polls
the task until it ends. Reports the fill, the redrive's msgs/s between the task's own start
and end, and how many messages the target queue holds then (every one, or the run failed).

The redrive goes to a queue of its own rather than back to the source, where each message
would expire and die again. RabbitMQ has no redrive (its users shovel dead letters back), so
there is nothing to compare with; SQS caps its redrive at 500 msg/s.

    warren bench redrive --url amqp://guest:guest@127.0.0.1:5672/%2F \
        --api http://127.0.0.1:15672 --messages 1000000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import time
import urllib.parse
from typing import Any

import aiohttp
from pamqp import commands

from warrenmq.amqp import frames

from . import wire
from .client import BenchError, ClientConnection, close_all
from .loadgen import ready_count
from .roles import Publisher

POLL_S = 0.2
FILL_POLL_S = 0.1


async def _declare(connection: ClientConnection, channel: int, names: dict[str, str]) -> None:
    for name in (names["dead_letters"], names["target"]):
        await connection.call(
            channel, commands.Queue.Declare(queue=name, durable=True), commands.Queue.DeclareOk
        )
    arguments = {
        "x-message-ttl": 0,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": names["dead_letters"],
    }
    await connection.call(
        channel,
        commands.Queue.Declare(queue=names["source"], durable=True, arguments=arguments),
        commands.Queue.DeclareOk,
    )


async def _fill(
    connection: ClientConnection, args: argparse.Namespace, names: dict[str, str]
) -> dict[str, Any]:
    """Publish every message to the source with confirms, then wait for the dead-letter
    queue to hold them all; the fill's figures."""
    channel = await connection.open_channel()
    await connection.call(channel, commands.Confirm.Select(), commands.Confirm.SelectOk)
    properties = frames.encode_properties(commands.Basic.Properties(delivery_mode=2))
    template = wire.PublishTemplate(
        channel, "", names["source"], args.size, connection.frame_max, property_bytes=properties
    )
    publisher = Publisher(connection, channel, template, args.messages, args.window)
    publisher.start()
    await publisher.done
    admin = await connection.open_channel()
    while await ready_count(connection, admin, names["dead_letters"]) < args.messages:
        await asyncio.sleep(FILL_POLL_S)
    seconds = (time.monotonic_ns() - publisher.start_ns) / 1e9
    return {
        "published": publisher.published,
        "nacked": publisher.nacked,
        "fill_msgs_per_s": round(publisher.published / seconds),
    }


async def _redrive(
    api: str, authorization: str, vhost: str, names: dict[str, str], timeout_s: float
) -> dict[str, Any]:
    """Start the redrive and poll it to its end; the finished task."""
    quoted = urllib.parse.quote(vhost, safe="")
    body = {"exchange": "", "routing_key": names["target"]}
    headers = {"Authorization": authorization}
    async with aiohttp.ClientSession(base_url=api.rstrip("/"), headers=headers) as session:
        path = f"/api/dlq/{quoted}/{urllib.parse.quote(names['dead_letters'], safe='')}/redrive"
        async with session.post(path, json=body) as response:
            if response.status != 201:
                raise BenchError(f"POST {path}: {response.status} {await response.text()}")
            task = await response.json()
        deadline = time.monotonic() + timeout_s
        while task["state"] == "running":
            if time.monotonic() > deadline:
                raise BenchError(f"the redrive did not end within {timeout_s} s: {task}")
            await asyncio.sleep(POLL_S)
            async with session.get(f"/api/dlq/redrives/{task['id']}") as response:
                if response.status != 200:
                    raise BenchError(f"GET redrive {task['id']}: {response.status}")
                task = await response.json()
    return task


async def _run(args: argparse.Namespace) -> dict[str, Any]:
    address = wire.parse_url(args.url)
    suffix = secrets.token_hex(3)
    names = {
        "source": f"warren-bench-redrive-src-{suffix}",
        "dead_letters": f"warren-bench-redrive-dlq-{suffix}",
        "target": f"warren-bench-redrive-target-{suffix}",
    }
    connection = await ClientConnection.open(address)
    try:
        channel = await connection.open_channel()
        await _declare(connection, channel, names)
        report: dict[str, Any] = {"messages": args.messages, "size_bytes": args.size}
        report.update(await _fill(connection, args, names))
        authorization = aiohttp.encode_basic_auth(address.username, address.password)
        task = await _redrive(args.api, authorization, address.vhost, names, args.timeout)
        seconds = max(((task["finished"] or 0) - task["created"]) / 1000, 1e-3)
        report.update(
            {
                "state": task["state"],
                "moved": task["moved"],
                "kept": task["kept"],
                "redrive_seconds": round(seconds, 3),
                "redrive_msgs_per_s": round(task["moved"] / seconds),
                "target_ready": await ready_count(connection, channel, names["target"]),
                "dead_letters_left": await ready_count(connection, channel, names["dead_letters"]),
            }
        )
        if not args.keep:
            for name in names.values():
                await connection.call(
                    channel, commands.Queue.Delete(queue=name), commands.Queue.DeleteOk
                )
        return report
    finally:
        await close_all([connection])


def _main(args: argparse.Namespace) -> int:
    try:
        report = asyncio.run(_run(args))
    except BenchError as error:
        print(json.dumps({"scenario": "redrive", "error": str(error)}, indent=2))
        return 1
    print(json.dumps(report, indent=2))
    return 0 if report["target_ready"] == args.messages else 1


def register(targets: Any) -> None:
    parser = targets.add_parser(
        "redrive", help="how fast Warren's redrive task moves dead letters to another queue"
    )
    parser.add_argument(
        "--url",
        default="amqp://guest:guest@127.0.0.1:5672/%2F",
        help="the broker over AMQP (its user also logs in to the API)",
    )
    parser.add_argument(
        "--api", default="http://127.0.0.1:15672", help="the broker's management API"
    )
    parser.add_argument("--messages", type=int, default=1_000_000, help="dead letters to move")
    parser.add_argument("--size", type=int, default=64, help="message body bytes (default 64)")
    parser.add_argument(
        "--window", type=int, default=1000, help="unconfirmed messages allowed (default 1000)"
    )
    parser.add_argument(
        "--timeout", type=float, default=1800.0, help="give up on the redrive after this long"
    )
    parser.add_argument("--keep", action="store_true", help="leave the three queues")
    parser.set_defaults(handler=_main)

"""Declare throughput: N durable queue declares over AMQP against `warren serve` started
from the running interpreter's warrenmq (so the venv picks the checkout), or against the
broker at --url (RabbitMQ, say: then no restart is timed).

    .venv/bin/python scripts/declare_bench.py --queues 10000 --concurrency 1|64 [--url URL]
"""

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import aiormq

sys.path.insert(0, str(Path.cwd() / "tests"))
from brokers import WarrenProcess  # noqa: E402


async def declare_all(url: str, queues: int, concurrency: int) -> float:
    connection = await aiormq.connect(url)
    channels = [await connection.channel() for _ in range(concurrency)]
    # Fresh names on every run: a broker kept between runs (--url) would otherwise find them.
    prefix = f"declare-bench-{time.time_ns()}"
    names = iter(range(queues))

    async def worker(channel):
        for i in names:
            await channel.queue_declare(f"{prefix}-q{i}", durable=True)

    started = time.perf_counter()
    await asyncio.gather(*(worker(ch) for ch in channels))
    took = time.perf_counter() - started
    await connection.close()
    return took


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--url", help="an AMQP URL to measure instead of a fresh warren serve")
    args = parser.parse_args()
    if args.url:
        took = asyncio.run(declare_all(args.url, args.queues, args.concurrency))
        print(
            f"{args.queues} durable queue declares, {args.concurrency} channel(s): "
            f"{took:.2f} s, {args.queues / took:.0f} declares/s"
        )
        return
    with tempfile.TemporaryDirectory() as directory:
        broker = WarrenProcess(Path(directory) / "data").start()
        try:
            took = asyncio.run(declare_all(broker.url, args.queues, args.concurrency))
            print(
                f"{args.queues} durable queue declares, {args.concurrency} channel(s): "
                f"{took:.2f} s, {args.queues / took:.0f} declares/s"
            )
            restart_started = time.perf_counter()
            broker.stop()
            broker.start()
            print(
                f"restart with {args.queues} queues: {time.perf_counter() - restart_started:.2f} s"
            )
        finally:
            broker.kill()


main()

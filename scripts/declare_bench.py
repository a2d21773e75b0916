"""Declare throughput: N durable queue declares over AMQP against `warren serve` started
from the running interpreter's warrenmq (so the venv picks the checkout).

    .venv/bin/python scripts/declare_bench.py --queues 10000 --concurrency 1|64
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
    names = iter(range(queues))

    async def worker(channel):
        for i in names:
            await channel.queue_declare(f"q{i}", durable=True)

    started = time.perf_counter()
    await asyncio.gather(*(worker(ch) for ch in channels))
    took = time.perf_counter() - started
    await connection.close()
    return took


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queues", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=1)
    args = parser.parse_args()
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

"""What a web console costs the broker it watches: GET `/api/queues` every `every_s` seconds
while a scenario runs (the console's queues view refreshes every second), each request's
time recorded, so `warren bench e2e --poll-api` compares AMQP throughput with and without it.

With `page_size` the request is the console's own (the first page, as RabbitMQ's UI pages
it); with 0 it is the whole list, as a script or dashboard that lists every queue asks.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiohttp

from .client import BenchError


class ApiPoller:
    def __init__(
        self, api_url: str, username: str, password: str, every_s: float, page_size: int
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.path = "/api/queues" + (
            f"?page=1&page_size={page_size}&name=&use_regex=false&pagination=true"
            if page_size
            else ""
        )
        self.authorization = aiohttp.encode_basic_auth(username, password)
        self.every_s = every_s
        self.latencies_ms: list[float] = []
        self.queues_seen = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._poll())

    async def stop(self) -> dict[str, Any]:
        """Stop polling; the polls' figures (a failed poll raises here)."""
        task, self._task = self._task, None
        if task is not None:
            if task.done():
                task.result()
            task.cancel()
        latencies = sorted(self.latencies_ms)
        return {
            "api_polls": len(latencies),
            "api_queues_listed": self.queues_seen,
            "api_poll_ms_p50": round(latencies[len(latencies) // 2], 2) if latencies else None,
            "api_poll_ms_max": round(latencies[-1], 2) if latencies else None,
        }

    async def _poll(self) -> None:
        headers = {"Authorization": self.authorization}
        async with aiohttp.ClientSession(headers=headers) as session:
            while True:
                started = time.perf_counter()
                async with session.get(self.api_url + self.path) as response:
                    if response.status != 200:
                        raise BenchError(f"GET {self.path}: {response.status}")
                    listed = await response.json()
                    # A page says how many queues there are; a whole list is them.
                    self.queues_seen = (
                        listed["total_count"] if isinstance(listed, dict) else len(listed)
                    )
                elapsed = time.perf_counter() - started
                self.latencies_ms.append(elapsed * 1000)
                await asyncio.sleep(max(0.0, self.every_s - elapsed))

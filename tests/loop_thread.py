"""An event loop on a thread of its own, for servers that blocking clients (pika) talk to."""

from __future__ import annotations

import asyncio
import threading

import uvloop


class LoopThread:
    """An event loop running on a daemon thread; call() runs a coroutine there and waits."""

    def __init__(self, new_loop=uvloop.new_event_loop) -> None:
        self.loop = new_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def start(self):
        self.thread.start()
        return self

    def call(self, coroutine, timeout_s: float = 10.0):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()

"""A TCP proxy between two nodes that the fault tests control: the network of a Jepsen test
on one machine, without iptables.

`LinkProxy(source, target, upstream)` listens on a loopback port (`start(port)`; 0: one the
OS picks) that node `source` dials instead of `target`'s own (`upstream`); each accepted
connection is piped both ways. Either direction can be blocked (`block(forward=True)`: what
`source` sends stops reaching `target`; `backward`: the replies) — a blocked direction holds
its bytes, as a cut network with TCP's retransmissions does, and delivers them in order once
healed; `delay_s` holds each chunk that long before passing it on (a slow link: latency, not
a lower rate); `drop()` closes every connection through it (a reset). New connections are
taken while blocked: their bytes wait like the others'.
"""

from __future__ import annotations

import asyncio
import contextlib

CHUNK_BYTES = 1 << 16


class _Gate:
    """One direction of a proxy: open, or blocked; and the delay its bytes take."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.open.set()
        self.delay_s = 0.0


class LinkProxy:
    def __init__(self, source: int, target: int, upstream: tuple[str, int]) -> None:
        self.source = source
        self.target = target
        self.upstream = upstream
        self.forward = _Gate()
        self.backward = _Gate()
        self.connections = 0
        """Connections accepted so far (the tests check nodes dial through here)."""
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._pumps: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    async def start(self, port: int = 0) -> LinkProxy:
        self._server = await asyncio.start_server(self._accepted, "127.0.0.1", port)
        return self

    def block(self, forward: bool = True, backward: bool = True) -> None:
        for gate, blocked in ((self.forward, forward), (self.backward, backward)):
            if blocked:
                gate.open.clear()

    def heal(self) -> None:
        for gate in (self.forward, self.backward):
            gate.open.set()
            gate.delay_s = 0.0

    def delay(self, seconds: float) -> None:
        self.forward.delay_s = self.backward.delay_s = seconds

    def drop(self) -> None:
        """Close every connection through the proxy now, both ends."""
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.drop()
        for pump in list(self._pumps):
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.transport.abort()
            self._writers.discard(writer)
            return
        self._writers.add(up_writer)
        for pump in (
            self._pump(reader, up_writer, self.forward),
            self._pump(up_reader, writer, self.backward),
        ):
            task = asyncio.ensure_future(pump)
            self._pumps.add(task)
            task.add_done_callback(self._pumps.discard)

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, gate: _Gate
    ) -> None:
        """Bytes from `reader` to `writer` through `gate`, each chunk after its delay; chunks
        read while the gate is shut wait for it, in order. The end of one side ends both."""
        in_transit: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        async def deliver() -> None:
            while True:
                due_s, chunk = await in_transit.get()
                await gate.open.wait()
                wait_s = due_s - loop.time()
                if wait_s > 0:
                    await asyncio.sleep(wait_s)
                await gate.open.wait()
                if not chunk:
                    return
                writer.write(chunk)
                await writer.drain()

        delivering = asyncio.ensure_future(deliver())
        try:
            while True:
                await gate.open.wait()
                chunk = await reader.read(CHUNK_BYTES)
                in_transit.put_nowait((loop.time() + gate.delay_s, chunk))
                if not chunk:
                    break
            await delivering
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            delivering.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await delivering
            writer.transport.abort()
            self._writers.discard(writer)

"""The fault tests' network (`fault_proxy.LinkProxy`): bytes pass both ways, a blocked
direction holds its bytes and delivers them in order once healed, a slow link delays them,
and a drop resets every connection."""

from __future__ import annotations

import asyncio
import time

import pytest
from fault_proxy import LinkProxy

SETTLE_S = 0.3


class Echo:
    """An upstream that records what reaches it and echoes it back."""

    def __init__(self) -> None:
        self.received = bytearray()
        self.server: asyncio.Server | None = None

    async def start(self) -> tuple[str, int]:
        self.server = await asyncio.start_server(self._echo, "127.0.0.1", 0)
        return "127.0.0.1", self.server.sockets[0].getsockname()[1]

    async def _echo(self, reader, writer) -> None:
        while chunk := await reader.read(1 << 16):
            self.received += chunk
            writer.write(chunk)
            await writer.drain()
        writer.close()


async def _through_proxy():
    echo = Echo()
    proxy = await LinkProxy(1, 2, await echo.start()).start()
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
    return echo, proxy, reader, writer


async def _closing(echo: Echo, proxy: LinkProxy, writer) -> None:
    writer.transport.abort()
    await proxy.close()
    echo.server.close()


def test_bytes_pass_both_ways_and_the_connection_is_counted():
    async def scenario():
        echo, proxy, reader, writer = await _through_proxy()
        writer.write(b"hello")
        assert await asyncio.wait_for(reader.readexactly(5), 5) == b"hello"
        assert proxy.connections == 1
        await _closing(echo, proxy, writer)

    asyncio.run(scenario())


@pytest.mark.parametrize("forward", [True, False], ids=["forward", "backward"])
def test_a_blocked_direction_holds_its_bytes_and_delivers_them_in_order_once_healed(forward):
    async def scenario():
        echo, proxy, reader, writer = await _through_proxy()
        proxy.block(forward=forward, backward=not forward)
        for part in (b"one,", b"two,", b"three"):
            writer.write(part)
            await asyncio.sleep(0.05)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(reader.readexactly(1), SETTLE_S)
        # Blocked forward, nothing reached upstream; blocked backward, all of it did.
        assert bytes(echo.received) == (b"" if forward else b"one,two,three")
        proxy.heal()
        assert await asyncio.wait_for(reader.readexactly(13), 5) == b"one,two,three"
        await _closing(echo, proxy, writer)

    asyncio.run(scenario())


def test_a_slow_link_delays_each_way_and_heal_ends_the_delay():
    async def scenario():
        echo, proxy, reader, writer = await _through_proxy()
        proxy.delay(0.2)
        started = time.monotonic()
        writer.write(b"x")
        await asyncio.wait_for(reader.readexactly(1), 5)
        assert time.monotonic() - started >= 0.4
        proxy.heal()
        started = time.monotonic()
        writer.write(b"y")
        await asyncio.wait_for(reader.readexactly(1), 5)
        assert time.monotonic() - started < 0.2
        await _closing(echo, proxy, writer)

    asyncio.run(scenario())


def test_a_drop_resets_every_connection_and_new_ones_are_taken():
    async def scenario():
        echo, proxy, reader, writer = await _through_proxy()
        writer.write(b"a")
        await asyncio.wait_for(reader.readexactly(1), 5)
        proxy.drop()
        with pytest.raises((asyncio.IncompleteReadError, ConnectionError)):
            await asyncio.wait_for(reader.readexactly(1), 5)
        again_reader, again_writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        again_writer.write(b"b")
        assert await asyncio.wait_for(again_reader.readexactly(1), 5) == b"b"
        assert proxy.connections == 2
        writer.transport.abort()
        await _closing(echo, proxy, again_writer)

    asyncio.run(scenario())

"""The Raft inter-node transport: frame codec properties and real loopback connections."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st
from ports import free_port

from warrenmq.cluster import auth
from warrenmq.cluster.transport import (
    FrameDecoder,
    FrameTooLarge,
    PeerTransport,
    encode_frame,
)


@given(
    payloads=st.lists(st.binary(max_size=300), max_size=30),
    cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=40),
)
def test_frames_survive_any_split_of_the_stream(payloads, cuts):
    stream = b"".join(encode_frame(p) for p in payloads)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    decoder = FrameDecoder()
    out: list[bytes] = []
    for start, end in zip(points, points[1:], strict=False):
        out.extend(decoder.feed(stream[start:end]))
    assert out == payloads
    assert decoder.buffered_bytes == 0


def test_partial_frame_stays_buffered_until_complete():
    decoder = FrameDecoder()
    frame = encode_frame(b"hello")
    assert decoder.feed(frame[:3]) == []
    assert decoder.feed(frame[3:7]) == []
    assert decoder.buffered_bytes == 7
    assert decoder.feed(frame[7:] + encode_frame(b"")) == [b"hello", b""]


def test_oversized_frame_is_refused_before_buffering_it():
    decoder = FrameDecoder(frame_bytes_max=16)
    assert decoder.feed(encode_frame(b"x" * 16)) == [b"x" * 16]
    with pytest.raises(FrameTooLarge):
        decoder.feed(encode_frame(b"x" * 17)[:4])


async def _until(predicate, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


def _make_transports(count: int):
    addresses = {i: ("127.0.0.1", free_port()) for i in range(1, count + 1)}
    received: dict[int, list[bytes]] = {i: [] for i in addresses}
    transports = {
        i: PeerTransport(i, addresses, received[i].append, backoff_s_min=0.01, backoff_s_max=0.1)
        for i in addresses
    }
    return transports, received


def test_three_peers_exchange_frames_in_order():
    async def scenario():
        transports, received = _make_transports(3)
        for t in transports.values():
            await t.start()
        try:
            await _until(
                lambda: all(
                    t.connected(p)
                    for t in transports.values()
                    for p in transports
                    if p != t.node_id
                )
            )
            for i in range(200):
                transports[1].send(2, b"a%d" % i)
                transports[1].send(3, b"b%d" % i)
                transports[3].send(2, b"c%d" % i)
            await _until(lambda: len(received[2]) == 400 and len(received[3]) == 200)
            from_1 = [f for f in received[2] if f.startswith(b"a")]
            from_3 = [f for f in received[2] if f.startswith(b"c")]
            assert from_1 == [b"a%d" % i for i in range(200)]
            assert from_3 == [b"c%d" % i for i in range(200)]
            assert received[3] == [b"b%d" % i for i in range(200)]
            assert received[1] == []
        finally:
            for t in transports.values():
                await t.close()

    asyncio.run(scenario())


def test_frames_to_an_absent_peer_are_dropped_and_delivery_resumes_when_it_appears():
    async def scenario():
        transports, received = _make_transports(2)
        await transports[1].start()
        try:
            assert transports[1].send(2, b"lost") is False
            assert transports[1].stats.frames_dropped == 1
            await transports[2].start()
            await _until(lambda: transports[1].connected(2))
            assert transports[1].send(2, b"kept")
            await _until(lambda: received[2] == [b"kept"])
        finally:
            for t in transports.values():
                await t.close()

    asyncio.run(scenario())


def test_dialler_reconnects_after_the_connection_drops():
    async def scenario():
        transports, received = _make_transports(2)
        for t in transports.values():
            await t.start()
        try:
            await _until(lambda: transports[1].connected(2))
            transports[1].send(2, b"one")
            await _until(lambda: received[2] == [b"one"])
            transports[2].drop_connections()
            # The redial can be quicker than a poll, so watch the connect count instead.
            await _until(lambda: transports[1].stats.connects >= 2 and transports[1].connected(2))
            transports[1].send(2, b"two")
            await _until(lambda: received[2] == [b"one", b"two"])
        finally:
            for t in transports.values():
                await t.close()

    asyncio.run(scenario())


def test_a_rejected_frame_closes_only_that_connection():
    async def scenario():
        addresses = {1: ("127.0.0.1", free_port()), 2: ("127.0.0.1", free_port())}
        good: list[bytes] = []

        def on_frame(payload: bytes) -> None:
            if payload == b"garbage":
                raise ValueError("undecodable")
            good.append(payload)

        t1 = PeerTransport(1, addresses, lambda p: None, backoff_s_min=0.01, backoff_s_max=0.1)
        t2 = PeerTransport(2, addresses, on_frame, backoff_s_min=0.01, backoff_s_max=0.1)
        await t1.start()
        await t2.start()
        try:
            await _until(lambda: t1.connected(2))
            t1.send(2, b"garbage")
            await _until(lambda: t2.stats.frames_rejected == 1)
            await _until(lambda: t1.stats.connects >= 2 and t1.connected(2))
            t1.send(2, b"fine")
            await _until(lambda: good == [b"fine"])
        finally:
            await t1.close()
            await t2.close()

    asyncio.run(scenario())


def test_frames_for_a_peer_that_stops_reading_are_dropped_at_the_buffer_bound():
    async def scenario():
        # A "peer" that accepts the connection, proves the secret, and never reads again.
        accepted: list[asyncio.StreamWriter] = []

        async def hold(reader, writer):
            await _prove_as_listener(reader, writer, node_id=2)
            accepted.append(writer)

        stalled = await asyncio.start_server(hold, "127.0.0.1", 0)
        stalled_port = stalled.sockets[0].getsockname()[1]
        addresses = {1: ("127.0.0.1", free_port()), 2: ("127.0.0.1", stalled_port)}
        bound = 256 << 10
        t1 = PeerTransport(1, addresses, lambda p: None, send_buffer_bytes_max=bound)
        await t1.start()
        try:
            await _until(lambda: t1.connected(2))
            frame = b"x" * (64 << 10)
            for _ in range(40):
                for _ in range(50):
                    t1.send(2, frame)
                await asyncio.sleep(0.01)
            assert t1.stats.frames_dropped > 0
            buffered = t1._outbound[2].get_write_buffer_size()
            assert buffered <= bound + len(frame) + 4, buffered
        finally:
            await t1.close()
            for writer in accepted:
                writer.close()
            stalled.close()
            await stalled.wait_closed()

    asyncio.run(scenario())


def test_peers_join_move_and_leave_at_runtime():
    async def scenario():
        transports, received = _make_transports(3)
        first = transports[1]
        first.set_addresses({1: first.addresses[1], 2: first.addresses[2]})  # 3 not yet known
        for t in transports.values():
            await t.start()
        try:
            await _until(lambda: first.connected(2))
            assert not first.connected(3) and first.send(3, b"unknown") is False
            first.set_addresses({**first.addresses, 3: transports[3].addresses[3]})
            await _until(lambda: first.connected(3))
            link = first.link(3)
            assert link is not None
            # What was queued before a peer is dropped is still written, then it is closed.
            first.send(3, b"last words")
            first.set_addresses({2: first.addresses[2]})
            await _until(lambda: received[3] == [b"last words"] and not first.connected(3))
            assert first.link(3) is None and first.send(3, b"gone") is False

            # Peer 2 moves: a new transport for it listens elsewhere, and is dialled there.
            await transports[2].close()
            moved_to = ("127.0.0.1", free_port())
            moved: list[bytes] = []
            transports[2] = PeerTransport(
                2, {**transports[2].addresses, 2: moved_to}, moved.append, backoff_s_min=0.01
            )
            await transports[2].start()
            first.set_addresses({2: moved_to})
            await _until(lambda: first.connected(2))
            first.send(2, b"found")
            await _until(lambda: moved == [b"found"])
            assert first.addresses == {1: transports[1].addresses[1], 2: moved_to}
        finally:
            for t in transports.values():
                await t.close()

    asyncio.run(scenario())


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    length = int.from_bytes(await reader.readexactly(4), "big")
    return await reader.readexactly(length)


async def _prove_as_listener(reader, writer, node_id: int, secret: str = "") -> None:
    """The listener's half of the handshake, by hand."""
    challenge = auth.nonce()
    writer.write(encode_frame(challenge))
    hello = await _read_frame(reader)
    peer, peer_nonce, mac = hello[:8], hello[8:24], hello[24:]
    assert auth.proof_valid(secret, auth.RAFT_DIALLER, challenge, int.from_bytes(peer, "big"), mac)
    writer.write(encode_frame(auth.proof(secret, auth.RAFT_LISTENER, peer_nonce, node_id)))
    await writer.drain()


def test_nodes_with_different_secrets_never_exchange_a_frame():
    async def scenario():
        addresses = {1: ("127.0.0.1", free_port()), 2: ("127.0.0.1", free_port())}
        received: dict[int, list[bytes]] = {1: [], 2: []}
        ours = PeerTransport(1, addresses, received[1].append, secret="s3cret", backoff_s_min=0.01)
        theirs = PeerTransport(2, addresses, received[2].append, secret="guess", backoff_s_min=0.01)
        await ours.start()
        await theirs.start()
        try:
            await _until(
                lambda: ours.stats.handshakes_refused >= 2 and theirs.stats.handshakes_refused >= 2
            )
            assert not ours.connected(2) and not theirs.connected(1)
            assert ours.send(2, b"append entries") is False
            assert theirs.send(1, b"append entries") is False
            assert received == {1: [], 2: []}
            assert ours.stats.connects == theirs.stats.connects == 0
        finally:
            await ours.close()
            await theirs.close()

    asyncio.run(scenario())


def test_frames_before_a_valid_hello_are_never_delivered():
    async def scenario():
        addresses = {1: ("127.0.0.1", free_port()), 2: ("127.0.0.1", free_port())}
        received: list[bytes] = []
        listener = PeerTransport(1, addresses, received.append, secret="s3cret")
        await listener.start()
        try:
            host, port = addresses[1]
            # A forged append straight away, then a hello proving a guessed secret.
            reader, writer = await asyncio.open_connection(host, port)
            challenge = await _read_frame(reader)
            writer.write(encode_frame(b"forged append entries"))
            assert await reader.read() == b""  # closed
            writer.close()
            reader, writer = await asyncio.open_connection(host, port)
            challenge = await _read_frame(reader)
            mac = auth.proof("guess", auth.RAFT_DIALLER, challenge, 2)
            writer.write(encode_frame((2).to_bytes(8, "big") + auth.nonce() + mac))
            writer.write(encode_frame(b"forged append entries"))
            assert await reader.read() == b""
            writer.close()
            # A hello that proved the secret on one connection, replayed on another.
            reader, writer = await asyncio.open_connection(host, port)
            challenge = await _read_frame(reader)
            hello = (2).to_bytes(8, "big") + auth.nonce()
            hello += auth.proof("s3cret", auth.RAFT_DIALLER, challenge, 2)
            writer.write(encode_frame(hello))
            assert len(await _read_frame(reader)) == auth.PROOF_BYTES  # welcomed
            writer.close()
            reader, writer = await asyncio.open_connection(host, port)
            await _read_frame(reader)
            writer.write(encode_frame(hello) + encode_frame(b"forged append entries"))
            assert await reader.read() == b""
            writer.close()
            assert received == []
            assert listener.stats.handshakes_refused == 3
        finally:
            await listener.close()

    asyncio.run(scenario())


def test_a_connection_that_never_says_hello_is_closed():
    async def scenario():
        addresses = {1: ("127.0.0.1", free_port()), 2: ("127.0.0.1", free_port())}
        listener = PeerTransport(1, addresses, lambda p: None, handshake_timeout_s=0.2)
        await listener.start()
        try:
            reader, writer = await asyncio.open_connection(*addresses[1])
            await _read_frame(reader)
            # Past the handshake's size bound: refused at once, without buffering it.
            big_reader, big_writer = await asyncio.open_connection(*addresses[1])
            await _read_frame(big_reader)
            big_writer.write((64 << 20).to_bytes(4, "big"))
            assert await asyncio.wait_for(big_reader.read(), 5) == b""
            assert await asyncio.wait_for(reader.read(), 5) == b""
            await _until(lambda: not listener._inbound)
            writer.close()
            big_writer.close()
        finally:
            await listener.close()

    asyncio.run(scenario())


def test_a_listener_that_cannot_prove_the_secret_gets_no_frames():
    async def scenario():
        impostor_heard: list[bytes] = []

        async def impostor(reader, writer):
            # Takes the dialler's hello, answers with a proof of a guessed secret, listens.
            challenge = auth.nonce()
            writer.write(encode_frame(challenge))
            hello = await _read_frame(reader)
            writer.write(encode_frame(auth.proof("guess", auth.RAFT_LISTENER, hello[8:24], 2)))
            impostor_heard.append(await reader.read())

        server = await asyncio.start_server(impostor, "127.0.0.1", 0)
        addresses = {1: ("127.0.0.1", free_port()), 2: server.sockets[0].getsockname()[:2]}
        dialler = PeerTransport(1, addresses, lambda p: None, secret="s3cret", backoff_s_min=0.01)
        await dialler.start()
        try:
            await _until(lambda: dialler.stats.handshakes_refused >= 2)
            assert not dialler.connected(2) and dialler.send(2, b"entries") is False
            assert impostor_heard and all(heard == b"" for heard in impostor_heard)
        finally:
            await dialler.close()
            server.close()
            await server.wait_closed()

    asyncio.run(scenario())

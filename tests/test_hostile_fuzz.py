"""Fuzzing a running `warren serve` with mutated frames over real sockets.

Every connection pipelines a valid handshake, then a session of valid frames (channels,
declares, binds, publishes with content, consumes, acks, transactions, heartbeats) into which
a seeded generator mixes mutations: flipped and random bytes, cut payloads with their size
fixed up (so the decoders see them) or not, wrong sizes, types, channels and frame ends, and
garbage. The broker must answer each connection with frames, a close, or by closing it; after
the run it must still be alive, serve a well-behaved client, and have logged no internal error
(an exception in a handler: a bug).

`make test` sends WARREN_FUZZ_FRAMES frames (default 20,000); `make fuzz` sends 1,000,000.
The seed is WARREN_FUZZ_SEED (default: a new one, printed, so a failure can be replayed).
"""

from __future__ import annotations

import os
import random
import socket
import struct
import threading

import pytest
from hostile import RSS_BYTES_MAX, serves_a_good_client
from pamqp import commands, frame, header
from raw_amqp import PROTOCOL_HEADER

from warrenmq.server.bench.loadgen import read_rss_bytes

FRAMES = int(os.environ.get("WARREN_FUZZ_FRAMES", "20000"))
FRAMES_PER_CONNECTION = 1000
WORKERS = 4
MUTATION_ODDS = 1 / 1000
READ_TIMEOUT_S = 30.0


def _marshal(channel: int, method) -> bytes:
    return frame.marshal(method, channel)


def handshake() -> bytes:
    """A whole client handshake, pipelined (the broker reads it in order)."""
    return (
        PROTOCOL_HEADER
        + _marshal(
            0,
            commands.Connection.StartOk(
                client_properties={"capabilities": {"authentication_failure_close": True}},
                mechanism="PLAIN",
                response="\0guest\0guest",
            ),
        )
        + _marshal(0, commands.Connection.TuneOk(channel_max=16, frame_max=4096, heartbeat=0))
        + _marshal(0, commands.Connection.Open(virtual_host="/"))
    )


def publish(channel: int, routing_key: str, body: bytes, properties=None) -> list[bytes]:
    properties = properties or commands.Basic.Properties()
    frames = [
        _marshal(channel, commands.Basic.Publish(exchange="", routing_key=routing_key)),
        frame.marshal(header.ContentHeader(0, len(body), properties), channel),
    ]
    for start in range(0, len(body), 4088):
        frames.append(struct.pack(">BHI", 3, channel, len(body[start : start + 4088])))
        frames[-1] += body[start : start + 4088] + b"\xce"
    return frames


def session_frames(rng: random.Random, count: int, queue: str) -> list[bytes]:
    """`count` valid frames: a realistic session on channels 1 to 3 (3 transactional)."""
    frames = [_marshal(number, commands.Channel.Open()) for number in (1, 2, 3)]
    frames.append(
        _marshal(
            1,
            commands.Queue.Declare(queue=queue, exclusive=True, arguments={"x-max-length": 50}),
        )
    )
    frames.append(_marshal(1, commands.Confirm.Select()))
    frames.append(_marshal(3, commands.Tx.Select()))
    tag = 0
    while len(frames) < count:
        choice = rng.randrange(16)
        channel = rng.choice((1, 2))
        if choice < 5:
            body = rng.randbytes(rng.choice((0, 10, 300, 5000)))
            properties = commands.Basic.Properties(
                delivery_mode=rng.choice((1, 2)),
                headers={"k": rng.randrange(1000), "nested": {"a": [1, "x"]}},
                priority=rng.randrange(10),
            )
            frames.extend(publish(rng.choice((1, 2, 3)), queue, body, properties))
        elif choice == 5:
            frames.append(_marshal(channel, commands.Basic.Qos(prefetch_count=rng.randrange(20))))
        elif choice == 6:
            frames.append(_marshal(2, commands.Basic.Get(queue=queue)))
        elif choice == 7:
            tag += 1
            frames.append(_marshal(2, commands.Basic.Consume(queue=queue, consumer_tag=f"c{tag}")))
        elif choice == 8:
            frames.append(
                _marshal(2, commands.Basic.Cancel(consumer_tag=f"c{rng.randint(0, tag)}"))
            )
        elif choice == 9:
            frames.append(_marshal(2, commands.Basic.Ack(delivery_tag=0, multiple=True)))
        elif choice == 10:
            frames.append(_marshal(2, commands.Basic.Nack(delivery_tag=0, multiple=True)))
        elif choice == 11:
            frames.append(
                _marshal(1, commands.Queue.Bind(queue=queue, exchange="amq.topic", routing_key="#"))
            )
        elif choice == 12:
            frames.append(_marshal(3, rng.choice((commands.Tx.Commit(), commands.Tx.Rollback()))))
        elif choice == 13:
            frames.append(struct.pack(">BHI", 8, 0, 0) + b"\xce")
        elif choice == 14:
            frames.append(
                _marshal(
                    1, commands.Exchange.Declare(exchange=f"{queue}-x", exchange_type="fanout")
                )
            )
        else:
            frames.append(_marshal(1, commands.Queue.Purge(queue=queue)))
    return frames[:count]


def mutate(rng: random.Random, data: bytes) -> bytes:
    """One frame, damaged in one of the ways hostile or buggy clients damage frames."""
    payload = data[7:-1]
    kind = rng.randrange(9)
    if kind == 0 and payload:
        position = rng.randrange(len(payload))
        payload = payload[:position] + bytes([payload[position] ^ (1 << rng.randrange(8))])
        payload += data[7 + position + 1 : -1]
    elif kind == 1 and payload:
        position = rng.randrange(len(payload))
        payload = payload[:position] + bytes([rng.randrange(256)]) + payload[position + 1 :]
    elif kind == 2:
        payload = payload[: rng.randrange(len(payload) + 1)]
    elif kind == 3:
        payload = payload + rng.randbytes(rng.randrange(1, 64))
    elif kind == 4:
        # The size field lies; what follows is read as the rest of this frame.
        return data[:3] + struct.pack(">I", rng.randrange(1 << 32)) + data[7:]
    elif kind == 5:
        return bytes([rng.randrange(256)]) + data[1:]
    elif kind == 6:
        return data[:1] + struct.pack(">H", rng.randrange(1 << 16)) + data[3:]
    elif kind == 7:
        return data[:-1] + bytes([rng.randrange(256)])
    else:
        return rng.randbytes(rng.randrange(1, 200))
    return data[:3] + struct.pack(">I", len(payload)) + payload + b"\xce"


def run_connection(port: int, rng: random.Random, count: int, queue: str) -> None:
    frames = session_frames(rng, count, queue)
    data = handshake() + b"".join(
        mutate(rng, item) if rng.random() < MUTATION_ODDS else item for item in frames
    )
    with socket.create_connection(("127.0.0.1", port), timeout=READ_TIMEOUT_S) as sock:
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            # Whatever the broker answers, it must end the connection once our side ended.
            while sock.recv(1 << 16):
                pass
        except (ConnectionResetError, BrokenPipeError):
            pass


@pytest.fixture
def warren(tmp_path):
    from brokers import WarrenProcess

    process = WarrenProcess(tmp_path / "data", log_path=tmp_path / "warren.log").start()
    yield process
    process.kill()


def test_mutated_frames_never_crash_the_broker(warren):
    seed = int(os.environ.get("WARREN_FUZZ_SEED") or random.randrange(1 << 32))
    print(f"fuzz seed {seed}, {FRAMES} frames")
    connections = max(1, FRAMES // FRAMES_PER_CONNECTION)
    sent = [0] * WORKERS
    failures: list[BaseException] = []

    def worker(index: int) -> None:
        rng = random.Random(seed * WORKERS + index)
        try:
            for number in range(index, connections, WORKERS):
                count = min(FRAMES_PER_CONNECTION, FRAMES - number * FRAMES_PER_CONNECTION)
                run_connection(warren.port, rng, count, f"fuzz-{seed}-{number}")
                sent[index] += count
        except BaseException as error:
            failures.append(error)

    threads = [threading.Thread(target=worker, args=(index,)) for index in range(WORKERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    assert sum(sent) >= FRAMES
    assert warren.process.poll() is None, warren.log_since_start()[-3000:]
    serves_a_good_client(warren)
    assert read_rss_bytes(warren.process.pid) < RSS_BYTES_MAX
    log = warren.log_since_start()
    assert "internal error" not in log, log[log.index("internal error") - 2000 :][:6000]

"""Commit throughput and latency of a 3-node Raft cluster on loopback, with fsync.

    python -m warrenmq.cluster.bench [--json] [--count 100000] [--inflight 4096]
                                          [--rate 1000] [--latency-seconds 5]
                                          [--data-dir DIR] [--skip-throughput]
                                          [-- NODE OPTIONS, e.g. --no-overlap-fsync]

Starts the node processes (`node.LocalCluster`) in a temporary directory, finds the leader
and drives it with 64-byte PUT commands (the whole encoded command is 64 bytes) over the
client protocol:

* throughput: `count` puts with up to `inflight` outstanding on one connection; a put
  counts when the leader has it committed (fsynced on a quorum) and applied;
* latency: an open-loop schedule of `rate` puts per second for `latency_seconds`; each
  latency runs from the put's scheduled send time to its answer, so a stalled server is
  charged for the puts it delayed (no coordinated omission).

The driver speaks the wire protocol directly (no per-request futures) so that it measures
the cluster rather than the client library; it shares the machine's cores with the nodes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from warrenmq.cluster.kv import (
    KVClient,
    KVError,
    Status,
    decode_response,
    encode_put,
    encode_request,
)
from warrenmq.cluster.local_cluster import LocalCluster
from warrenmq.cluster.transport import FrameDecoder

COMMAND_BYTES = 64
_KEY_BYTES = 12
_KEY_SPACE = 10_000
_NODE_STATS = (
    "role",
    "commit",
    "ready_count",
    "entries_persisted",
    "persist_ms_total",
    "persist_ms_max",
)  # keys repeat, so the state machine (and its snapshots) stays small


def command_for(sequence: int) -> bytes:
    key = b"k%011d" % (sequence % _KEY_SPACE)
    assert len(key) == _KEY_BYTES
    command = encode_put(key, b"v" * (COMMAND_BYTES - 3 - _KEY_BYTES))
    assert len(command) == COMMAND_BYTES
    return command


class _Driver(asyncio.Protocol):
    """Pipelined puts on one connection; records when each was due and when it was answered."""

    def __init__(self, total: int) -> None:
        self._decoder = FrameDecoder()
        self.transport: asyncio.Transport | None = None
        self.due_s = [0.0] * total
        self.latencies_s: list[float] = []
        self.sent = 0
        self.answered = 0
        self.failures = 0
        self.total = total
        self.on_answer: asyncio.Event = asyncio.Event()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, count: int, due_s: float | None = None) -> None:
        assert self.transport is not None
        count = min(count, self.total - self.sent)
        if count <= 0:
            return
        now_s = time.perf_counter() if due_s is None else due_s
        frames = []
        for sequence in range(self.sent, self.sent + count):
            self.due_s[sequence] = now_s
            frames.append(encode_request(sequence, command_for(sequence)))
        self.sent += count
        self.transport.write(b"".join(frames))

    def data_received(self, data: bytes) -> None:
        now_s = time.perf_counter()
        for frame in self._decoder.feed(data):
            request_id, status, _ = decode_response(frame)
            if status is Status.OK:
                self.latencies_s.append(now_s - self.due_s[request_id])
            else:
                self.failures += 1
            self.answered += 1
        self.on_answer.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.on_answer.set()


async def _find_leader(cluster: LocalCluster, timeout_s: float = 20.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for address in cluster.client_addresses():
            client = KVClient([address], request_timeout_s=1.0)
            try:
                status = await client.status()
            except (KVError, OSError):
                continue  # that node is down or busy; ask the next
            finally:
                await client.close()
            if status["role"] == "leader":
                # Leadership counts once the leader can commit; one put proves it.
                probe = KVClient([address], request_timeout_s=5.0)
                try:
                    await probe.put(b"bench-probe", b"1")
                finally:
                    await probe.close()
                return address
        await asyncio.sleep(0.1)
    raise TimeoutError("no leader elected")


async def _connect(address: str, total: int) -> _Driver:
    host, port = address.rsplit(":", 1)
    _, driver = await asyncio.get_running_loop().create_connection(
        lambda: _Driver(total), host, int(port)
    )
    return driver


async def measure_throughput(address: str, count: int, inflight: int) -> dict[str, object]:
    driver = await _connect(address, count)
    started_s = time.perf_counter()
    driver.send(inflight)
    while driver.answered < count:
        driver.on_answer.clear()
        await driver.on_answer.wait()
        if driver.transport is None or driver.transport.is_closing():
            raise ConnectionError("leader closed the connection")
        driver.send(inflight - (driver.sent - driver.answered))
    elapsed_s = time.perf_counter() - started_s
    assert driver.transport is not None
    driver.transport.close()
    latencies = sorted(driver.latencies_s)
    return {
        "commits": count - driver.failures,
        "failures": driver.failures,
        "inflight": inflight,
        "seconds": round(elapsed_s, 3),
        "commits_per_s": round((count - driver.failures) / elapsed_s),
        "p50_ms": round(_percentile(latencies, 0.50) * 1000, 3),
        "p99_ms": round(_percentile(latencies, 0.99) * 1000, 3),
    }


async def measure_latency(address: str, rate_per_s: int, seconds: float) -> dict[str, object]:
    total = int(rate_per_s * seconds)
    driver = await _connect(address, total)
    interval_s = 1.0 / rate_per_s
    started_s = time.perf_counter()
    while driver.sent < total:
        now_s = time.perf_counter()
        due = min(total, int((now_s - started_s) / interval_s) + 1)
        while driver.sent < due:
            # Each put is stamped with its own scheduled time, even if sent late.
            driver.send(1, due_s=started_s + driver.sent * interval_s)
        await asyncio.sleep(interval_s)
    deadline_s = time.perf_counter() + 30
    while driver.answered < total and time.perf_counter() < deadline_s:
        driver.on_answer.clear()
        try:
            await asyncio.wait_for(driver.on_answer.wait(), 1.0)
        except TimeoutError:
            pass
    assert driver.transport is not None
    driver.transport.close()
    latencies = sorted(driver.latencies_s)
    return {
        "rate_per_s": rate_per_s,
        "seconds": seconds,
        "commits": len(latencies),
        "failures": driver.failures + (total - driver.answered),
        "p50_ms": round(_percentile(latencies, 0.50) * 1000, 3),
        "p99_ms": round(_percentile(latencies, 0.99) * 1000, 3),
        "p999_ms": round(_percentile(latencies, 0.999) * 1000, 3),
        "max_ms": round(latencies[-1] * 1000, 3) if latencies else None,
        "mean_ms": round(statistics.fmean(latencies) * 1000, 3) if latencies else None,
    }


def _percentile(sorted_values: Sequence[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


async def _run(cluster: LocalCluster, args: argparse.Namespace) -> dict[str, object]:
    leader = await _find_leader(cluster)
    await measure_throughput(leader, min(5_000, args.count), min(args.inflight, 1_000))  # warm-up
    throughput = (
        None
        if args.skip_throughput
        else await measure_throughput(leader, args.count, args.inflight)
    )
    latency = await measure_latency(leader, args.rate, args.latency_seconds)
    node_stats = {}
    for address in cluster.client_addresses():
        client = KVClient([address], request_timeout_s=2.0)
        try:
            status = await client.status()
        finally:
            await client.close()
        node_stats[str(status["id"])] = {key: status[key] for key in _NODE_STATS}
    return {
        "nodes": cluster.size,
        "fsync": True,
        "command_bytes": COMMAND_BYTES,
        "cpus": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "node_args": list(args.node_args),
        "throughput": throughput,
        "latency": latency,
        "node_stats": node_stats,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m warrenmq.cluster.bench", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    parser.add_argument("--count", type=int, default=100_000, help="puts in the throughput run")
    parser.add_argument(
        "--inflight", type=int, default=4096, help="outstanding puts in the throughput run"
    )
    parser.add_argument("--rate", type=int, default=1000, help="puts per second in the latency run")
    parser.add_argument("--latency-seconds", type=float, default=5.0)
    parser.add_argument(
        "--data-dir", type=Path, default=None, help="default: a temporary directory, removed after"
    )
    parser.add_argument(
        "--skip-throughput", action="store_true", help="run only the latency schedule"
    )
    parser.add_argument(
        "node_args", nargs="*", help="extra node options, after --, e.g. -- --no-overlap-fsync"
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="warren-raft-bench-", dir=args.data_dir) as directory:
        cluster = LocalCluster(Path(directory), size=3, extra_args=tuple(args.node_args))
        with cluster:
            cluster.wait_listening()
            try:
                import uvloop
            except ImportError:
                result = asyncio.run(_run(cluster, args))
            else:
                result = uvloop.run(_run(cluster, args))
    if args.json:
        print(json.dumps(result))
    else:
        t, lat = result["throughput"], result["latency"]
        print(json.dumps(result, indent=2))
        if t is not None:
            print(f"{t['commits_per_s']} commits/s ({t['inflight']} in flight)", file=sys.stderr)
        print(
            f"at {lat['rate_per_s']}/s: p50 {lat['p50_ms']} ms, p99 {lat['p99_ms']} ms",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

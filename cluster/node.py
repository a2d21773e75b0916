"""A Raft node process serving the replicated key-value service.

    python -m warrenmq.cluster.node --id 1 \\
        --peers 1=127.0.0.1:7001,2=127.0.0.1:7002,3=127.0.0.1:7003 \\
        --clients 1=127.0.0.1:8001,2=127.0.0.1:8002,3=127.0.0.1:8003 \\
        --data-dir /var/lib/warren/raft-1

`RaftServer` is a `group.RaftGroup` (the host loop of `core.RaftNode`: ticker, peer
transport, durable storage, snapshots; see its module docstring) replicating `kv.KVStore`,
plus the client protocol of `kv.py` and linearizable reads.

Clients (`kv.KVClient`) may talk to any node: writes and membership changes are redirected
to the leader (NOT_LEADER names its client address), reads are served linearizably by any
node through ReadIndex. Every queue has a bound: proposals waiting to commit pause the
client sockets, reads in progress are refused BUSY, peer send buffers drop frames. A storage
error or a core exception halts the node (fail-stop; exit code 70), a SIGTERM makes a
leader hand over its leadership before it exits.

`local_cluster.LocalCluster` starts such nodes as child processes on free loopback ports (the
kill test and the benchmark use it).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import heapq
import itertools
import json
import logging
import signal
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from warrenmq.cluster.group import Applied, GroupConfig, RaftGroup
from warrenmq.cluster.kv import (
    KVStore,
    Op,
    Status,
    decode_command,
    decode_request,
    encode_not_leader,
    encode_response,
    put_key_end,
)
from warrenmq.cluster.raft.core import LEADER, NotLeader, ProposalRefused, RaftConfig, Ready
from warrenmq.cluster.transport import FrameDecoder

_log = logging.getLogger(__name__)
_READ_CONTEXT = struct.Struct("<Q")


@dataclass(frozen=True, kw_only=True)
class ServerConfig(GroupConfig):
    """The group's settings (`peers` required: the demo always has a transport) and the
    client protocol's."""

    clients: dict[int, tuple[str, int]]
    """Client-protocol address of every voter, so a follower can name the leader's."""
    proposals_pending_max: int = 50_000
    """Stop reading client sockets while this many proposals wait to commit."""
    reads_pending_max: int = 100_000
    """Answer BUSY to reads beyond this many accepted and not yet answered."""
    read_timeout_s: float = 5.0
    """A read whose ReadIndex round never completes (leader lost) is answered RETRY."""
    gc_freeze_entries: int = 10_000
    """A process that is nothing but a Raft node freezes its long-lived objects."""


class _ClientConnection(asyncio.Protocol):
    """One client socket: requests in, coalesced responses out."""

    def __init__(self, server: RaftServer) -> None:
        self._server = server
        self._decoder = FrameDecoder(frame_bytes_max=4 << 20)
        self.transport: asyncio.Transport | None = None
        self._out: list[bytes] = []
        self.open = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.open = True
        self._server._client_connected(self)

    def data_received(self, data: bytes) -> None:
        server = self._server
        try:
            for frame in self._decoder.feed(data):
                request_id, command = decode_request(frame)
                server._on_request(self, request_id, command)
        except ValueError:
            assert self.transport is not None
            self.transport.abort()
            return
        server._kick()

    def respond(self, request_id: int, status: Status, payload: bytes = b"") -> None:
        if not self.open:
            return
        if not self._out:
            asyncio.get_running_loop().call_soon(self._flush)
        self._out.append(encode_response(request_id, status, payload))

    def _flush(self) -> None:
        out, self._out = self._out, []
        if self.open and self.transport is not None:
            self.transport.write(b"".join(out))

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        self._server._client_disconnected(self)


@dataclass
class _ReadBatch:
    requests: list[tuple[_ClientConnection, int, bytes]] = field(default_factory=list)
    deadline_s: float = 0.0


class RaftServer(RaftGroup):
    """One node: a `RaftGroup` replicating the key-value store, and its client service."""

    def __init__(self, config: ServerConfig) -> None:
        self.server_config = config
        self.kv = KVStore()
        super().__init__(config, self.kv)
        self._client_server: asyncio.AbstractServer | None = None
        self._clients: set[_ClientConnection] = set()
        self._reading_paused = False
        self._read_batch: list[tuple[_ClientConnection, int, bytes]] = []
        self._reads_pending = 0  # accepted and not yet answered, wherever they wait
        self._reads_by_context: dict[bytes, _ReadBatch] = {}
        self._reads_waiting: list[tuple[int, int, _ReadBatch]] = []  # heap by read index
        self._read_counter = itertools.count(1)
        self.read_pauses = 0
        self.reads_refused = 0

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        host, port = self.server_config.clients[self.server_config.node_id]
        await super().start()
        self._client_server = await loop.create_server(
            lambda: _ClientConnection(self), host, port, reuse_address=True
        )

    def _close_inputs(self) -> None:
        if self._client_server is not None:
            self._client_server.close()
        for client in list(self._clients):
            if client.transport is not None:
                client.transport.abort()

    # -- requests ----------------------------------------------------------------------

    def _on_request(self, client: _ClientConnection, request_id: int, command: bytes) -> None:
        if put_key_end(command) >= 0:
            self._propose(client, request_id, command)
            return
        # Raises CommandError (a ValueError) on garbage, which drops the connection.
        parsed = decode_command(command)
        op = parsed.op
        if op is Op.PUT or op is Op.CAS:
            self._propose(client, request_id, command)
        elif op is Op.ADD_VOTER or op is Op.REMOVE_VOTER:
            self._propose_membership(client, request_id, op, int.from_bytes(parsed.value, "big"))
        elif op is Op.GET:
            if self.raft.role != LEADER and self.raft.leader_id is None:
                client.respond(request_id, Status.NOT_LEADER, self._leader_hint())
                return
            if self._reads_pending >= self.server_config.reads_pending_max:
                self.reads_refused += 1
                client.respond(request_id, Status.BUSY, b"too many reads in progress")
                return
            self._reads_pending += 1
            self._read_batch.append((client, request_id, parsed.key))
        else:
            client.respond(request_id, Status.OK, json.dumps(self.status()).encode())

    def _propose_membership(
        self, client: _ClientConnection, request_id: int, op: Op, node: int
    ) -> None:
        raft = self.raft
        adding = op is Op.ADD_VOTER
        if raft.role == LEADER and (node in raft.voters) == adding:
            # Already so (possibly by a change still committing): asking again is a no-op,
            # which makes the request safe to retry after an unknown outcome.
            client.respond(request_id, Status.OK)
            return
        if node not in self.server_config.peers:
            client.respond(request_id, Status.REFUSED, f"no address known for node {node}".encode())
            return
        self._propose(
            client, request_id, b"", membership=(node if adding else None, None if adding else node)
        )

    def _propose(
        self,
        client: _ClientConnection,
        request_id: int,
        command: bytes,
        membership: tuple[int | None, int | None] | None = None,
    ) -> None:
        try:
            if membership is None:
                # Leader only: the demo redirects its clients to the leader (NOT_LEADER)
                # rather than forwarding their writes.
                future = self._track(self.raft.propose(command))
            else:
                future = self.propose_membership(add=membership[0], remove=membership[1])
        except NotLeader:
            client.respond(request_id, Status.NOT_LEADER, self._leader_hint())
            return
        except ProposalRefused as exc:
            client.respond(request_id, Status.BUSY, str(exc).encode())
            return
        except Exception as exc:
            self._fail(exc)
            return
        future.add_done_callback(functools.partial(_answer, client, request_id))
        if (
            self.proposals_pending >= self.server_config.proposals_pending_max
            and not self._reading_paused
        ):
            self._reading_paused = True
            self.read_pauses += 1
            for c in self._clients:
                if c.transport is not None:
                    c.transport.pause_reading()

    def _leader_hint(self) -> bytes:
        leader = self.raft.leader_id
        address = self.server_config.clients.get(leader) if leader is not None else None
        return encode_not_leader(leader, f"{address[0]}:{address[1]}" if address else None)

    def _client_connected(self, client: _ClientConnection) -> None:
        self._clients.add(client)
        if self._reading_paused and client.transport is not None:
            client.transport.pause_reading()

    def _client_disconnected(self, client: _ClientConnection) -> None:
        self._clients.discard(client)

    def status(self) -> dict[str, object]:
        return {
            **super().status(),
            "keys": len(self.kv),
            "client_read_pauses": self.read_pauses,
            "reads_pending": self._reads_pending,
            "reads_refused": self.reads_refused,
        }

    # -- hooks of the host loop --------------------------------------------------------

    def _before_ready(self) -> None:
        if self._read_batch:
            batch, self._read_batch = self._read_batch, []
            self._start_read(batch)

    def _after_ready(self, ready: Ready) -> None:
        for read_state in ready.read_states:
            batch = self._reads_by_context.pop(read_state.context, None)
            if batch is not None:
                heapq.heappush(
                    self._reads_waiting, (read_state.index, next(self._read_counter), batch)
                )
        self._serve_reads()
        if (
            self._reading_paused
            and self.proposals_pending < self.server_config.proposals_pending_max // 2
        ):
            self._reading_paused = False
            for client in self._clients:
                if client.transport is not None:
                    client.transport.resume_reading()

    def _after_tick(self, now_s: float) -> None:
        self._expire_reads(now_s)

    def _on_leadership_change(self) -> None:
        self._retry_unconfirmed_reads()

    # -- linearizable reads (ReadIndex) -------------------------------------------------

    def _start_read(self, requests: list[tuple[_ClientConnection, int, bytes]]) -> None:
        """One ReadIndex round for a batch of reads. A follower asks its leader for the
        index (the core forwards it), then serves the reads itself once it has applied
        that far: reads scale over the replicas and stay linearizable."""
        if self.raft.role != LEADER and self.raft.leader_id is None:
            self._answer_reads(requests, Status.NOT_LEADER, self._leader_hint())
            return
        context = _READ_CONTEXT.pack(next(self._read_counter))
        deadline_s = asyncio.get_running_loop().time() + self.server_config.read_timeout_s
        self._reads_by_context[context] = _ReadBatch(requests, deadline_s)
        self.raft.read_index(context)

    def _serve_reads(self) -> None:
        waiting = self._reads_waiting
        applied = self.applied_index
        get = self.kv.get
        while waiting and waiting[0][0] <= applied:
            _, _, batch = heapq.heappop(waiting)
            self._reads_pending -= len(batch.requests)
            for client, request_id, key in batch.requests:
                value = get(key)
                if value is None:
                    client.respond(request_id, Status.NOT_FOUND)
                else:
                    client.respond(request_id, Status.OK, value)

    def _retry_unconfirmed_reads(self) -> None:
        # A ReadIndex round asked of a leader that is no longer ours may never be answered
        # (a deposed leader's round cannot complete); reads are safe to redo, and the client
        # redoes them on RETRY.
        batches, self._reads_by_context = self._reads_by_context, {}
        for batch in batches.values():
            self._answer_reads(batch.requests, Status.RETRY, b"leader changed during the read")

    def _expire_reads(self, now_s: float) -> None:
        expired = [c for c, b in self._reads_by_context.items() if b.deadline_s <= now_s]
        for context in expired:
            requests = self._reads_by_context.pop(context).requests
            self._answer_reads(requests, Status.RETRY, b"read index not confirmed in time")
        # A follower cut off from its leader never applies up to a read's index.
        if self._reads_waiting and any(b.deadline_s <= now_s for _, _, b in self._reads_waiting):
            keep = []
            for item in self._reads_waiting:
                if item[2].deadline_s > now_s:
                    keep.append(item)
                    continue
                self._answer_reads(
                    item[2].requests, Status.RETRY, b"not applied up to the read index in time"
                )
            heapq.heapify(keep)
            self._reads_waiting = keep

    def _answer_reads(
        self, requests: list[tuple[_ClientConnection, int, bytes]], status: Status, payload: bytes
    ) -> None:
        self._reads_pending -= len(requests)
        for client, request_id, _ in requests:
            client.respond(request_id, status, payload)


def _answer(client: _ClientConnection, request_id: int, future: asyncio.Future[Applied]) -> None:
    """Tell a client how its write ended: the store's answer, or RETRY if it is unknown."""
    error = future.exception()
    if error is not None:
        client.respond(request_id, Status.RETRY, str(error).encode())
        return
    result = future.result().result
    if result is None:  # a membership change
        client.respond(request_id, Status.OK)
    else:
        client.respond(request_id, *result)


def _parse_addresses(text: str) -> dict[int, tuple[str, int]]:
    addresses: dict[int, tuple[str, int]] = {}
    for item in text.split(","):
        node, _, address = item.partition("=")
        host, _, port = address.rpartition(":")
        addresses[int(node)] = (host, int(port))
    return addresses


def format_addresses(addresses: dict[int, tuple[str, int]]) -> str:
    return ",".join(f"{n}={h}:{p}" for n, (h, p) in sorted(addresses.items()))


def _argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m warrenmq.cluster.node",
        description="Run one Raft node of the replicated key-value service.",
    )
    parser.add_argument("--id", type=int, required=True)
    parser.add_argument(
        "--peers", required=True, help="id=host:port of every node's Raft transport"
    )
    parser.add_argument("--clients", required=True, help="id=host:port of every node's client port")
    parser.add_argument("--data-dir", required=True, type=Path)
    parser.add_argument(
        "--voters", default=None, help="bootstrap voter ids, e.g. 1,2,3 (default: every peer)"
    )
    parser.add_argument("--tick-ms", type=float, default=10.0)
    parser.add_argument("--election-ticks", type=int, default=30)
    parser.add_argument("--heartbeat-ticks", type=int, default=3)
    parser.add_argument("--max-entries-per-append", type=int, default=4096)
    parser.add_argument("--snapshot-entries", type=int, default=50_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--no-overlap-fsync",
        action="store_true",
        help=(
            "a leader sends its appends only after its own fsync (the strict order; for comparison)"
        ),
    )
    return parser


async def _serve(config: ServerConfig) -> int:
    server = RaftServer(config)
    await server.start()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, lambda: asyncio.ensure_future(server.stop()))
    print(f"raft node {config.node_id} serving", flush=True)
    await server.wait_stopped()
    return 70 if server.fatal_error is not None else 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _argument_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    raft_config = RaftConfig(
        node_id=args.id,
        election_ticks=args.election_ticks,
        heartbeat_ticks=args.heartbeat_ticks,
        max_entries_per_append=args.max_entries_per_append,
    )
    config = ServerConfig(
        node_id=args.id,
        peers=_parse_addresses(args.peers),
        clients=_parse_addresses(args.clients),
        data_dir=args.data_dir,
        voters=tuple(int(v) for v in args.voters.split(",")) if args.voters else None,
        tick_s=args.tick_ms / 1000,
        raft=raft_config,
        snapshot_entries=args.snapshot_entries,
        seed=args.seed,
        overlap_leader_fsync=not args.no_overlap_fsync,
    )
    # Long-lived objects (the log, the store) need not be rescanned by every collection.
    gc.freeze()
    try:
        import uvloop
    except ImportError:
        return asyncio.run(_serve(config))
    return uvloop.run(_serve(config))


if __name__ == "__main__":
    raise SystemExit(main())

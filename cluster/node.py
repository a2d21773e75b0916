"""A Raft node process serving the replicated key-value service.

    python -m warrenmq.cluster.node --id 1 \\
        --peers 1=127.0.0.1:7001,2=127.0.0.1:7002,3=127.0.0.1:7003 \\
        --clients 1=127.0.0.1:8001,2=127.0.0.1:8002,3=127.0.0.1:8003 \\
        --data-dir /var/lib/warren/raft-1

`RaftServer` is the host loop of `core.RaftNode` (see its module docstring): a ticker, the
peer transport (`transport.py`), durable storage (`storage.py`) and the client protocol of
`kv.py`. Everything that arrives in one event-loop iteration (peer frames, client requests,
a tick) is stepped into the core first; the resulting Ready is then handled once, so a burst
of pipelined client writes costs one append and one fsync per Ready, not one per write.
Messages of a Ready leave only after its entries and hard state are durable, with one
exception argued in `_may_send_before_persisting`: a steady leader's appends leave before
its own fsync, so that it overlaps the followers' fsyncs.

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
import gc
import heapq
import itertools
import json
import logging
import random
import signal
import struct
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

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
from warrenmq.cluster.raft.core import (
    LEADER,
    NotLeader,
    ProposalRefused,
    RaftConfig,
    RaftError,
    RaftNode,
    Ready,
)
from warrenmq.cluster.raft.messages import (
    DecodeError,
    Entry,
    EntryKind,
    Message,
    MessageKind,
    decode_message,
    encode_message,
)
from warrenmq.cluster.storage import RaftStorage
from warrenmq.cluster.transport import FrameDecoder, PeerTransport

_log = logging.getLogger(__name__)
_READ_CONTEXT = struct.Struct("<Q")
_READY_ROUNDS_MAX = 64


@dataclass(frozen=True)
class ServerConfig:
    node_id: int
    peers: dict[int, tuple[str, int]]
    """Raft transport address of every voter, this node included."""
    clients: dict[int, tuple[str, int]]
    """Client-protocol address of every voter, so a follower can name the leader's."""
    data_dir: Path
    voters: tuple[int, ...] | None = None
    """The bootstrap voter set (default: every peer). A node that is to join later is
    started with the voters it will join (without itself) and added by ADD_VOTER; the
    configuration then lives in the log and snapshots, which win over this on restart."""
    tick_s: float = 0.01
    raft: RaftConfig | None = None
    snapshot_entries: int = 50_000
    """Compact the log once this many applied entries are held after the last snapshot."""
    proposals_pending_max: int = 50_000
    """Stop reading client sockets while this many proposals wait to commit."""
    reads_pending_max: int = 100_000
    """Answer BUSY to reads beyond this many accepted and not yet answered."""
    read_timeout_s: float = 5.0
    """A read whose ReadIndex round never completes (leader lost) is answered RETRY."""
    seed: int = 0
    gc_freeze_entries: int = 10_000
    """Move every live object to the permanent GC generation after this many applied entries."""
    overlap_leader_fsync: bool = True
    """Let a steady leader's appends leave before its own fsync (see
    _may_send_before_persisting).
    """


def coalesce_appends(messages: Sequence[Message]) -> list[Message]:
    """Merge runs of APPENDs to one peer whose entries follow each other into one APPEND.

    The core sends one APPEND per proposal while its pipeline has room, so a burst of
    pipelined writes would otherwise cost a message (encode, decode, step, ack) per entry.
    The merged APPEND carries the first one's consistency check (index, log_term) and the
    last one's commit; the follower's single ack frees every merged in-flight slot, as the
    leader releases all in-flight appends at or below an acked index.
    """
    out: list[Message] = []
    open_run: dict[int, int] = {}  # peer -> position in `out` of its APPEND still open to merging
    merged: dict[int, tuple[list[Entry], int]] = {}  # position -> (all entries, last commit)
    for m in messages:
        if m.kind is MessageKind.APPEND and m.entries:
            position = open_run.get(m.dst)
            if position is not None:
                head = out[position]
                run = merged.get(position)
                last_index = run[0][-1].index if run is not None else head.entries[-1].index
                if head.term == m.term and last_index == m.index:
                    if run is None:
                        run = merged[position] = (list(head.entries), head.commit)
                    run[0].extend(m.entries)
                    merged[position] = (run[0], m.commit)
                    continue
            open_run[m.dst] = len(out)
        else:
            # Anything else to this peer must stay after the appends sent before it.
            open_run.pop(m.dst, None)
        out.append(m)
    for position, (entries, commit) in merged.items():
        out[position] = replace(out[position], entries=tuple(entries), commit=commit)
    return out


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


class RaftServer:
    """One node: the core, its storage and transport, and the key-value service on top."""

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        node_id = config.node_id
        self.raft_config = config.raft or RaftConfig(node_id=node_id)
        assert self.raft_config.node_id == node_id
        self.storage = RaftStorage.open(config.data_dir)
        hard_state = self.storage.hard_state
        if hard_state is not None and hard_state.commit > self.storage.last_index:
            raise RuntimeError(
                f"stored commit {hard_state.commit} is beyond the log end {self.storage.last_index}"
            )
        self.raft = RaftNode(
            self.raft_config,
            tuple(sorted(config.voters if config.voters is not None else config.peers)),
            random.Random(config.seed * 1_000_003 + node_id),
            hard_state=hard_state,
            snapshot=self.storage.snapshot,
            entries=self.storage.entries(),
        )
        self.kv = KVStore()
        if self.storage.snapshot is not None:
            self.kv.restore(self.storage.snapshot.index, self.storage.snapshot.data)
        self.transport = PeerTransport(node_id, config.peers, self._on_peer_frame)
        self._client_server: asyncio.AbstractServer | None = None
        self._clients: set[_ClientConnection] = set()
        self._reading_paused = False
        # index -> (term it was proposed in, connection, request id)
        self._proposals: dict[int, tuple[int, _ClientConnection, int]] = {}
        self._read_batch: list[tuple[_ClientConnection, int, bytes]] = []
        self._reads_pending = 0  # accepted and not yet answered, wherever they wait
        self._reads_by_context: dict[bytes, _ReadBatch] = {}
        self._reads_waiting: list[tuple[int, int, _ReadBatch]] = []  # heap by read index
        self._read_counter = itertools.count(1)
        self._kick_scheduled = False
        self._was_leader = False
        self._leadership: tuple[int, int | None] = (0, None)
        self._ticker: asyncio.TimerHandle | None = None
        self._next_tick_s = 0.0
        self._stopped = asyncio.Event()
        self.fatal_error: BaseException | None = None
        self.ready_count = 0
        self.entries_persisted = 0
        self.persist_s_total = 0.0
        self.persist_s_max = 0.0
        self.read_pauses = 0
        self.reads_refused = 0
        self._frozen_at_index = 0

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await self.transport.start()
        host, port = self.config.clients[self.config.node_id]
        self._client_server = await loop.create_server(
            lambda: _ClientConnection(self), host, port, reuse_address=True
        )
        self._next_tick_s = loop.time() + self.config.tick_s
        self._ticker = loop.call_at(self._next_tick_s, self._on_tick)
        self._kick()

    async def stop(self, transfer_timeout_s: float = 1.0) -> None:
        """Shut down; a leader first hands its leadership to a peer (Raft §3.10), so a
        planned restart costs the cluster a round trip instead of an election timeout."""
        if self.fatal_error is not None:
            return
        if self.raft.role == LEADER and transfer_timeout_s > 0:
            await self._transfer_leadership_away(transfer_timeout_s)
        if self._ticker is not None:
            self._ticker.cancel()
        if self._client_server is not None:
            self._client_server.close()
        for client in list(self._clients):
            if client.transport is not None:
                client.transport.abort()
        await self.transport.close()
        self.storage.close()
        self._stopped.set()

    async def _transfer_leadership_away(self, timeout_s: float) -> None:
        peers = [
            v for v in self.raft.voters if v != self.config.node_id and self.transport.connected(v)
        ]
        if not peers:
            return
        try:
            self.raft.transfer_leadership(peers[0])
        except RaftError:
            return
        self._kick()
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + timeout_s
        while self.raft.role == LEADER and loop.time() < deadline_s:
            await asyncio.sleep(self.config.tick_s)

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    # -- inputs ------------------------------------------------------------------------

    def _on_tick(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            self.raft.tick()
        except Exception as exc:
            self._fail(exc)
            return
        now_s = loop.time()
        # Keep the tick rate steady: a late tick does not push every later one back.
        self._next_tick_s = max(self._next_tick_s + self.config.tick_s, now_s)
        self._ticker = loop.call_at(self._next_tick_s, self._on_tick)
        self._expire_reads(now_s)
        self._kick()

    def _on_peer_frame(self, frame: bytes) -> None:
        if self.fatal_error is not None or self._stopped.is_set():
            return
        try:
            message = decode_message(frame)
        except DecodeError as exc:
            raise ValueError(str(exc)) from exc  # the transport drops the connection
        if message.dst != self.config.node_id:
            raise ValueError(f"message for node {message.dst} reached node {self.config.node_id}")
        try:
            self.raft.step(message)
        except Exception as exc:
            self._fail(exc)
            return
        self._kick()

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
            if self._reads_pending >= self.config.reads_pending_max:
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
        if node not in self.config.peers:
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
        raft = self.raft
        try:
            if membership is None:
                index = raft.propose(command)
            else:
                index = raft.propose_membership(add=membership[0], remove=membership[1])
        except NotLeader:
            client.respond(request_id, Status.NOT_LEADER, self._leader_hint())
            return
        except ProposalRefused as exc:
            client.respond(request_id, Status.BUSY, str(exc).encode())
            return
        except Exception as exc:
            self._fail(exc)
            return
        superseded = self._proposals.get(index)
        if superseded is not None:
            # Our earlier entry at this index was truncated away: it will never apply.
            superseded[1].respond(superseded[2], Status.RETRY, b"entry was overwritten")
        self._proposals[index] = (raft.term, client, request_id)
        if len(self._proposals) >= self.config.proposals_pending_max and not self._reading_paused:
            self._reading_paused = True
            self.read_pauses += 1
            for c in self._clients:
                if c.transport is not None:
                    c.transport.pause_reading()

    def _leader_hint(self) -> bytes:
        leader = self.raft.leader_id
        address = self.config.clients.get(leader) if leader is not None else None
        return encode_not_leader(leader, f"{address[0]}:{address[1]}" if address else None)

    def _client_connected(self, client: _ClientConnection) -> None:
        self._clients.add(client)
        if self._reading_paused and client.transport is not None:
            client.transport.pause_reading()

    def _client_disconnected(self, client: _ClientConnection) -> None:
        self._clients.discard(client)

    def status(self) -> dict[str, object]:
        raft = self.raft
        return {
            "id": raft.node_id,
            "role": raft.role,
            "term": raft.term,
            "leader": raft.leader_id,
            "commit": raft.commit_index,
            "applied": self.kv.applied_index,
            "last_index": raft.last_index,
            "first_index": raft.first_index,
            "voters": list(raft.voters),
            "keys": len(self.kv),
            "ready_count": self.ready_count,
            "entries_persisted": self.entries_persisted,
            "persist_ms_total": round(self.persist_s_total * 1000, 3),
            "persist_ms_max": round(self.persist_s_max * 1000, 3),
            "frames_dropped": self.transport.stats.frames_dropped,
            "client_read_pauses": self.read_pauses,
            "reads_pending": self._reads_pending,
            "reads_refused": self.reads_refused,
        }

    # -- the host loop -----------------------------------------------------------------

    def _kick(self) -> None:
        if not self._kick_scheduled:
            self._kick_scheduled = True
            asyncio.get_running_loop().call_soon(self._drive)

    def _drive(self) -> None:
        self._kick_scheduled = False
        if self.fatal_error is not None or self._stopped.is_set():
            return
        try:
            self._drive_once()
        except Exception as exc:
            self._fail(exc)

    def _drive_once(self) -> None:
        """Step what is batched into the core, then handle its Ready until it has none."""
        raft = self.raft
        if self._read_batch:
            batch, self._read_batch = self._read_batch, []
            self._start_read(batch)
        for _ in range(_READY_ROUNDS_MAX):
            if not raft.has_ready():
                break
            ready = raft.ready()
            self._handle_ready(ready)
            raft.advance(ready)
        else:
            self._kick()  # still more: yield to the loop rather than spin here
        is_leader = raft.role == LEADER
        if self._was_leader and not is_leader:
            self._on_leadership_lost()
        self._was_leader = is_leader
        leadership = (raft.term, raft.leader_id)
        if leadership != self._leadership:
            self._leadership = leadership
            _log.info(
                "node %d: term %d, leader %s, role %s",
                raft.node_id,
                raft.term,
                raft.leader_id,
                raft.role,
            )
            self._retry_unconfirmed_reads()
        # Everything this iteration had to say is queued: write it now rather than one
        # loop iteration later.
        self.transport.flush()

    def _fail(self, exc: BaseException) -> None:
        """Fail-stop: after a failed fsync or a broken invariant, our promises to the peers
        (votes, acks) may no longer be true of the disk, so the node must not say another
        word. It halts; a restart recovers from what storage really holds."""
        if self.fatal_error is not None:
            return
        self.fatal_error = exc
        traceback.print_exception(exc, file=sys.stderr)
        if self._ticker is not None:
            self._ticker.cancel()
        if self._client_server is not None:
            self._client_server.close()
        for client in list(self._clients):
            if client.transport is not None:
                client.transport.abort()
        self.transport.drop_connections()
        asyncio.ensure_future(self.transport.close())
        self._stopped.set()

    def _handle_ready(self, ready: Ready) -> None:
        self.ready_count += 1
        messages = coalesce_appends(ready.messages)
        send = self.transport.send
        if messages and self._may_send_before_persisting(ready):
            for message in messages:
                send(message.dst, encode_message(message))
            messages = []
            # The writes are flushed now, so followers fsync while we do (the flush would
            # otherwise wait for the next loop iteration, after our fsync).
            self.transport.flush()
        persist_started_s = time.perf_counter()
        self.storage.save(ready.hard_state, ready.entries, ready.snapshot)
        persist_s = time.perf_counter() - persist_started_s
        self.persist_s_total += persist_s
        self.persist_s_max = max(self.persist_s_max, persist_s)
        self.entries_persisted += len(ready.entries)
        if ready.snapshot is not None:
            self._install_snapshot_state(ready.snapshot.index, ready.snapshot.data)
        for message in messages:
            send(message.dst, encode_message(message))
        if ready.committed:
            self._apply(ready.committed)
        for read_state in ready.read_states:
            batch = self._reads_by_context.pop(read_state.context, None)
            if batch is not None:
                heapq.heappush(
                    self._reads_waiting, (read_state.index, next(self._read_counter), batch)
                )
        self._serve_reads()

    def _may_send_before_persisting(self, ready: Ready) -> bool:
        """Whether this Ready's messages may leave before its entries are fsynced.

        A leader may replicate entries it has not yet made durable itself (Raft
        dissertation §10.2.1): its appends promise nothing about its own disk. The danger
        would be counting its own unsynced copy towards a commit; but the followers' acks
        can only be stepped after this callback returns, and `save` below fsyncs before it
        does, so every commit the core computes from them already includes our durable
        copy. This halves commit latency (our fsync overlaps the followers'). It holds
        only while this node was leader for the whole Ready: its term and vote did not
        change in it (a new term or vote must be durable before anyone hears of it).
        """
        if (
            not self.config.overlap_leader_fsync
            or self.raft.role != LEADER
            or ready.snapshot is not None
        ):
            return False
        hard_state = ready.hard_state
        return hard_state is None or self.storage.term_and_vote_durable(
            hard_state.term, hard_state.vote
        )

    def _install_snapshot_state(self, index: int, data: bytes) -> None:
        self.kv.restore(index, data)
        for proposal_index in [i for i in self._proposals if i <= index]:
            _, client, request_id = self._proposals.pop(proposal_index)
            client.respond(request_id, Status.RETRY, b"replaced by a snapshot; outcome unknown")

    def _apply(self, entries: Sequence) -> None:
        kv = self.kv
        proposals = self._proposals
        normal = EntryKind.NORMAL
        for entry in entries:
            index = entry.index
            if index <= kv.applied_index:
                continue  # covered by the snapshot the state machine was restored from
            if entry.kind == normal:
                status, payload = kv.apply(index, entry.data)
            else:
                kv.skip(index)
                status, payload = Status.OK, b""
            proposal = proposals.pop(index, None)
            if proposal is not None:
                term, client, request_id = proposal
                if term == entry.term:
                    client.respond(request_id, status, payload)
                else:
                    client.respond(request_id, Status.RETRY, b"a new leader replaced the entry")
        if self._reading_paused and len(proposals) < self.config.proposals_pending_max // 2:
            self._reading_paused = False
            for client in self._clients:
                if client.transport is not None:
                    client.transport.resume_reading()
        self._maybe_compact()
        if kv.applied_index - self._frozen_at_index >= self.config.gc_freeze_entries:
            # The log entries the core holds (until the next compaction) are long-lived and
            # numerous; a full collection that rescans them all paused a node for up to
            # ~100 ms under load. Frozen objects are still freed by reference counting;
            # only reference cycles among them would outlive us, and the entries, messages
            # and store values have none.
            gc.freeze()
            self._frozen_at_index = kv.applied_index

    def _maybe_compact(self) -> None:
        raft = self.raft
        applied = self.kv.applied_index
        if applied - raft.first_index + 1 < self.config.snapshot_entries:
            return
        snapshot = raft.compact(applied, self.kv.snapshot())
        self.storage.compact(snapshot)

    # -- linearizable reads (ReadIndex) -------------------------------------------------

    def _start_read(self, requests: list[tuple[_ClientConnection, int, bytes]]) -> None:
        """One ReadIndex round for a batch of reads. A follower asks its leader for the
        index (the core forwards it), then serves the reads itself once it has applied
        that far: reads scale over the replicas and stay linearizable."""
        if self.raft.role != LEADER and self.raft.leader_id is None:
            self._answer_reads(requests, Status.NOT_LEADER, self._leader_hint())
            return
        context = _READ_CONTEXT.pack(next(self._read_counter))
        deadline_s = asyncio.get_running_loop().time() + self.config.read_timeout_s
        self._reads_by_context[context] = _ReadBatch(requests, deadline_s)
        self.raft.read_index(context)

    def _serve_reads(self) -> None:
        waiting = self._reads_waiting
        applied = self.kv.applied_index
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

    def _on_leadership_lost(self) -> None:
        # Our uncommitted entries may yet commit under the next leader, or be overwritten;
        # we cannot know which now, and waiting could take until the log grows past them.
        # Tell the clients at once so they can find the new leader (and check, or retry).
        proposals, self._proposals = self._proposals, {}
        for _, client, request_id in proposals.values():
            client.respond(request_id, Status.RETRY, b"leadership lost; outcome unknown")

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

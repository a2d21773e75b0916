"""A small replicated key-value service: its state machine, command and wire codecs, and client.

Commands (the data of a NORMAL Raft entry) and client requests share one encoding, so the
leader proposes the bytes a client sent without decoding and re-encoding them:

    command  = op:u8 key_len:u16 key body
      PUT    body = value
      CAS    body = has_expected:u8 expected_len:u32 expected value
      GET    body = (empty; never proposed: reads go through ReadIndex)
      STATUS key and body empty; never proposed
      ADD_VOTER / REMOVE_VOTER  key empty, body = node id:u64; the leader proposes a
             single-server membership change (a CONFIG entry, not a command)

A client request is `request_id:u32 command` in a length-prefixed frame (the same framing as
the inter-node transport). A response is `request_id:u32 status:u8 payload`:

    OK          payload = the value (GET) or empty (PUT, CAS)
    NOT_FOUND   GET of an absent key
    CAS_FAILED  payload = has_current:u8 current
    NOT_LEADER  payload = leader_id:u32 (0 when unknown) then the leader's client address
                "host:port" in UTF-8 (empty when unknown), so the client redirects
    RETRY       payload = a reason in UTF-8; the outcome of a write is unknown (the leader lost
                its leadership before the entry was known committed), so it may or may not
                apply; a read simply was not served (its ReadIndex round was lost) and is redone
    BUSY        payload = a reason in UTF-8; refused before proposing (too many uncommitted
                entries, leadership transfer), so certainly not applied; clients retry
    REFUSED     payload = a reason in UTF-8; a request that can never succeed as asked

Reads are linearizable on every node: the leader confirms its leadership with a ReadIndex
round, a follower asks the leader for the read index and answers once it has applied that
far. Responses on one connection may come out of request order (a read waits for ReadIndex
while later writes commit); the request id pairs them.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum

from warrenmq.cluster.transport import FrameDecoder, encode_frame


class Op(IntEnum):
    PUT = 1
    CAS = 2
    GET = 3
    STATUS = 4  # node-local: role, term, leader, indexes as JSON; answered by any node
    ADD_VOTER = 5  # membership change through the leader; body = node id:u64
    REMOVE_VOTER = 6


class Status(IntEnum):
    OK = 0
    NOT_FOUND = 1
    CAS_FAILED = 2
    NOT_LEADER = 3
    RETRY = 4
    BUSY = 5
    REFUSED = 6


KEY_BYTES_MAX = 0xFFFF
VALUE_BYTES_MAX = 1 << 20

_KEY_HEAD = struct.Struct(">BH")
_CAS_EXPECTED_HEAD = struct.Struct(">BI")
_REQUEST_HEAD = struct.Struct(">I")
_RESPONSE_HEAD = struct.Struct(">IB")
_LEADER_HEAD = struct.Struct(">I")
_SNAPSHOT_PAIR_HEAD = struct.Struct(">HI")
_NODE_ID = struct.Struct(">Q")


# Enum calls (Op(code)) cost a microsecond each; these lookups sit on the per-command path.
_OP_BY_CODE = {op.value: op for op in Op}
_STATUS_BY_CODE = tuple(sorted(Status, key=lambda status: status.value))
assert [status.value for status in _STATUS_BY_CODE] == list(range(len(_STATUS_BY_CODE)))
_APPLIED_OK = (Status.OK, b"")


def put_key_end(command: bytes) -> int:
    """Where the key of a well-formed PUT ends, or -1 if `command` is not one.

    The hot path (every replica applies every put) checks just this instead of decoding a
    Command object.
    """
    if len(command) < 3 or command[0] != Op.PUT:
        return -1
    key_end = 3 + ((command[1] << 8) | command[2])
    return key_end if len(command) >= key_end else -1


class CommandError(ValueError):
    """Bytes that are not a well-formed command."""


def _check_key_value(key: bytes, value: bytes) -> None:
    if len(key) > KEY_BYTES_MAX:
        raise CommandError(f"key of {len(key)} bytes exceeds {KEY_BYTES_MAX}")
    if len(value) > VALUE_BYTES_MAX:
        raise CommandError(f"value of {len(value)} bytes exceeds {VALUE_BYTES_MAX}")


def encode_put(key: bytes, value: bytes) -> bytes:
    _check_key_value(key, value)
    return _KEY_HEAD.pack(Op.PUT, len(key)) + key + value


def encode_get(key: bytes) -> bytes:
    _check_key_value(key, b"")
    return _KEY_HEAD.pack(Op.GET, len(key)) + key


def encode_status() -> bytes:
    return _KEY_HEAD.pack(Op.STATUS, 0)


def encode_membership(op: Op, node_id: int) -> bytes:
    assert op in (Op.ADD_VOTER, Op.REMOVE_VOTER)
    return _KEY_HEAD.pack(op, 0) + _NODE_ID.pack(node_id)


def encode_cas(key: bytes, expected: bytes | None, value: bytes) -> bytes:
    _check_key_value(key, value)
    if expected is None:
        tail = _CAS_EXPECTED_HEAD.pack(0, 0)
    else:
        _check_key_value(key, expected)
        tail = _CAS_EXPECTED_HEAD.pack(1, len(expected)) + expected
    return _KEY_HEAD.pack(Op.CAS, len(key)) + key + tail + value


@dataclass(frozen=True, slots=True)
class Command:
    op: Op
    key: bytes
    value: bytes = b""
    expected: bytes | None = None


def decode_command(data: bytes) -> Command:
    if len(data) < _KEY_HEAD.size:
        raise CommandError("command shorter than its header")
    op_code, key_len = _KEY_HEAD.unpack_from(data)
    key_end = _KEY_HEAD.size + key_len
    if len(data) < key_end:
        raise CommandError("command shorter than its key")
    key = data[_KEY_HEAD.size : key_end]
    op = _OP_BY_CODE.get(op_code)
    if op is None:
        raise CommandError(f"unknown op {op_code}")
    if op is Op.PUT:
        return Command(op, key, data[key_end:])
    if op is Op.GET or op is Op.STATUS:
        if len(data) != key_end:
            raise CommandError(f"{op.name} carries a body")
        return Command(op, key)
    if op is Op.ADD_VOTER or op is Op.REMOVE_VOTER:
        if len(data) != key_end + _NODE_ID.size:
            raise CommandError(f"{op.name} needs a node id")
        return Command(op, key, data[key_end:])
    if len(data) < key_end + _CAS_EXPECTED_HEAD.size:
        raise CommandError("CAS shorter than its expected-value header")
    has_expected, expected_len = _CAS_EXPECTED_HEAD.unpack_from(data, key_end)
    expected_start = key_end + _CAS_EXPECTED_HEAD.size
    if has_expected not in (0, 1) or len(data) < expected_start + expected_len:
        raise CommandError("CAS expected value is malformed")
    expected = data[expected_start : expected_start + expected_len] if has_expected else None
    return Command(op, key, data[expected_start + expected_len :], expected)


def encode_request(request_id: int, command: bytes) -> bytes:
    return encode_frame(_REQUEST_HEAD.pack(request_id) + command)


def decode_request(payload: bytes) -> tuple[int, bytes]:
    """(request_id, command bytes) of one request frame's payload."""
    if len(payload) < _REQUEST_HEAD.size + _KEY_HEAD.size:
        raise CommandError("request shorter than its header")
    (request_id,) = _REQUEST_HEAD.unpack_from(payload)
    return request_id, payload[_REQUEST_HEAD.size :]


def encode_response(request_id: int, status: Status, payload: bytes = b"") -> bytes:
    return encode_frame(_RESPONSE_HEAD.pack(request_id, status) + payload)


def decode_response(frame: bytes) -> tuple[int, Status, bytes]:
    if len(frame) < _RESPONSE_HEAD.size:
        raise CommandError("response shorter than its header")
    request_id, status = _RESPONSE_HEAD.unpack_from(frame)
    if status >= len(_STATUS_BY_CODE):
        raise CommandError(f"unknown status {status}")
    return request_id, _STATUS_BY_CODE[status], frame[_RESPONSE_HEAD.size :]


def encode_not_leader(leader_id: int | None, client_address: str | None) -> bytes:
    return _LEADER_HEAD.pack(leader_id or 0) + (client_address or "").encode()


def decode_not_leader(payload: bytes) -> tuple[int | None, str | None]:
    (leader_id,) = _LEADER_HEAD.unpack_from(payload)
    address = payload[_LEADER_HEAD.size :].decode()
    return (leader_id or None), (address or None)


class KVStore:
    """The replicated state machine: a dict, changed only by applying committed commands."""

    def __init__(self) -> None:
        self._data: dict[bytes, bytes] = {}
        self.applied_index = 0

    def __len__(self) -> int:
        return len(self._data)

    def get(self, key: bytes) -> bytes | None:
        return self._data.get(key)

    def apply(self, index: int, data: bytes) -> tuple[Status, bytes]:
        """Apply the command committed at `index`; return what its client should hear."""
        assert index > self.applied_index, "entries are applied once, in log order"
        self.applied_index = index
        key_end = put_key_end(data)
        if key_end >= 0:
            self._data[data[3:key_end]] = data[key_end:]
            return _APPLIED_OK
        try:
            command = decode_command(data)
        except CommandError:
            # The leader only proposes commands that decoded, so this is a bug or a
            # foreign writer; every replica skips it the same way, keeping them equal.
            return Status.RETRY, b"undecodable command"
        if command.op is Op.PUT:
            self._data[command.key] = command.value
            return Status.OK, b""
        if command.op is Op.CAS:
            current = self._data.get(command.key)
            if current != command.expected:
                if current is None:
                    return Status.CAS_FAILED, b"\x00"
                return Status.CAS_FAILED, b"\x01" + current
            self._data[command.key] = command.value
            return Status.OK, b""
        return Status.RETRY, f"{command.op.name} is not a command".encode()

    def skip(self, index: int) -> None:
        """Account for a committed entry that is not a command (no-op, membership change)."""
        assert index > self.applied_index
        self.applied_index = index

    def snapshot(self) -> bytes:
        parts = []
        for key, value in self._data.items():
            parts.append(_SNAPSHOT_PAIR_HEAD.pack(len(key), len(value)))
            parts.append(key)
            parts.append(value)
        return b"".join(parts)

    def restore(self, index: int, snapshot: bytes) -> None:
        data: dict[bytes, bytes] = {}
        view = memoryview(snapshot)
        position = 0
        while position < len(view):
            key_len, value_len = _SNAPSHOT_PAIR_HEAD.unpack_from(view, position)
            position += _SNAPSHOT_PAIR_HEAD.size
            key = bytes(view[position : position + key_len])
            position += key_len
            data[key] = bytes(view[position : position + value_len])
            position += value_len
        if position != len(view):
            raise CommandError("snapshot ends inside a pair")
        self._data = data
        self.applied_index = index


class KVError(Exception):
    """A request that did not complete with a definite answer."""


class KVUnavailable(KVError):
    """No leader answered in time; the request did not apply, or its outcome is unknown."""


class CasFailed(KVError):
    def __init__(self, current: bytes | None) -> None:
        super().__init__(f"current value is {current!r}")
        self.current = current


_TIMED_OUT = object()


def _time_out(future: asyncio.Future[tuple[Status, bytes]]) -> None:
    if not future.done():
        future.set_result((_TIMED_OUT, b""))  # type: ignore[arg-type]


class _ClientProtocol(asyncio.Protocol):
    """One connection of a KVClient, with the requests that wait for an answer on it."""

    def __init__(self, client: KVClient) -> None:
        self._client = client
        self._decoder = FrameDecoder()
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.get_running_loop().create_future()
        self.waiting: dict[int, asyncio.Future[tuple[Status, bytes]]] = {}
        self._write_buffer: list[bytes] = []
        self.retired = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self, request_id: int, command: bytes) -> asyncio.Future[tuple[Status, bytes]]:
        future: asyncio.Future[tuple[Status, bytes]] = asyncio.get_running_loop().create_future()
        self.waiting[request_id] = future
        if not self._write_buffer:
            # Pipelined requests issued in one loop iteration leave in one write.
            asyncio.get_running_loop().call_soon(self._flush)
        self._write_buffer.append(encode_request(request_id, command))
        return future

    def _flush(self) -> None:
        frames, self._write_buffer = self._write_buffer, []
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(frames))

    def retire(self) -> None:
        """Take no new requests; close once the ones in flight are answered."""
        self.retired = True
        if not self.waiting and self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        for frame in self._decoder.feed(data):
            request_id, status, payload = decode_response(frame)
            future = self.waiting.pop(request_id, None)
            if future is not None and not future.done():
                future.set_result((status, payload))
        if self.retired and not self.waiting and self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        waiting, self.waiting = self.waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_result((Status.RETRY, b"connection lost; outcome unknown"))
        self._client._on_connection_lost(self)


class KVClient:
    """A pipelining client that follows NOT_LEADER redirects.

    Any number of requests (up to a bound) may be in flight on its connection. A request
    refused with NOT_LEADER (so certainly not applied) is resent to the named leader; a
    request whose connection dies or that hears RETRY has an unknown outcome and raises
    KVUnavailable (the caller decides whether a retry is safe).
    """

    def __init__(
        self,
        addresses: Sequence[str],
        *,
        request_timeout_s: float = 10.0,
        redirect_pause_s: float = 0.05,
        inflight_requests_max: int = 100_000,
    ) -> None:
        assert addresses
        self._addresses = list(addresses)
        self._target = 0
        self._leader_hint: str | None = None
        self.request_timeout_s = request_timeout_s
        self.redirect_pause_s = redirect_pause_s
        self._inflight = asyncio.Semaphore(inflight_requests_max)
        self._protocol: _ClientProtocol | None = None
        self._connecting: asyncio.Future[_ClientProtocol] | None = None
        self._next_request_id = 1
        self._retired: set[_ClientProtocol] = set()

    @property
    def address(self) -> str:
        """The node this client is talking to now (after redirects)."""
        return self._leader_hint or self._addresses[self._target]

    async def put(self, key: bytes, value: bytes) -> None:
        status, payload = await self.request(encode_put(key, value))
        self._expect_ok(status, payload)

    async def cas(self, key: bytes, expected: bytes | None, value: bytes) -> None:
        status, payload = await self.request(encode_cas(key, expected, value))
        if status is Status.CAS_FAILED:
            raise CasFailed(payload[1:] if payload[:1] == b"\x01" else None)
        self._expect_ok(status, payload)

    async def get(self, key: bytes) -> bytes | None:
        status, payload = await self.request(encode_get(key), idempotent=True)
        if status is Status.NOT_FOUND:
            return None
        self._expect_ok(status, payload)
        return payload

    async def add_voter(self, node_id: int) -> None:
        """Make `node_id` a voter; returns once the change is committed. BUSY (another
        change in progress) is retried until the deadline."""
        status, payload = await self.request(encode_membership(Op.ADD_VOTER, node_id))
        self._expect_ok(status, payload)

    async def remove_voter(self, node_id: int) -> None:
        status, payload = await self.request(encode_membership(Op.REMOVE_VOTER, node_id))
        self._expect_ok(status, payload)

    async def status(self) -> dict[str, object]:
        """The status of the node this client is connected to (no redirect)."""
        status, payload = await self.request(encode_status(), idempotent=True)
        self._expect_ok(status, payload)
        return json.loads(payload)

    @staticmethod
    def _expect_ok(status: Status, payload: bytes) -> None:
        if status is Status.RETRY or status is Status.BUSY:
            raise KVUnavailable(payload.decode(errors="replace"))
        if status is Status.REFUSED:
            raise KVError(payload.decode(errors="replace"))
        if status is not Status.OK:
            raise KVError(f"unexpected {status.name}")

    async def request(self, command: bytes, *, idempotent: bool = False) -> tuple[Status, bytes]:
        """Send one command and return its final (status, payload), following redirects.

        An `idempotent` request (a read) is also resent after RETRY or a lost connection,
        until the deadline: doing it twice is harmless.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.request_timeout_s
        async with self._inflight:
            while True:
                remaining_s = deadline - loop.time()
                if remaining_s <= 0:
                    raise KVUnavailable("no leader answered in time")
                protocol = self._protocol
                if protocol is None:
                    try:
                        protocol = await asyncio.wait_for(self._connect(), remaining_s)
                    except (TimeoutError, OSError):
                        self._rotate()
                        await asyncio.sleep(self.redirect_pause_s)
                        continue
                request_id = self._next_request_id
                self._next_request_id = (request_id + 1) & 0xFFFFFFFF or 1
                future = protocol.send(request_id, command)
                # A timer rather than wait_for: wait_for costs a task per request.
                timer = loop.call_later(remaining_s, _time_out, future)
                try:
                    status, payload = await future
                finally:
                    timer.cancel()
                if status is _TIMED_OUT:
                    protocol.waiting.pop(request_id, None)
                    raise KVUnavailable("request timed out; outcome unknown")
                if status is Status.BUSY or (idempotent and status is Status.RETRY):
                    await asyncio.sleep(self.redirect_pause_s)
                    continue
                if status is not Status.NOT_LEADER:
                    return status, payload
                _, leader_address = decode_not_leader(payload)
                self._redirect(protocol, leader_address)
                await asyncio.sleep(self.redirect_pause_s)

    async def _connect(self) -> _ClientProtocol:
        if self._protocol is not None:
            return self._protocol
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._open())
        connecting = self._connecting
        try:
            return await asyncio.shield(connecting)
        finally:
            if connecting.done() and self._connecting is connecting:
                self._connecting = None

    async def _open(self) -> _ClientProtocol:
        host, port = self.address.rsplit(":", 1)
        loop = asyncio.get_running_loop()
        _, protocol = await loop.create_connection(lambda: _ClientProtocol(self), host, int(port))
        self._protocol = protocol
        return protocol

    def _rotate(self) -> None:
        self._leader_hint = None
        self._target = (self._target + 1) % len(self._addresses)

    def _redirect(self, protocol: _ClientProtocol, leader_address: str | None) -> None:
        if self._protocol is not protocol:
            return  # an earlier answer on this connection already moved the client
        if leader_address is None or leader_address == self.address:
            self._rotate()
        else:
            self._leader_hint = leader_address
        self._protocol = None
        # Requests pipelined behind this one still get their own answers (most likely
        # NOT_LEADER too, which is definite); closing now would make them ambiguous.
        self._retired.add(protocol)
        protocol.retire()

    def _on_connection_lost(self, protocol: _ClientProtocol) -> None:
        self._retired.discard(protocol)
        if self._protocol is protocol:
            self._protocol = None
            self._rotate()

    async def close(self) -> None:
        protocols = list(self._retired)
        if self._protocol is not None:
            protocols.append(self._protocol)
        self._protocol = None
        for protocol in protocols:
            if protocol.transport is not None:
                protocol.transport.close()
            await protocol.closed

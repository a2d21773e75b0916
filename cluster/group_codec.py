"""What a `group.RaftGroup` says beyond the Raft messages, as bytes (sans-I/O).

* Peer frames. A Raft message frame starts with its codec version byte
  (`messages.CODEC_VERSION`); the group's own frames start with a kind byte outside that
  range, so the first byte tells them apart and frames from nodes that predate them decode
  as before:
  - PROPOSE (follower -> leader): requests forwarded by a member that does not lead,
    batched per loop iteration: normal proposals and membership changes.
  - PROPOSE_REPLY (leader -> follower): per request, where it was appended (index, term),
    that nothing had to be appended (a membership change already in effect, done once the
    follower applied up to `index`), or a refusal (not the leader + its hint, or the
    reason a leader refused).
  - REMOVED (member -> removed node): your removal is committed.
* HOST log entries (`EntryKind.HOST`): the group's own data in the log, interpreted by the
  group and never handed to the state machine: a member's transport address.
* The group's part of a snapshot: the address map and the ids of removed members, in an
  envelope around the state machine's bytes, which the machine never sees.

Malformed input raises `DecodeError`, which makes the transport drop the connection.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from enum import IntEnum

from warrenmq.cluster.raft.messages import DecodeError

PROPOSE = 0x50
PROPOSE_REPLY = 0x51
REMOVED = 0x52
FRAME_KINDS = frozenset({PROPOSE, PROPOSE_REPLY, REMOVED})
REQUESTS_PER_FRAME_MAX = 1 << 20

_FRAME_HEAD = struct.Struct("<BQI")  # kind, src, count
_REQUEST = struct.Struct("<QBI")  # request id, kind, data length
_REPLY = struct.Struct("<QBQQQI")  # request id, status, index, term, leader (0 = none), reason len
_REMOVED = struct.Struct("<BQ")  # kind, src
_MEMBER = struct.Struct("<BQH")  # host entry tag, node id, port; then the host, UTF-8
_NODE = struct.Struct("<Q")
_HOST_ADDRESS = 1
_SNAPSHOT_MAGIC = b"WRGROUP1"
_SNAPSHOT_HEAD = struct.Struct("<8sI")  # magic, length of the group's state (JSON)


class RequestKind(IntEnum):
    PROPOSE = 0  # data: the state machine's command
    ADD_MEMBER = 1  # data: encode_member
    REMOVE_MEMBER = 2  # data: encode_node


class ReplyStatus(IntEnum):
    APPENDED = 0  # at (index, term): done once that entry applies with that term
    IN_EFFECT = 1  # nothing appended: done once applied up to index
    NOT_LEADER = 2  # leader = the replier's hint (0: unknown)
    REFUSED = 3  # reason: why the leader refused


@dataclass(frozen=True, slots=True)
class Request:
    id: int
    kind: RequestKind
    data: bytes


@dataclass(frozen=True, slots=True)
class Reply:
    id: int
    status: ReplyStatus
    index: int = 0
    term: int = 0
    leader: int = 0
    reason: str = ""


def frame_kind(frame: bytes) -> int:
    if not frame:
        raise DecodeError("empty frame")
    return frame[0]


def encode_propose(src: int, requests: list[Request]) -> bytes:
    parts = [_FRAME_HEAD.pack(PROPOSE, src, len(requests))]
    for request in requests:
        parts.append(_REQUEST.pack(request.id, request.kind, len(request.data)))
        parts.append(request.data)
    return b"".join(parts)


def decode_propose(frame: bytes) -> tuple[int, list[Request]]:
    src, count, offset = _decode_head(frame, PROPOSE)
    requests = []
    for _ in range(count):
        if offset + _REQUEST.size > len(frame):
            raise DecodeError("truncated request")
        request_id, kind, length = _REQUEST.unpack_from(frame, offset)
        offset += _REQUEST.size
        if offset + length > len(frame):
            raise DecodeError("truncated request data")
        try:
            request_kind = RequestKind(kind)
        except ValueError as exc:
            raise DecodeError(f"unknown request kind {kind}") from exc
        requests.append(Request(request_id, request_kind, frame[offset : offset + length]))
        offset += length
    _expect_end(frame, offset)
    return src, requests


def encode_replies(src: int, replies: list[Reply]) -> bytes:
    parts = [_FRAME_HEAD.pack(PROPOSE_REPLY, src, len(replies))]
    for reply in replies:
        reason = reply.reason.encode()
        parts.append(
            _REPLY.pack(reply.id, reply.status, reply.index, reply.term, reply.leader, len(reason))
        )
        parts.append(reason)
    return b"".join(parts)


def decode_replies(frame: bytes) -> tuple[int, list[Reply]]:
    src, count, offset = _decode_head(frame, PROPOSE_REPLY)
    replies = []
    for _ in range(count):
        if offset + _REPLY.size > len(frame):
            raise DecodeError("truncated reply")
        request_id, status, index, term, leader, length = _REPLY.unpack_from(frame, offset)
        offset += _REPLY.size
        if offset + length > len(frame):
            raise DecodeError("truncated reply reason")
        try:
            reply_status = ReplyStatus(status)
            reason = frame[offset : offset + length].decode()
        except ValueError as exc:
            raise DecodeError(f"bad reply: {exc}") from exc
        replies.append(Reply(request_id, reply_status, index, term, leader, reason))
        offset += length
    _expect_end(frame, offset)
    return src, replies


def encode_removed(src: int) -> bytes:
    return _REMOVED.pack(REMOVED, src)


def decode_removed(frame: bytes) -> int:
    if len(frame) != _REMOVED.size or frame[0] != REMOVED:
        raise DecodeError("malformed REMOVED frame")
    return _REMOVED.unpack(frame)[1]


def _decode_head(frame: bytes, kind: int) -> tuple[int, int, int]:
    if len(frame) < _FRAME_HEAD.size:
        raise DecodeError(f"frame of {len(frame)} bytes is shorter than its head")
    frame_kind_, src, count = _FRAME_HEAD.unpack_from(frame, 0)
    if frame_kind_ != kind:
        raise DecodeError(f"frame kind {frame_kind_:#x}, expected {kind:#x}")
    if count > REQUESTS_PER_FRAME_MAX:
        raise DecodeError(f"{count} items in one frame")
    return src, count, _FRAME_HEAD.size


def _expect_end(frame: bytes, offset: int) -> None:
    if offset != len(frame):
        raise DecodeError(f"{len(frame) - offset} trailing bytes after the frame")


# -- request data and HOST entries ---------------------------------------------------------


def encode_member(node_id: int, host: str, port: int) -> bytes:
    """A member's transport address: ADD_MEMBER's data and a HOST entry's."""
    return _MEMBER.pack(_HOST_ADDRESS, node_id, port) + host.encode()


def decode_member(data: bytes) -> tuple[int, str, int]:
    if len(data) < _MEMBER.size or data[0] != _HOST_ADDRESS:
        raise DecodeError("malformed member address")
    _, node_id, port = _MEMBER.unpack_from(data, 0)
    try:
        host = data[_MEMBER.size :].decode()
    except UnicodeDecodeError as exc:
        raise DecodeError("member host is not UTF-8") from exc
    if node_id <= 0 or not host:
        raise DecodeError("member address without a node id or host")
    return node_id, host, port


def encode_node(node_id: int) -> bytes:
    return _NODE.pack(node_id)


def decode_node(data: bytes) -> int:
    if len(data) != _NODE.size:
        raise DecodeError("malformed node id")
    return _NODE.unpack(data)[0]


# -- the group's part of a snapshot ---------------------------------------------------------


@dataclass
class GroupState:
    """What the group itself derives from the log (see the module docstring)."""

    addresses: dict[int, tuple[str, int]] = field(default_factory=dict)
    removed: set[int] = field(default_factory=set)


def wrap_snapshot(state: GroupState, machine_data: bytes) -> bytes:
    own = json.dumps(
        {
            "addresses": {str(n): [h, p] for n, (h, p) in sorted(state.addresses.items())},
            "removed": sorted(state.removed),
        }
    ).encode()
    return _SNAPSHOT_HEAD.pack(_SNAPSHOT_MAGIC, len(own)) + own + machine_data


def unwrap_snapshot(data: bytes) -> tuple[GroupState | None, bytes]:
    """The group's state and the machine's bytes; (None, data) for a snapshot taken before
    groups kept state of their own (the machine's bytes alone)."""
    if len(data) < _SNAPSHOT_HEAD.size or not data.startswith(_SNAPSHOT_MAGIC):
        return None, data
    _, length = _SNAPSHOT_HEAD.unpack_from(data, 0)
    end = _SNAPSHOT_HEAD.size + length
    try:
        own = json.loads(data[_SNAPSHOT_HEAD.size : end])
        addresses = {int(n): (str(h), int(p)) for n, (h, p) in own["addresses"].items()}
        removed = {int(n) for n in own["removed"]}
    except (ValueError, KeyError, TypeError) as exc:
        raise DecodeError(f"malformed group state in a snapshot: {exc}") from exc
    return GroupState(addresses, removed), data[end:]

"""Raft log entries, snapshots and messages, and their compact binary codec.

Everything here is plain data: the core (`core.py`) produces and consumes these values, the
transport ships `encode_message` bytes between nodes, and storage may use `encode_entry` /
`decode_entry` for its records. The codec is fixed-width little-endian `struct` headers
followed by length-prefixed payloads; `decode_message(encode_message(m)) == m` for every
message (tested with hypothesis), and malformed input raises `DecodeError`, never anything
else, so a transport can drop a corrupt frame without crashing.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

CODEC_VERSION = 1
NODE_ID_MAX = (1 << 64) - 1
# Bounds checked on decode so that a corrupt length field cannot make us allocate gigabytes.
ENTRIES_PER_MESSAGE_MAX = 1 << 20
VOTERS_MAX = 1 << 16


class DecodeError(ValueError):
    """The bytes are not a well-formed encoding of the expected value."""


class EntryKind(IntEnum):
    NORMAL = 0
    NOOP = 1  # appended by every new leader so that it can commit its term (Raft §5.4.2)
    CONFIG = 2  # data is encode_voters(new voter set); takes effect when appended (§4.1)
    HOST = 3  # the hosting group's own data (group_codec), never its state machine's


@dataclass(frozen=True, slots=True)
class Entry:
    term: int
    index: int
    kind: EntryKind
    data: bytes


@dataclass(frozen=True, slots=True)
class Snapshot:
    """State machine image covering the log up to and including `index` (whose term is `term`)."""

    index: int
    term: int
    voters: tuple[int, ...]
    data: bytes


class MessageKind(IntEnum):
    PRE_VOTE = 1
    PRE_VOTE_RESP = 2
    VOTE = 3
    VOTE_RESP = 4
    APPEND = 5
    APPEND_RESP = 6
    HEARTBEAT = 7
    HEARTBEAT_RESP = 8
    SNAPSHOT = 9  # InstallSnapshot; answered with APPEND_RESP
    TIMEOUT_NOW = 10  # leadership transfer: campaign now, bypassing pre-vote and lease
    READ_INDEX = 11  # follower asks the leader for a read index; context identifies the read
    READ_INDEX_RESP = 12  # leader answers with index; reject=True if it could not serve it


@dataclass(frozen=True, slots=True)
class Message:
    """One Raft message. Field meaning per kind:

    * PRE_VOTE / VOTE: index, log_term = candidate's last log index and term;
      context = b"transfer" for an election started by TIMEOUT_NOW.
    * *_VOTE_RESP: reject = vote refused.
    * APPEND: index, log_term = index and term of the entry preceding `entries`; commit.
    * APPEND_RESP: accepted -> index = last index known to match the leader;
      rejected -> index = the rejected `index`, reject_hint / log_term = the follower's hint
      for fast backtracking (largest index <= hint with term <= log_term).
    * HEARTBEAT: commit (capped at the follower's match); context = read-index round id.
    * HEARTBEAT_RESP: context echoed back.
    * SNAPSHOT: snapshot.
    * READ_INDEX / READ_INDEX_RESP: context = the caller's read context; index = read index.
    """

    kind: MessageKind
    src: int
    dst: int
    term: int
    log_term: int = 0
    index: int = 0
    commit: int = 0
    entries: tuple[Entry, ...] = ()
    reject: bool = False
    reject_hint: int = 0
    snapshot: Snapshot | None = None
    context: bytes = b""


# version, kind, src, dst, term, log_term, index, commit, reject_hint, n_entries, context_len, flags
_HEADER = struct.Struct("<BBQQQQQQQIIB")
_ENTRY = struct.Struct("<QQBI")  # term, index, kind, data_len
_SNAPSHOT = struct.Struct("<QQII")  # index, term, n_voters, data_len
_U64 = struct.Struct("<Q")
_FLAG_REJECT = 1
_FLAG_SNAPSHOT = 2


def encode_voters(voters: tuple[int, ...] | list[int]) -> bytes:
    """The data of a CONFIG entry: the complete new voter set, sorted."""
    ordered = sorted(set(voters))
    return struct.pack(f"<I{len(ordered)}Q", len(ordered), *ordered)


def decode_voters(data: bytes) -> tuple[int, ...]:
    if len(data) < 4:
        raise DecodeError("voter set shorter than its count")
    (count,) = struct.unpack_from("<I", data, 0)
    if count > VOTERS_MAX or len(data) != 4 + 8 * count:
        raise DecodeError(f"voter set of {count} ids in {len(data)} bytes")
    return tuple(struct.unpack_from(f"<{count}Q", data, 4))


def encode_entry(entry: Entry) -> bytes:
    return _ENTRY.pack(entry.term, entry.index, entry.kind, len(entry.data)) + entry.data


def decode_entry(buf: bytes | memoryview, offset: int = 0) -> tuple[Entry, int]:
    """Decode one entry at `offset`; returns it and the offset just past it."""
    end = offset + _ENTRY.size
    if end > len(buf):
        raise DecodeError("truncated entry header")
    term, index, kind, data_len = _ENTRY.unpack_from(buf, offset)
    if end + data_len > len(buf):
        raise DecodeError("truncated entry data")
    try:
        entry_kind = EntryKind(kind)
    except ValueError as exc:
        raise DecodeError(f"unknown entry kind {kind}") from exc
    return Entry(term, index, entry_kind, bytes(buf[end : end + data_len])), end + data_len


def encode_snapshot(snapshot: Snapshot) -> bytes:
    voters = snapshot.voters
    return b"".join(
        (
            _SNAPSHOT.pack(snapshot.index, snapshot.term, len(voters), len(snapshot.data)),
            struct.pack(f"<{len(voters)}Q", *voters),
            snapshot.data,
        )
    )


def decode_snapshot(buf: bytes | memoryview, offset: int = 0) -> tuple[Snapshot, int]:
    end = offset + _SNAPSHOT.size
    if end > len(buf):
        raise DecodeError("truncated snapshot header")
    index, term, n_voters, data_len = _SNAPSHOT.unpack_from(buf, offset)
    if n_voters > VOTERS_MAX:
        raise DecodeError(f"snapshot with {n_voters} voters")
    voters_end = end + 8 * n_voters
    if voters_end + data_len > len(buf):
        raise DecodeError("truncated snapshot body")
    voters = tuple(struct.unpack_from(f"<{n_voters}Q", buf, end))
    data = bytes(buf[voters_end : voters_end + data_len])
    return Snapshot(index, term, voters, data), voters_end + data_len


def encode_message(m: Message) -> bytes:
    flags = (_FLAG_REJECT if m.reject else 0) | (_FLAG_SNAPSHOT if m.snapshot is not None else 0)
    parts = [
        _HEADER.pack(
            CODEC_VERSION,
            m.kind,
            m.src,
            m.dst,
            m.term,
            m.log_term,
            m.index,
            m.commit,
            m.reject_hint,
            len(m.entries),
            len(m.context),
            flags,
        ),
        m.context,
    ]
    parts.extend(encode_entry(e) for e in m.entries)
    if m.snapshot is not None:
        parts.append(encode_snapshot(m.snapshot))
    return b"".join(parts)


def decode_message(b: bytes | memoryview) -> Message:
    if len(b) < _HEADER.size:
        raise DecodeError(f"message of {len(b)} bytes is shorter than the header")
    (
        version,
        kind,
        src,
        dst,
        term,
        log_term,
        index,
        commit,
        reject_hint,
        n_entries,
        context_len,
        flags,
    ) = _HEADER.unpack_from(b, 0)
    if version != CODEC_VERSION:
        raise DecodeError(f"codec version {version}, expected {CODEC_VERSION}")
    try:
        message_kind = MessageKind(kind)
    except ValueError as exc:
        raise DecodeError(f"unknown message kind {kind}") from exc
    if n_entries > ENTRIES_PER_MESSAGE_MAX:
        raise DecodeError(f"{n_entries} entries in one message")
    if flags & ~(_FLAG_REJECT | _FLAG_SNAPSHOT):
        raise DecodeError(f"unknown flags {flags:#x}")
    offset = _HEADER.size
    if offset + context_len > len(b):
        raise DecodeError("truncated context")
    context = bytes(b[offset : offset + context_len])
    offset += context_len
    entries = []
    for _ in range(n_entries):
        entry, offset = decode_entry(b, offset)
        entries.append(entry)
    snapshot = None
    if flags & _FLAG_SNAPSHOT:
        snapshot, offset = decode_snapshot(b, offset)
    if offset != len(b):
        raise DecodeError(f"{len(b) - offset} trailing bytes after the message")
    return Message(
        kind=message_kind,
        src=src,
        dst=dst,
        term=term,
        log_term=log_term,
        index=index,
        commit=commit,
        entries=tuple(entries),
        reject=bool(flags & _FLAG_REJECT),
        reject_hint=reject_hint,
        snapshot=snapshot,
        context=context,
    )

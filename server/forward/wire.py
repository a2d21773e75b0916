"""The link's messages: a kind byte, then its fields in a fixed order (sans-I/O).

Each message travels as one frame of ``cluster/transport.py``'s framing (a 4-byte length, then
the payload). Fields are packed by a per-kind schema, one letter per field:

* ``Q`` an unsigned 64-bit integer, ``B`` a bool;
* ``s`` a UTF-8 string and ``b`` bytes, each with a 32-bit length;
* ``L`` a list of strings, ``I`` a list of unsigned 64-bit integers, ``M`` a list of bytes,
  each with a 32-bit count;
* ``T`` an AMQP argument table, as the metadata stores it (``metadata/encoding.py``: lossless,
  bytes stay bytes and bools stay bools, which pamqp's table encoder cannot promise).

A message's properties and body travel as the bytes the publisher sent: nothing is decoded
on the way.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from typing import Any

from warrenmq.server.metadata.encoding import table_from_json, table_to_json

MAGIC = b"WRNLINK1"
"""What a link's first frame is preceded by, in place of AMQP's protocol header: the owner's
AMQP listener tells the two apart by the first byte (``W`` against AMQP's ``A``)."""
LINK_FIRST_BYTE = MAGIC[:1]

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


class Kind(enum.IntEnum):
    # entry -> owner
    HELLO = 1
    PUBLISH = 2
    CONSUME = 3
    CREDIT = 4
    SETTLE = 5
    CANCEL = 6
    GET = 7
    PURGE = 8
    DELETE = 9
    STATS = 10
    BARRIER = 11
    # owner -> entry
    WELCOME = 20
    CONFIRM = 21
    NACK = 22
    DELIVER = 23
    CANCELLED = 24
    REPLY = 25
    GOT = 26
    ERROR = 27
    # entry -> owner
    PUBLISH_KEPT = 28
    STREAM_ACK = 29
    APPEND = 30
    # owner -> entry
    CHALLENGE = 31
    # owner -> entry: the answer to STATS
    STATS_REPLY = 32
    # entry -> owner: browse a queue (the DLQ tools), answered by PEEKED
    PEEK = 33
    PEEKED = 34
    # entry -> owner: which boot of the owner runs (`NodeStarted`), answered by REPLY
    BOOT = 35
    # entry -> owner: a redrive task's operation (`server/redrive.py`), answered by REDRIVEN
    REDRIVE = 36
    REDRIVEN = 37
    # entry -> owner: the topic API and consumer groups on a partition led elsewhere
    READ = 38
    TRACKED = 39
    COMMIT_OFFSET = 40
    CONSUME_PARTITION = 41
    # owner -> entry: the answer to READ
    RECORDS = 42
    # entry -> owner: the owner's part of a cluster-wide HTTP API figure, answered by VIEWED
    VIEW = 43
    VIEWED = 44
    # entry -> owner: a consumer group member to the group's coordinator (the node leading
    # the super stream's partition 0)
    GROUP_JOIN = 45
    GROUP_LEAVE = 46
    DRAINED = 47
    GROUP_DESCRIBE = 48
    # owner -> entry: the coordinator to a member's node
    ASSIGN = 49
    REVOKE = 50
    GROUP_CANCELLED = 51
    GROUP_DESCRIBED = 52
    # entry -> owner: a follower node's fetch from the node leading the partitions it
    # follows there (`server/replication.py`), answered by FETCHED whenever the leader has
    # news or the long poll ends
    FETCH = 53
    FETCHED = 54


class Settle(enum.IntEnum):
    ACK = 0
    REJECT = 1
    REQUEUE = 2
    REQUEUE_FAILED = 3


SCHEMAS: dict[Kind, str] = {
    # node id, the entry's nonce, proof over the owner's CHALLENGE nonce (`proof`)
    Kind.HELLO: "Qbb",
    # seq, vhost, queues, exchange, routing key, properties, body, persistent, expiring, BCC keys
    Kind.PUBLISH: "QsLssbbBBL",
    # consumer id, vhost, queue, the client's consumer tag, exclusive, arguments
    Kind.CONSUME: "QsssBT",
    # consumer id, deliveries more it may take
    Kind.CREDIT: "QQ",
    # vhost, queue, Settle, offsets
    Kind.SETTLE: "ssQI",
    # consumer id (answered by a REPLY with the same id once the owner removed it)
    Kind.CANCEL: "Q",
    # request id, vhost, queue
    Kind.GET: "Qss",
    Kind.PURGE: "Qss",
    # request id, vhost, queue, if_unused, if_empty
    Kind.DELETE: "QssBB",
    Kind.STATS: "Qss",
    # the entry node's applied metadata index: what follows needs the owner to have it too
    Kind.BARRIER: "Q",
    # node id, proof over the nonce of the entry's HELLO
    Kind.WELCOME: "Qb",
    # seq through which every publish not nacked is stored
    Kind.CONFIRM: "Q",
    Kind.NACK: "Q",
    # consumer id, then the message: offset, timestamp, exchange, routing key, properties,
    # body, redelivered, delivery count, failed count
    Kind.DELIVER: "QQQbbbbBQQ",
    # consumer id, reason
    Kind.CANCELLED: "Qs",
    # request (or consumer) id, two counts (what they count depends on the request)
    Kind.REPLY: "QQQ",
    # request id, ready count after it, then the message as in DELIVER
    Kind.GOT: "QQQQbbbbBQQ",
    # request (or consumer) id, reply code, reply text
    Kind.ERROR: "QQs",
    # PUBLISH's fields, then the failed deliveries a dead letter carries into its target
    Kind.PUBLISH_KEPT: "QsLssbbBBLQ",
    # consumer id, offsets: a forwarded stream consumer's acks (its credit, its tracked offset)
    Kind.STREAM_ACK: "QI",
    # request id, vhost, stream, exchange, routing key, properties, body: one record the
    # topic API appends, answered by a REPLY(offset, 0) once fsynced, or REPLY(0, 1) for an
    # idempotent producer's duplicate
    Kind.APPEND: "Qssssbb",
    # a fresh nonce the entry's HELLO must prove the secret over, so no hello can be replayed
    Kind.CHALLENGE: "b",
    # request id, the queue's figures (`QueueStats.values`)
    Kind.STATS_REPLY: "QI",
    # request id, vhost, queue, from offset, messages at most
    Kind.PEEK: "QssQQ",
    # request id, then the messages found, a list per field: offsets, timestamps, exchanges,
    # routing keys, properties, bodies, redelivered, delivery counts, failed counts, in flight
    Kind.PEEKED: "QIIMMMMIIII",
    # request id (the REPLY's first count is the owner's boot)
    Kind.BOOT: "Q",
    # request id, operation (start, list, get, cancel, resume), vhost, queue, its argument
    # (start: the spec as JSON; get, cancel, resume: the task id)
    Kind.REDRIVE: "Qssss",
    # request id, the answer as JSON: a task, a list of tasks, or {"error": ..., "reason": ...}
    Kind.REDRIVEN: "Qs",
    # request id, vhost, stream, offset, from the first retained (the offset is ignored),
    # limit, bytes max, timeout_ms: the topic API's GET, answered by RECORDS
    Kind.READ: "QssQBQQQ",
    # request id, vhost, stream, tag: answered by REPLY(end offset, tag's offset + 1 or 0)
    Kind.TRACKED: "Qsss",
    # request id, vhost, stream, tag, offset: answered by REPLY(0, 0) once durable
    Kind.COMMIT_OFFSET: "QsssQ",
    # consumer id, vhost, partition stream, the member's tag, group, the member's arguments
    # (x-stream-offset, filter): one partition of a consumer group, read from the group's
    # committed offset; then as a forwarded stream consumer (CREDIT, DELIVER, STREAM_ACK)
    Kind.CONSUME_PARTITION: "QssssT",
    # request id, next offset, then the records' offsets, timestamps, exchanges, routing
    # keys, properties and bodies
    Kind.RECORDS: "QQIIMMMM",
    # a `cluster/replication/codec.py` FetchRequest, FetchResponse
    Kind.FETCH: "b",
    Kind.FETCHED: "b",
    # request id, the view's name, its argument as JSON (`server/http/node_views.py`)
    Kind.VIEW: "Qss",
    # request id, the owner's part as JSON
    Kind.VIEWED: "Qs",
    # member id (the member's node numbers them on its link), vhost, super stream, group, the
    # member's consumer tag: answered by REPLY(member id, 0, 0) once it is a member
    Kind.GROUP_JOIN: "Qssss",
    # member id: it cancelled or its channel closed (its partitions are let go already)
    Kind.GROUP_LEAVE: "Q",
    # member id, partition index: a revoked partition's deliveries are all acked, and its
    # committed offset is where the member's acks got to
    Kind.DRAINED: "QQ",
    # request id, vhost, super stream, group: answered by GROUP_DESCRIBED
    Kind.GROUP_DESCRIBE: "Qsss",
    # member id, partition index: attach it to the member (from the group's committed offset)
    Kind.ASSIGN: "QQ",
    # member id, partition index: stop delivering it, answer DRAINED once all acked
    Kind.REVOKE: "QQ",
    # member id, reason: the group ended (a partition deleted): cancel the member
    Kind.GROUP_CANCELLED: "Qs",
    # request id, the group as JSON (`Group.describe`; null when it has no members)
    Kind.GROUP_DESCRIBED: "Qs",
}


def _pack_bytes(out: list[bytes], data: bytes) -> None:
    out.append(_U32.pack(len(data)))
    out.append(data)


_PACKERS: dict[str, Callable[[list[bytes], Any], None]] = {
    "Q": lambda out, value: out.append(_U64.pack(value)),
    "B": lambda out, value: out.append(b"\x01" if value else b"\x00"),
    "s": lambda out, value: _pack_bytes(out, value.encode()),
    "b": _pack_bytes,
    "L": lambda out, values: (
        out.append(_U32.pack(len(values))),
        [_pack_bytes(out, value.encode()) for value in values],
    ),
    "I": lambda out, values: (
        out.append(_U32.pack(len(values))),
        out.append(b"".join(_U64.pack(value) for value in values)),
    ),
    "T": lambda out, table: _pack_bytes(out, table_to_json(table).encode()),
    "M": lambda out, values: (
        out.append(_U32.pack(len(values))),
        [_pack_bytes(out, value) for value in values],
    ),
}


def encode(kind: Kind, *fields: Any) -> bytes:
    """One message's payload (frame it with `cluster.transport.encode_frame`)."""
    schema = SCHEMAS[kind]
    assert len(fields) == len(schema), (kind, fields)
    out = [bytes((kind,))]
    for letter, value in zip(schema, fields, strict=True):
        _PACKERS[letter](out, value)
    return b"".join(out)


def decode(payload: bytes) -> tuple[Kind, list[Any]]:
    """(kind, fields) of one payload; ValueError if it is not a whole message."""
    try:
        kind = Kind(payload[0])
        view = memoryview(payload)
        position = 1
        fields: list[Any] = []
        for letter in SCHEMAS[kind]:
            if letter == "Q":
                fields.append(_U64.unpack_from(view, position)[0])
                position += 8
            elif letter == "B":
                fields.append(payload[position] == 1)
                position += 1
            elif letter in "sbT":
                (length,) = _U32.unpack_from(view, position)
                position += 4
                data = payload[position : position + length]
                if len(data) != length:
                    raise ValueError("field runs past the message")
                position += length
                if letter == "s":
                    fields.append(data.decode())
                elif letter == "T":
                    fields.append(table_from_json(data.decode()))
                else:
                    fields.append(data)
            elif letter in "LM":
                (count,) = _U32.unpack_from(view, position)
                position += 4
                chunks: list[Any] = []
                for _ in range(count):
                    (length,) = _U32.unpack_from(view, position)
                    position += 4
                    chunk = payload[position : position + length]
                    if len(chunk) != length:
                        raise ValueError("field runs past the message")
                    chunks.append(chunk.decode() if letter == "L" else chunk)
                    position += length
                fields.append(chunks)
            else:
                (count,) = _U32.unpack_from(view, position)
                position += 4
                end = position + 8 * count
                fields.append([value for (value,) in _U64.iter_unpack(view[position:end])])
                position = end
        if position != len(payload):
            raise ValueError("bytes left over after the message")
        return kind, fields
    except (IndexError, struct.error, UnicodeDecodeError) as error:
        raise ValueError(f"malformed link message: {error}") from error


class Role(enum.IntEnum):
    """Which end proves the secret (`cluster.auth`): part of the proof, so one end's proof can
    never be reflected back as the other's."""

    ENTRY = 1
    OWNER = 2

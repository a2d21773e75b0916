"""A compact binary form of the replication messages (little-endian, struct-based).

    message        u8 kind, then the kind's body; nothing may follow it
    key            u8 type (0 bytes, 1 UTF-8 str), u16 length, the bytes
    PartitionState (1)  u8 n, n x i32 replicas, i32 leader, i64 leader_epoch,
                        u8 m, m x i32 isr, i64 partition_epoch
    FetchRequest   (2)  u64 request_id, i32 replica, u32 max_bytes, u32 max_wait_ms,
                        u32 n, n x (key, i64 leader_epoch, i64 epoch),
                        u32 m, m x (key, i64 leader_epoch, i64 fetch_offset, i64 durable_offset)
    FetchResponse  (3)  u64 request_id, u32 n, n x (key, u8 error, i64 epoch, i64 end_offset),
                        u32 m, m x (key, u8 error, i64 high_watermark, i64 log_start,
                                    u32 length, the stored batches)
    AlterIsr       (4)  key, i32 leader, i64 leader_epoch, i64 partition_epoch,
                        u8 n, n x i32 isr

`decode` raises CodecError, and nothing else, on any input that is not exactly one message.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from .messages import (
    AlterIsr,
    EpochAnswer,
    EpochQuery,
    FetchedPartition,
    FetchError,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    Message,
    PartitionKey,
    PartitionState,
)

KIND_PARTITION_STATE = 1
KIND_FETCH_REQUEST = 2
KIND_FETCH_RESPONSE = 3
KIND_ALTER_ISR = 4

_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_KEY_HEAD = struct.Struct("<BH")
_STATE_EPOCHS = struct.Struct("<iq")
_REQUEST_HEAD = struct.Struct("<QiII")
_QUERY = struct.Struct("<qq")
_FETCH_PARTITION = struct.Struct("<qqq")
_ANSWER = struct.Struct("<Bqq")
_FETCHED_HEAD = struct.Struct("<BqqI")
_RESPONSE_HEAD = struct.Struct("<Q")
_ALTER_HEAD = struct.Struct("<iqq")

_KEY_BYTES = 0
_KEY_STR = 1


class CodecError(ValueError):
    """Bytes that do not decode to exactly one replication message."""


def encode(message: Message) -> bytes:
    """The message's bytes. Raises CodecError when a field does not fit its wire type."""
    parts: list[bytes] = []
    try:
        if isinstance(message, PartitionState):
            parts.append(_U8.pack(KIND_PARTITION_STATE))
            _put_nodes(parts, message.replicas)
            parts.append(_STATE_EPOCHS.pack(message.leader, message.leader_epoch))
            _put_nodes(parts, message.isr)
            parts.append(_I64.pack(message.partition_epoch))
        elif isinstance(message, FetchRequest):
            parts.append(_U8.pack(KIND_FETCH_REQUEST))
            parts.append(
                _REQUEST_HEAD.pack(
                    message.request_id, message.replica, message.max_bytes, message.max_wait_ms
                )
            )
            parts.append(_U32.pack(len(message.queries)))
            for query in message.queries:
                _put_key(parts, query.key)
                parts.append(_QUERY.pack(query.leader_epoch, query.epoch))
            parts.append(_U32.pack(len(message.partitions)))
            for partition in message.partitions:
                _put_key(parts, partition.key)
                parts.append(
                    _FETCH_PARTITION.pack(
                        partition.leader_epoch, partition.fetch_offset, partition.durable_offset
                    )
                )
        elif isinstance(message, FetchResponse):
            parts.append(_U8.pack(KIND_FETCH_RESPONSE))
            parts.append(_RESPONSE_HEAD.pack(message.request_id))
            parts.append(_U32.pack(len(message.answers)))
            for answer in message.answers:
                _put_key(parts, answer.key)
                parts.append(_ANSWER.pack(answer.error, answer.epoch, answer.end_offset))
            parts.append(_U32.pack(len(message.partitions)))
            for fetched in message.partitions:
                _put_key(parts, fetched.key)
                parts.append(
                    _FETCHED_HEAD.pack(
                        fetched.error,
                        fetched.high_watermark,
                        fetched.log_start,
                        len(fetched.records),
                    )
                )
                parts.append(bytes(fetched.records))
        elif isinstance(message, AlterIsr):
            parts.append(_U8.pack(KIND_ALTER_ISR))
            _put_key(parts, message.key)
            parts.append(
                _ALTER_HEAD.pack(message.leader, message.leader_epoch, message.partition_epoch)
            )
            _put_nodes(parts, message.isr)
        else:
            raise CodecError(f"not a replication message: {type(message).__name__}")
    except struct.error as exc:
        raise CodecError(f"{type(message).__name__} does not fit the wire format: {exc}") from None
    return b"".join(parts)


def _put_key(parts: list[bytes], key: PartitionKey) -> None:
    if isinstance(key, str):
        data, kind = key.encode(), _KEY_STR
    elif isinstance(key, bytes):
        data, kind = key, _KEY_BYTES
    else:
        raise CodecError(f"a partition key is bytes or str, not {type(key).__name__}")
    parts.append(_KEY_HEAD.pack(kind, len(data)))
    parts.append(data)


def _put_nodes(parts: list[bytes], nodes: tuple[int, ...]) -> None:
    parts.append(_U8.pack(len(nodes)))
    parts.append(struct.pack(f"<{len(nodes)}i", *nodes))


class _Reader:
    __slots__ = ("data", "at")

    def __init__(self, data: bytes | memoryview) -> None:
        self.data = memoryview(data)
        self.at = 0

    def take(self, layout: struct.Struct) -> tuple:
        try:
            values = layout.unpack_from(self.data, self.at)
        except struct.error:
            raise CodecError(f"message ends inside a field at byte {self.at}") from None
        self.at += layout.size
        return values

    def raw(self, length: int) -> bytes:
        end = self.at + length
        if end > len(self.data):
            raise CodecError(f"message ends inside a {length}-byte field at byte {self.at}")
        value = bytes(self.data[self.at : end])
        self.at = end
        return value

    def key(self) -> PartitionKey:
        kind, length = self.take(_KEY_HEAD)
        data = self.raw(length)
        if kind == _KEY_BYTES:
            return data
        if kind == _KEY_STR:
            try:
                return data.decode()
            except UnicodeDecodeError:
                raise CodecError("a str partition key is not UTF-8") from None
        raise CodecError(f"unknown partition key type {kind}")

    def nodes(self) -> tuple[int, ...]:
        (count,) = self.take(_U8)
        return struct.unpack(f"<{count}i", self.raw(4 * count))

    def count(self, item_bytes_min: int) -> int:
        (count,) = self.take(_U32)
        # Bound the loop by what the bytes can hold, so a forged count costs nothing.
        if count * item_bytes_min > len(self.data) - self.at:
            raise CodecError(f"count {count} overruns the message at byte {self.at}")
        return count

    def error(self, value: int) -> FetchError:
        try:
            return FetchError(value)
        except ValueError:
            raise CodecError(f"unknown fetch error code {value}") from None


def _decode_state(reader: _Reader) -> PartitionState:
    replicas = reader.nodes()
    leader, leader_epoch = reader.take(_STATE_EPOCHS)
    isr = reader.nodes()
    (partition_epoch,) = reader.take(_I64)
    return PartitionState(replicas, leader, leader_epoch, isr, partition_epoch)


def _decode_request(reader: _Reader) -> FetchRequest:
    request_id, replica, max_bytes, max_wait_ms = reader.take(_REQUEST_HEAD)
    queries = tuple(
        EpochQuery(reader.key(), *reader.take(_QUERY))
        for _ in range(reader.count(_KEY_HEAD.size + _QUERY.size))
    )
    partitions = tuple(
        FetchPartition(reader.key(), *reader.take(_FETCH_PARTITION))
        for _ in range(reader.count(_KEY_HEAD.size + _FETCH_PARTITION.size))
    )
    return FetchRequest(request_id, replica, max_bytes, max_wait_ms, queries, partitions)


def _decode_response(reader: _Reader) -> FetchResponse:
    (request_id,) = reader.take(_RESPONSE_HEAD)
    answers = []
    for _ in range(reader.count(_KEY_HEAD.size + _ANSWER.size)):
        key = reader.key()
        error, epoch, end_offset = reader.take(_ANSWER)
        answers.append(EpochAnswer(key, reader.error(error), epoch, end_offset))
    partitions = []
    for _ in range(reader.count(_KEY_HEAD.size + _FETCHED_HEAD.size)):
        key = reader.key()
        error, high_watermark, log_start, length = reader.take(_FETCHED_HEAD)
        partitions.append(
            FetchedPartition(
                key, reader.error(error), high_watermark, log_start, reader.raw(length)
            )
        )
    return FetchResponse(request_id, tuple(answers), tuple(partitions))


def _decode_alter_isr(reader: _Reader) -> AlterIsr:
    key = reader.key()
    leader, leader_epoch, partition_epoch = reader.take(_ALTER_HEAD)
    return AlterIsr(key, leader, leader_epoch, partition_epoch, reader.nodes())


_DECODERS: dict[int, Callable[[_Reader], Message]] = {
    KIND_PARTITION_STATE: _decode_state,
    KIND_FETCH_REQUEST: _decode_request,
    KIND_FETCH_RESPONSE: _decode_response,
    KIND_ALTER_ISR: _decode_alter_isr,
}


def decode(data: bytes | memoryview) -> Message:
    """The one message `data` holds. Raises CodecError on anything else."""
    reader = _Reader(data)
    (kind,) = reader.take(_U8)
    decoder = _DECODERS.get(kind)
    if decoder is None:
        raise CodecError(f"unknown replication message kind {kind}")
    message = decoder(reader)
    if reader.at != len(reader.data):
        raise CodecError(f"{len(reader.data) - reader.at} bytes follow the message")
    return message

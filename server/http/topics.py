"""The topic API (Warren's, from the seed design): streams and super streams as topics over
HTTP, a second adapter over the same core as AMQP.

    POST /topics/{topic}/messages                 append records; their partitions and offsets
    GET  /topics/{topic}/messages?partition=&offset=&limit=&timeout_ms=
                                                  records from an offset, long polling
    POST /consumer/commit                         {"group", "topic", "offsets": [...]}
    GET  /consumer/offsets?group=G[&topic=T]      a group's committed offsets

Every path takes `?vhost=` (default "/"): the seed's paths name none. An unknown vhost or
topic is 404 {"error": "Object Not Found", "reason": "Not Found"}, as the management API
answers; a topic name longer than 255 bytes (no queue or exchange can have one) is 400.

A topic is a super stream (its partitions in their order: partition i is `NAME-i`) or else a
stream (one partition, 0). In a cluster a partition another node leads is read, appended to
and committed on that node, through the link (`forward`), by the same code as here.

The same records are seen over AMQP: a record is stored as an AMQP publisher's message would
be, body = value, routing key = key (UTF-8, at most 255 bytes), headers = the AMQP headers,
persistent.

POST body: {"records": [{"key"?, "value", "partition"?, "headers"?, "sequence"?}, ...],
"key_format"?, "value_format"?, "producer"?}, or one record's fields at the top level.
`key_format` and `value_format` are "json" (any JSON value, stored as its compact JSON
text), "string" (a JSON string, stored as UTF-8) or "base64" (bytes); a key is "string" and
a value "json" unless the request says otherwise. A record goes to its
`partition` when it names one; else, on a super stream, where the core's publish through the
super stream exchange routes its key (as an AMQP publisher's, `x-stream-partition` header
included); else to partition 0. The reply, {"offsets": [{"partition", "offset"}, ...]} in
the records' order, comes only once every record is fsynced: the commit a publisher confirm
waits for. With "producer" (a name) each record needs a "sequence" (a whole number growing
with each new record): they become the `x-producer-id` and `x-producer-sequence` headers of
the idempotent producers (`stream/producers.py`), so a retried POST appends nothing twice;
a record dropped as a duplicate is answered {"partition", "offset": null, "duplicate": true}.
A POST needs write permission on the super stream's exchange (the AMQP publish's check), or
on the stream itself (the check RabbitMQ's stream protocol makes of a publisher).

GET answers {"records": [{"partition", "offset", "timestamp" (ms), "key", "value",
"headers"}], "next_offset"} with at most `limit` (1 to 10,000, default 100; about 8 MiB)
fsynced records from `offset` (default: the first retained; below it, the first retained),
read through the stream's own read path. When there are none yet it waits, up to
`timeout_ms` (0 to 60,000, default 0), for the tick to wake it once one is fsynced: no
polling. `key_format` and `value_format` are as for POST, with the same defaults; a key or value
that is not valid in the asked format (text that is not JSON, bytes that are not UTF-8)
comes as "string" if it is UTF-8, else "base64", and the record says so in "key_format" or
"value_format". A record without a routing key has key null. A GET needs read permission on
the partition's stream, as basic.consume.

Committed offsets are the consumer groups' own (`stream/groups.py`): group G's offset on a
partition is the partition stream's tracked offset under the tag `group:G`, durable before
the reply (204). It means what Kafka's committed offset means and what Warren's tracked
offset already is (the end of the contiguous acked prefix): the offset of the next record to
read; every record below it is done. An AMQP member of G resumes from it, and what AMQP
members ack is what GET /consumer/offsets shows. A commit to a super stream while G has AMQP
members is refused (409): their acks commit its offsets. Committing needs read permission on
each partition stream (what consuming it needs); an offset beyond a partition's end is 400.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from pamqp import commands

from warrenmq.amqp import frames, replies
from warrenmq.amqp.properties import HEADERS_FLAG_BYTE0
from warrenmq.exchanges.binding import EXCHANGE, QUEUE
from warrenmq.exchanges.errors import NotFound, RoutingError
from warrenmq.exchanges.super_stream import SuperStreamExchange
from warrenmq.log import Record
from warrenmq.server.forward.entry import RemoteQueue
from warrenmq.server.stream.groups import group_tag
from warrenmq.server.stream.producers import PRODUCER_ID, PRODUCER_SEQUENCE
from warrenmq.server.stream.stream import Stream
from warrenmq.server.vhost import VirtualHost

from .api import Call, no_content, reply, sync
from .errors import ApiError, bad_request, object_not_found, refused
from .exchanges import Stored, channel_error
from .values import integer, json_type, text, to_amqp, to_json

NAME_BYTES_MAX = 255
FORMATS = ("json", "string", "base64")
# A key is a routing key, text; a value is a body, JSON unless said otherwise.
DEFAULT_FORMATS = {"key_format": "string", "value_format": "json"}
RECORDS_PER_POST_MAX = 10_000
LIMIT_DEFAULT = 100
LIMIT_MAX = 10_000
# What one GET reads from the log (at least one record): each is held until the reply is sent.
READ_BYTES_MAX = 8 << 20
TIMEOUT_MS_MAX = 60_000
_SENDER_SELECTED = ("CC", "BCC")
_PERSISTENT = 2
_PLAIN_PROPERTIES = frames.encode_properties(commands.Basic.Properties(delivery_mode=_PERSISTENT))


@dataclass(frozen=True, slots=True)
class Topic:
    name: str
    exchange: str | None
    """The super stream's exchange; None for a stream."""
    partitions: list[Stream | RemoteQueue]
    """Each a stream led here or a `RemoteQueue` standing for one another node leads."""


def _checked_name(kind: str, name: str) -> str:
    size = len(name.encode())
    if size > NAME_BYTES_MAX:
        raise bad_request(f"{kind} should be less than 255 bytes, actually was {size}")
    return name


def topic_of(vhost: VirtualHost, name: str) -> Topic:
    """The super stream, else the stream, called `name` (404 when neither is)."""
    exchange = vhost.router.get(_checked_name("topic", name))
    if exchange is not None and isinstance(exchange.table, SuperStreamExchange):
        partitions = [_stream(vhost, d.name) for d in exchange.table.partitions()]
        streams = [p for p in partitions if p is not None]
        if streams and len(streams) == len(partitions):
            return Topic(name, name, streams)
        raise object_not_found()
    stream = _stream(vhost, name)
    if stream is not None:
        return Topic(name, None, [stream])
    raise object_not_found()


def _stream(vhost: VirtualHost, name: str) -> Stream | RemoteQueue | None:
    """The stream `name`, led here or elsewhere (None: no stream)."""
    queue = vhost.queues.get(name)
    if isinstance(queue, Stream):
        return queue
    remote = vhost.remote.get(name)
    if remote is not None and remote.queue_type == Stream.queue_type:
        return remote
    return None


def topics_of(vhost: VirtualHost) -> list[Topic]:
    """Every topic of a vhost: the super streams, then the streams that are no partition."""
    topics = []
    for exchange in vhost.router.exchanges():
        if isinstance(exchange.table, SuperStreamExchange):
            try:
                topics.append(topic_of(vhost, exchange.name))
            except ApiError:
                continue
    partitions = {stream.name for topic in topics for stream in topic.partitions}
    for queue in [*vhost.queues.values(), *vhost.remote.values()]:
        stream = _stream(vhost, queue.name)
        if stream is not None and stream.name not in partitions:
            topics.append(Topic(stream.name, None, [stream]))
    return topics


def _format(given: Any, key: str) -> str:
    chosen = given.get(key, DEFAULT_FORMATS[key])
    if chosen not in FORMATS:
        raise bad_request(f"{key} must be one of {', '.join(FORMATS)}")
    return chosen


def _field(index: int, part: str = "") -> str:
    """How a refusal names a record's field (built only for a refusal: POSTs are hot)."""
    return f"records[{index}]{part}"


def _bytes(value: Any, given_as: str, index: int, part: str) -> bytes:
    """A record's key or value, in its format, as the bytes stored."""
    if given_as == "json":
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    if not isinstance(value, str):
        raise bad_request(f"{_field(index, part)} must be a string, got {json_type(value)}")
    if given_as == "string":
        return value.encode()
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error:
        raise bad_request(f"{_field(index, part)} is not_base64") from None


def _shown(data: bytes, asked: str) -> tuple[Any, str]:
    """A stored key or value in the asked format, or in the one it can be shown in."""
    if asked == "base64":
        return base64.b64encode(data).decode("ascii"), asked
    try:
        decoded = data.decode("utf-8")
    except UnicodeDecodeError:
        return base64.b64encode(data).decode("ascii"), "base64"
    if asked == "json":
        try:
            return json.loads(decoded, parse_constant=_not_json), asked
        except (ValueError, RecursionError):
            return decoded, "string"
    return decoded, asked


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


@dataclass(slots=True)
class _Outgoing:
    """One record of a POST, as the core publishes it."""

    routing_key: str
    properties: bytes
    body: bytes
    partition: int | None


def _outgoing(
    given: Any, index: int, formats: tuple[str, str], producer: str | None, partitions: int
) -> _Outgoing:
    if not isinstance(given, dict):
        raise bad_request(f"{_field(index)} must be an object, got {json_type(given)}")
    if "value" not in given:
        raise bad_request(f"{_field(index)}: [{{key_missing,value}}]")
    key_format, value_format = formats
    body = _bytes(given["value"], value_format, index, ".value")
    routing_key = ""
    if given.get("key") is not None:
        key = _bytes(given["key"], key_format, index, ".key")
        if len(key) > NAME_BYTES_MAX:
            raise bad_request(f"{_field(index, '.key')} is longer than 255 bytes: a routing key")
        try:
            routing_key = key.decode("utf-8")
        except UnicodeDecodeError:
            raise bad_request(f"{_field(index, '.key')} is not UTF-8: a routing key") from None
    partition = given.get("partition")
    if partition is not None:
        if isinstance(partition, bool) or not isinstance(partition, int):
            raise bad_request(f"{_field(index, '.partition')} must be a whole number")
        if not 0 <= partition < partitions:
            raise bad_request(f"{_field(index, '.partition')} must be from 0 to {partitions - 1}")
    headers = given.get("headers")
    if headers is None:
        headers = {}
    elif not isinstance(headers, dict):
        raise bad_request(
            f"{_field(index, '.headers')} must be an object, got {json_type(headers)}"
        )
    elif headers:
        headers = to_amqp(headers)
        if any(name in headers for name in _SENDER_SELECTED):
            raise bad_request(f"{_field(index)}: CC and BCC headers would copy it elsewhere")
    if producer is not None:
        sequence = given.get("sequence")
        if isinstance(sequence, bool) or not isinstance(sequence, int) or sequence < 0:
            raise bad_request(
                f"{_field(index, '.sequence')} must be a whole number: a producer numbers each"
            )
        headers[PRODUCER_ID] = producer
        headers[PRODUCER_SEQUENCE] = sequence
    properties = (
        frames.encode_properties(
            commands.Basic.Properties(headers=headers, delivery_mode=_PERSISTENT)
        )
        if headers
        else _PLAIN_PROPERTIES
    )
    return _Outgoing(routing_key, properties, body, partition)


def _records_of(body: dict[str, Any]) -> list[Any]:
    records = body.get("records")
    if records is None:
        if "value" not in body:
            raise bad_request("[{key_missing,records}]")
        return [body]
    if not isinstance(records, list):
        raise bad_request(f"records must be an array, got {json_type(records)}")
    if not 1 <= len(records) <= RECORDS_PER_POST_MAX:
        raise bad_request(f"records must hold 1 to {RECORDS_PER_POST_MAX} records")
    return records


async def post_messages(call: Call) -> web.Response:
    body = await call.body()
    records = _records_of(body)
    formats = (_format(body, "key_format"), _format(body, "value_format"))
    producer = body.get("producer")
    if producer is not None:
        if not isinstance(producer, str) or not producer:
            raise bad_request("producer must be a name (a string)")
        _checked_name("producer", producer)
    vhost = call.vhost()
    remote = _remote_stream(vhost, call.params["topic"])
    if remote is not None:
        outgoing = [
            _outgoing(given, index, formats, producer, 1) for index, given in enumerate(records)
        ]
        call.check("write", QUEUE, remote.name)
        _check_sizes(call, outgoing)
        return _offsets_reply([(0, offset) for offset in await _append_remote(remote, outgoing)])
    topic = topic_of(vhost, call.params["topic"])
    partitions = topic.partitions
    outgoing = [
        _outgoing(given, index, formats, producer, len(partitions))
        for index, given in enumerate(records)
    ]
    if topic.exchange is None:
        call.check("write", QUEUE, topic.name)
    else:
        call.check("write", EXCHANGE, topic.exchange)
    _check_sizes(call, outgoing)
    indexes = {stream.name: index for index, stream in enumerate(partitions)}
    stored = Stored()
    placed: list[tuple[int, int | None]] = []
    # Records for partitions led elsewhere: (their place in `placed`, their append there).
    appending: list[tuple[int, asyncio.Future[int | None]]] = []
    # Staged without a pause between them: one tick writes them, one fsync makes them durable.
    for tag, record in enumerate(outgoing, 1):
        if record.partition is not None or topic.exchange is None:
            # No BCC keys: a record with CC or BCC headers was refused.
            route = ((partitions[record.partition or 0].name,), record.properties, ())
        else:
            route = sync(vhost.route, topic.exchange, record.routing_key, record.properties)
        names = list(route[0])
        if len(names) != 1 or names[0] not in indexes:
            raise bad_request(f"records[{tag - 1}] routes to no partition of {topic.name}")
        index = indexes[names[0]]
        stream = partitions[index]
        if isinstance(stream, RemoteQueue):
            append = stream.append(
                topic.exchange or "", record.routing_key, record.properties, record.body
            )
            appending.append((len(placed), asyncio.ensure_future(append)))
            placed.append((index, None))
            continue
        offset = stream.staged_end
        sync(
            vhost.stage,
            route,
            topic.exchange or "",
            record.routing_key,
            record.body,
            True,
            False,
            (stored, tag),
        )
        placed.append((index, offset if stream.staged_end > offset else None))
    await call.api.host.after_commit()
    remote_offsets = await _appended(future for _, future in appending)
    unstored = stored.failed or any(
        offset is not None
        and (partitions[index].deleted or partitions[index].log.committed_offset <= offset)  # type: ignore[union-attr]
        for index, offset in placed
    )
    if unstored:
        raise _unstored()
    for (position, _), offset in zip(appending, remote_offsets, strict=True):
        placed[position] = (placed[position][0], offset)
    return _offsets_reply(placed)


def _check_sizes(call: Call, outgoing: list[_Outgoing]) -> None:
    size_max = call.api.host.config.message_bytes_max
    for record in outgoing:
        if len(record.body) > size_max:
            raise channel_error(
                replies.PRECONDITION_FAILED,
                f"message size {len(record.body)} is larger than configured max size {size_max}",
            )


def _offsets_reply(placed: list[tuple[int, int | None]]) -> web.Response:
    """(partition, offset) of each record in the POST's order; None: a duplicate."""
    return reply(
        {
            "offsets": [
                {"partition": index, "offset": offset}
                if offset is not None
                else {"partition": index, "offset": None, "duplicate": True}
                for index, offset in placed
            ]
        }
    )


def _remote_stream(vhost: VirtualHost, name: str) -> RemoteQueue | None:
    """The stream `name` when another node leads it (a POST to it is appended there)."""
    queue = vhost.remote.get(_checked_name("topic", name))
    if queue is None or queue.queue_type != Stream.queue_type or vhost.router.get(name):
        return None
    return queue


async def _append_remote(remote: RemoteQueue, outgoing: list[_Outgoing]) -> list[int | None]:
    """Each record appended by the stream's node, in order (sent together: one tick there
    writes them), once fsynced there."""
    return await _appended(
        asyncio.ensure_future(remote.append("", r.routing_key, r.properties, r.body))
        for r in outgoing
    )


async def _appended(appending: Iterable[Awaitable[int | None]]) -> list[int | None]:
    """The offsets of records appended on the nodes leading their partitions."""
    try:
        return list(await asyncio.gather(*appending))
    except (RoutingError, replies.ProtocolError) as error:
        if isinstance(error, replies.ProtocolError) and error.code == replies.INTERNAL_ERROR:
            raise _unstored() from None
        raise refused(error) from None


def _unstored() -> ApiError:
    return ApiError(
        500,
        "internal_error",
        "storing the records failed: retry (with a producer, nothing is appended twice)",
    )


def query_integer(call: Call, key: str, default: int, low: int, high: int) -> int:
    value = integer(call.query, key, default)
    if not low <= value <= high:
        raise bad_request(f"{key} must be from {low} to {high}")
    return value


def _record_json(partition: int, record: Record, formats: tuple[str, str]) -> dict[str, Any]:
    item: dict[str, Any] = {
        "partition": partition,
        "offset": record.offset,
        "timestamp": record.timestamp_ms,
    }
    key_format, value_format = formats
    if record.routing_key:
        item["key"], shown_as = _shown(record.routing_key, key_format)
        if shown_as != key_format:
            item["key_format"] = shown_as
    else:
        item["key"] = None
    item["value"], shown_as = _shown(record.body, value_format)
    if shown_as != value_format:
        item["value_format"] = shown_as
    properties = record.properties
    headers = (
        frames.decode_properties(properties).headers
        if properties and properties[0] & HEADERS_FLAG_BYTE0
        else None
    )
    item["headers"] = to_json(headers) if headers else {}
    return item


async def get_messages(call: Call) -> web.Response:
    vhost = call.vhost()
    topic = topic_of(vhost, call.params["topic"])
    partition = query_integer(call, "partition", 0, 0, len(topic.partitions) - 1)
    stream = topic.partitions[partition]
    # Without one: the first retained.
    offset = query_integer(call, "offset", -1, 0, 2**63 - 1) if "offset" in call.query else None
    limit = query_integer(call, "limit", LIMIT_DEFAULT, 1, LIMIT_MAX)
    timeout_ms = query_integer(call, "timeout_ms", 0, 0, TIMEOUT_MS_MAX)
    formats = (_format(call.query, "key_format"), _format(call.query, "value_format"))
    call.check("read", QUEUE, stream.name)
    try:
        if isinstance(stream, RemoteQueue):
            read = await stream.read(offset, limit, READ_BYTES_MAX, timeout_ms)
        else:
            read = await stream.read_waiting(offset, limit, READ_BYTES_MAX, timeout_ms)
    except (RoutingError, replies.ProtocolError) as error:
        if isinstance(error, replies.ProtocolError) and error.code == replies.RESOURCE_ERROR:
            read = None
        elif isinstance(error, NotFound):
            raise object_not_found() from None
        else:
            raise refused(error) from None
    if read is None:
        raise ApiError(503, "service_unavailable", "too many readers wait on this partition")
    records, next_offset = read
    return reply(
        {
            "records": [_record_json(partition, record, formats) for record in records],
            "next_offset": next_offset,
        }
    )


def _commits(given: Any, topic: Topic, ends: list[int]) -> dict[int, int]:
    """partition -> offset of a commit's "offsets" (400 when one is out of range)."""
    if not isinstance(given, list) or not given:
        raise bad_request("offsets must be a non-empty array of {partition, offset}")
    commits: dict[int, int] = {}
    for item in given:
        if not isinstance(item, dict):
            raise bad_request(f"offsets hold objects, got {json_type(item)}")
        partition, offset = item.get("partition", 0), item.get("offset")
        for name, value in (("partition", partition), ("offset", offset)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise bad_request(f"{name} must be a whole number, got {json_type(value)}")
        if not 0 <= partition < len(topic.partitions):
            raise bad_request(f"partition must be from 0 to {len(topic.partitions) - 1}")
        if partition in commits:
            raise bad_request(f"partition {partition} is committed twice")
        end = ends[partition]
        if not 0 <= offset <= end:
            raise bad_request(f"offset of partition {partition} must be from 0 to {end}")
        commits[partition] = offset
    return commits


def _group(given: Any) -> str:
    if not isinstance(given, str) or not given:
        raise bad_request("group must be a name (a string)")
    return _checked_name("group", given)


async def commit(call: Call) -> web.Response:
    body = await call.body()
    group = _group(body.get("group"))
    vhost = call.vhost()
    topic = topic_of(vhost, text(body, "topic"))
    tag = group_tag(group)
    ends = [end for end, _ in await _tracked(topic, tag)]
    commits = _commits(body.get("offsets"), topic, ends)
    for partition in commits:
        call.check("read", QUEUE, topic.partitions[partition].name)
    # The whole group: its coordinator may be another node, its members on any.
    active = None
    if topic.exchange is not None:
        active = await _on_partitions(vhost.describe_group(topic.name, group))
    if active is not None:
        raise ApiError(
            409,
            "conflict",
            f"group {group} of {topic.name} has members: their acks commit its offsets",
        )
    committing = []
    for partition, offset in commits.items():
        stream = topic.partitions[partition]
        if isinstance(stream, RemoteQueue):
            committing.append(stream.commit_offset(tag, offset))
        else:
            stream.tracked.set(tag, offset)
            committing.append(stream.tracked.commit())
    await _on_partitions(asyncio.gather(*committing))
    return no_content()


async def _tracked(topic: Topic, tag: str) -> list[tuple[int, int | None]]:
    """Each partition's end offset and its offset tracked under `tag` (asked of the node
    leading it)."""
    asked = []
    for stream in topic.partitions:
        if isinstance(stream, RemoteQueue):
            asked.append(stream.tracked(tag))
        else:
            asked.append(_known((stream.log.end_offset, stream.tracked.get(tag))))
    return await _on_partitions(asyncio.gather(*asked))


async def _known(value: Any) -> Any:
    return value


async def _on_partitions(asked: Awaitable[Any]) -> Any:
    """What the nodes leading a topic's partitions answered; their refusals as the API's."""
    try:
        return await asked
    except (RoutingError, replies.ProtocolError) as error:
        if isinstance(error, NotFound):
            raise object_not_found() from None
        raise refused(error) from None


async def offsets(call: Call) -> web.Response:
    group = _group(call.query.get("group"))
    vhost = call.vhost()
    name = call.query.get("topic")
    topics = topics_of(vhost) if name is None else [topic_of(vhost, name)]
    tag = group_tag(group)
    committed = [
        {"topic": topic.name, "partition": index, "offset": offset}
        for topic in topics
        for index, (_, offset) in enumerate(await _tracked(topic, tag))
        if offset is not None
    ]
    return reply({"group": group, "offsets": committed})

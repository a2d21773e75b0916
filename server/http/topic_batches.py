"""A topic's stored batches over HTTP (Warren's), for readers that decode records themselves,
such as the Spark data source (`spark/`): the broker hands out the log's bytes as it stored
them, as a Kafka fetch does, and the reader checks the CRCs and decodes.

    GET /topics/{topic}/partitions?vhost=&timestamp=
        {"partitions": [{"partition", "stream", "first_offset", "next_offset",
        "offset_for_timestamp"?}]}: each partition's first retained offset and the offset after
        its last fsynced record (what a reader may read up to); with `timestamp` (ms since the
        epoch), the first offset of the first batch stamped at or after it (null when every
        record is older)
    GET /topics/{topic}/batches?vhost=&partition=&offset=&max_bytes=
        application/octet-stream: whole batches (`log/batch.py`'s format) from the one holding
        `offset`, up to the fsynced end, about `max_bytes` (1 to 16 MiB, default 4 MiB) and at
        least one batch when there is one; an empty body when `offset` is at or past the end.
        The first batch may begin before `offset`. `X-Warren-First-Offset` and
        `X-Warren-Next-Offset` say where the partition starts and ends. An offset below the
        first retained one (retention deleted it) is 416, with the same headers, so that the
        reader decides whether that loss is an error.

A topic is what the topic API calls one (`topics.py`): a super stream (its partitions in
order) or a stream (partition 0). Both need read permission on the partition's stream, as
basic.consume does.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from warrenmq.exchanges.binding import QUEUE
from warrenmq.server.stream.stream import Stream

from .api import Call, reply
from .errors import ApiError
from .topics import query_integer, topic_of

FETCH_BYTES_DEFAULT = 4 << 20
# A fetch is read in a worker thread (log/partition.py's read_batches); this bounds the memory a
# request holds.
FETCH_BYTES_MAX = 16 << 20
FIRST_OFFSET_HEADER = "X-Warren-First-Offset"
NEXT_OFFSET_HEADER = "X-Warren-Next-Offset"
_OFFSET_MAX = 2**63 - 1


def _bounds(stream: Stream) -> dict[str, str]:
    log = stream.log
    return {
        FIRST_OFFSET_HEADER: str(log.start_offset),
        NEXT_OFFSET_HEADER: str(log.durable_offset),
    }


def _partition_json(index: int, stream: Stream, timestamp_ms: int | None) -> dict[str, Any]:
    log = stream.log
    item: dict[str, Any] = {
        "partition": index,
        "stream": stream.name,
        "first_offset": log.start_offset,
        "next_offset": log.durable_offset,
    }
    if timestamp_ms is not None:
        found = log.offset_for_timestamp(timestamp_ms)
        item["offset_for_timestamp"] = None if found is None else min(found, log.durable_offset)
    return item


async def get_partitions(call: Call) -> web.Response:
    topic = topic_of(call.vhost(), call.params["topic"])
    timestamp_ms = (
        query_integer(call, "timestamp", 0, -_OFFSET_MAX, _OFFSET_MAX)
        if "timestamp" in call.query
        else None
    )
    for stream in topic.partitions:
        call.check("read", QUEUE, stream.name)
    return reply(
        {
            "partitions": [
                _partition_json(index, stream, timestamp_ms)
                for index, stream in enumerate(topic.partitions)
            ]
        }
    )


async def get_batches(call: Call) -> web.Response:
    topic = topic_of(call.vhost(), call.params["topic"])
    partition = query_integer(call, "partition", 0, 0, len(topic.partitions) - 1)
    stream = topic.partitions[partition]
    offset = query_integer(call, "offset", stream.log.start_offset, 0, _OFFSET_MAX)
    max_bytes = query_integer(call, "max_bytes", FETCH_BYTES_DEFAULT, 1, FETCH_BYTES_MAX)
    call.check("read", QUEUE, stream.name)
    log = stream.log
    if offset < log.start_offset:
        raise ApiError(
            416,
            "offset_out_of_range",
            f"offset {offset} is below the first retained offset {log.start_offset}",
            _bounds(stream),
        )
    body = await log.read_batches(offset, log.durable_offset, max_bytes)
    return web.Response(body=body, content_type="application/octet-stream", headers=_bounds(stream))

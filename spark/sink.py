"""The `warren` sink: `df.write.format("warren")` and `writeStream.format("warren")` append
rows to a stream or a super stream, each row exactly once.

Rows have `value` (binary or string), and optionally `key` (the routing key: a super stream
routes by it), `partition` (a super stream's partition index) and `headers` (Kafka's
array<struct<key, value>> or a map). They are POSTed to the topic API in requests of a bounded
size, each answered once fsynced (the publisher confirm), as an idempotent producer
(`server/stream/producers.py`): every task publishes as its own producer and numbers its rows,
so a retried task's rows that already landed are dropped as duplicates.

* batch: the producer is `spark-<job>-<partition>`, the job an id drawn on the driver when the
  write starts (a retried task gets the same one); sequences count the task's rows from 1;
* streaming: the producer is `spark-<query id>-<partition>` (the query id survives restarts
  from the checkpoint) and sequences are `batch id << 32 | row`, so a micro-batch replayed
  after a crash or a restart appends only what it had not.

Options: `url`, `user`, `password`, `vhost` as for reads; `stream` or `superStream` (where
the rows go).
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from .client import Client, nodes_of

# A request carries at most this many records (the topic API takes 10,000) and about this
# many bytes of JSON (its body limit is 20 MiB).
RECORDS_PER_REQUEST_MAX = 5_000
REQUEST_BYTES_MAX = 8 << 20
# Streaming sequences: the batch id above the row's number within the task.
_ROW_BITS = 32
_BATCH_ID = "streaming.sql.batchId"
_QUERY_ID = "sql.streaming.queryId"


def _target(options: Mapping[str, str]) -> tuple[Client, str]:
    if "url" not in options:
        raise ValueError("option url is required")
    given = [options[name] for name in ("stream", "superStream") if options.get(name)]
    if len(given) != 1:
        raise ValueError("give exactly one of the options stream or superStream")
    client = Client(
        nodes_of(options["url"], options.get("user"), options.get("password")),
        options.get("vhost", "/"),
    )
    return client, given[0]


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _record(row: dict[str, Any], sequence: int) -> dict[str, Any]:
    value = row["value"]
    record: dict[str, Any] = {
        "value": base64.b64encode(
            value if isinstance(value, bytes) else str(value).encode()
        ).decode("ascii"),
        "sequence": sequence,
    }
    if row.get("key") is not None:
        record["key"] = _text(row["key"])
    if row.get("partition") is not None:
        record["partition"] = int(row["partition"])
    headers = row.get("headers")
    if headers:
        pairs = (
            headers.items()
            if isinstance(headers, dict)
            else ((item["key"], item["value"]) for item in headers)
        )
        record["headers"] = {key: _text(value) for key, value in pairs if value is not None}
    return record


class Published(WriterCommitMessage):
    def __init__(self, rows: int, duplicates: int) -> None:
        self.rows = rows
        self.duplicates = duplicates


def publish(
    client: Client,
    topic: str,
    producer: str,
    first_sequence: int,
    batches: Iterator[pa.RecordBatch],
) -> Published:
    """Every row of `batches`, numbered from `first_sequence`, as `producer`."""
    sequence = first_sequence
    rows = duplicates = 0
    pending: list[dict[str, Any]] = []
    pending_bytes = 0

    def send() -> int:
        offsets = client.publish(
            topic,
            {
                "producer": producer,
                "key_format": "string",
                "value_format": "base64",
                "records": pending,
            },
        )
        return sum(1 for item in offsets if item.get("duplicate"))

    for batch in batches:
        if "value" not in batch.schema.names:
            raise ValueError("the rows to write need a value column")
        for row in batch.to_pylist():
            record = _record(row, sequence)
            sequence += 1
            rows += 1
            pending.append(record)
            pending_bytes += len(record["value"]) + 64 + len(record.get("key", ""))
            if len(pending) >= RECORDS_PER_REQUEST_MAX or pending_bytes >= REQUEST_BYTES_MAX:
                duplicates += send()
                pending, pending_bytes = [], 0
    if pending:
        duplicates += send()
    return Published(rows, duplicates)


class WarrenWriter(DataSourceArrowWriter):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.client, self.topic = _target(options)
        # Drawn once on the driver: every attempt of a task publishes as the same producer.
        self.job = uuid.uuid4().hex

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        context = TaskContext.get()
        producer = f"spark-{self.job}-{context.partitionId()}"
        return publish(self.client, self.topic, producer, 1, iterator)


class WarrenStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.client, self.topic = _target(options)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Published:
        context = TaskContext.get()
        batch_id = context.getLocalProperty(_BATCH_ID)
        query_id = context.getLocalProperty(_QUERY_ID)
        if batch_id is None or query_id is None:
            raise RuntimeError("the warren stream writer runs only inside a streaming query")
        producer = f"spark-{query_id}-{context.partitionId()}"
        first = (int(batch_id) << _ROW_BITS) + 1
        return publish(self.client, self.topic, producer, first, iterator)

    def commit(self, messages: list[Any], batchId: int) -> None:
        """Nothing to do: every row was confirmed as it was written."""

    def abort(self, messages: list[Any], batchId: int) -> None:
        """Nothing to undo: what landed stays, and a replay of the batch skips it."""

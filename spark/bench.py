"""The data source's read benchmark: a stream of small messages read in batch by Spark into an
aggregation over every column, beside Spark reading the same rows from Parquet in the same
run, and a streaming read of it (Trigger.AvailableNow, no maxOffsetsPerTrigger).

    python -m warrenmq.spark.bench --messages 10000000      # against `make run`

The stream (`bench-spark-N`, N messages of 64-byte bodies) is filled through the topic API
once and kept for later runs.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from .client import Client, WarrenError, nodes_of

BODY_BYTES = 64
KEYS = 100
RECORDS_PER_POST = 10_000


def fill(client: Client, stream: str, messages: int, threads: int) -> None:
    """Publish `messages` bodies of 64 bytes to `stream` (declared as a one-partition topic)."""
    try:
        have = sum(p.next_offset - p.first_offset for p in client.partitions(stream))
    except WarrenError:
        raise SystemExit(
            f"declare the stream first: warren's AMQP `queue.declare` of {stream} with "
            f"x-queue-type=stream (this script does it with --declare)"
        ) from None
    if have >= messages:
        return
    body = base64.b64encode(b"x" * BODY_BYTES).decode("ascii")

    def post(start: int) -> None:
        count = min(RECORDS_PER_POST, messages - start)
        records = [{"key": f"k{(start + i) % KEYS}", "value": body} for i in range(count)]
        client.publish(stream, {"value_format": "base64", "records": records})

    began = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(post, range(have, messages, RECORDS_PER_POST)))
    elapsed = time.perf_counter() - began
    print(f"filled {messages - have:,} messages in {elapsed:.1f} s", flush=True)


def every_column(frame):
    """An aggregation that reads every column of the source's schema."""
    from pyspark.sql import functions as F

    aggregates = [F.count(F.lit(1)).alias("rows")]
    for field in frame.schema.fields:
        column = F.col(field.name)
        kind = field.dataType.typeName()
        if kind in ("binary", "string"):
            aggregates.append(F.sum(F.length(column)).alias(f"{field.name}_bytes"))
        elif kind in ("integer", "long"):
            aggregates.append(F.sum(column).alias(f"{field.name}_sum"))
        else:
            aggregates.append(F.max(column).alias(f"{field.name}_max"))
    return frame.agg(*aggregates)


def timed(action) -> tuple[float, object]:
    began = time.perf_counter()
    result = action()
    return time.perf_counter() - began, result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://guest:guest@localhost:15672")
    parser.add_argument("--amqp", default="amqp://guest:guest@localhost:5672/%2F")
    parser.add_argument("--messages", type=int, default=10_000_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument(
        "--min-partitions",
        default="2",
        help="the reads' minPartitions: the one partition split so that every core reads",
    )
    parser.add_argument("--declare", action="store_true", help="declare the stream over AMQP")
    parser.add_argument("--fill-threads", type=int, default=2)
    args = parser.parse_args(argv)

    stream = f"bench-spark-{args.messages}"
    if args.declare:
        import pika

        connection = pika.BlockingConnection(pika.URLParameters(args.amqp))
        connection.channel().queue_declare(
            stream, durable=True, arguments={"x-queue-type": "stream"}
        )
        connection.close()
    client = Client(nodes_of(args.url, None, None))
    fill(client, stream, args.messages, args.fill_threads)

    from . import local_session

    spark = local_session("warren-bench", args.master, **{"spark.driver.memory": "2g"})

    def source(ending: str = "latest"):
        return (
            spark.read.format("warren")
            .option("url", args.url)
            .option("streams", stream)
            .option("minPartitions", args.min_partitions)
            .option("endingOffsets", ending)
            .load()
        )

    # The workers and the JIT warm up on the first 100,000 rows.
    every_column(source(json.dumps({stream: {"0": 100_000}}))).collect()
    seconds, (row,) = timed(lambda: every_column(source()).collect())
    rows = row["rows"]
    print(f"warren batch read:   {rows:,} rows in {seconds:.1f} s = {rows / seconds:,.0f} rows/s")

    with tempfile.TemporaryDirectory() as directory:
        parquet = os.path.join(directory, "rows.parquet")
        source().write.parquet(parquet)
        every_column(spark.read.parquet(parquet).where("offset < 100000")).collect()
        parquet_s, (parquet_row,) = timed(
            lambda: every_column(spark.read.parquet(parquet)).collect()
        )
    assert parquet_row == row, (parquet_row, row)
    print(
        f"parquet batch read:  {rows:,} rows in {parquet_s:.1f} s = {rows / parquet_s:,.0f} rows/s"
        f" (warren takes {seconds / parquet_s:.1f}x as long)"
    )

    with tempfile.TemporaryDirectory() as checkpoint:
        query = (
            spark.readStream.format("warren")
            .option("url", args.url)
            .option("streams", stream)
            .option("startingOffsets", "earliest")
            .option("minPartitions", args.min_partitions)
            .load()
            .writeStream.format("noop")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
        )
        streaming_s, _ = timed(lambda: query.start().awaitTermination())
    rate = rows / streaming_s
    print(f"warren stream read:  {rows:,} rows in {streaming_s:.1f} s = {rate:,.0f} rows/s")
    spark.stop()


if __name__ == "__main__":
    main()

"""The `warren` PySpark data source (`spark/`) on a local[2] Spark against a broker in this
process: batch reads equal what was published, offsets and timestamps choose the range,
minPartitions splits, a streaming query restarted from its checkpoint reads each row once,
deleted records are detected, and the sink appends each row once when a task is retried.

One SparkSession serves every test (a JVM start takes ~10 s on this machine); each test uses
streams of its own."""

from __future__ import annotations

import base64
import json
import os
import shutil
import time
import urllib.request

import pika
import pytest
from brokers import declare_stream
from http_api import HttpApi, eventually, name, path

pyspark = pytest.importorskip("pyspark")

from pyspark.sql import functions as F  # noqa: E402

import warrenmq.spark  # noqa: E402
from warrenmq.spark.client import Client  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def spark():
    if shutil.which("java") is None:
        # CI machines have Java 17; elsewhere these tests need one installed.
        if os.environ.get("CI") == "true":
            pytest.fail("Spark needs Java (17) on PATH")
        pytest.skip("Spark needs Java (17) on PATH")
    saved = {key: os.environ.get(key) for key in ("PYSPARK_PYTHON", "PYTHONSAFEPATH")}
    session = warrenmq.spark.local_session(
        "warren-tests",
        "local[2, 4]",  # 4 attempts a task: the sink's retry test
        **{
            "spark.sql.shuffle.partitions": "2",
            "spark.sql.execution.arrow.maxRecordsPerBatch": "1000",
        },
    )
    yield session
    session.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture
def api(module_broker) -> HttpApi:
    return HttpApi(module_broker.management_url)


def reader(spark, broker, **options):
    return (
        spark.read.format("warren").option("url", broker.management_url).options(**options).load()
    )


def stream_reader(spark, broker, **options):
    """A streaming read from the first retained offset."""
    read = spark.readStream.format("warren").option("url", broker.management_url)
    return read.option("startingOffsets", "earliest").options(**options).load()


def publish_values(client: Client, topic: str, values: list[int]) -> None:
    client.publish(topic, {"records": [{"key": f"k{v % 17}", "value": v} for v in values]})


def test_batch_read_of_a_super_stream_equals_what_was_published(spark, module_broker, api):
    events = name("events")
    assert api.put(path("api", "super-streams", "/", events), {"partitions": 3}).status == 201
    connection = module_broker.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    published = {}
    for i in range(600):
        key = f"user-{i % 23}"
        properties = pika.BasicProperties(
            content_type="application/json",
            message_id=f"m{i}",
            correlation_id=f"c{i % 5}",
            headers={"n": i, "source": "test"},
        )
        body = json.dumps({"i": i}).encode()
        channel.basic_publish(events, key, body, properties)
        published[f"m{i}"] = (key.encode(), body)
    connection.close()

    frame = reader(spark, module_broker, superStream=events, includeHeaders="true")
    rows = frame.collect()
    assert len(rows) == 600
    assert {row.message_id: (bytes(row.key), bytes(row.value)) for row in rows} == published
    by_partition: dict[int, list[int]] = {}
    for row in rows:
        assert row.stream == f"{events}-{row.partition}"
        assert row.exchange == events
        assert row.content_type == "application/json" and row.delivery_mode is None
        assert row.correlation_id == f"c{int(row.message_id[1:]) % 5}"
        headers = {header.key: bytes(header.value) for header in row.headers}
        assert headers == {"n": row.message_id[1:].encode(), "source": b"test"}
        assert row.timestamp is not None
        by_partition.setdefault(row.partition, []).append(row.offset)
    # Every offset of every partition once.
    assert sorted(by_partition) == [0, 1, 2]
    for offsets in by_partition.values():
        assert sorted(offsets) == list(range(len(offsets)))

    # minPartitions splits the partitions' ranges by offset; the rows are the same.
    split = reader(spark, module_broker, superStream=events, minPartitions="8")
    assert split.rdd.getNumPartitions() >= 8
    assert sorted(
        (r.partition, r.offset) for r in split.select("partition", "offset").collect()
    ) == (sorted((r.partition, r.offset) for r in rows))
    assert "headers" not in split.columns


def test_offsets_json_and_starting_timestamp_choose_the_range(spark, module_broker, topic_client):
    stream = name("ledger")
    declare_stream(module_broker, stream)
    publish_values(topic_client, stream, list(range(20)))
    time.sleep(0.05)  # the next POST's batch is stamped later
    publish_values(topic_client, stream, list(range(20, 30)))

    window = reader(
        spark,
        module_broker,
        streams=stream,
        startingOffsets=json.dumps({stream: {"0": 5}}),
        endingOffsets=json.dumps({stream: {"0": 12}}),
    )
    assert [row.offset for row in window.orderBy("offset").collect()] == list(range(5, 12))

    second = reader(spark, module_broker, streams=stream).where("offset = 20").first()
    since_ms = int(second.timestamp.timestamp() * 1000)
    later = reader(spark, module_broker, streams=stream, startingTimestamp=str(since_ms))
    assert [json.loads(bytes(row.value)) for row in later.orderBy("offset").collect()] == list(
        range(20, 30)
    )


def test_streaming_read_restarted_from_its_checkpoint_reads_each_row_once(
    spark, module_broker, api, topic_client, tmp_path
):
    events = name("clicks")
    assert api.put(path("api", "super-streams", "/", events), {"partitions": 2}).status == 201
    publish_values(topic_client, events, list(range(1000)))
    output, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")

    def start(trigger: dict):
        stream = stream_reader(
            spark, module_broker, superStream=events, maxOffsetsPerTrigger="150"
        ).select("partition", "offset", "value")
        return (
            stream.writeStream.format("parquet")
            .option("path", output)
            .option("checkpointLocation", checkpoint)
            .trigger(**trigger)
            .start()
        )

    # Stopped mid-stream: after its first micro-batch, with most rows still to read.
    first = start({"processingTime": "1 second"})
    deadline = time.monotonic() + 120
    while not first.recentProgress and time.monotonic() < deadline:
        time.sleep(0.2)
    first.stop()
    progress = [p for p in first.recentProgress if p["numInputRows"]]
    assert progress and all(p["numInputRows"] <= 150 for p in progress)
    assert sum(p["numInputRows"] for p in progress) < 1000

    publish_values(topic_client, events, list(range(1000, 1300)))
    second = start({"availableNow": True})
    second.awaitTermination(180)
    assert all(p["numInputRows"] <= 150 for p in second.recentProgress)

    rows = spark.read.parquet(output).collect()
    assert sorted(json.loads(bytes(row.value)) for row in rows) == list(range(1300))
    assert len({(row.partition, row.offset) for row in rows}) == 1300


def test_records_deleted_by_retention_are_detected(spark, module_broker, topic_client):
    stream = name("short")
    declare_stream(
        module_broker,
        stream,
        **{"x-stream-max-segment-size-bytes": 2_000, "x-max-length-bytes": 6_000},
    )
    for start in range(0, 1000, 50):
        publish_values(topic_client, stream, list(range(start, start + 50)))
    first_offset = topic_client.partitions(stream)[0].first_offset
    assert first_offset > 0

    from_zero = json.dumps({stream: {"0": 0}})
    with pytest.raises(Exception, match="deleted by retention"):
        reader(spark, module_broker, streams=stream, startingOffsets=from_zero).count()
    kept = reader(
        spark, module_broker, streams=stream, startingOffsets=from_zero, failOnDataLoss="false"
    )
    assert sorted(row.offset for row in kept.select("offset").collect()) == list(
        range(first_offset, 1000)
    )


def test_the_sink_appends_each_row_once_when_a_task_is_retried(spark, module_broker, api):
    stream = name("sink")
    declare_stream(module_broker, stream)
    url = module_broker.management_url
    target = path("api", "streams", "/", stream)

    def messages() -> int:
        request = urllib.request.Request(url + target)
        request.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
        with urllib.request.urlopen(request) as reply:
            return json.loads(reply.read())["messages"]

    @F.udf("binary")
    def value_failing_once(i):
        # The first attempt dies at row 9,000, once the writer's first request (5,000 rows)
        # has landed: its retry sends them again.
        from pyspark import TaskContext

        if i == 9_000 and TaskContext.get().attemptNumber() == 0:
            deadline = time.monotonic() + 60
            while messages() < 5_000 and time.monotonic() < deadline:
                time.sleep(0.1)
            raise RuntimeError("the writer dies mid-batch")
        return str(i).encode()

    rows = spark.range(0, 10_000, numPartitions=1).select(
        value_failing_once("id").alias("value"), F.col("id").cast("string").alias("key")
    )
    rows.write.format("warren").option("url", url).option("stream", stream).mode("append").save()

    info = eventually(lambda: api.get(target).json["messages"], 10_000)
    assert info == 10_000
    assert api.get(target).json["duplicates_dropped"] == 5_000
    read = reader(spark, module_broker, streams=stream)
    assert sorted(int(bytes(row.value)) for row in read.select("value").collect()) == list(
        range(10_000)
    )


def test_the_stream_sink_appends_a_replayed_micro_batch_once(
    spark, module_broker, api, topic_client, tmp_path
):
    source, target = name("orders"), name("copies")
    declare_stream(module_broker, source)
    declare_stream(module_broker, target)
    publish_values(topic_client, source, list(range(300)))
    checkpoint = tmp_path / "checkpoint"

    def run() -> None:
        query = (
            stream_reader(spark, module_broker, streams=source, maxOffsetsPerTrigger="100")
            .select("key", "value")
            .writeStream.format("warren")
            .option("url", module_broker.management_url)
            .option("stream", target)
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(180)

    run()
    # A crash after the sink wrote the last micro-batch but before Spark committed it: the
    # restarted query runs that micro-batch again.
    commits = checkpoint / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (commits / str(last)).unlink()
    (commits / f".{last}.crc").unlink(missing_ok=True)
    run()

    stream = path("api", "streams", "/", target)
    assert api.get(stream).json["messages"] == 300
    assert api.get(stream).json["duplicates_dropped"] == 100
    copies = reader(spark, module_broker, streams=target).collect()
    assert sorted(json.loads(bytes(row.value)) for row in copies) == list(range(300))

"""Count events and sum their amounts per user and minute of their event time, from the super
stream `events` to the stream `events-per-minute`, exactly once (a streaming query with a
checkpoint). A minute's results are written once the watermark (the latest event time seen,
less a minute) has passed it: the sink appends, it does not update."""

from __future__ import annotations

import pika
from common import arguments, spark_session

SOURCE = "events"
TARGET = "events-per-minute"
CHECKPOINT = "checkpoints/events-per-minute"


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--follow", action="store_true", help="keep running (every 10 s)")
    args = parser.parse_args()
    connection = pika.BlockingConnection(pika.URLParameters(args.amqp))
    connection.channel().queue_declare(TARGET, durable=True, arguments={"x-queue-type": "stream"})
    connection.close()

    spark = spark_session("events-per-minute")
    from pyspark.sql import functions as F

    events = (
        spark.readStream.format("warren")
        .option("url", args.url)
        .option("superStream", SOURCE)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "1000")
        .load()
        .select(
            F.col("key").cast("string").alias("user"),
            F.col("value").cast("string").alias("json"),
        )
        .select(
            "user",
            F.timestamp_millis(F.get_json_object("json", "$.time").cast("long")).alias("time"),
            F.get_json_object("json", "$.amount").cast("long").alias("amount"),
        )
    )
    per_minute = (
        events.withWatermark("time", "1 minute")
        .groupBy(F.window("time", "1 minute"), "user")
        .agg(F.count(F.lit(1)).alias("events"), F.sum("amount").alias("amount"))
        .select(
            F.col("user").alias("key"),
            F.to_json(
                F.struct(F.col("window.start").alias("minute"), "user", "events", "amount")
            ).alias("value"),
        )
    )
    trigger = {"processingTime": "10 seconds"} if args.follow else {"availableNow": True}
    query = (
        per_minute.writeStream.format("warren")
        .option("url", args.url)
        .option("stream", TARGET)
        .option("checkpointLocation", CHECKPOINT)
        .trigger(**trigger)
        .start()
    )
    query.awaitTermination()
    read = sum(progress["numInputRows"] for progress in query.recentProgress)
    print(f"read {read:,} events; the closed minutes' results are in the stream {TARGET}")
    spark.stop()


if __name__ == "__main__":
    main()

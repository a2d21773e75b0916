"""Dead letters retained in the stream `dead-letters`, counted by hour, reason and source
queue (a batch job)."""

from __future__ import annotations

from common import arguments, spark_session

DEAD_LETTERS = "dead-letters"


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--stream", default=DEAD_LETTERS)
    args = parser.parse_args()
    spark = spark_session("dead-letter-report")
    from pyspark.sql import functions as F

    letters = (
        spark.read.format("warren")
        .option("url", args.url)
        .option("streams", args.stream)
        .option("includeHeaders", "true")
        .load()
    )
    headers = F.map_from_entries(
        F.transform("headers", lambda h: F.struct(h["key"], h["value"].cast("string")))
    )
    report = (
        letters.select(
            F.date_trunc("hour", "timestamp").alias("hour"),
            headers["x-first-death-reason"].alias("reason"),
            headers["x-first-death-queue"].alias("source_queue"),
        )
        .groupBy("hour", "reason", "source_queue")
        .count()
        .orderBy("hour", "reason", "source_queue")
    )
    report.show(100, truncate=False)
    spark.stop()


if __name__ == "__main__":
    main()

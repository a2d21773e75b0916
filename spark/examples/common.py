"""What the examples share: a local Spark session with the `warren` source registered."""

from __future__ import annotations

import argparse
import os
import sys

DEFAULT_URL = "http://guest:guest@localhost:15672"
DEFAULT_AMQP = "amqp://guest:guest@localhost:5672/%2F"


def arguments(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--url", default=DEFAULT_URL, help="the broker's HTTP API")
    parser.add_argument("--amqp", default=DEFAULT_AMQP, help="the broker's AMQP URL")
    return parser


def spark_session(name: str):
    # The Python workers run this interpreter (where warrenmq is installed), without the
    # working directory first on sys.path (a checkout's root has a `warrenmq/` folder).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYTHONSAFEPATH", "1")
    from pyspark.sql import SparkSession

    import warrenmq.spark

    spark = (
        SparkSession.builder.master("local[2]")
        .appName(name)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    warrenmq.spark.register(spark)
    return spark

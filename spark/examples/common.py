"""What the examples share: a local Spark session with the `warren` source registered."""

from __future__ import annotations

import argparse

DEFAULT_URL = "http://guest:guest@localhost:15672"
DEFAULT_AMQP = "amqp://guest:guest@localhost:5672/%2F"


def arguments(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--url", default=DEFAULT_URL, help="the broker's HTTP API")
    parser.add_argument("--amqp", default=DEFAULT_AMQP, help="the broker's AMQP URL")
    return parser


def spark_session(name: str):
    import warrenmq.spark

    return warrenmq.spark.local_session(name, **{"spark.sql.shuffle.partitions": "2"})

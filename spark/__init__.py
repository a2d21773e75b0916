"""The PySpark data source `warren` (`pip install warrenmq[spark]`): batch and streaming
reads of Warren's streams and super streams, and a sink that appends each row exactly once.

    import warrenmq.spark
    warrenmq.spark.register(spark)
    spark.read.format("warren").option("url", "http://guest:guest@localhost:15672")
        .option("superStream", "events").load()
"""

from __future__ import annotations

from typing import Any


def register(spark: Any) -> None:
    """Make `format("warren")` known to this Spark session."""
    from .source import WarrenDataSource

    spark.dataSource.register(WarrenDataSource)


def local_session(app: str, master: str = "local[2]", **config: str) -> Any:
    """A SparkSession on this machine with `warren` registered (the examples', the
    benchmark's and the tests'). Its Python workers run this interpreter, the one warrenmq is
    installed in, and do not put the working directory first on sys.path: at a checkout's
    root, `warrenmq/` is only the package's top folder."""
    import os
    import sys

    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYTHONSAFEPATH", "1")
    builder = SparkSession.builder.master(master).appName(app).config("spark.ui.enabled", "false")
    for key, value in config.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark

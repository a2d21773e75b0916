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

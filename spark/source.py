"""The `warren` data source: batch and streaming reads of streams and super streams, and the
sink (`sink.py`), as a PySpark Python data source.

Each input partition is one topic partition's range of offsets (or a slice of it, with
`minPartitions`); its task fetches the stored batches of that range from the broker and
decodes them into Arrow record batches (`decode.py`). A micro-batch is a fixed offset range
per partition, written to the checkpoint before it runs, so a replay reads the same rows.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from . import decode
from .client import OffsetOutOfRange
from .options import Offsets, Range, SourceOptions, ranges

_PROPERTY_TYPES = {"s": StringType(), "i": IntegerType()}


def source_schema(include_headers: bool) -> StructType:
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("stream", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("exchange", StringType()),
    ]
    fields += [
        StructField(name, _PROPERTY_TYPES[kind]) for name, _, kind in decode.PROPERTY_COLUMNS
    ]
    if include_headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    return StructType(fields)


class DataLossError(RuntimeError):
    """Records a read needs were deleted by retention (failOnDataLoss is true)."""


class WarrenPartition(InputPartition):
    def __init__(self, piece: Range) -> None:
        super().__init__(piece)
        self.piece = piece


def _read(
    options: SourceOptions, spark_schema: StructType, piece: Range
) -> Iterator[pa.RecordBatch]:
    arrow_schema = to_arrow_schema(spark_schema, timezone="UTC")
    client = options.client

    def fetch(offset: int) -> bytes:
        try:
            return client.batches(piece.topic, piece.partition, offset)
        except OffsetOutOfRange as loss:
            if options.fail_on_data_loss:
                raise DataLossError(
                    f"{piece.stream}: offsets {offset} to {loss.first_offset - 1} were deleted "
                    f"by retention before they were read (set failOnDataLoss to false to skip "
                    f"them)"
                ) from None
            if loss.first_offset >= piece.end:
                return b""
            return client.batches(piece.topic, piece.partition, loss.first_offset)

    yield from decode.record_batches(
        fetch, piece.start, piece.end, piece.stream, piece.partition, arrow_schema
    )


class WarrenDataSource(DataSource):
    """spark.read.format("warren").option("url", ...).option("superStream", "orders")"""

    @classmethod
    def name(cls) -> str:
        return "warren"

    def schema(self) -> StructType:
        return source_schema(self.options.get("includeHeaders", "false").lower() == "true")

    def reader(self, schema: StructType) -> DataSourceReader:
        return WarrenBatchReader(SourceOptions.parse(self.options, streaming=False), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return WarrenStreamReader(SourceOptions.parse(self.options, streaming=True), schema)

    def writer(self, schema: StructType, overwrite: bool):
        from .sink import WarrenWriter

        return WarrenWriter(self.options)

    def streamWriter(self, schema: StructType, overwrite: bool):
        from .sink import WarrenStreamWriter

        return WarrenStreamWriter(self.options)


class WarrenBatchReader(DataSourceReader):
    def __init__(self, options: SourceOptions, spark_schema: StructType) -> None:
        self.options = options
        self.spark_schema = spark_schema

    def partitions(self) -> list[WarrenPartition]:
        options = self.options
        start = options.resolve(options.starting, options.starting_timestamp_ms)
        end = options.resolve(options.ending, options.ending_timestamp_ms)
        found = ranges(options.partitions(), start, end, options.min_partitions)
        return [WarrenPartition(piece) for piece in found]

    def read(self, partition: WarrenPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, self.spark_schema, partition.piece)


class WarrenStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are {topic: {partition: next offset to read}}; partitions that appear later
    (none do today: a super stream's partitions are fixed) would start at their earliest."""

    def __init__(self, options: SourceOptions, spark_schema: StructType) -> None:
        self.options = options
        self.spark_schema = spark_schema
        self._available_now: Offsets | None = None
        self._latest: Offsets | None = None

    def initialOffset(self) -> Offsets:
        options = self.options
        return options.resolve(options.starting, options.starting_timestamp_ms)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = self.options.resolve("latest", None)

    def latestOffset(self, start: Offsets | None = None, limit: ReadLimit | None = None) -> Offsets:
        """The end of the next micro-batch. PySpark 4.0 and 4.1 call this without arguments
        (no admission control there): everything available."""
        latest = self._available_now or self.options.resolve("latest", None)
        self._latest = latest
        if start is None:
            return latest
        end = {
            topic: {
                key: max(offset, start.get(topic, {}).get(key, offset))
                for key, offset in partitions.items()
            }
            for topic, partitions in latest.items()
        }
        if isinstance(limit, ReadMaxRows):
            end = _admitted(start, end, limit.max_rows)
        return end

    def reportLatestOffset(self) -> Offsets | None:
        return self._latest

    def partitions(self, start: Offsets, end: Offsets) -> list[WarrenPartition]:
        names = self.options.partitions()
        found = ranges(names, start, end, self.options.min_partitions)
        return [WarrenPartition(piece) for piece in found]

    def read(self, partition: WarrenPartition) -> Iterator[pa.RecordBatch]:
        return _read(self.options, self.spark_schema, partition.piece)

    def commit(self, end: Offsets) -> None:
        """Nothing to do: the checkpoint holds the offsets; the stream keeps its records."""


def _admitted(start: Offsets, end: Offsets, rows_max: int) -> Offsets:
    """`end` cut so that at most `rows_max` offsets are read in all, shared in proportion to
    what each partition has waiting (Kafka's rate limit), deterministically."""
    waiting = {
        (topic, key): end[topic][key] - start.get(topic, {}).get(key, end[topic][key])
        for topic in end
        for key in end[topic]
    }
    total = sum(waiting.values())
    if total <= rows_max:
        return end
    admitted = {pair: count * rows_max // total for pair, count in waiting.items()}
    # What the rounding down left: to the partitions in order, so each batch makes progress.
    spare = rows_max - sum(admitted.values())
    for pair in sorted(waiting):
        extra = min(spare, waiting[pair] - admitted[pair])
        admitted[pair] += extra
        spare -= extra
    cut: Offsets = {}
    for (topic, key), count in admitted.items():
        cut.setdefault(topic, {})[key] = end[topic][key] - waiting[(topic, key)] + count
    return cut

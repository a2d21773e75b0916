"""The Spark data source's decoder (spark/decode.py) against the log's own record decoder
(log/batch.py's decode_records), the oracle: any batches, any records, any range read, the
same rows byte for byte; any corrupted byte or lying record framing refused."""

from __future__ import annotations

import threading
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pa = pytest.importorskip("pyarrow")
pytest.importorskip("pyspark")

from pyspark.sql.pandas.types import to_arrow_schema  # noqa: E402

from warrenmq.amqp import properties as amqp_properties  # noqa: E402
from warrenmq.log.batch import (  # noqa: E402
    HEADER_BYTES,
    decode_records,
    encode_header,
    encode_records,
    read_header,
    verify_crc,
)
from warrenmq.log.errors import CorruptBatchError, LogError  # noqa: E402
from warrenmq.spark import decode  # noqa: E402
from warrenmq.spark.source import source_schema  # noqa: E402

# Property bytes as publishers send them: none, delivery-mode only, strings and headers.
PROPERTIES = [
    b"\x00\x00",
    b"\x10\x00\x02",
    amqp_properties.join(
        {
            0x8000: b"\x10application/json",
            0x0080: b"\x03m-1",
            0x0800: b"\x05",
            amqp_properties.HEADERS_FLAG: amqp_properties.table(
                [("source", amqp_properties.longstr("orders")), ("n", amqp_properties.long(7))]
            )[1:],
        }
    ),
]
RECORD_BYTES_MAX = 1 << 20

# Bodies mostly of a few sizes, so that runs of like records (the fast path) and changes of
# size inside a batch both occur.
bodies = st.one_of(
    st.sampled_from([b"", b"x" * 64, b"y" * 65]),
    st.binary(max_size=300),
)
records = st.tuples(
    st.sampled_from([b"", b"amq.topic", b"e" * 255]),
    st.sampled_from([b"", b"k1", b"k10", b"r" * 255]),
    st.sampled_from(PROPERTIES),
    bodies,
)
batches = st.lists(
    st.one_of(st.lists(records, min_size=1, max_size=4), st.lists(records, max_size=300)),
    min_size=1,
    max_size=6,
)
# How the walk is tuned: as shipped; every round vectorised; every batch walked in Python after
# one round, a few records at a time.
TUNINGS = [
    {"ROUND_RECORDS_MIN": decode.ROUND_RECORDS_MIN},
    {"ROUND_RECORDS_MIN": 0},
    {"ROUND_RECORDS_MIN": 1 << 30, "WALK_RECORDS": 3},
]


def stored(batch_records: list[list[tuple]], first_offset: int) -> bytes:
    """The batches as the log stores them, offsets dense from `first_offset`."""
    parts = []
    offset = first_offset
    for index, records in enumerate(batch_records):
        payload = encode_records(records, RECORD_BYTES_MAX)
        parts.append(encode_header(offset, 3, len(records), 1_700_000_000_000 + index, payload))
        parts.append(payload)
        offset += len(records)
    return b"".join(parts)


def reference_records(data: bytes) -> list:
    """Every record of `data`, by the log's decoder."""
    found = []
    position = 0
    while position < len(data):
        header = read_header(data, position)
        if header is None:
            raise CorruptBatchError("a batch header is cut")
        if position + header.total_bytes > len(data):
            raise CorruptBatchError("a batch is cut")
        verify_crc(data, position, header)
        found += decode_records(data, position, header, header.base_offset)
        position += header.total_bytes
    return found


def schema(with_headers: bool) -> pa.Schema:
    return to_arrow_schema(source_schema(with_headers), timezone="UTC")


def read(data: bytes, start: int, end: int, with_headers: bool) -> list[pa.RecordBatch]:
    return list(
        decode.record_batches(
            lambda offset: data if offset < end else b"",
            start,
            end,
            "s",
            2,
            schema(with_headers),
        )
    )


def fields_located(data: bytes) -> list[tuple[bytes, bytes, bytes, bytes]]:
    """(exchange, key, properties, body) of every record, as the decoder finds them."""
    located = decode.locate(data)
    fields = decode._fields(data, located.starts)
    columns = [decode._field(fields, which, pa.binary()).to_pylist() for which in (1, 2, 3, 4)]
    return list(zip(*columns, strict=True))


@pytest.mark.parametrize("tuning", TUNINGS)
@settings(max_examples=40, deadline=None)
@given(
    batch_records=batches,
    first_offset=st.integers(0, 10_000),
    cut=st.tuples(st.floats(0, 1), st.floats(0, 1)),
    with_headers=st.booleans(),
)
def test_the_rows_are_the_log_decoders_records(
    tuning, batch_records, first_offset, cut, with_headers
):
    data = stored(batch_records, first_offset)
    expected = reference_records(data)
    count = len(expected)
    start = first_offset + int(min(cut) * count)
    end = first_offset + int(max(cut) * count)
    with mock.patch.multiple(decode, **tuning):
        rows = pa.Table.from_batches(read(data, start, end, with_headers), schema(with_headers))
    wanted = [record for record in expected if start <= record.offset < end]
    assert rows.column("offset").to_pylist() == [record.offset for record in wanted]
    assert rows.column("value").to_pylist() == [record.body for record in wanted]
    assert rows.column("key").to_pylist() == [record.routing_key for record in wanted]
    exchange = rows.column("exchange").cast(pa.binary()).to_pylist()
    assert exchange == [record.exchange for record in wanted]
    microseconds = rows.column("timestamp").cast(pa.int64()).to_pylist()
    assert microseconds == [record.timestamp_ms * 1000 for record in wanted]
    assert set(rows.column("stream").to_pylist()) <= {"s"}
    assert set(rows.column("partition").to_pylist()) <= {2}
    names = [name for name, _, _ in decode.PROPERTY_COLUMNS] + (["headers"] if with_headers else [])
    decoded = [decode._decoded_properties(record.properties, with_headers) for record in wanted]
    for index, name in enumerate(names):
        assert rows.column(name).to_pylist() == [row[index] for row in decoded], name


@settings(max_examples=60, deadline=None)
@given(batch_records=batches, data=st.data())
def test_any_changed_byte_is_refused(batch_records, data):
    stored_bytes = bytearray(stored(batch_records, 0))
    at = data.draw(st.integers(0, len(stored_bytes) - 1))
    stored_bytes[at] ^= data.draw(st.integers(1, 255))
    with pytest.raises(CorruptBatchError):
        decode.locate(bytes(stored_bytes))


@pytest.mark.parametrize("tuning", TUNINGS)
@settings(max_examples=60, deadline=None)
@given(
    payloads=st.lists(
        st.tuples(st.binary(max_size=120), st.integers(0, 12)), min_size=1, max_size=4
    ),
)
def test_framing_that_lies_under_a_good_crc_is_refused_as_the_log_refuses_it(tuning, payloads):
    """Batches whose CRC is right but whose record lengths are anything: the decoder finds the
    records the log's decoder finds, or refuses the fetch when the log's decoder does."""
    parts = []
    offset = 0
    for payload, count in payloads:
        parts += [encode_header(offset, 1, count, 0, payload), payload]
        offset += count
    data = b"".join(parts)
    try:
        expected = [
            (r.exchange, r.routing_key, r.properties, r.body) for r in reference_records(data)
        ]
    except (CorruptBatchError, LogError):
        with mock.patch.multiple(decode, **tuning), pytest.raises(CorruptBatchError):
            decode.locate(data)
        return
    with mock.patch.multiple(decode, **tuning):
        assert fields_located(data) == expected


def test_a_batch_header_cut_short_is_refused():
    data = stored([[(b"", b"k", b"\x00\x00", b"v")]], 0)
    with pytest.raises(CorruptBatchError):
        decode.locate(data[: HEADER_BYTES - 1])
    with pytest.raises(CorruptBatchError):
        decode.locate(data[:-1])


def test_the_next_fetch_runs_while_the_current_one_is_consumed():
    batch_records = [[(b"", b"k1", PROPERTIES[0], b"x" * 64)] * 10 for _ in range(4)]
    data = stored(batch_records, 0)
    size = len(data) // 4
    requested: list[int] = []
    fetched_ahead = threading.Event()

    def fetch(offset: int) -> bytes:
        """One stored batch per fetch, as a broker with a small max_bytes answers."""
        requested.append(offset)
        if offset == 10:
            fetched_ahead.set()
        return data[offset // 10 * size : (offset // 10 + 1) * size]

    reading = decode.record_batches(fetch, 5, 35, "s", 2, schema(False))
    first = next(reading)
    assert fetched_ahead.wait(10), "the second fetch did not start while the first was read"
    rest = list(reading)
    offsets = [offset for batch in [first, *rest] for offset in batch.column("offset").to_pylist()]
    assert offsets == list(range(5, 35))
    assert requested == [5, 10, 20, 30]

"""The compiled record codecs (log/_speedups.pyx) against their pure-Python reference (batch).

Both must give the same answer for any input: the same bytes or records, or the same
exception with the same text. Inputs: well-formed batches and records, the same damaged, and
records off the common case (names over 255 bytes, fields that are not bytes).

The extension is optional at install; CI has a C compiler, so there a missing extension
fails here instead of silently measuring the reference.
"""

import os

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from warrenmq.log import batch

if batch._speedups is None and os.environ.get("CI") != "true":
    pytest.skip(
        "the compiled record codecs were not built (no C compiler?) or WARREN_PURE_PYTHON is set",
        allow_module_level=True,
    )


def outcome(function, *args):
    try:
        return ("returned", function(*args))
    except Exception as error:  # the type and text are what is compared
        return ("raised", type(error), str(error))


names = st.one_of(st.binary(max_size=12), st.sampled_from([b"n" * 255, b"n" * 256]))
fields = st.one_of(st.binary(max_size=40), st.sampled_from([b"b" * 1000]))
records = st.lists(st.tuples(names, names, fields, fields), max_size=12)


def test_the_log_uses_the_compiled_codecs():
    assert batch.encode_records is batch._speedups.encode_records
    assert batch.decode_records is batch._speedups.decode_records


@settings(max_examples=400)
@given(records=records, record_bytes_max=st.sampled_from([10, 60, 1100, 1 << 20]))
@example(records=[(b"e" * 255, b"k" * 255, b"", b"")], record_bytes_max=1 << 20)
@example(records=[(b"e" * 256, b"", b"", b"")], record_bytes_max=1 << 20)
@example(records=[(b"", b"k" * 256, b"", b"")], record_bytes_max=1 << 20)
@example(records=[(b"", b"", b"", b"x" * 10)], record_bytes_max=20)  # exactly at the bound
@example(records=[(b"", b"", b"", b"x" * 11)], record_bytes_max=20)  # one past it
def test_encode_records_agrees_with_the_reference(records, record_bytes_max):
    assert outcome(batch.encode_records, records, record_bytes_max) == outcome(
        batch.python_encode_records, records, record_bytes_max
    )


@given(records=records)
def test_records_off_the_common_case_go_to_the_reference(records):
    for shaped in (
        tuple(records),
        [list(record) for record in records],
        [(bytearray(e), k, p, b) for e, k, p, b in records],
        [(e, k, p, memoryview(b)) for e, k, p, b in records],
        [(e, k, p) for e, k, p, _ in records],
    ):
        assert outcome(batch.encode_records, shaped, 1 << 20) == outcome(
            batch.python_encode_records, shaped, 1 << 20
        )


def stored_batch(records, base_offset, term, timestamp_ms):
    payload = batch.python_encode_records(records, 1 << 20)
    return batch.encode_header(base_offset, term, len(records), timestamp_ms, payload) + payload


@st.composite
def batches(draw):
    """A stored batch (with bytes before it), and where it is, maybe damaged."""
    fitting = st.lists(st.tuples(st.binary(max_size=8), st.binary(max_size=8), fields, fields))
    data = stored_batch(
        draw(fitting.filter(bool)),
        draw(st.integers(0, 2**40)),
        draw(st.integers(0, 2**40)),
        draw(st.integers(0, 2**40)),
    )
    prefix = draw(st.binary(max_size=5))
    header = batch.read_header(prefix + data, len(prefix))
    damage = draw(st.sampled_from(["none", "byte", "count", "length"]))
    body = bytearray(data)
    if damage == "byte":
        at = draw(st.integers(batch.HEADER_BYTES, len(body) - 1))
        body[at] = draw(st.integers(0, 255))
    elif damage == "count":
        header = header._replace(
            record_count=max(0, header.record_count + draw(st.integers(-2, 2)))
        )
    elif damage == "length":
        header = header._replace(length=max(0, header.length + draw(st.integers(-9, 9))))
    return prefix + bytes(body), len(prefix), header


@settings(max_examples=400)
@given(stored=batches(), skip=st.integers(-3, 14))
def test_decode_records_agrees_with_the_reference(stored, skip):
    data, position, header = stored
    first = header.base_offset + skip
    compiled = outcome(batch.decode_records, data, position, header, first)
    assert compiled == outcome(batch.python_decode_records, data, position, header, first)
    if compiled[0] == "returned":
        assert all(type(record) is batch.Record for record in compiled[1])


def test_decoded_records_are_records_that_outlive_the_batch_they_came_from():
    data = stored_batch([(b"amq.direct", b"k", b"\x00\x00", b"body")], 7, 2, 1234)
    decoded = batch.decode_records(data, 0, batch.read_header(data, 0), 7)
    del data
    assert decoded == [batch.Record(7, 1234, 2, b"amq.direct", b"k", b"\x00\x00", b"body")]
    assert decoded[0].body == b"body" and decoded[0]._replace(term=3).term == 3

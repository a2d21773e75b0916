# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled twins of the record codecs every stored message goes through: ``batch.encode_records``
when a queue's tick appends, ``batch.decode_records`` when a consumer's read misses the tail
cache.

The pure-Python functions in ``batch`` stay the reference. These take the common case only
(records that are tuples of four bytes within their bounds; a batch whose framing adds up)
and hand anything else to the reference, so that every error, and its text, comes from one
place. ``tests/test_log_speedups.py`` checks that both agree on any input. ``batch`` uses
these when the install could build them, and ``WARREN_PURE_PYTHON=1`` keeps it on the
reference.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE, PyTuple_SET_ITEM
from libc.stdint cimport uint32_t
from libc.string cimport memcpy

from . import batch


cdef extern from "Python.h":
    object PyType_GenericAlloc(PyTypeObject* type, Py_ssize_t nitems)
    bint PyBytes_CheckExact(object o)
    bint PyTuple_CheckExact(object o)
    bint PyList_CheckExact(object o)


cdef Py_ssize_t RECORD_HEADER_BYTES = batch.RECORD_HEADER_BYTES
cdef Py_ssize_t HEADER_BYTES = batch.HEADER_BYTES
cdef unsigned long long U32_MAX = 0xFFFFFFFF
cdef object RECORD = batch.Record

cdef object _reference_encode = None
cdef object _reference_decode = None


def use_reference(encode_records, decode_records):
    """The pure-Python functions that take every input off the common case."""
    global _reference_encode, _reference_decode
    _reference_encode = encode_records
    _reference_decode = decode_records


cdef inline unsigned char* _put32(unsigned char* at, unsigned long long value):
    at[0] = value & 0xFF
    at[1] = (value >> 8) & 0xFF
    at[2] = (value >> 16) & 0xFF
    at[3] = (value >> 24) & 0xFF
    return at + 4


cdef inline uint32_t _get32(const unsigned char* at):
    return at[0] | (<uint32_t>at[1] << 8) | (<uint32_t>at[2] << 16) | (<uint32_t>at[3] << 24)


cdef inline unsigned char* _put(unsigned char* at, object data):
    cdef Py_ssize_t size = PyBytes_GET_SIZE(data)
    memcpy(at, PyBytes_AS_STRING(data), size)
    return at + size


def encode_records(records, Py_ssize_t record_bytes_max):
    """``batch.encode_records``: the records' framing and bytes, one after another."""
    if not PyList_CheckExact(records):
        return _reference_encode(records, record_bytes_max)
    cdef Py_ssize_t count = PyList_GET_SIZE(records)
    cdef Py_ssize_t i, j, total = 0, size
    cdef object record
    for i in range(count):
        record = <object>PyList_GET_ITEM(records, i)
        if not PyTuple_CheckExact(record) or PyTuple_GET_SIZE(record) != 4:
            return _reference_encode(records, record_bytes_max)
        size = RECORD_HEADER_BYTES
        for j in range(4):
            field = <object>PyTuple_GET_ITEM(record, j)
            if not PyBytes_CheckExact(field):
                return _reference_encode(records, record_bytes_max)
            size += PyBytes_GET_SIZE(field)
        if (
            PyBytes_GET_SIZE(<object>PyTuple_GET_ITEM(record, 0)) > 255
            or PyBytes_GET_SIZE(<object>PyTuple_GET_ITEM(record, 1)) > 255
            or <unsigned long long>PyBytes_GET_SIZE(<object>PyTuple_GET_ITEM(record, 2)) > U32_MAX
            or <unsigned long long>PyBytes_GET_SIZE(<object>PyTuple_GET_ITEM(record, 3)) > U32_MAX
            or size > record_bytes_max
        ):
            return _reference_encode(records, record_bytes_max)
        total += size
    payload = PyBytes_FromStringAndSize(NULL, total)
    cdef unsigned char* at = <unsigned char*>PyBytes_AS_STRING(payload)
    for i in range(count):
        record = <object>PyList_GET_ITEM(records, i)
        exchange = <object>PyTuple_GET_ITEM(record, 0)
        routing_key = <object>PyTuple_GET_ITEM(record, 1)
        properties = <object>PyTuple_GET_ITEM(record, 2)
        body = <object>PyTuple_GET_ITEM(record, 3)
        at[0] = PyBytes_GET_SIZE(exchange)
        at[1] = PyBytes_GET_SIZE(routing_key)
        at = _put32(_put32(at + 2, PyBytes_GET_SIZE(properties)), PyBytes_GET_SIZE(body))
        at = _put(_put(_put(_put(at, exchange), routing_key), properties), body)
    return payload


cdef inline void _set(object record, Py_ssize_t index, object value):
    Py_INCREF(value)
    PyTuple_SET_ITEM(record, index, value)


cdef inline object _slice(const unsigned char* data, Py_ssize_t start, Py_ssize_t end):
    return PyBytes_FromStringAndSize(<const char*>data + start, end - start)


def decode_records(buf, Py_ssize_t position, header, first_offset):
    """``batch.decode_records``: the records of the CRC-verified batch at ``position``, from
    ``first_offset`` on."""
    if not PyBytes_CheckExact(buf) or position < 0:
        return _reference_decode(buf, position, header, first_offset)
    cdef const unsigned char* data = <const unsigned char*>PyBytes_AS_STRING(buf)
    cdef Py_ssize_t buf_end = PyBytes_GET_SIZE(buf)
    cdef Py_ssize_t total = header.total_bytes
    cdef Py_ssize_t end = position + total
    cdef Py_ssize_t pos = position + HEADER_BYTES
    cdef Py_ssize_t count = header.record_count
    cdef Py_ssize_t routing_key_at, properties_at, body_at, record_end, i, skip
    cdef unsigned long long base = header.base_offset
    cdef long long first = first_offset - header.base_offset
    if total < HEADER_BYTES or end > buf_end or count < 0:
        return _reference_decode(buf, position, header, first_offset)
    timestamp_ms = header.max_timestamp_ms
    term = header.term
    records = []
    for i in range(count):
        if pos + RECORD_HEADER_BYTES > end:
            return _reference_decode(buf, position, header, first_offset)
        routing_key_at = pos + RECORD_HEADER_BYTES + data[pos]
        properties_at = routing_key_at + data[pos + 1]
        body_at = properties_at + <Py_ssize_t>_get32(data + pos + 2)
        record_end = body_at + <Py_ssize_t>_get32(data + pos + 6)
        if record_end > end:
            return _reference_decode(buf, position, header, first_offset)
        if i >= first:
            # A Record made as tuple.__new__ would make it, without the call: allocated at
            # its size, then each item set.
            record = PyType_GenericAlloc(<PyTypeObject*>RECORD, 7)
            _set(record, 0, base + i)
            _set(record, 1, timestamp_ms)
            _set(record, 2, term)
            _set(record, 3, _slice(data, pos + RECORD_HEADER_BYTES, routing_key_at))
            _set(record, 4, _slice(data, routing_key_at, properties_at))
            _set(record, 5, _slice(data, properties_at, body_at))
            _set(record, 6, _slice(data, body_at, record_end))
            records.append(record)
        pos = record_end
    if pos != end:
        return _reference_decode(buf, position, header, first_offset)
    return records

# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled twins of two decoders every publish goes through: ``fastpath.scan_properties`` and
``fastpath.decode_publish``.

The pure-Python functions in ``fastpath`` stay the reference. These take the well-formed
case only (every length inside its bounds, text in ASCII) and hand anything else to the
reference, so that every error, and the text a client sees in it, comes from one place.
``tests/test_amqp_speedups.py`` checks that both agree on any bytes. ``fastpath`` uses these
when the install could build them (a C compiler; the build is optional), and
``WARREN_PURE_PYTHON=1`` keeps it on the reference.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeASCII

from . import field_table

cdef unsigned int FLAGS_KNOWN = 0xFFFC
cdef unsigned int HEADERS_FLAG = 0x2000
cdef unsigned int DELIVERY_MODE_FLAG = 0x1000
cdef unsigned int PRIORITY_FLAG = 0x0800
cdef unsigned int EXPIRATION_FLAG = 0x0100
cdef unsigned int TIMESTAMP_FLAG = 0x0040
cdef unsigned int USER_ID_FLAG = 0x0010

_python_scan_properties = None
_python_decode_publish = None


def use_reference(scan_properties, decode_publish):
    """The reference functions that inputs off the fast case go to (``fastpath``'s)."""
    global _python_scan_properties, _python_decode_publish
    _python_scan_properties = scan_properties
    _python_decode_publish = decode_publish


cdef inline bint _ascii(const unsigned char* text, Py_ssize_t length):
    cdef Py_ssize_t i
    for i in range(length):
        if text[i] & 0x80:
            return False
    return True


def scan_properties(property_bytes):
    """``fastpath.scan_properties``: (delivery_mode, priority, expiration, user_id)."""
    if type(property_bytes) is not bytes:
        return _python_scan_properties(property_bytes)
    cdef const unsigned char* data = <const unsigned char*>PyBytes_AS_STRING(property_bytes)
    cdef Py_ssize_t end = PyBytes_GET_SIZE(property_bytes)
    cdef Py_ssize_t offset = 2
    cdef Py_ssize_t start
    cdef unsigned int flags, flag
    cdef int bit
    if end < 2:
        return _python_scan_properties(property_bytes)
    flags = (data[0] << 8) | data[1]
    if flags & ~FLAGS_KNOWN:
        return _python_scan_properties(property_bytes)
    delivery_mode = priority = expiration = user_id = None
    # Fields in wire order: flag bits 15 down to 2.
    for bit in range(15, 1, -1):
        flag = 1u << bit
        if not flags & flag:
            continue
        if flag == HEADERS_FLAG:
            if offset + 4 > end:
                return _python_scan_properties(property_bytes)
            start = offset + 4
            offset = start + (
                (<Py_ssize_t>data[offset] << 24)
                | (<Py_ssize_t>data[offset + 1] << 16)
                | (<Py_ssize_t>data[offset + 2] << 8)
                | data[offset + 3]
            )
            if offset > end:
                return _python_scan_properties(property_bytes)
            try:
                field_table.check(property_bytes, start, offset)
            except Exception:
                return _python_scan_properties(property_bytes)
        elif flag == DELIVERY_MODE_FLAG or flag == PRIORITY_FLAG:
            if offset >= end:
                return _python_scan_properties(property_bytes)
            if flag == DELIVERY_MODE_FLAG:
                delivery_mode = data[offset]
            else:
                priority = data[offset]
            offset += 1
        elif flag == TIMESTAMP_FLAG:
            offset += 8
        else:
            if offset >= end:
                return _python_scan_properties(property_bytes)
            start = offset + 1
            offset = start + data[offset]
            if offset > end or not _ascii(data + start, offset - start):
                return _python_scan_properties(property_bytes)
            if flag == EXPIRATION_FLAG:
                expiration = PyUnicode_DecodeASCII(<const char*>data + start, offset - start, NULL)
            elif flag == USER_ID_FLAG:
                user_id = PyUnicode_DecodeASCII(<const char*>data + start, offset - start, NULL)
    if offset != end:
        return _python_scan_properties(property_bytes)
    return delivery_mode, priority, expiration, user_id


def decode_publish(payload):
    """``fastpath.decode_publish``: (exchange, routing_key, mandatory, immediate)."""
    if type(payload) is not bytes:
        return _python_decode_publish(payload)
    cdef const unsigned char* data = <const unsigned char*>PyBytes_AS_STRING(payload)
    cdef Py_ssize_t size = PyBytes_GET_SIZE(payload)
    cdef Py_ssize_t exchange_end, routing_key_end
    cdef unsigned char bits
    if size < 9:
        return _python_decode_publish(payload)
    exchange_end = 7 + data[6]
    if exchange_end >= size:
        return _python_decode_publish(payload)
    routing_key_end = exchange_end + 1 + data[exchange_end]
    if (
        routing_key_end + 1 != size
        or not _ascii(data + 7, exchange_end - 7)
        or not _ascii(data + exchange_end + 1, routing_key_end - exchange_end - 1)
    ):
        return _python_decode_publish(payload)
    bits = data[routing_key_end]
    return (
        PyUnicode_DecodeASCII(<const char*>data + 7, exchange_end - 7, NULL),
        PyUnicode_DecodeASCII(
            <const char*>data + exchange_end + 1, routing_key_end - exchange_end - 1, NULL
        ),
        (bits & 1) != 0,
        (bits & 2) != 0,
    )

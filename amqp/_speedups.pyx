# cython: language_level=3, boundscheck=False, wraparound=False
"""Compiled twins of the codecs every message goes through: ``fastpath.scan_properties`` and
``fastpath.decode_publish`` on the way in, ``fastpath.deliver_many_parts`` on the way out.

The pure-Python functions in ``fastpath`` stay the reference. These take the common case only
(every length inside its bounds, text in ASCII, a body in one frame) and hand anything else to
the reference, so that every error, and the text a client sees in it, comes from one place.
``tests/test_amqp_speedups.py`` checks that both agree on any input, byte for byte.
``fastpath`` uses these when the install could build them (a C compiler; the build is
optional), and ``WARREN_PURE_PYTHON=1`` keeps it on the reference.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_DecodeASCII
from libc.string cimport memcpy

from . import field_table, frames

cdef unsigned int FLAGS_KNOWN = 0xFFFC
cdef unsigned int HEADERS_FLAG = 0x2000
cdef unsigned int DELIVERY_MODE_FLAG = 0x1000
cdef unsigned int PRIORITY_FLAG = 0x0800
cdef unsigned int EXPIRATION_FLAG = 0x0100
cdef unsigned int TIMESTAMP_FLAG = 0x0040
cdef unsigned int USER_ID_FLAG = 0x0010

cdef object _reference = None


def use_reference(fastpath):
    """The module whose pure-Python functions take every input off the common case."""
    global _reference
    _reference = fastpath


cdef inline bint _ascii(const unsigned char* text, Py_ssize_t length):
    cdef Py_ssize_t i
    for i in range(length):
        if text[i] & 0x80:
            return False
    return True


def scan_properties(property_bytes):
    """``fastpath.scan_properties``: (delivery_mode, priority, expiration, user_id)."""
    if type(property_bytes) is bytes:
        scanned = _scan(property_bytes)
        if scanned is not None:
            return scanned
    return _reference.python_scan_properties(property_bytes)


cdef object _scan(bytes property_bytes):
    """``scan_properties`` on the common case; None for anything else."""
    cdef const unsigned char* data = <const unsigned char*>PyBytes_AS_STRING(property_bytes)
    cdef Py_ssize_t end = PyBytes_GET_SIZE(property_bytes)
    cdef Py_ssize_t offset = 2
    cdef Py_ssize_t start
    cdef unsigned int flags, flag
    cdef int bit
    if end < 2:
        return None
    flags = (data[0] << 8) | data[1]
    if flags & ~FLAGS_KNOWN:
        return None
    delivery_mode = priority = expiration = user_id = None
    # Fields in wire order: flag bits 15 down to 2.
    for bit in range(15, 1, -1):
        flag = 1u << bit
        if not flags & flag:
            continue
        if flag == HEADERS_FLAG:
            if offset + 4 > end:
                return None
            start = offset + 4
            offset = start + (
                (<Py_ssize_t>data[offset] << 24)
                | (<Py_ssize_t>data[offset + 1] << 16)
                | (<Py_ssize_t>data[offset + 2] << 8)
                | data[offset + 3]
            )
            if offset > end:
                return None
            try:
                field_table.check(property_bytes, start, offset)
            except Exception:
                return None
        elif flag == DELIVERY_MODE_FLAG or flag == PRIORITY_FLAG:
            if offset >= end:
                return None
            if flag == DELIVERY_MODE_FLAG:
                delivery_mode = data[offset]
            else:
                priority = data[offset]
            offset += 1
        elif flag == TIMESTAMP_FLAG:
            offset += 8
        else:
            if offset >= end:
                return None
            start = offset + 1
            offset = start + data[offset]
            if offset > end or not _ascii(data + start, offset - start):
                return None
            if flag == EXPIRATION_FLAG:
                expiration = PyUnicode_DecodeASCII(<const char*>data + start, offset - start, NULL)
            elif flag == USER_ID_FLAG:
                user_id = PyUnicode_DecodeASCII(<const char*>data + start, offset - start, NULL)
    if offset != end:
        return None
    return delivery_mode, priority, expiration, user_id


def decode_publish(payload):
    """``fastpath.decode_publish``: (exchange, routing_key, mandatory, immediate)."""
    if type(payload) is bytes:
        decoded = _decode_publish(
            <const unsigned char*>PyBytes_AS_STRING(payload), PyBytes_GET_SIZE(payload)
        )
        if decoded is not None:
            return decoded
    return _reference.python_decode_publish(payload)


cdef object _decode_publish(const unsigned char* data, Py_ssize_t size):
    """``decode_publish`` of the method payload at ``data`` on the common case; None for
    anything else."""
    cdef Py_ssize_t exchange_end, routing_key_end
    cdef unsigned char bits
    if size < 9:
        return None
    exchange_end = 7 + data[6]
    if exchange_end >= size:
        return None
    routing_key_end = exchange_end + 1 + data[exchange_end]
    if (
        routing_key_end + 1 != size
        or not _ascii(data + 7, exchange_end - 7)
        or not _ascii(data + exchange_end + 1, routing_key_end - exchange_end - 1)
    ):
        return None
    bits = data[routing_key_end]
    return (
        PyUnicode_DecodeASCII(<const char*>data + 7, exchange_end - 7, NULL),
        PyUnicode_DecodeASCII(
            <const char*>data + exchange_end + 1, routing_key_end - exchange_end - 1, NULL
        ),
        (bits & 1) != 0,
        (bits & 2) != 0,
    )


cdef Py_ssize_t FRAME_MIN_BYTES = frames.FRAME_MIN_BYTES
cdef Py_ssize_t FRAME_OVERHEAD_BYTES = frames.FRAME_OVERHEAD_BYTES
cdef unsigned char FRAME_METHOD = frames.FRAME_METHOD
cdef unsigned char FRAME_HEADER = frames.FRAME_HEADER
cdef unsigned char FRAME_BODY = frames.FRAME_BODY
cdef unsigned char FRAME_END = frames.FRAME_END
# A body up to this size is copied into its message's one bytes object; a larger one is its own
# part, copied once, into the connection's coalesced write.
cdef Py_ssize_t BODY_INLINE_BYTES_MAX = 1024


cdef inline unsigned char* _put16(unsigned char* at, unsigned long value):
    at[0] = (value >> 8) & 0xFF
    at[1] = value & 0xFF
    return at + 2


cdef inline unsigned char* _put32(unsigned char* at, unsigned long long value):
    at[0] = (value >> 24) & 0xFF
    at[1] = (value >> 16) & 0xFF
    at[2] = (value >> 8) & 0xFF
    at[3] = value & 0xFF
    return at + 4


cdef inline unsigned char* _put64(unsigned char* at, unsigned long long value):
    _put32(at, value >> 32)
    return _put32(at + 4, value & 0xFFFFFFFF)


cdef inline unsigned char* _put(unsigned char* at, bytes data, Py_ssize_t size):
    memcpy(at, PyBytes_AS_STRING(data), size)
    return at + size


def deliver_many_parts(parts, channel, consumer_tag, first_tag, messages, frame_max):
    """``fastpath.deliver_many_parts``: each message's frames appended to ``parts`` as one
    bytes object (its body a part of its own above ``BODY_INLINE_BYTES_MAX``); returns the
    bodies' bytes."""
    if (
        type(parts) is not list
        or type(channel) is not int
        or type(first_tag) is not int
        or type(frame_max) is not int
        or not 0 <= channel <= 0xFFFF
        or not 0 <= first_tag < (1 << 63)
        or not FRAME_MIN_BYTES <= frame_max <= 0xFFFFFFFF
    ):
        return _reference.python_deliver_many_parts(
            parts, channel, consumer_tag, first_tag, messages, frame_max
        )
    cdef bytes tag = _reference._shortstr(consumer_tag)
    cdef Py_ssize_t tag_size = PyBytes_GET_SIZE(tag)
    cdef Py_ssize_t chunk_bytes_max = frame_max - FRAME_OVERHEAD_BYTES
    cdef unsigned long long delivery_tag = first_tag
    cdef Py_ssize_t body_bytes = 0
    cdef Py_ssize_t exchange_size, routing_key_size, properties_size, body_size, method_size
    cdef Py_ssize_t inline_size, size
    cdef unsigned char* at
    cdef bytes framed
    for message in messages:
        exchange = message.exchange
        routing_key = message.routing_key
        property_bytes = message.properties
        body = message.body
        if (
            type(exchange) is not bytes
            or type(routing_key) is not bytes
            or type(property_bytes) is not bytes
            or type(body) is not bytes
            or PyBytes_GET_SIZE(exchange) > 255
            or PyBytes_GET_SIZE(routing_key) > 255
            or PyBytes_GET_SIZE(body) > chunk_bytes_max
            or delivery_tag >= (1ULL << 63)
        ):
            # Off the common case (a body split over frames, a name too long to send, ...):
            # this message goes through the reference.
            body_bytes += _reference.python_deliver_many_parts(
                parts, channel, consumer_tag, delivery_tag, [message], frame_max
            )
            delivery_tag += 1
            continue
        exchange_size = PyBytes_GET_SIZE(exchange)
        routing_key_size = PyBytes_GET_SIZE(routing_key)
        properties_size = PyBytes_GET_SIZE(property_bytes)
        body_size = PyBytes_GET_SIZE(body)
        method_size = 16 + tag_size + exchange_size + routing_key_size
        inline_size = body_size if body_size <= BODY_INLINE_BYTES_MAX else 0
        size = (7 + method_size + 1) + (7 + 12 + properties_size + 1)
        if body_size:
            size += 7 + inline_size + (1 if inline_size else 0)
        framed = PyBytes_FromStringAndSize(NULL, size)
        at = <unsigned char*>PyBytes_AS_STRING(framed)
        # basic.deliver
        at[0] = FRAME_METHOD
        at = _put32(_put16(at + 1, channel), method_size)
        at = _put16(_put16(at, 60), 60)
        at[0] = tag_size
        at = _put(at + 1, tag, tag_size)
        at = _put64(at, delivery_tag)
        at[0] = 1 if message.redelivered else 0
        at[1] = exchange_size
        at = _put(at + 2, exchange, exchange_size)
        at[0] = routing_key_size
        at = _put(at + 1, routing_key, routing_key_size)
        at[0] = FRAME_END
        # content header
        at[1] = FRAME_HEADER
        at = _put32(_put16(at + 2, channel), 12 + properties_size)
        at = _put64(_put16(_put16(at, 60), 0), body_size)
        at = _put(at, property_bytes, properties_size)
        at[0] = FRAME_END
        at += 1
        if body_size:
            at[0] = FRAME_BODY
            at = _put32(_put16(at + 1, channel), body_size)
            if inline_size:
                at = _put(at, body, body_size)
                at[0] = FRAME_END
        parts.append(framed)
        if body_size and not inline_size:
            parts.append(body)
            parts.append(frames.FRAME_END_BYTE)
        body_bytes += body_size
        delivery_tag += 1
    return body_bytes


cdef inline Py_ssize_t _whole_frame(
    const unsigned char* data,
    Py_ssize_t end,
    Py_ssize_t at,
    unsigned char frame_type,
    unsigned int channel,
    Py_ssize_t frame_bytes_max,
):
    """The payload size of the frame at ``at``: one of ``frame_type`` on ``channel``, whole in
    the buffer, within the frame bound and properly ended. -1 for anything else."""
    cdef Py_ssize_t size
    if at + 7 > end or data[at] != frame_type or ((data[at + 1] << 8) | data[at + 2]) != channel:
        return -1
    size = (
        (<Py_ssize_t>data[at + 3] << 24)
        | (<Py_ssize_t>data[at + 4] << 16)
        | (<Py_ssize_t>data[at + 5] << 8)
        | data[at + 6]
    )
    if size > frame_bytes_max or at + 7 + size >= end or data[at + 7 + size] != FRAME_END:
        return -1
    return size


def publish_frames(
    buffer, Py_ssize_t offset, Py_ssize_t frame_bytes_max, Py_ssize_t message_bytes_max,
    confirm_tag, event_type,
):
    """A whole publish at ``offset`` in ``buffer``: (the offset after it, the
    ``event_type`` (``events.MessagePublished``) it makes, with ``confirm_tag``), or None.

    ``Connection.next_event`` asks this first when a method frame starts at ``offset`` on a
    channel that awaits one. It takes the common case only: the basic.publish frame, its
    content header and its body in one frame (none for an empty body), all three whole in
    the buffer, on the same channel, each within the frame bound and well formed, the body
    within the message bound. Anything else (a body split over frames, a frame still
    arriving, any error) is None, and the connection parses the frames one by one, as it
    would without this: the reference. ``tests/test_amqp_speedups.py`` holds the two to the
    same events and the same bytes sent, whatever the input and however it arrives."""
    if type(buffer) is not bytes:
        return None
    cdef const unsigned char* data = <const unsigned char*>PyBytes_AS_STRING(buffer)
    cdef Py_ssize_t end = PyBytes_GET_SIZE(buffer)
    cdef unsigned int channel
    cdef Py_ssize_t method_size, header_size, body_frame_size, at
    cdef unsigned long long body_size
    if offset < 0 or offset + 7 > end:
        return None
    channel = (data[offset + 1] << 8) | data[offset + 2]
    method_size = _whole_frame(data, end, offset, FRAME_METHOD, channel, frame_bytes_max)
    at = offset + 7
    if (
        method_size < 4
        or ((data[at] << 8) | data[at + 1]) != 60
        or ((data[at + 2] << 8) | data[at + 3]) != 40
    ):
        return None
    publish = _decode_publish(data + at, method_size)
    if publish is None or publish[3]:
        return None
    at += method_size + 1
    header_size = _whole_frame(data, end, at, FRAME_HEADER, channel, frame_bytes_max)
    at += 7
    if header_size < 14 or ((data[at] << 8) | data[at + 1]) != 60 or data[at + 2] or data[at + 3]:
        return None
    body_size = (
        (<unsigned long long>data[at + 4] << 56)
        | (<unsigned long long>data[at + 5] << 48)
        | (<unsigned long long>data[at + 6] << 40)
        | (<unsigned long long>data[at + 7] << 32)
        | (<unsigned long long>data[at + 8] << 24)
        | (<unsigned long long>data[at + 9] << 16)
        | (<unsigned long long>data[at + 10] << 8)
        | data[at + 11]
    )
    if message_bytes_max < 0 or body_size > <unsigned long long>message_bytes_max:
        return None
    property_bytes = PyBytes_FromStringAndSize(<const char*>data + at + 12, header_size - 12)
    scanned = _scan(property_bytes)
    if scanned is None:
        return None
    at += header_size + 1
    if body_size == 0:
        body = b""
    else:
        body_frame_size = _whole_frame(data, end, at, FRAME_BODY, channel, frame_bytes_max)
        if body_frame_size < 0 or <unsigned long long>body_frame_size != body_size:
            return None
        body = PyBytes_FromStringAndSize(<const char*>data + at + 7, body_frame_size)
        at += 7 + body_frame_size + 1
    exchange, routing_key, mandatory, _ = publish
    delivery_mode, priority, expiration, user_id = scanned
    return at, tuple.__new__(
        event_type,
        (
            channel,
            exchange,
            routing_key,
            mandatory,
            property_bytes,
            body,
            delivery_mode,
            priority,
            expiration,
            user_id,
            confirm_tag,
        ),
    )

"""The replication messages' binary codec: every message round-trips, and any other input
raises CodecError, never anything else."""

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warrenmq.cluster.replication.codec import CodecError, decode, encode
from warrenmq.cluster.replication.messages import (
    AlterIsr,
    EpochAnswer,
    EpochQuery,
    FetchedPartition,
    FetchError,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    PartitionState,
)

i64 = st.integers(-(2**63), 2**63 - 1)
u32 = st.integers(0, 2**32 - 1)
node = st.integers(-(2**31), 2**31 - 1)
nodes = st.lists(node, max_size=7).map(tuple)
key = st.one_of(st.binary(max_size=40), st.text(max_size=20))
error = st.sampled_from(FetchError)

messages = st.one_of(
    st.builds(PartitionState, nodes, node, i64, nodes, i64),
    st.builds(
        FetchRequest,
        st.integers(0, 2**64 - 1),
        node,
        u32,
        u32,
        st.lists(st.builds(EpochQuery, key, i64, i64), max_size=4).map(tuple),
        st.lists(st.builds(FetchPartition, key, i64, i64, i64), max_size=4).map(tuple),
    ),
    st.builds(
        FetchResponse,
        st.integers(0, 2**64 - 1),
        st.lists(st.builds(EpochAnswer, key, error, i64, i64), max_size=4).map(tuple),
        st.lists(
            st.builds(FetchedPartition, key, error, i64, i64, st.binary(max_size=100)),
            max_size=4,
        ).map(tuple),
    ),
    st.builds(AlterIsr, key, node, i64, i64, nodes),
)


@given(messages)
def test_every_message_round_trips(message):
    assert decode(encode(message)) == message


@given(messages, st.data())
def test_a_cut_or_extended_message_raises_codec_error(message, data):
    encoded = encode(message)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(CodecError):
        decode(encoded[:cut])
    with pytest.raises(CodecError):
        decode(encoded + b"\x00")


@given(st.binary(max_size=300))
def test_garbage_raises_codec_error_or_decodes_to_a_message_that_round_trips(data):
    try:
        message = decode(data)
    except CodecError:
        return
    assert encode(message) == data


@given(messages, st.data())
def test_flipped_bytes_never_raise_anything_but_codec_error(message, data):
    encoded = bytearray(encode(message))
    at = data.draw(st.integers(0, len(encoded) - 1))
    encoded[at] ^= data.draw(st.integers(1, 255))
    try:
        decode(bytes(encoded))
    except CodecError:
        pass


def test_a_forged_count_is_refused_before_any_work():
    forged = bytes([3]) + struct.pack("<QI", 7, 2**32 - 1)
    with pytest.raises(CodecError, match="overruns"):
        decode(forged)


def test_fields_out_of_range_and_foreign_objects_raise_codec_error():
    with pytest.raises(CodecError):
        encode(AlterIsr(b"k", 1, 2**63, 0, (1,)))
    with pytest.raises(CodecError):
        encode(AlterIsr(1234, 1, 1, 0, (1,)))  # type: ignore[arg-type]
    with pytest.raises(CodecError):
        encode("not a message")  # type: ignore[arg-type]
    with pytest.raises(CodecError, match="kind"):
        decode(b"\x09")
    with pytest.raises(CodecError):
        decode(b"")

"""The super stream exchange: RabbitMQ stream clients' murmur3 routing, partition order, the
explicit partition header, binding checks."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warrenmq.exchanges.binding import QUEUE, Destination
from warrenmq.exchanges.errors import PreconditionFailed
from warrenmq.exchanges.router import Router
from warrenmq.exchanges.super_stream import (
    PARTITION_HEADER,
    PARTITION_ORDER,
    SUPER_STREAM,
    SuperStreamExchange,
    partition_index,
)


@pytest.mark.parametrize(
    ("key", "unsigned_hash"),
    # The stream Java client's own test vectors (HashUtilsTest, default seed).
    [("hello", 1321743225), ("brave", 3825276426), ("new", 2970740106), ("world", 2453398188)],
)
def test_keys_hash_as_the_stream_clients_hash_them(key, unsigned_hash):
    for partitions in (1, 2, 3, 7, 1024):
        assert partition_index(key, partitions) == unsigned_hash % partitions


def partitioned(count: int, *, reverse: bool = False) -> SuperStreamExchange:
    table = SuperStreamExchange()
    orders = range(count - 1, -1, -1) if reverse else range(count)
    for order in orders:
        table.bind(Destination(QUEUE, f"s-{order}"), str(order), {PARTITION_ORDER: order})
    return table


@given(st.text(max_size=40), st.integers(1, 16))
def test_one_partition_per_message_chosen_by_the_key_in_partition_order(key, count):
    expected = [Destination(QUEUE, f"s-{partition_index(key, count)}")]
    assert list(partitioned(count).match(key)) == expected
    # The order argument decides, not the order of binding.
    assert list(partitioned(count, reverse=True).match(key)) == expected


def test_the_partition_header_names_a_partition():
    table = partitioned(3)
    assert list(table.match("hello", {PARTITION_HEADER: 2})) == [Destination(QUEUE, "s-2")]
    assert list(table.match("hello", {PARTITION_HEADER: 9})) == []
    assert list(table.match("hello", {PARTITION_HEADER: "1"})) == []
    assert list(table.match("hello", {"other": 1})) == [Destination(QUEUE, "s-0")]
    assert list(SuperStreamExchange().match("hello")) == []


def test_bindings_need_an_order_and_unbinding_reorders():
    table = partitioned(3)
    for arguments in ({}, {PARTITION_ORDER: "1"}, {PARTITION_ORDER: True}):
        with pytest.raises(PreconditionFailed):
            table.validate_binding(arguments)
    table.unbind(Destination(QUEUE, "s-1"), "1", {PARTITION_ORDER: 1})
    assert table.partitions() == [Destination(QUEUE, "s-0"), Destination(QUEUE, "s-2")]
    key = next(k for k in map(str, range(100)) if partition_index(k, 2) == 1)
    assert list(table.match(key)) == [Destination(QUEUE, "s-2")]


def test_the_router_routes_a_super_stream_and_never_caches_it():
    queues = {"s-0", "s-1"}
    router = Router(queue_exists=queues.__contains__)
    router.declare("s", SUPER_STREAM, durable=True)
    for order in (0, 1):
        router.bind_queue("s", f"s-{order}", str(order), {PARTITION_ORDER: order})
    assert router.route("s", "hello") == {f"s-{partition_index('hello', 2)}"}
    assert router.route("s", "hello", {PARTITION_HEADER: 1}) == {"s-1"}
    with pytest.raises(PreconditionFailed):
        router.bind_queue("s", "s-0", "x", {})

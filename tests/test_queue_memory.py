"""Memory grows with holes and in-flight messages, never with queue depth."""

import asyncio
import gc
import tracemalloc

import pytest

from warrenmq.log import LogConfig
from warrenmq.server.queue import LogQueue, QueueConfig

# A broker appends one batch per queue per event-loop tick; 100 messages is a busy tick.
BATCH = 100
# Without the log's tail cache, what remains is the queue's own state and the logs' indexes.
NO_TAIL_CACHE = QueueConfig(
    message_log=LogConfig(segment_bytes_max=16 << 20, tail_cache_bytes_max=0)
)


def fill(queue, start, count):
    for base in range(start, start + count, BATCH):
        queue.append(
            [(b"", b"work", b"\x10\x00\x02", b"%064d" % i) for i in range(base, base + BATCH)]
        )


def traced_bytes():
    gc.collect()
    return tracemalloc.get_traced_memory()[0]


def measure(directory, config):
    async def scenario():
        queue = LogQueue.open(directory, config)
        tracemalloc.start()
        try:
            empty = traced_bytes()
            fill(queue, 0, 10_000)
            await queue.commit()
            shallow = traced_bytes()
            fill(queue, 10_000, 990_000)
            await queue.commit()
            deep = traced_bytes()
            # Some consumers: a thousand in flight, every other one acked, out of order.
            taken = queue.take_many(1000)
            queue.ack_many(m.offset for m in taken[1::2])
            del taken
            await queue.commit()
            busy = traced_bytes()
        finally:
            tracemalloc.stop()
        assert queue.ready_count == 999_000 and queue.unacked_count == 500
        queue.close()
        return empty, shallow, deep, busy

    return asyncio.run(scenario())


@pytest.mark.slow
def test_a_million_ready_messages_cost_no_more_than_ten_thousand(tmp_path):
    empty, shallow, deep, busy = measure(tmp_path, NO_TAIL_CACHE)
    assert shallow - empty < 1 << 20, (empty, shallow)
    # 990,000 more messages: only the logs' sparse indexes grow (16 bytes per 4 KiB written).
    assert deep - shallow < 1 << 20, (shallow, deep)
    # 500 in flight, 500 holes and the read-ahead slice: a few hundred kilobytes at most.
    assert busy - deep < 1 << 20, (deep, busy)


@pytest.mark.slow
def test_a_million_ready_messages_with_the_default_tail_cache_stay_under_the_budget(tmp_path):
    """The issue's budget: a million ready 64-byte messages add < 50 MB to the broker."""
    empty, _, deep, busy = measure(tmp_path, QueueConfig())
    assert busy - empty < 50 << 20, (empty, deep, busy)

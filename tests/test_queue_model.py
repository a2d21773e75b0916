"""Model test of the durable queue: random append/take/ack/requeue/purge/commit/crash sequences.

Between crashes the queue must behave exactly like a plain in-memory model (which message
each take returns, its redelivered flag and delivery count, the counts). At a crash, each log
keeps its fsynced part plus an arbitrary prefix of what was written after the last fsync (the
partition log's own crash recovery is tested to leave exactly that); the reopened queue must
then satisfy the guarantees stated in `warrenmq.server.queue.log_queue`:

* every committed message is there, once, and every message present is intact;
* no message whose ack was durable comes back; every message not acked comes back;
* a message that had been delivered comes back with redelivered=True;
* its delivery count is never more than the deliveries it had, and after a clean shutdown
  exactly that (redeliveries write their counts to the ack log).
"""

import asyncio

import pytest
from doubles import HeldExecutor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from warrenmq.log import LogConfig
from warrenmq.server.queue import LogQueue, QueueConfig


class Model:
    def __init__(self):
        self.bodies = []  # by offset
        self.durable_end = 0  # messages below are fsynced
        self.acked = set()
        self.pending_acks = set()  # acked in memory, not yet durable
        self.durable_acks = set()
        self.in_flight = set()
        self.redeliver = set()
        self.next = 0
        self.counts = {}  # offset -> deliveries so far

    @property
    def ready(self):
        return len(self.redeliver) + len(self.bodies) - self.next

    def expected_take(self):
        if self.redeliver:
            offset = min(self.redeliver)
            return offset, True, self.counts[offset] + 1
        if self.next < len(self.bodies):
            return self.next, False, 1
        return None

    def took(self, offset):
        self.redeliver.discard(offset)
        self.in_flight.add(offset)
        self.counts[offset] = self.counts.get(offset, 0) + 1
        if offset == self.next:
            self.next += 1

    def ack(self, offset):
        self.in_flight.remove(offset)
        self.acked.add(offset)
        self.pending_acks.add(offset)

    def begin_commit(self):
        """What a commit starting now vouches for once it returns."""
        return set(self.pending_acks), len(self.bodies)

    def end_commit(self, begun):
        written, end = begun
        self.durable_acks |= written
        self.pending_acks -= written
        self.durable_end = max(self.durable_end, end)


class Harness:
    def __init__(self, directory, config):
        self.directory = directory
        self.config = config
        self.executor = HeldExecutor()
        self.model = Model()
        self.queue = LogQueue.open(directory, config, executor=self.executor)
        self.in_flight_commit = None  # (task, what the model gets when it returns)

    async def begin_commit(self):
        assert self.in_flight_commit is None
        begun = self.model.begin_commit()
        task = asyncio.ensure_future(self.queue.commit())
        # Let the commit write its ack record and hand both fsyncs to the executor.
        for _ in range(5):
            await asyncio.sleep(0)
        self.in_flight_commit = (task, begun)

    async def finish_commit(self):
        task, begun = self.in_flight_commit
        self.in_flight_commit = None
        while not task.done():
            self.executor.run_all()
            await asyncio.sleep(0)
        durable = task.result()
        self.model.end_commit(begun)
        return durable

    async def commit(self):
        if self.in_flight_commit is not None:
            await self.finish_commit()
        await self.begin_commit()
        return await self.finish_commit()

    def crash(self, data):
        """Lose whatever the last fsyncs did not cover, keeping any prefix of it."""
        queue = self.queue
        self.executor.drop_all()
        if self.in_flight_commit is not None:
            self.in_flight_commit[0].cancel()
            self.in_flight_commit = None
        log, acks = queue._log, queue._acks
        log.truncate(
            data.draw(st.integers(log.durable_offset, log.end_offset), label="messages kept")
        )
        acks.truncate(
            data.draw(st.integers(acks.durable_offset, acks.end_offset), label="ack records kept")
        )
        queue.close()

    def reopen(self):
        self.queue = LogQueue.open(self.directory, self.config, executor=self.executor)


def config_strategy():
    return st.builds(
        lambda lead, uncommitted, segment, compact: QueueConfig(
            message_log=LogConfig(
                segment_bytes_max=segment, tail_cache_bytes_max=256, index_interval_bytes=64
            ),
            ack_log=LogConfig(
                segment_bytes_max=256, tail_cache_bytes_max=0, index_interval_bytes=64
            ),
            delivered_mark_lead=lead,
            ack_log_compact_bytes=compact,
            read_ahead_records_max=3,
            deliver_uncommitted=uncommitted,
        ),
        st.integers(2, 8),
        st.booleans(),
        st.sampled_from([200, 400, 1 << 20]),
        st.sampled_from([64, 300, 1 << 20]),
    )


async def take_checked(harness):
    queue, model = harness.queue, harness.model
    expected = model.expected_take()
    held = queue.held_until_commit
    message = queue.take()
    assert held == (message is None and expected is not None)
    if message is None and expected is not None:
        # Only new messages may wait, for the delivered mark or (quorum style) their fsync.
        assert not expected[1]
        if harness.in_flight_commit is not None:
            await harness.finish_commit()
            message = queue.take()
        if message is None:
            assert queue.needs_commit
            await harness.commit()
            message = queue.take()
    if expected is None:
        assert message is None
        return
    assert message is not None
    assert (message.offset, message.redelivered, message.delivery_count) == expected
    assert message.body == model.bodies[message.offset]
    assert message.exchange == b"ex" and message.routing_key == b"rk%d" % message.offset
    model.took(message.offset)


def check_recovered(queue, model, delivered_before, exact_counts=False):
    end = queue.end_offset
    assert model.durable_end <= end <= len(model.bodies)
    redeliver = set(queue._redeliver)
    assert len(redeliver) == len(queue._redeliver)
    ready = redeliver | set(range(queue._next, end))
    for offset in range(end):
        if offset in model.durable_acks:
            assert offset not in ready, f"durably acked {offset} came back"
        if offset not in model.acked:
            assert offset in ready, f"unacked {offset} was lost"
        if offset in ready and offset in delivered_before:
            assert offset in redeliver, f"delivered {offset} came back as new"
    assert queue.ready_count == len(ready)
    assert queue.unacked_count == 0
    # Every surviving message is intact.
    offset = queue._log.start_offset
    while offset < end:
        records = queue._log.read(offset, 50)
        for record in records:
            assert record.body == model.bodies[record.offset]
        offset = records[-1].offset + 1
    # From here on the model follows what survived.
    del model.bodies[end:]
    model.durable_end = end
    model.acked = {o for o in range(end) if o not in ready}
    model.durable_acks = set(model.acked)
    model.pending_acks = set()
    model.in_flight = set()
    model.redeliver = redeliver
    model.next = queue._next
    counts = {}
    for offset in range(model.next):
        if offset in ready:
            recovered = queue.deliveries(offset)
            had = model.counts.get(offset, 1)
            assert 1 <= recovered <= had, (offset, recovered, had)
            if exact_counts:
                assert recovered == had, (offset, recovered, had)
        counts[offset] = queue.deliveries(offset)
    model.counts = counts


async def run(directory, config, data):
    harness = Harness(directory, config)
    model = harness.model
    serial = 0
    try:
        for _ in range(data.draw(st.integers(1, 60), label="steps")):
            queue = harness.queue
            op = data.draw(st.sampled_from(OPS), label="op")
            if op == "append":
                n = data.draw(st.integers(1, 5), label="n")
                records = []
                for i in range(n):
                    offset = len(model.bodies) + i
                    records.append((b"ex", b"rk%d" % offset, b"\x90\x00", b"body-%d" % serial))
                    serial += 1
                assert queue.append(records) == len(model.bodies)
                model.bodies += [r[3] for r in records]
            elif op == "take":
                await take_checked(harness)
            elif op == "take_many":
                count = data.draw(st.integers(1, 6), label="count")
                messages = queue.take_many(count)
                assert len(messages) <= count
                for message in messages:
                    expected = model.expected_take()
                    assert (message.offset, message.redelivered, message.delivery_count) == expected
                    assert message.body == model.bodies[message.offset]
                    model.took(message.offset)
                if len(messages) < count and model.expected_take() is not None:
                    # Stopped early: only at new messages waiting for a commit.
                    assert not model.expected_take()[1]
                    assert queue.needs_commit or harness.in_flight_commit is not None
            elif op in ("ack", "ack_many", "requeue") and model.in_flight:
                chosen = data.draw(
                    st.lists(
                        st.sampled_from(sorted(model.in_flight)),
                        min_size=1,
                        max_size=4,
                        unique=True,
                    ),
                    label="offsets",
                )
                if op == "ack":
                    assert queue.ack(chosen[0])
                    model.ack(chosen[0])
                elif op == "ack_many":
                    assert queue.ack_many(chosen) == len(chosen)
                    for offset in chosen:
                        model.ack(offset)
                else:
                    assert queue.requeue(chosen) == len(chosen)
                    for offset in chosen:
                        model.in_flight.remove(offset)
                        model.redeliver.add(offset)
            elif op == "stale":
                offset = data.draw(st.integers(0, len(model.bodies) + 2), label="stale")
                if offset not in model.in_flight:
                    assert not queue.ack(offset)
                    assert queue.requeue([offset]) == 0
            elif op == "peek":
                message = queue.peek()
                expected = model.expected_take()
                if expected is None:
                    assert message is None
                else:
                    assert (message.offset, message.redelivered, message.delivery_count) == expected
                    assert message.body == model.bodies[message.offset]
            elif op == "drop_head":
                count = data.draw(st.integers(1, 4), label="count")
                dropped = []
                while len(dropped) < count and model.expected_take() is not None:
                    offset = model.expected_take()[0]
                    model.redeliver.discard(offset)
                    if offset == model.next:
                        model.next += 1
                    model.acked.add(offset)
                    model.pending_acks.add(offset)
                    dropped.append(offset)
                assert queue.drop_head(count) == len(dropped)
            elif op == "purge":
                assert queue.purge() == model.ready
                purged = model.redeliver | set(range(model.next, len(model.bodies)))
                model.acked |= purged
                model.pending_acks |= purged
                model.redeliver = set()
                model.next = len(model.bodies)
            elif op == "commit":
                assert await harness.commit() == len(model.bodies)
            elif op == "begin_commit" and harness.in_flight_commit is None:
                await harness.begin_commit()
            elif op == "finish_commit" and harness.in_flight_commit is not None:
                await harness.finish_commit()
            elif op == "crash":
                delivered = set(model.counts)
                harness.crash(data)
                harness.reopen()
                check_recovered(harness.queue, model, delivered)
            elif op == "shutdown":
                if harness.in_flight_commit is not None:
                    await harness.finish_commit()
                assert queue.requeue(sorted(model.in_flight)) == len(model.in_flight)
                model.redeliver |= model.in_flight
                model.in_flight = set()
                shutdown = asyncio.ensure_future(queue.shutdown())
                while not shutdown.done():
                    harness.executor.run_all()
                    await asyncio.sleep(0)
                shutdown.result()
                model.end_commit(model.begin_commit())
                delivered = set(model.counts)
                next_before = model.next
                harness.reopen()
                check_recovered(harness.queue, model, delivered, exact_counts=True)
                # A clean restart flags exactly what was delivered, nothing more.
                assert harness.queue._next == next_before
                assert set(harness.queue._redeliver) <= delivered
            queue = harness.queue
            assert queue.ready_count == model.ready
            assert queue.unacked_count == len(model.in_flight)
            assert queue.floor == min(set(range(len(model.bodies) + 1)) - model.acked)
        # Drain: everything not acked is delivered, exactly once.
        queue = harness.queue
        while model.in_flight:
            offset = min(model.in_flight)
            queue.requeue([offset])
            model.in_flight.remove(offset)
            model.redeliver.add(offset)
        while model.ready:
            await take_checked(harness)
        assert queue.take() is None
    finally:
        harness.executor.drop_all()
        harness.queue.close()


OPS = [
    "append",
    "append",
    "take",
    "take",
    "take",
    "ack",
    "ack_many",
    "requeue",
    "stale",
    "purge",
    "commit",
    "begin_commit",
    "finish_commit",
    "crash",
    "shutdown",
]


SETTINGS = dict(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@settings(max_examples=40, **SETTINGS)
@given(config=config_strategy(), data=st.data())
def test_queue_matches_the_model_across_crashes(tmp_path_factory, config, data):
    asyncio.run(run(tmp_path_factory.mktemp("queue"), config, data))


@pytest.mark.slow
@settings(max_examples=600, **SETTINGS)
@given(config=config_strategy(), data=st.data())
def test_queue_matches_the_model_across_many_crashes(tmp_path_factory, config, data):
    asyncio.run(run(tmp_path_factory.mktemp("queue"), config, data))

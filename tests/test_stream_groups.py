"""Consumer groups without a socket: partitions spread evenly, cooperative moves (a partition
changes owner only once its deliveries are acked, or returned by a member that left), order
per partition and every message delivered, committed offsets resumed."""

from __future__ import annotations

import asyncio
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from warrenmq.amqp import properties as props
from warrenmq.log import LogConfig
from warrenmq.server.stream.cursor import Cursor
from warrenmq.server.stream.groups import Group
from warrenmq.server.stream.offset_spec import OffsetSpec, Start
from warrenmq.server.stream.stream import Stream, StreamLog

NOW_MS = 1_700_000_000_000
FIRST = OffsetSpec(Start.FIRST)


class Channel:
    """A member's channel: keeps its unacked deliveries as (cursor, consumer, offset)."""

    def __init__(self, name: str, log: list) -> None:
        self.name = name
        self.log = log
        self.unacked: list = []

    def can_deliver(self):
        return True

    def credit(self):
        return 1_000_000

    def block(self, consumer):
        raise AssertionError("never out of channel credit")

    def forget_blocked(self, consumer):
        pass

    def deliver(self, consumer, messages):
        consumer.unacked_count += len(messages)
        for message in messages:
            headers = dict(props.headers(message.properties))
            partition = props.text(headers["x-stream-partition"])
            assert props.integer(headers["x-stream-offset"]) == message.offset
            self.unacked.append((consumer.queue, consumer, message.offset))
            self.log.append((self.name, partition, message.offset))

    def cancel(self, consumer, reason):
        pass

    def ack_some(self, rng: random.Random) -> None:
        """Ack a random subset of what it holds, in random order."""
        rng.shuffle(self.unacked)
        keep = rng.randrange(len(self.unacked) + 1)
        acked, self.unacked = self.unacked[keep:], self.unacked[:keep]
        for cursor, consumer, offset in acked:
            consumer.unacked_count -= 1
            cursor.ack([offset])
            cursor.prefetch_freed(consumer)


def open_partitions(directory, count):
    partitions = []
    for index in range(count):
        engine = StreamLog.open(directory / f"p-{index}", LogConfig(), {})
        partitions.append(
            Stream(
                "/",
                f"p-{index}",
                engine,
                arguments={},
                effective_arguments={},
                batch_records_max=64,
            )
        )
    return partitions


def publish(partition: Stream, count: int) -> None:
    for _ in range(count):
        partition.stage((b"", b"k", b"\x00\x00", b"x"), True)
    partition.flush(NOW_MS)
    asyncio.run(partition.commit())


def active_owners(group: Group) -> dict[int, list[str]]:
    """Who may be handed messages of each partition now (a consumer rotating on it)."""
    owners: dict[int, list[str]] = {}
    for index, partition in enumerate(group.partitions):
        owners[index] = [c.channel.name for c in partition.consumers.values()]
    return owners


def test_partitions_spread_evenly_and_resume_from_the_committed_offset(tmp_path):
    partitions = open_partitions(tmp_path, 4)
    for partition in partitions:
        publish(partition, 5)
    log: list = []
    group = Group("s", "g", partitions, lambda cursor: None)
    channels = {name: Channel(name, log) for name in "ab"}
    members = {n: group.join(n, c, FIRST, None, 100) for n, c in channels.items()}
    assert {i: o for i, o in active_owners(group).items()} == {
        0: ["a"],
        1: ["b"],
        2: ["a"],
        3: ["b"],
    }
    for partition in partitions:
        partition.dispatch(NOW_MS)
    assert len(log) == 20
    # b acks only partition 1's first two; then leaves: partition 1 resumes at 2, 3 at 0.
    for cursor, _, offset in list(channels["b"].unacked):
        if cursor.stream.name == "p-1" and offset < 2:
            cursor.ack([offset])
    group.leave(members["b"].queue)
    assert active_owners(group) == {0: ["a"], 1: ["a"], 2: ["a"], 3: ["a"]}
    starts = {p.name: next(iter(p.consumers.values())).queue.next_offset for p in partitions}
    assert starts == {"p-0": 5, "p-1": 2, "p-2": 5, "p-3": 0}
    assert partitions[1].tracked.get("group:g") == 2


def test_a_moving_partition_waits_for_its_acks(tmp_path):
    partitions = open_partitions(tmp_path, 2)
    publish(partitions[1], 3)
    log: list = []
    group = Group("s", "g", partitions, lambda cursor: None)
    a = Channel("a", log)
    group.join("a", a, FIRST, None, 100)
    partitions[1].dispatch(NOW_MS)
    b = Channel("b", log)
    group.join("b", b, FIRST, None, 100)
    # Partition 1 goes to b, but only once a acked what it holds.
    assert active_owners(group) == {0: ["a"], 1: []}
    assert group.describe()["partitions"][1]["moving"]
    held = list(a.unacked)
    for cursor, _, offset in held[:2]:
        cursor.ack([offset])
    assert active_owners(group)[1] == []
    cursor, consumer, offset = held[2]
    cursor.ack([offset])
    assert active_owners(group) == {0: ["a"], 1: ["b"]}
    moved = next(iter(partitions[1].consumers.values())).queue
    assert moved.next_offset == 3


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32), st.integers(1, 4))
def test_members_joining_and_leaving_under_load(tmp_path_factory, seed, partition_count):
    """Three members join and leave at random while messages arrive and are acked at random:
    no partition ever has two active members, each member sees each partition in order,
    and every message is delivered (once acked, never again)."""
    rng = random.Random(seed)
    partitions = open_partitions(tmp_path_factory.mktemp("g"), partition_count)
    log: list = []
    group = Group("s", "g", partitions, lambda cursor: None)
    channels = {name: Channel(name, log) for name in "abc"}
    joined: dict[str, object] = {}
    published = [0] * partition_count
    for _ in range(60):
        action = rng.random()
        name = rng.choice("abc")
        if action < 0.2 and name not in joined:
            # A member joining again is a new member (its deliveries tell them apart).
            channels[name] = Channel(f"{name}{len(log)}", log)
            joined[name] = group.join(name, channels[name], FIRST, None, rng.randint(1, 5))
        elif action < 0.3 and name in joined:
            group.leave(joined.pop(name).queue)
            channels[name].unacked = []  # returned: never acked
        elif action < 0.6:
            index = rng.randrange(partition_count)
            count = rng.randint(1, 5)
            publish(partitions[index], count)
            published[index] += count
        else:
            channels[name].ack_some(rng)
        for partition in partitions:
            partition.dispatch(NOW_MS)
        for cursor in [c.queue for p in partitions for c in p.consumers.values()]:
            assert isinstance(cursor, Cursor)
            cursor.dispatch(NOW_MS)
        assert all(len(owners) <= 1 for owners in active_owners(group).values())
    # Drain: one member stays and acks everything.
    for name in list(joined):
        group.leave(joined.pop(name).queue)
        channels[name].unacked = []
    last = Channel("z", log)
    group.join("z", last, FIRST, None, 1000)
    for _ in range(10):
        for partition in partitions:
            partition.dispatch(NOW_MS)
        for cursor, consumer, offset in list(last.unacked):
            consumer.unacked_count -= 1
            cursor.ack([offset])
            cursor.prefetch_freed(consumer)
        last.unacked = []
    for index, partition in enumerate(partitions):
        seen = [offset for _, name, offset in log if name == partition.name]
        assert set(seen) == set(range(published[index]))
        assert partition.tracked.get("group:g") == published[index]
        # In order: one owner's deliveries follow each other; a new owner starts at the
        # committed offset, at or below where the last one had got to.
        deliveries = [(member, offset) for member, name, offset in log if name == partition.name]
        for (before, previous), (member, offset) in zip(deliveries, deliveries[1:], strict=False):
            if member == before:
                assert offset == previous + 1
            else:
                assert offset <= previous + 1

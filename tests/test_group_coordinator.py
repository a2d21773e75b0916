"""A consumer group's coordinator without a socket: members connected to other nodes are
stand-ins (`MemberStandIn`) whose partitions go by ASSIGN and come back by REVOKE, answered
once drained; and a member's own node (`MemberElsewhere`): what it attaches, when it says
DRAINED, and what it commits."""

from __future__ import annotations

import asyncio
import random

import pytest
from test_stream_groups import FIRST, NOW_MS, Channel, open_partitions, publish

from warrenmq.server.forward import wire
from warrenmq.server.forward.coordination import MemberElsewhere
from warrenmq.server.queue.consumer import Consumer
from warrenmq.server.stream.groups import Group, MemberStandIn, attach_partition, commit_released


class Node:
    """A member's node as the coordinator sees it: what it was told, in order, what it
    holds (assigned and not yet drained) and the revokes it has not answered."""

    def __init__(self) -> None:
        self.told: list[tuple[str, str, int]] = []
        self.held: dict[str, set[int]] = {}
        self.revoked: dict[tuple[str, int], MemberStandIn] = {}

    def join(self, group: Group, tag: str) -> MemberStandIn:
        held = self.held.setdefault(tag, set())

        def assign(index: int) -> None:
            self.told.append(("assign", tag, index))
            held.add(index)

        def revoke(index: int) -> None:
            self.told.append(("revoke", tag, index))
            self.revoked[tag, index] = member

        def cancel(reason: str) -> None:
            self.told.append(("cancel", tag, -1))

        member = group.join_elsewhere(tag, assign, revoke, cancel)
        return member

    def drain(self, member: MemberStandIn, index: int) -> None:
        del self.revoked[member.tag, index]
        self.held[member.tag].discard(index)
        member.group.drained(member, index)

    def leave(self, member: MemberStandIn) -> None:
        """Its member left: its node let go of everything."""
        self.held[member.tag].clear()
        for tag, index in list(self.revoked):
            if tag == member.tag:
                del self.revoked[tag, index]
        member.group.leave(member)


def holders(group: Group, node: Node) -> dict[int, list[str]]:
    """Who may be handed messages of each partition now: local consumers rotating on it,
    and stand-ins whose node holds it."""
    found: dict[int, list[str]] = {}
    for index, partition in enumerate(group.partitions):
        found[index] = [c.channel.name for c in partition.consumers.values()]
        found[index] += [tag for tag, held in node.held.items() if index in held]
    return found


def test_a_stand_in_gets_its_share_and_a_revoked_partition_waits_for_drained(tmp_path):
    partitions = open_partitions(tmp_path, 4)
    group = Group("s", "g", partitions, lambda cursor: None)
    node = Node()
    local = group.join("a", Channel("a", []), FIRST, None, 100)
    remote = node.join(group, "r")
    assert node.told == [("assign", "r", 1), ("assign", "r", 3)]
    assert holders(group, node) == {0: ["a"], 1: ["r"], 2: ["a"], 3: ["r"]}
    assert group.describe()["members"] == ["a", "r"]
    assert [p["member"] for p in group.describe()["partitions"]] == ["a", "r", "a", "r"]
    # A third member: partition 2 moves from a (nothing unacked: at once), 3 is revoked
    # from r and goes nowhere until r's node drained it.
    node.told.clear()
    third = group.join("c", Channel("c", []), FIRST, None, 100)
    assert node.told == [("revoke", "r", 3)]
    assert holders(group, node) == {0: ["a"], 1: ["r"], 2: ["c"], 3: ["r"]}
    assert group.describe()["partitions"][3]["moving"] is True
    # A DRAINED from another member (or of another partition) moves nothing.
    other = node.join(group, "x")
    group.drained(other, 3)
    group.drained(remote, 1)
    assert group.owner(3) is None and group.owner(1) is remote
    node.leave(other)
    node.drain(remote, 3)
    assert holders(group, node) == {0: ["a"], 1: ["r"], 2: ["c"], 3: ["a"]}
    # The stand-in leaves (its node let go of its partitions): they move at once.
    node.told.clear()
    node.leave(remote)
    assert node.told == []
    assert holders(group, node) == {0: ["a"], 1: ["c"], 2: ["a"], 3: ["c"]}
    assert local.queue in group.members and third.queue in group.members


def test_a_stand_in_leaving_while_a_partition_moves_from_it(tmp_path):
    partitions = open_partitions(tmp_path, 2)
    group = Group("s", "g", partitions, lambda cursor: None)
    node = Node()
    remote = node.join(group, "r")
    assert node.held["r"] == {0, 1}
    group.join("a", Channel("a", []), FIRST, None, 100)
    assert node.told[-1] == ("revoke", "r", 1)
    assert group.owner(1) is None
    # Its node's link went: the coordinator removes it, and what moved from it settles.
    node.leave(remote)
    assert holders(group, node) == {0: ["a"], 1: ["a"]}
    assert not group.describe()["partitions"][1]["moving"]


def test_dissolve_returns_the_stand_ins_too(tmp_path):
    partitions = open_partitions(tmp_path, 2)
    group = Group("s", "g", partitions, lambda cursor: None)
    node = Node()
    remote = node.join(group, "r")
    group.join("a", Channel("a", []), FIRST, None, 100)
    members = group.dissolve()
    assert remote in members and len(members) == 2
    assert group.members == [] and group.owner(0) is None and group.owner(1) is None


@pytest.mark.parametrize("seed", range(8))
def test_never_two_holders_of_a_partition_as_members_come_and_go(tmp_path_factory, seed):
    """Local members and stand-ins join and leave at random, stand-ins' nodes drain late:
    a partition never has two holders, and every partition ends with one."""
    rng = random.Random(seed)
    partitions = open_partitions(tmp_path_factory.mktemp("p"), 5)
    group = Group("s", "g", partitions, lambda cursor: None)
    node = Node()
    members: list = []
    for step in range(60):
        action = rng.random()
        if action < 0.3 or not members:
            members.append(node.join(group, f"r{step}"))
        elif action < 0.5:
            members.append(group.join(f"a{step}", Channel(f"a{step}", []), FIRST, None, 9).queue)
        elif action < 0.7:
            leaving = members.pop(rng.randrange(len(members)))
            if isinstance(leaving, MemberStandIn):
                node.leave(leaving)
            else:
                group.leave(leaving)
        elif node.revoked:
            (tag, index), member = rng.choice(sorted(node.revoked.items()))
            node.drain(member, index)
        assert all(len(h) <= 1 for h in holders(group, node).values()), step
    # Every revoke answered: each partition has its one holder.
    while node.revoked:
        (tag, index), member = next(iter(node.revoked.items()))
        node.drain(member, index)
    if members:
        assert all(len(h) == 1 for h in holders(group, node).values())


class Link:
    """The link to the coordinator, as a `MemberElsewhere` uses it."""

    def __init__(self) -> None:
        self.sent: list[tuple] = []
        self.group_members: dict = {}
        self.closed = False

    def next_id(self) -> int:
        return 7

    def send(self, kind, *fields) -> None:
        self.sent.append((kind, *fields))

    async def request(self, kind, *fields) -> list:
        self.sent.append((kind, *fields))
        return [0, 0]


class Coordinator:
    """Partition 0's `RemoteQueue`, as a `MemberElsewhere` uses it."""

    vhost = "/"

    def __init__(self) -> None:
        self.link = Link()

    def _link(self) -> Link:
        return self.link


def test_a_member_elsewhere_attaches_after_its_consume_ok_and_drains_before_moving(tmp_path):
    partitions = open_partitions(tmp_path, 2)
    for partition in partitions:
        publish(partition, 3)
    coordinator = Coordinator()
    link = coordinator.link
    channel = Channel("m", [])
    gone: list = []
    member = MemberElsewhere(
        coordinator,  # type: ignore[arg-type]
        "s",
        "g",
        partitions,
        channel,
        "m",
        FIRST,
        None,
        10,
        {},
        lambda cursor: None,
        lambda partition, member: None,  # type: ignore[arg-type, return-value]
        gone.append,
    )
    assert asyncio.run(member.join()) is member.consumer
    assert link.sent == [(wire.Kind.GROUP_JOIN, 7, "/", "s", "g", "m")]
    assert link.group_members == {7: member}
    # Assigned before the client has its consume-ok: attached only at the dispatch after.
    member.assign(0)
    member.assign(1)
    assert not partitions[0].consumers
    member.dispatch(NOW_MS)
    assert sorted(member.owned) == [0, 1]
    for partition in partitions:
        partition.dispatch(NOW_MS)
    assert len(channel.log) == 6
    # Revoked: no more deliveries from it; DRAINED once its deliveries are acked, with the
    # committed offset where the acks got to.
    link.sent.clear()
    member.revoke(0)
    assert not partitions[0].consumers and link.sent == []
    for cursor, _, offset in list(channel.unacked):
        if cursor.stream is partitions[0]:
            cursor.ack([offset])
    assert link.sent == [(wire.Kind.DRAINED, 7, 0)]
    assert partitions[0].tracked.get("group:g") == 3
    # Leaving: partition 1 let go at once, committed where its acks got to (none), then
    # GROUP_LEAVE.
    link.sent.clear()

    async def leave() -> None:
        await member.leave()

    asyncio.run(leave())
    assert link.sent == [(wire.Kind.GROUP_LEAVE, 7)]
    assert not partitions[1].consumers and partitions[1].tracked.get("group:g") == 0
    assert gone == [member] and link.group_members == {}
    # Late words from the coordinator change nothing.
    member.assign(1)
    assert not partitions[1].consumers


def test_a_released_partition_never_takes_back_the_next_members_commits(tmp_path):
    """A member's node learns late that the member is gone (SIGKILL) while the coordinator
    already gave its partition to another member: the late release leaves the committed
    offset where the new member's acks moved it."""
    (partition,) = open_partitions(tmp_path, 1)
    publish(partition, 6)
    gone, moved_to = Channel("gone", []), Channel("next", [])
    old = attach_partition(partition, "g", "gone", gone, FIRST, None, 2)
    partition.dispatch(NOW_MS)
    old.queue.ack([0])
    assert partition.tracked.get("group:g") == 1
    new = attach_partition(partition, "g", "next", moved_to, FIRST, None, 10)
    partition.dispatch(NOW_MS)
    for cursor, _, offset in list(moved_to.unacked):
        cursor.ack([offset])
    assert partition.tracked.get("group:g") == 6
    partition.remove_consumer(old)
    commit_released(old.queue)
    assert partition.tracked.get("group:g") == 6
    # With no other member on it, a release commits where the acks got to.
    partition.remove_consumer(new)
    partition.tracked.set("group:g", 2)
    commit_released(new.queue)
    assert partition.tracked.get("group:g") == 6


class Elsewhere:
    """A partition another node leads, and a member's consumer's cursor of it there
    (`RemoteCursor`'s part the group uses): its removal is under way until `let_go()`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.letting_go = None
        self.on_drained = None
        self.held: set[int] = set()

    @property
    def holds_unacked(self) -> bool:
        return bool(self.held) or self.letting_go is not None

    def remove_consumer(self, consumer) -> None:
        self.letting_go = "under way"

    def returned(self) -> None:
        self.held.clear()

    def let_go(self) -> None:
        self.letting_go = None
        if self.on_drained is not None and not self.holds_unacked:
            drained, self.on_drained = self.on_drained, None
            drained()


def test_a_partition_led_elsewhere_moves_once_its_node_has_the_members_acks(tmp_path):
    """The next member may be on another node: its CONSUME_PARTITION must find the
    committed offset after the leaving member's acks, which travel on the leaving
    member's own link; the move waits for that link's answer, also when the member left."""
    cursors: list[Elsewhere] = []

    def attach_elsewhere(partition, member):
        cursor = Elsewhere(partition.name)
        cursors.append(cursor)
        return Consumer(member.tag, member.consumer.channel, cursor, False, False, 0, 1)

    group = Group("s", "g", [Elsewhere("p-0")], lambda cursor: None, attach_elsewhere)
    node = Node()
    local = group.join("a", Channel("a", []), FIRST, None, 100)
    # A leaves with a delivery unacked: it is returned, but the move waits for the link.
    cursors[0].held.add(5)
    remote = node.join(group, "r")
    assert group.owner(0) is local.queue and node.told == []
    group.leave(local.queue)
    assert group.owner(0) is None and node.told == []
    cursors[0].let_go()
    assert node.told == [("assign", "r", 0)]
    # The stand-in leaves, a local member gets it; that one leaves with nothing unacked:
    # the move still waits for its node.
    group.join("b", Channel("b", []), FIRST, None, 100)
    node.leave(remote)
    assert group.owner(0) is not None and group.owner(0).tag == "b"
    group.join("c", Channel("c", []), FIRST, None, 100)
    group.leave(group.owner(0))
    assert group.owner(0) is None
    cursors[-1].let_go()
    assert group.owner(0).tag == "c"

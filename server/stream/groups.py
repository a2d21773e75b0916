"""Consumer groups on super streams (Warren's): `basic.consume` on a super stream's name with
`x-consumer-group: G` makes the consumer a member of G.

Each partition has at most one active member of G, and the partitions are spread evenly
(partition i goes to the (i mod members)-th member, in the order they joined). When members
join or leave the partitions are reassigned cooperatively: a partition that moves stops
being delivered by its old owner at once, but goes to its new owner only once every delivery
the old one holds from it is acked (or returned: the old owner is gone, its deliveries count
as never acked). The new owner resumes from G's committed offset on the partition, so order
per partition holds across rebalances, and nothing acked is delivered to G again.

G's committed offset on a partition is a tracked offset of that partition stream
(`tracked_offsets`, under the tag `group:G`): the end of the contiguous acked prefix,
durable. A partition with no committed offset starts where the member's `x-stream-offset`
says (by default "next"). Deliveries carry `x-stream-offset` and `x-stream-partition` (the
partition stream's name). A member's prefetch applies to each of its partitions.

Pure bookkeeping on top of `Stream.attach`: no I/O, no clock. A partition another node leads
(a `RemoteQueue`) is read by a member through the link: `attach_elsewhere` registers it there,
where `attach_partition` attaches it as it would here.

In a cluster, one node holds the group (members and who owns which partition): its
coordinator, the node leading the super stream's partition 0 (metadata every node has). A
member connected to another node is a `MemberStandIn` here, whose partitions its own node
attaches (`forward/coordination.py`): assigning one sends it there, and revoking one takes
it back once that node said its deliveries from it are all acked (`drained`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from warrenmq.server.queue.consumer import Consumer, ConsumerChannel

from . import offset_spec
from .cursor import Cursor, partition_entry
from .filter import StreamFilter
from .stream import Stream

GROUP_ARGUMENT = "x-consumer-group"
GROUP_TAG_PREFIX = "group:"


def group_tag(group: str) -> str:
    """The tracked-offset tag under which a group's committed offsets are kept."""
    return GROUP_TAG_PREFIX + group


def attach_partition(
    partition: Stream,
    group: str,
    tag: str,
    channel: ConsumerChannel,
    spec: offset_spec.OffsetSpec,
    stream_filter: StreamFilter | None,
    prefetch_count: int,
) -> Consumer:
    """A member's consumer of one partition: from the group's committed offset there, else
    where the member's `spec` says; acks move that committed offset; each delivery names the
    partition."""
    tracked_tag = group_tag(group)
    committed = partition.tracked.get(tracked_tag)
    if committed is None:
        start = partition.start_offset(spec)
    else:
        start = max(committed, partition.log.start_offset)
    consumer = partition.attach(
        tag,
        channel,
        start,
        tracked_tag=tracked_tag,
        stream_filter=stream_filter,
        exclusive=False,
        prefetch_count=prefetch_count,
    )
    cursor = consumer.queue
    assert isinstance(cursor, Cursor)
    cursor.partition_entry = partition_entry(partition.name)
    return consumer


def commit_released(cursor: Cursor) -> None:
    """A member let go of a partition: the group's committed offset there is where its acks
    got to, unless another member reads it already (a cluster's coordinator moved it on
    before this node heard the member was gone): that one started from the committed
    offset and its acks move it, which this must not take back."""
    tag = cursor.tracked_tag
    assert tag is not None
    stream = cursor.stream
    for consumer in stream.consumers.values():
        other = consumer.queue
        if other is not cursor and getattr(other, "tracked_tag", None) == tag:
            return
    stream.tracked.set(tag, cursor.tracked_offset)


class NeverDelivered:
    """The ConsumedQueue of a member's own consumer: nothing is ever delivered through it."""

    consumer_timeout_ms: int | None = None
    visibility_timeout_ms: int | None = None

    # Deliveries come from the partitions' consumers and are settled with their cursors; the
    # member's own consumer has none to settle, free or unblock.
    def ack(self, offsets: list[int]) -> None:
        """Nothing: see above."""

    def reject(self, offsets: list[int]) -> None:
        """Nothing: see above."""

    def requeue(self, offsets: list[int], failed: bool) -> None:
        """Nothing: see above."""

    def stale_settled(self) -> None:
        """Nothing: see above."""

    def prefetch_freed(self, consumer: Consumer) -> None:
        """Nothing: see above."""

    def unblock(self, consumer: Consumer) -> None:
        """Nothing: see above."""


class Member(NeverDelivered):
    """One member of a group: the consumer its channel holds (`consumer`, never delivered
    to itself) and one consumer per partition it owns."""

    def __init__(
        self,
        group: Group,
        tag: str,
        channel: ConsumerChannel,
        spec: offset_spec.OffsetSpec,
        stream_filter: StreamFilter | None,
        prefetch_count: int,
        arguments: Mapping[str, Any],
    ) -> None:
        self.group = group
        self.arguments = dict(arguments)
        """What the member consumed with (its offset spec and filter), for the partitions
        another node leads."""
        self.spec = spec
        self.filter = stream_filter
        self.owned: dict[int, Consumer] = {}
        """Partition index -> the consumer reading it for this member."""
        self.consumer = Consumer(tag, channel, self, False, False, 0, prefetch_count)

    @property
    def tag(self) -> str:
        return self.consumer.tag

    @property
    def group_name(self) -> str:
        return self.group.name


class MemberStandIn:
    """A member connected to another node, as its group's coordinator holds it: `assign`
    and `revoke` tell that node (which attaches the partition, and answers a revoke once
    the member's deliveries from it are all acked: `Group.drained`); `cancel` tells it the
    group ended."""

    def __init__(
        self,
        group: Group,
        tag: str,
        assign: Callable[[int], None],
        revoke: Callable[[int], None],
        cancel: Callable[[str], None],
    ) -> None:
        self.group = group
        self.tag = tag
        self.owned: dict[int, None] = {}
        """The partitions assigned to it (by index)."""
        self.assign = assign
        self.revoke = revoke
        self.cancel = cancel


class Group:
    """One consumer group of one super stream: members, who owns which partition, and the
    partitions on their way from one member to another."""

    def __init__(
        self,
        super_stream: str,
        name: str,
        partitions: Sequence[Any],
        wake: Callable[[Cursor], None],
        attach_elsewhere: Callable[[Any, Member], Consumer] | None = None,
    ) -> None:
        """`partitions`: each a `Stream`, or a stand-in for one another node leads that
        `attach_elsewhere` attaches a member to."""
        self.super_stream = super_stream
        self.name = name
        self.partitions = list(partitions)
        self.tag = group_tag(name)
        self.members: list[Member | MemberStandIn] = []
        self._moving: dict[int, tuple[Any, Member | MemberStandIn | None]] = {}
        """Partitions taken from a member (its cursor, or None for a stand-in's, and the
        member, None once it left) whose deliveries from them are not all acked yet."""
        self._wake = wake
        self._attach_elsewhere = attach_elsewhere

    def join(
        self,
        tag: str,
        channel: ConsumerChannel,
        spec: offset_spec.OffsetSpec,
        stream_filter: StreamFilter | None,
        prefetch_count: int,
        arguments: Mapping[str, Any] | None = None,
    ) -> Consumer:
        member = Member(self, tag, channel, spec, stream_filter, prefetch_count, arguments or {})
        self.members.append(member)
        self.rebalance()
        return member.consumer

    def join_elsewhere(
        self,
        tag: str,
        assign: Callable[[int], None],
        revoke: Callable[[int], None],
        cancel: Callable[[str], None],
    ) -> MemberStandIn:
        """A member connected to another node joins (this node coordinates the group)."""
        member = MemberStandIn(self, tag, assign, revoke, cancel)
        self.members.append(member)
        self.rebalance()
        return member

    def drained(self, member: MemberStandIn, index: int) -> None:
        """`member`'s node let go of partition `index` (revoked): it moves on."""
        moving = self._moving.get(index)
        if moving is not None and moving[1] is member:
            self._settle_move(index)

    def leave(self, member: Member | MemberStandIn) -> None:
        """A member cancelled or its channel closed: its deliveries are returned (its
        partitions move at once, from the last offset it acked)."""
        if member not in self.members:
            return
        self.members.remove(member)
        for index in list(member.owned):
            self._release(member, index)
        for index, (_, previous) in list(self._moving.items()):
            if previous is member:
                self._settle_move(index)
        self.rebalance()

    def dissolve(self) -> list[Member | MemberStandIn]:
        """A partition was deleted: the group ends. What its members acked stays committed on
        the partitions left; the members are returned, for their channels to cancel."""
        members, self.members = self.members, []
        for member in members:
            for index in list(member.owned):
                self._release(member, index)
        for index in list(self._moving):
            cursor = self._moving.pop(index)[0]
            if cursor is not None:
                cursor.on_drained = None
            self._commit(index, cursor)
        return members

    def owner(self, index: int) -> Member | MemberStandIn | None:
        for member in self.members:
            if index in member.owned:
                return member
        return None

    def rebalance(self) -> None:
        """Move every partition towards its target owner, cooperatively."""
        members = self.members
        for index in range(len(self.partitions)):
            target = members[index % len(members)] if members else None
            current = self.owner(index)
            if current is target:
                continue
            if current is not None:
                self._revoke(current, index)
            if target is not None and index not in self._moving:
                self._assign(target, index)

    def _revoke(self, member: Member | MemberStandIn, index: int) -> None:
        """Stop delivering partition `index` to `member`; it moves once its deliveries are
        all acked."""
        if isinstance(member, MemberStandIn):
            del member.owned[index]
            self._moving[index] = (None, member)
            member.revoke(index)
            return
        consumer = member.owned.pop(index)
        cursor = detached(consumer)
        if cursor.holds_unacked:
            self._moving[index] = (cursor, member)
            cursor.on_drained = lambda: self._settle_move(index)
        else:
            self._commit(index, cursor)

    def _release(self, member: Member | MemberStandIn, index: int) -> None:
        """A leaving member's partition: what it did not ack is returned (a stand-in's node
        committed what its member acked). One another node leads moves once that node
        has the member's acks (`RemoteCursor.letting_go`)."""
        consumer = member.owned.pop(index)
        if consumer is None:
            return
        cursor = detached(consumer)
        if isinstance(cursor, Cursor) or cursor.letting_go is None:
            self._commit(index, cursor)
            return
        cursor.returned()
        # No member: a move `leave` does not settle at once.
        self._moving[index] = (cursor, None)
        cursor.on_drained = lambda: self._settle_move(index)

    def _commit(self, index: int, cursor: Any) -> None:
        # Another node's partition: its node commits what the member acked there.
        if isinstance(cursor, Cursor):
            self.partitions[index].tracked.set(self.tag, cursor.tracked_offset)

    def _settle_move(self, index: int) -> None:
        moving = self._moving.pop(index, None)
        if moving is None:
            return
        cursor = moving[0]
        if cursor is not None:
            cursor.on_drained = None
        self._commit(index, cursor)
        self.rebalance()

    def _assign(self, member: Member | MemberStandIn, index: int) -> None:
        if isinstance(member, MemberStandIn):
            member.owned[index] = None
            member.assign(index)
            return
        member.owned[index] = attach_member(
            self.partitions[index], member, self._wake, self._attach_elsewhere
        )

    def describe(self) -> dict[str, Any]:
        """Members, assignments, committed offsets and lag, for the HTTP API."""
        partitions = []
        for index, partition in enumerate(self.partitions):
            owner = self.owner(index)
            if not isinstance(partition, Stream):
                # Its committed offset and lag are known on the node leading it.
                partitions.append(
                    {
                        "partition": partition.name,
                        "member": None if owner is None else owner.tag,
                        "moving": index in self._moving,
                        "committed_offset": None,
                        "lag": None,
                    }
                )
                continue
            committed = partition.tracked.get(self.tag)
            partitions.append(
                {
                    "partition": partition.name,
                    "member": None if owner is None else owner.tag,
                    "moving": index in self._moving,
                    "committed_offset": committed,
                    "lag": partition.lag(committed),
                }
            )
        return {
            "super_stream": self.super_stream,
            "group": self.name,
            "members": [member.tag for member in self.members],
            "partitions": partitions,
        }


def attach_member(
    partition: Any,
    member: Any,
    wake: Callable[[Cursor], None],
    attach_elsewhere: Callable[[Any, Any], Consumer] | None,
) -> Consumer:
    """`member`'s consumer of `partition` (a `Stream`, or a stand-in for one another node
    leads, which `attach_elsewhere` registers there). `member` is a `Member` or a member of
    a group another node coordinates: its consumer, spec, filter and arguments."""
    if not isinstance(partition, Stream):
        assert attach_elsewhere is not None
        return attach_elsewhere(partition, member)
    consumer = attach_partition(
        partition,
        member.group_name,
        member.consumer.tag,
        member.consumer.channel,
        member.spec,
        member.filter,
        member.consumer.prefetch_count,
    )
    wake(consumer.queue)  # type: ignore[arg-type]
    return consumer


def detached(consumer: Consumer) -> Any:
    """Stop a partition's consumer (a `Cursor`'s, or one registered on another node); its
    cursor, which still knows what it holds unacked."""
    cursor = consumer.queue
    if isinstance(cursor, Cursor):
        cursor.stream.remove_consumer(consumer)
    else:
        cursor.remove_consumer(consumer)
    return cursor

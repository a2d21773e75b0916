"""A consumer group member whose group another node coordinates, as the member's own node
runs it (`MemberElsewhere`).

The coordinator of (vhost, super stream, group) is the node leading the super stream's
partition 0: metadata every node has, so every member finds the same one with no new
metadata. There the group is a `groups.Group` like any, this member a `MemberStandIn` in it.
Over the link this node dialled to the coordinator:

    GROUP_JOIN(member id, vhost, super stream, group, tag), answered by REPLY, makes it a
    member; the coordinator then sends ASSIGN(member id, partition index) for each partition
    it gives the member, which attaches it here as a local member's is (`groups.attach_member`:
    `attach_partition` if this node leads it, else CONSUME_PARTITION to its node), and
    REVOKE(member id, index) for one it moves to another member: delivering stops at once, and
    DRAINED(member id, index) answers once the member's deliveries from it are all acked and
    the partition's node has those acks (its committed offset is where they got to), so the
    next member resumes after them. GROUP_LEAVE(member id) follows a cancel or a closed
    channel, once the member's partitions are let go (what it did not ack goes to the next).
    GROUP_CANCELLED(member id, reason) ends a member (its group ended: a partition deleted).

Failure: the link lost cancels this node's members of groups coordinated there (basic.cancel
to clients that asked for it, as when a queue's node goes down), and the coordinator removes
the members of the node whose link it lost, whose partitions go to the others.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from warrenmq.server.queue.consumer import Consumer, ConsumerChannel
from warrenmq.server.stream import offset_spec
from warrenmq.server.stream.cursor import Cursor
from warrenmq.server.stream.filter import StreamFilter
from warrenmq.server.stream.groups import (
    NeverDelivered,
    attach_member,
    commit_released,
    detached,
)

from . import wire
from .link import LinkError

if TYPE_CHECKING:
    from .entry import EntryLink, RemoteQueue


class MemberElsewhere(NeverDelivered):
    """A member of a group `coordinator` (partition 0's `RemoteQueue`) coordinates: the
    client's consumer (`consumer`, never delivered to itself) and the partitions the
    coordinator assigned it (`owned`)."""

    # The tick dispatches it once the client has its consume-ok: assignments that came
    # before wait for that (deliveries must not overtake the consume-ok).
    deleted = False
    has_timers = False
    dead_letters: tuple[Any, ...] = ()
    needs_commit = False
    committing = False

    def __init__(
        self,
        coordinator: RemoteQueue,
        super_stream: str,
        group_name: str,
        partitions: Sequence[Any],
        channel: ConsumerChannel,
        tag: str,
        spec: offset_spec.OffsetSpec,
        stream_filter: StreamFilter | None,
        prefetch_count: int,
        arguments: Mapping[str, Any],
        wake: Callable[[Any], None],
        attach_elsewhere: Callable[[Any, Any], Consumer],
        gone: Callable[[MemberElsewhere], None],
    ) -> None:
        self.coordinator = coordinator
        self.link: EntryLink = coordinator._link()
        self.member_id = self.link.next_id()
        self.super_stream = super_stream
        self.group_name = group_name
        self.partitions = list(partitions)
        self.spec = spec
        self.filter = stream_filter
        self.arguments = dict(arguments)
        self.consumer = Consumer(tag, channel, self, False, False, 0, prefetch_count)
        self.owned: dict[int, Consumer] = {}
        """Partition index -> the consumer reading it for this member."""
        self._early: list[int] | None = []
        """Partitions assigned before the client had its consume-ok (None after)."""
        self._draining: dict[int, Any] = {}
        """Revoked partitions' cursors whose deliveries are not all acked yet."""
        self.left = False
        self._wake = wake
        self._attach_elsewhere = attach_elsewhere
        self._gone = gone
        self._tasks: set[asyncio.Future[Any]] = set()

    async def join(self) -> Consumer:
        """Become a member on the coordinator; raises what it refused with, or 404 as for a
        queue whose node is down."""
        link = self.link
        link.group_members[self.member_id] = self
        fields = (self.coordinator.vhost, self.super_stream, self.group_name, self.consumer.tag)
        try:
            await link.request(wire.Kind.GROUP_JOIN, self.member_id, *fields)
        except asyncio.CancelledError:
            self._forget()
            link.send(wire.Kind.GROUP_LEAVE, self.member_id)
            raise
        except LinkError:
            self._forget()
            raise self.coordinator._unavailable() from None
        except BaseException:
            self._forget()
            raise
        return self.consumer

    def _forget(self) -> None:
        self.left = True
        self.link.group_members.pop(self.member_id, None)
        self._gone(self)

    def dispatch(self, now_ms: int) -> bool:
        """The client has its consume-ok: the partitions assigned so far are attached."""
        early, self._early = self._early, None
        for index in early or ():
            self._attach(index)
        return False

    # -- what the coordinator says ------------------------------------------------------

    def assign(self, index: int) -> None:
        if self.left:
            return
        if self._early is not None:
            self._early.append(index)
            return
        self._attach(index)

    def _attach(self, index: int) -> None:
        self.owned[index] = attach_member(
            self.partitions[index], self, self._wake, self._attach_elsewhere
        )

    def revoke(self, index: int) -> None:
        if self._early is not None and index in self._early:
            self._early.remove(index)
        consumer = self.owned.pop(index, None)
        if consumer is None:
            self.link.send(wire.Kind.DRAINED, self.member_id, index)
            return
        cursor = detached(consumer)
        if cursor.holds_unacked:
            self._draining[index] = cursor
            cursor.on_drained = lambda: self._let_go(index, cursor)
        else:
            self._let_go(index, cursor)

    def _let_go(self, index: int, cursor: Any) -> None:
        """DRAINED: the member acked what it was delivered, and a partition another node
        leads has those acks there (`RemoteCursor.letting_go`), so the next member resumes
        after them."""
        self._draining.pop(index, None)
        if isinstance(cursor, Cursor):
            commit_released(cursor)
        self.link.send(wire.Kind.DRAINED, self.member_id, index)

    def cancelled(self, reason: str) -> None:
        """The coordinator ended the member (the link to it lost, its group ended): its
        partitions are let go, and the client told as a deleted queue's consumers are."""
        if self.left:
            return
        self._let_all_go()
        self._forget()
        self.consumer.channel.cancel(self.consumer, reason)

    # -- the client -----------------------------------------------------------------------

    def leave(self) -> asyncio.Future[Any]:
        """basic.cancel, or its channel closed: its partitions are let go (what it did not
        ack goes to the next member), then the coordinator hears of it."""
        removals = self._let_all_go()
        self._forget()
        return asyncio.ensure_future(self._left(removals))

    async def _left(self, removals: list[asyncio.Future[Any]]) -> None:
        if removals:
            await asyncio.wait(removals)
        self.link.send(wire.Kind.GROUP_LEAVE, self.member_id)

    def _let_all_go(self) -> list[asyncio.Future[Any]]:
        """Stop every partition; returns the removals under way on other nodes (each
        commits the member's acks there, `owner._released`)."""
        self.left = True
        self._early = None
        draining, self._draining = self._draining, {}
        removals = []
        for cursor in draining.values():
            cursor.on_drained = None
            if not isinstance(cursor, Cursor) and cursor.letting_go is not None:
                removals.append(cursor.letting_go)
        for consumer in self.owned.values():
            cursor = detached(consumer)
            if isinstance(cursor, Cursor):
                commit_released(cursor)
            elif cursor.letting_go is not None:
                removals.append(cursor.letting_go)
        self.owned = {}
        return removals


async def described_elsewhere(
    coordinator: RemoteQueue, super_stream: str, group_name: str
) -> dict[str, Any] | None:
    """The group as its coordinator describes it (`Group.describe`: every member, wherever
    connected); None when it has no members. 404 as for a queue whose node is down."""
    link = coordinator._link()
    fields = (coordinator.vhost, super_stream, group_name)
    try:
        (described,) = await link.request(wire.Kind.GROUP_DESCRIBE, link.next_id(), *fields)
    except LinkError:
        raise coordinator._unavailable() from None
    return json.loads(described)

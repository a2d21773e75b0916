"""`cluster.group.RaftGroup` with several members, in process on loopback ports: proposals
and membership changes from any member (a follower forwards them to the leader and its
future resolves once its OWN machine applied the entry), addresses in the log, removal."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from ports import free_port, free_ports
from test_raft_group import Journal

from warrenmq.cluster import group_codec as wire
from warrenmq.cluster.group import (
    REMOVED_MARKER_FILE,
    GroupConfig,
    GroupStopped,
    ProposalLost,
    RaftGroup,
)
from warrenmq.cluster.group_codec import GroupState, Reply, ReplyStatus, Request, RequestKind
from warrenmq.cluster.raft.core import LEADER, NotLeader, ProposalRefused, RaftConfig
from warrenmq.cluster.raft.messages import DecodeError

WAIT_S = 20.0
ids = st.integers(min_value=1, max_value=(1 << 64) - 1)

# -- codecs ----------------------------------------------------------------------------


@given(
    src=ids,
    requests=st.lists(
        st.builds(Request, ids, st.sampled_from(RequestKind), st.binary(max_size=50)), max_size=20
    ),
    replies=st.lists(
        st.builds(Reply, ids, st.sampled_from(ReplyStatus), ids, ids, ids, st.text(max_size=30)),
        max_size=20,
    ),
)
def test_frames_round_trip(src, requests, replies):
    assert wire.decode_propose(wire.encode_propose(src, requests)) == (src, requests)
    assert wire.decode_replies(wire.encode_replies(src, replies)) == (src, replies)
    assert wire.decode_removed(wire.encode_removed(src)) == src


@given(data=st.binary(max_size=80))
def test_garbage_frames_raise_decode_errors_only(data):
    for decode in (wire.decode_propose, wire.decode_replies, wire.decode_removed):
        for frame in (data, bytes([wire.PROPOSE]) + data, bytes([wire.PROPOSE_REPLY]) + data):
            try:
                decode(frame)
            except DecodeError:
                pass


@given(
    node=ids,
    host=st.text(min_size=1, max_size=40),
    port=st.integers(0, 65535),
    addresses=st.dictionaries(
        ids, st.tuples(st.text(min_size=1, max_size=20), st.integers(0, 65535)), max_size=5
    ),
    removed=st.sets(ids, max_size=5),
    machine=st.binary(max_size=100),
)
def test_member_addresses_and_snapshot_envelopes_round_trip(
    node, host, port, addresses, removed, machine
):
    assert wire.decode_member(wire.encode_member(node, host, port)) == (node, host, port)
    assert wire.decode_node(wire.encode_node(node)) == node
    state, data = wire.unwrap_snapshot(wire.wrap_snapshot(GroupState(addresses, removed), machine))
    assert (state, data) == (GroupState(addresses, removed), machine)


def test_a_snapshot_from_before_the_envelope_is_the_machine_bytes():
    assert wire.unwrap_snapshot(b"raw machine state") == (None, b"raw machine state")


# -- groups of three or four -------------------------------------------------------------


def _config(tmp_path: Path, node: int, peers: dict, **settings) -> GroupConfig:
    return GroupConfig(
        node_id=node,
        data_dir=tmp_path / f"node-{node}",
        peers=peers,
        raft=RaftConfig(node_id=node, election_ticks=10, heartbeat_ticks=2),
        **settings,
    )


class Cluster:
    """In-process members of one group, each with its Journal."""

    def __init__(self, tmp_path: Path, size: int, **settings) -> None:
        self.tmp_path = tmp_path
        self.settings = settings
        self.peers = {i: ("127.0.0.1", port) for i, port in enumerate(free_ports(size), 1)}
        self.groups: dict[int, RaftGroup] = {}
        self.journals: dict[int, Journal] = {}

    async def start(self, node: int, peers: dict | None = None, **settings) -> RaftGroup:
        journal = Journal()
        config = _config(self.tmp_path, node, peers or self.peers, **self.settings, **settings)
        group = RaftGroup(config, journal)
        await group.start()
        self.groups[node] = group
        self.journals[node] = journal
        return group

    async def start_all(self) -> None:
        for node in self.peers:
            await self.start(node)

    async def stop(self, node: int) -> None:
        await self.groups.pop(node).stop()

    async def stop_all(self) -> None:
        for node in list(self.groups):
            await self.stop(node)

    async def leader(self) -> int:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            leaders = [i for i, g in self.groups.items() if g.leading]
            if len(leaders) == 1:
                return leaders[0]
            await asyncio.sleep(0.02)
        raise AssertionError("no single leader")

    async def follower(self) -> int:
        leader = await self.leader()
        return next(i for i in self.groups if i != leader)

    async def until(self, predicate, what: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while not predicate():
            assert time.monotonic() < deadline, what
            await asyncio.sleep(0.02)

    async def all_applied(self, values: list[bytes]) -> None:
        await self.until(
            lambda: all(j.values() == values for j in self.journals.values()),
            "every member applies the same entries",
        )


def run(tmp_path, size, scenario, **settings):
    async def main():
        cluster = Cluster(tmp_path, size, **settings)
        try:
            await cluster.start_all()
            await scenario(cluster)
        finally:
            await cluster.stop_all()

    asyncio.run(main())


def test_a_follower_proposal_is_applied_on_that_follower_when_it_resolves(tmp_path):
    async def scenario(cluster: Cluster):
        follower = await cluster.follower()
        applied = await asyncio.wait_for(cluster.groups[follower].propose(b"first"), WAIT_S)
        # Read-your-writes on the follower: its own machine applied it, with its own result.
        assert cluster.journals[follower].values() == [b"first"]
        assert applied.result == 1
        assert cluster.journals[follower].entries[-1][0] == applied.index
        await cluster.all_applied([b"first"])
        leader = await cluster.leader()
        status = cluster.groups[follower].status()
        assert (status["role"], status["leader"]) == ("follower", leader)
        assert status["term"] == cluster.groups[leader].raft.term
        assert status["applied"] >= applied.index and status["commit"] >= applied.index
        assert status["peers_connected"] == sorted(set(cluster.peers) - {follower})
        assert status["members"] == [
            {"id": node, "address": f"{host}:{port}", "connected": True}
            for node, (host, port) in sorted(cluster.peers.items())
        ]
        assert status["removed"] is False

    run(tmp_path, 3, scenario)


def test_concurrent_proposals_from_every_member_apply_once_in_one_order(tmp_path):
    async def scenario(cluster: Cluster):
        await cluster.leader()
        futures = [
            group.propose(b"%d-%d" % (node, i))
            for i in range(200)
            for node, group in cluster.groups.items()
        ]
        results = await asyncio.wait_for(asyncio.gather(*futures), WAIT_S)
        assert len({a.index for a in results}) == len(futures)
        expected = sorted(b"%d-%d" % (n, i) for i in range(200) for n in cluster.groups)
        order = cluster.journals[1].values()
        assert sorted(order) == expected, "each proposal applied exactly once"
        await cluster.all_applied(order)
        # A member's proposals of one loop iteration left in one frame, not one each.
        follower = await cluster.follower()
        assert cluster.groups[follower].transport.stats.frames_sent < 200

    run(tmp_path, 3, scenario)


@pytest.mark.parametrize("answered", [False, True], ids=["before-answer", "after-answer"])
def test_a_follower_proposal_when_the_leader_dies_resolves_or_is_lost(tmp_path, answered):
    async def scenario(cluster: Cluster):
        leader = await cluster.leader()
        follower = next(i for i in cluster.groups if i != leader)
        group = cluster.groups[follower]
        futures = [group.propose(b"v%d" % i) for i in range(50)]
        await asyncio.sleep(0)
        if answered:
            # The leader appended them all and said where; none need be committed yet.
            await cluster.until(lambda: not group._sent and not group._unsent, "answers")
        # Killed, not stopped: no leadership handover, connections just drop.
        cluster.groups.pop(leader)._fail(RuntimeError("killed"))
        outcomes = await asyncio.wait_for(asyncio.gather(*futures, return_exceptions=True), WAIT_S)
        journal = dict(cluster.journals[follower].entries)
        for i, outcome in enumerate(outcomes):
            if isinstance(outcome, BaseException):
                assert isinstance(outcome, ProposalLost), outcome
            else:
                assert journal[outcome.index] == b"v%d" % i
        if not answered:
            assert all(isinstance(o, ProposalLost) for o in outcomes), "the link dropped"
        # The survivors elect a leader and serve proposals from the follower again. (Not
        # before: the dead group's listener closes a moment after it halts, and a proposal
        # sent to it meanwhile is lost.)
        await cluster.leader()
        applied = await asyncio.wait_for(group.propose(b"after"), WAIT_S)
        assert cluster.journals[follower].values()[-1] == b"after"
        assert applied.result == len(cluster.journals[follower].values())

    run(tmp_path, 3, scenario)


@pytest.mark.parametrize("request_", ["propose", "read_point"])
def test_no_leader_known_waits_briefly_then_fails_not_leader(tmp_path, request_):
    async def scenario(cluster: Cluster):
        await cluster.leader()
        for node in (2, 3):
            await cluster.stop(node)
        # Alone, node 1 soon knows no leader (check-quorum) and cannot elect one.
        await cluster.until(lambda: cluster.groups[1].raft.leader_id is None, "leader lost")
        group = cluster.groups[1]
        asked = group.propose(b"nobody") if request_ == "propose" else group.read_point()
        with pytest.raises(NotLeader):
            await asyncio.wait_for(asked, WAIT_S)

    run(tmp_path, 3, scenario, leader_wait_s=0.3)


async def _add_fourth(cluster: Cluster, proposer: int) -> RaftGroup:
    host, port = "127.0.0.1", free_port()
    voters = tuple(cluster.peers)
    joiner = await cluster.start(4, peers={**cluster.peers, 4: (host, port)}, voters=voters)
    assert joiner.raft.role != LEADER
    await asyncio.wait_for(cluster.groups[proposer].add_member(4, host, port), WAIT_S)
    # Again: a no-op success, so a retry after an unknown outcome is safe.
    await asyncio.wait_for(cluster.groups[proposer].add_member(4, host, port), WAIT_S)
    return joiner


def test_a_member_added_from_a_follower_catches_up_by_snapshot_and_keeps_addresses(tmp_path):
    async def scenario(cluster: Cluster):
        follower = await cluster.follower()
        for i in range(40):
            await cluster.groups[follower].propose(b"v%d" % i)
        leader = await cluster.leader()
        await cluster.until(
            lambda: cluster.groups[leader].storage.snapshot is not None, "the leader compacts"
        )
        joiner = await _add_fourth(cluster, follower)
        expected = [b"v%d" % i for i in range(40)]
        await cluster.until(
            lambda: cluster.journals[4].values() == expected, "the new member catches up"
        )
        assert cluster.journals[4].restored_at > 0, "it caught up through a snapshot"
        address = f"127.0.0.1:{joiner.config.peers[4][1]}"
        for node, group in cluster.groups.items():
            await cluster.until(lambda g=group: 4 in g.raft.voters, f"{node} knows 4 votes")
            members = {m["id"]: m["address"] for m in group.status()["members"]}
            assert members[4] == address
        # Every member's transport dials the new one.
        for node, group in cluster.groups.items():
            if node != 4:
                await cluster.until(lambda g=group: g.transport.connected(4), f"{node} dials 4")
        # More entries, so that the joiner's own snapshot is taken after its join.
        for i in range(40, 60):
            await cluster.groups[4].propose(b"v%d" % i)
        expected += [b"v%d" % i for i in range(40, 60)]
        await cluster.all_applied(expected)

        # A restart of every member started only with the bootstrap addresses (the joiner
        # not among them) still knows every address, from its snapshot and log.
        for node in list(cluster.groups):
            await cluster.stop(node)
        for node in (1, 2, 3):
            await cluster.start(node)
        await cluster.start(4, peers={**cluster.peers, 4: joiner.config.peers[4]})
        await cluster.leader()
        for node, group in cluster.groups.items():
            members = {m["id"]: m["address"] for m in group.status()["members"]}
            assert members[4] == address, node
        await cluster.groups[2].propose(b"restarted")
        await cluster.all_applied(expected + [b"restarted"])

    run(tmp_path, 3, scenario, snapshot_entries=10)


def test_a_member_removed_from_a_follower_learns_it_and_stops_serving(tmp_path):
    async def scenario(cluster: Cluster):
        leader = await cluster.leader()
        follower, victim = (i for i in cluster.groups if i != leader)
        await cluster.groups[follower].propose(b"before")
        await asyncio.wait_for(cluster.groups[follower].remove_member(victim), WAIT_S)
        await asyncio.wait_for(cluster.groups[follower].remove_member(victim), WAIT_S)
        for node in (leader, follower):
            assert victim not in cluster.groups[node].raft.voters or node != follower
        removed = cluster.groups[victim]
        await cluster.until(lambda: removed.removed, "the removed member learns it")
        assert removed.status()["removed"] is True
        with pytest.raises(ProposalRefused):
            removed.propose(b"refused")
        # The others carry on without it, and no longer dial it.
        await cluster.groups[follower].propose(b"after")
        await cluster.until(
            lambda: not cluster.groups[leader].transport.connected(victim), "no longer dialled"
        )
        assert cluster.journals[leader].values() == [b"before", b"after"]
        # A restart remembers the removal.
        await cluster.stop(victim)
        assert (tmp_path / f"node-{victim}" / REMOVED_MARKER_FILE).exists()
        restarted = await cluster.start(victim)
        assert restarted.removed

    run(tmp_path, 3, scenario)


def test_a_leader_removed_from_a_follower_hands_over(tmp_path):
    async def scenario(cluster: Cluster):
        leader = await cluster.leader()
        follower = next(i for i in cluster.groups if i != leader)
        await asyncio.wait_for(cluster.groups[follower].remove_member(leader), WAIT_S)
        old = cluster.groups[leader]
        await cluster.until(lambda: old.removed, "the old leader learns it was removed")
        rest = {i: g for i, g in cluster.groups.items() if i != leader}
        await cluster.until(
            lambda: any(g.leading for g in rest.values()), "the others elect a leader"
        )
        await cluster.groups[follower].propose(b"after")

    run(tmp_path, 3, scenario)


def test_a_stopped_follower_fails_what_it_forwarded(tmp_path):
    async def scenario(cluster: Cluster):
        follower = await cluster.follower()
        group = cluster.groups[follower]
        future = group.propose(b"x")
        await cluster.stop(follower)
        with pytest.raises((GroupStopped, ProposalLost)):
            await future

    run(tmp_path, 3, scenario)


# -- linearizable read points (ReadIndex) -----------------------------------------------


def test_a_read_point_through_a_follower_covers_a_write_acknowledged_by_the_leader(tmp_path):
    async def scenario(cluster: Cluster):
        leader = await cluster.leader()
        follower = next(i for i in cluster.groups if i != leader)
        group = cluster.groups[follower]
        for i in range(20):
            written = await asyncio.wait_for(cluster.groups[leader].propose(b"w%d" % i), WAIT_S)
            # Concurrent readers share one round; each point covers the acknowledged write.
            points = await asyncio.wait_for(
                asyncio.gather(*(group.read_point() for _ in range(3))), WAIT_S
            )
            assert min(points) >= written.index
            await asyncio.wait_for(group.applied(points[0]), WAIT_S)
            assert cluster.journals[follower].values()[-1] == b"w%d" % i
        own = await asyncio.wait_for(cluster.groups[leader].read_point(), WAIT_S)
        assert own >= written.index

    run(tmp_path, 3, scenario)


def test_a_read_point_asked_of_a_dead_leader_is_asked_of_the_next(tmp_path):
    async def scenario(cluster: Cluster):
        leader = await cluster.leader()
        follower = next(i for i in cluster.groups if i != leader)
        group = cluster.groups[follower]
        written = await asyncio.wait_for(cluster.groups[leader].propose(b"before"), WAIT_S)
        cluster.groups.pop(leader)._fail(RuntimeError("killed"))
        # Still believed the leader: the request goes to the dead node and is never answered.
        assert group.raft.leader_id == leader
        point = await asyncio.wait_for(group.read_point(), WAIT_S)
        assert point >= written.index
        assert group.raft.leader_id not in (None, leader)

    run(tmp_path, 3, scenario)


def test_a_group_of_one_has_its_read_point_at_once(tmp_path):
    async def main():
        group = RaftGroup(GroupConfig(node_id=1, data_dir=tmp_path), Journal())
        await group.start()
        try:
            written = await asyncio.wait_for(group.propose(b"x"), WAIT_S)
            point = group.read_point()
            assert point.done() and point.result() == written.index
        finally:
            await group.stop()

    asyncio.run(main())

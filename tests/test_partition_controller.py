"""The partition controller: when the metadata leader judges a node gone (silence counted
from its last Raft message, or from when this node began to lead), and the elections it
then proposes, only while it leads and only when they change something."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from warrenmq.cluster.group import ProposalLost
from warrenmq.server.metadata import commands as c
from warrenmq.server.metadata.records import NO_LEADER
from warrenmq.server.metadata.state import MetadataState
from warrenmq.server.metadata.store import StoreFailed
from warrenmq.server.partition_controller import PartitionController, gone_nodes


def test_a_node_is_gone_after_the_bound_of_silence():
    heard = {2: 10.0, 3: 12.5}
    assert gone_nodes({1, 2, 3}, 1, heard, 13.0, 0.0, 3.0) == ()
    assert gone_nodes({1, 2, 3}, 1, heard, 13.1, 0.0, 3.0) == (2,)
    assert gone_nodes({1, 2, 3}, 1, heard, 16.0, 0.0, 3.0) == (2, 3)


def test_silence_counts_from_when_this_node_began_to_lead():
    # Heard long ago under another leader, or never: not gone until the bound passes again.
    assert gone_nodes({1, 2, 3}, 1, {2: 1.0}, 102.0, 100.0, 3.0) == ()
    assert gone_nodes({1, 2, 3}, 1, {2: 1.0}, 103.5, 100.0, 3.0) == (2, 3)


def test_this_node_is_never_gone():
    assert gone_nodes({1}, 1, {}, 1e9, 0.0, 3.0) == ()


class FakeStore:
    def __init__(self, state: MetadataState) -> None:
        self.state = state
        self.node_id = 1
        self.group = SimpleNamespace(
            leading=True, removed=False, heard_s={}, raft=SimpleNamespace(voters=(1, 2, 3))
        )
        self.proposed: list[c.Command] = []

        self.lose_proposals = False

    async def apply(self, command: c.Command):
        self.proposed.append(command)
        if self.lose_proposals:
            raise StoreFailed("leadership lost") from ProposalLost("outcome unknown")
        return self.state.apply(command)


def three_nodes() -> MetadataState:
    state = MetadataState()
    state.apply(c.DeclareVhost("/"))
    for node in (1, 2, 3):
        state.apply(c.RegisterNode(node, "127.0.0.1", 5672 + node))
    return state


def test_the_leader_elects_from_the_isr_once_a_leader_is_gone():
    state = three_nodes()
    state.apply(c.DeclareQueue("/", "q", True, node=2, replicas=(2, 3, 1), isr=(2, 3)))
    store = FakeStore(state)
    controller = PartitionController(store, node_gone_s=3.0)
    store.group.heard_s.update({2: 0.0, 3: 0.0})

    async def scenario():
        await controller.check(0.0)
        store.group.heard_s[3] = 2.9
        await controller.check(3.0)
        assert store.proposed == []
        await controller.check(3.1)

    asyncio.run(scenario())
    assert store.proposed == [c.ElectLeaders((2,))]
    record = state.queue("/", "q")
    assert (record.node, record.isr, record.leader_epoch) == (3, (3,), 1)


def test_with_the_leader_alone_in_sync_nobody_is_elected_and_no_node_judges_but_the_leader():
    state = three_nodes()
    state.apply(c.DeclareQueue("/", "q", True, node=2, replicas=(2, 3, 1)))
    store = FakeStore(state)
    controller = PartitionController(store, node_gone_s=3.0)

    async def scenario():
        store.group.leading = False
        await controller.check(0.0)
        await controller.check(100.0)
        assert store.proposed == []
        store.group.leading = True
        await controller.check(100.0)
        store.group.heard_s[3] = 103.5
        await controller.check(104.0)
        store.group.heard_s[3] = 107.5
        await controller.check(108.0)

    asyncio.run(scenario())
    # Once: the partition has no leader then, and the next judgement changes nothing.
    assert store.proposed == [c.ElectLeaders((2,))]
    assert state.queue("/", "q").node == NO_LEADER


def test_a_leader_that_heard_from_no_majority_judges_nothing():
    """As a metadata leader resumed from SIGSTOP finds it: everyone silent for as long as it
    was stopped. It is the one that was gone; the others elected another leader meanwhile."""
    state = three_nodes()
    state.apply(c.DeclareQueue("/", "q", True, node=2, replicas=(2, 3, 1), isr=(2, 3)))
    store = FakeStore(state)
    controller = PartitionController(store, node_gone_s=3.0)
    store.group.heard_s.update({2: 10.0, 3: 10.0})

    async def scenario():
        await controller.check(10.0)
        await controller.check(30.0)

    asyncio.run(scenario())
    assert store.proposed == []
    assert state.queue("/", "q").node == 2


def test_an_election_whose_outcome_is_unknown_is_not_proposed_again():
    """Leadership was lost with the proposal in flight: the next leader judges for itself,
    and this one judges again only while it still leads."""
    state = three_nodes()
    state.apply(c.DeclareQueue("/", "q", True, node=2, replicas=(2, 3, 1), isr=(2, 3)))
    store = FakeStore(state)
    store.lose_proposals = True
    controller = PartitionController(store, node_gone_s=3.0)
    store.group.heard_s.update({2: 0.0, 3: 0.0})

    async def scenario():
        await controller.check(0.0)
        store.group.heard_s[3] = 3.0
        await controller.check(3.1)
        assert store.proposed == [c.ElectLeaders((2,))], "proposed once, and not again"
        store.group.leading = False
        await controller.check(3.6)

    asyncio.run(scenario())
    assert store.proposed == [c.ElectLeaders((2,))]
    assert state.queue("/", "q").node == 2

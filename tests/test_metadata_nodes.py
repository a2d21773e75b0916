"""The metadata of a cluster: node records, queue placement, a node's transient queues, the
seed guard, and entries and snapshots from before placement."""

from __future__ import annotations

import dataclasses
import json

import pytest

from warrenmq.exchanges.errors import RoutingError
from warrenmq.server.metadata import commands as c
from warrenmq.server.metadata.encoding import decode_commands, encode_commands
from warrenmq.server.metadata.records import NodeRecord
from warrenmq.server.metadata.state import MetadataState


def with_nodes(*node_ids: int) -> MetadataState:
    state = MetadataState()
    state.apply(c.DeclareVhost("/"))
    for node_id in node_ids:
        state.apply(c.RegisterNode(node_id, "127.0.0.1", 5670 + node_id, 0, 15670 + node_id))
    return state


def test_node_records_are_registered_replaced_and_forgotten():
    state = with_nodes(1, 2)
    assert state.nodes[2] == NodeRecord(2, "127.0.0.1", 5672, 0, 15672)
    assert state.nodes[2].name == "warren@2"
    assert not state.apply(c.RegisterNode(2, "127.0.0.1", 5672, 0, 15672)).changed
    assert state.apply(c.RegisterNode(2, "10.0.0.2", 5672)).changed
    assert state.nodes[2].host == "10.0.0.2"
    assert state.apply(c.ForgetNode(2)).changed
    assert list(state.nodes) == [1]
    assert not state.apply(c.ForgetNode(2)).changed


def test_balanced_placement_picks_the_node_leading_fewest_queues_ties_to_the_lowest_id():
    state = with_nodes(3, 1, 2)
    assert state.balanced_node(default=3) == 1
    for name, node in (("a", 1), ("b", 1), ("c", 2)):
        state.apply(c.DeclareQueue("/", name, durable=True, node=node))
    assert state.balanced_node(default=1) == 3
    state.apply(c.DeclareQueue("/", "d", durable=True, node=3))
    assert state.balanced_node(default=1) == 2
    state.apply(c.DeleteQueue("/", "a"))
    state.apply(c.DeleteQueue("/", "b"))
    assert (state.queues_led(1), state.balanced_node(default=2)) == (0, 1)
    assert MetadataState().balanced_node(default=7) == 7


def test_balanced_placement_picks_only_among_the_running_nodes():
    state = with_nodes(1, 2, 3)
    state.apply(c.DeclareQueue("/", "a", durable=True, node=2))
    assert state.balanced_node(default=2, among={2, 3}) == 3
    assert state.balanced_node(default=2, besides=2, among={2}) == 2


def test_a_redeclaration_keeps_the_queue_on_its_node():
    state = with_nodes(1, 2)
    state.apply(c.DeclareQueue("/", "q", durable=True, node=2))
    outcome = state.apply(c.DeclareQueue("/", "q", durable=True, node=1))
    assert not outcome.created and outcome.queue.node == 2


def test_forget_transient_of_a_node_keeps_other_nodes_exclusive_queues_and_exchanges():
    state = with_nodes(1, 2)
    state.apply(c.DeclareExchange("/", "transient", "fanout"))
    for name, node, exclusive in (("mine", 1, True), ("theirs", 2, True), ("kept", 1, False)):
        state.apply(
            c.DeclareQueue(
                "/", name, durable=not exclusive, exclusive=exclusive, owner="x", node=node
            )
        )
        state.apply(c.Bind("/", "transient", name))
    assert state.has_transient(1) and state.has_transient(2)
    state.apply(c.ForgetTransient(node=1))
    assert sorted(state.queues("/")) == ["kept", "theirs"]
    assert state.queues("/")["theirs"].node == 2
    assert state.router("/").get("transient") is not None
    assert sorted(b.destination.name for _, b in state.bindings("/")) == ["kept", "theirs"]
    assert not state.has_transient(1) and list(state.nodes) == [1, 2]
    state.apply(c.ForgetTransient())
    assert sorted(state.queues("/")) == ["kept"]
    assert state.router("/").get("transient") is None


def _with_transient_exchange_held_by(boots: dict[int, int]) -> MetadataState:
    state = with_nodes(*boots)
    for node, boot in boots.items():
        holders = state.transient_holders
        state.apply(c.NodeStarted(node, boot, tuple(holders), tuple(holders.values())))
    state.apply(c.DeclareExchange("/", "durable", "fanout", durable=True))
    state.apply(c.DeclareExchange("/", "transient", "fanout"))
    state.apply(c.DeclareQueue("/", "q", durable=True, node=2))
    state.apply(c.Bind("/", "transient", "q"))
    state.apply(c.Bind("/", "durable", "q"))
    state.apply(c.Bind("/", "durable", "transient", destination_kind="exchange"))
    return state


def test_a_node_started_while_a_holder_runs_keeps_the_transient_exchanges():
    """A rolling restart: node 1 comes back while 2 and 3 run as they did."""
    state = _with_transient_exchange_held_by({1: 11, 2: 22, 3: 33})
    outcome = state.apply(c.NodeStarted(1, 111, (2, 3), (22, 33)))
    assert outcome.deleted_exchanges == ()
    assert state.router("/").get("transient") is not None
    assert state.transient_holders == {1: 111, 2: 22, 3: 33}
    # Then 2 and 3 in turn: each finds a holder running.
    state.apply(c.NodeStarted(2, 222, (1, 3), (111, 33)))
    state.apply(c.NodeStarted(3, 333, (1, 2), (111, 222)))
    assert state.router("/").get("transient") is not None


def test_a_node_started_with_no_holder_running_forgets_the_transient_exchanges():
    """The whole cluster restarted: node 2 finds 1 down and 3 running a new boot."""
    state = _with_transient_exchange_held_by({1: 11, 2: 22, 3: 33})
    outcome = state.apply(c.NodeStarted(2, 222, (3,), (333,)))
    assert outcome.deleted_exchanges == ("transient",)
    assert state.router("/").get("transient") is None
    assert state.router("/").get("durable") is not None
    assert [(source, b.destination.name) for source, b in state.bindings("/")] == [("durable", "q")]
    assert state.queue("/", "q") is not None
    assert state.transient_holders == {2: 222}
    # Applied again (its outcome was lost): nothing more goes, and 2 still holds.
    state.apply(c.DeclareExchange("/", "later", "fanout"))
    state.apply(c.NodeStarted(2, 222, (3,), (333,)))
    assert state.router("/").get("later") is not None
    # 3 then finds 2 running: it keeps what 2 holds.
    state.apply(c.NodeStarted(3, 333, (2,), (222,)))
    assert state.router("/").get("later") is not None
    assert state.transient_holders == {2: 222, 3: 333}


def test_holders_survive_snapshots_entries_and_a_forgotten_node():
    state = _with_transient_exchange_held_by({1: 11, 2: 22})
    restored = MetadataState.from_snapshot(state.snapshot())
    assert restored.transient_holders == {1: 11, 2: 22}
    assert restored.router("/").get("transient") is not None
    assert restored.snapshot() == state.snapshot()
    command = c.NodeStarted(3, 1 << 61, (1, 2), (11, 22))
    assert decode_commands(encode_commands([command])) == [command]
    state.apply(c.ForgetNode(1))
    assert state.transient_holders == {2: 22}


def test_the_seed_guard_refuses_a_second_seed():
    state = MetadataState()
    state.apply(c.ExpectNew())
    state.apply(c.DeclareVhost("/"))
    with pytest.raises(RoutingError, match="seeded"):
        state.apply(c.ExpectNew())


def test_snapshots_keep_nodes_and_placement():
    state = with_nodes(1, 2)
    state.apply(c.DeclareQueue("/", "q", durable=True, node=2))
    restored = MetadataState.from_snapshot(state.snapshot())
    assert restored.nodes == state.nodes
    assert restored.queue("/", "q").node == 2 and restored.queues_led(2) == 1
    assert restored.snapshot() == state.snapshot()


def test_snapshots_and_entries_from_before_placement_put_queues_on_node_1():
    state = with_nodes()
    state.apply(c.DeclareQueue("/", "q", durable=True))
    document = json.loads(state.snapshot())
    document["format"] = 3
    del document["nodes"]
    document["queues"] = [row[:6] for row in document["queues"]]
    restored = MetadataState.from_snapshot(json.dumps(document).encode())
    assert restored.queue("/", "q").node == 1 and not restored.nodes
    entry = json.loads(encode_commands([c.DeclareQueue("/", "old", node=3), c.ForgetTransient(2)]))
    # As written before placement: DeclareQueue without its node (nor the replica set that
    # came after it), ForgetTransient bare. Field i of a command is entry item i + 1.
    node_item = [field.name for field in dataclasses.fields(c.DeclareQueue)].index("node") + 1
    entry = [entry[0][:node_item], entry[1][:1]]
    declare, forget = decode_commands(json.dumps(entry).encode())
    assert declare.node == 1 and forget.node is None

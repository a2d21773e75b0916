"""Replica sets in the metadata state machine (issue 12's design): partition state on queue
records, how many replicas a new queue gets and where, AlterIsr, ElectLeaders, grow,
shrink and rebalance, and snapshots and log entries from before replica sets."""

from __future__ import annotations

import json

import pytest

from warrenmq.server.metadata import commands as c
from warrenmq.server.metadata import partitions
from warrenmq.server.metadata.encoding import decode_commands, encode_commands
from warrenmq.server.metadata.errors import BadRequest, NotFound
from warrenmq.server.metadata.records import NO_LEADER
from warrenmq.server.metadata.state import MetadataState


def cluster(nodes: int = 3) -> MetadataState:
    state = MetadataState()
    state.apply(c.DeclareVhost("/"))
    for node in range(1, nodes + 1):
        state.apply(c.RegisterNode(node, "127.0.0.1", 5672 + node))
    return state


def declare(state: MetadataState, name: str, node: int, replicas=(), isr=(), **fields):
    fields.setdefault("durable", True)
    return state.apply(
        c.DeclareQueue("/", name, node=node, replicas=replicas, isr=isr, **fields)
    ).queue


# --- records and snapshots ------------------------------------------------------------------


def test_a_new_queue_is_in_sync_on_its_leader_alone():
    state = cluster()
    record = declare(state, "q", 2, replicas=(2, 3, 1))
    assert (record.node, record.replicas, record.isr) == (2, (2, 3, 1), (2,))
    assert (record.leader_epoch, record.partition_epoch, record.min_isr) == (0, 0, 2)
    assert record.under_min_isr
    assert state.replicas_held(1) == state.replicas_held(3) == 1
    assert state.queues_led(2) == 1


def test_a_declare_entry_from_before_replica_sets_is_its_leader_alone():
    # What an old log holds: DeclareQueue with fields up to `node`.
    entry = b'[["DeclareQueue",["str","/"],["str","q"],["bool",true],["bool",false],'
    entry += b'["bool",false],["table",[]],["void",null],["bool",false],["int",2]]]'
    state = cluster()
    record = state.apply(decode_commands(entry)[0]).queue
    assert (record.node, record.replicas, record.isr) == (2, (2,), (2,))
    assert (record.leader_epoch, record.partition_epoch) == (0, 0)


@pytest.mark.parametrize("fmt", [3, 4])
def test_snapshots_from_before_replica_sets_read_as_the_leader_alone(fmt):
    state = cluster()
    declare(state, "q", 2, replicas=(2, 3), isr=(2, 3))
    document = json.loads(state.snapshot())
    document["format"] = fmt
    for row in document["queues"]:
        del row[7 if fmt == 4 else 6 :]
    restored = MetadataState.from_snapshot(json.dumps(document).encode())
    record = restored.queue("/", "q")
    node = 2 if fmt == 4 else 1
    assert (record.node, record.replicas, record.isr) == (node, (node,), (node,))
    assert (record.leader_epoch, record.partition_epoch) == (0, 0)


def test_snapshots_keep_the_partition_state():
    state = cluster()
    declare(state, "q", 1, replicas=(1, 2, 3), isr=(1, 2, 3))
    state.apply(c.ElectLeaders((1,)))
    state.apply(c.AlterIsr("/", "q", 2, 1, 2, (2,)))
    snapshot = state.snapshot()
    restored = MetadataState.from_snapshot(snapshot)
    assert restored.snapshot() == snapshot
    assert restored.queue("/", "q") == state.queue("/", "q")
    assert restored.queues_led(2) == 1 and restored.replicas_held(3) == 1


@pytest.mark.parametrize(
    "command",
    [
        c.AlterIsr("/", "q", 1, 2, 3, (1, 2)),
        c.ElectLeaders((1, 3)),
        c.GrowReplicas(2, "even", "^/$", "^q"),
        c.ShrinkReplicas(3),
        c.Rebalance("quorum", ".*", "q"),
        c.DeclareQueue("/", "q", True, node=2, replicas=(2, 1), isr=(2,), leader_epoch=4),
    ],
)
def test_replica_commands_survive_the_log_encoding(command):
    assert decode_commands(encode_commands([command])) == [command]


def test_malformed_partition_state_is_refused():
    state = cluster()
    with pytest.raises(ValueError, match="distinct"):
        declare(state, "a", 1, replicas=(1, 1))
    with pytest.raises(ValueError, match="hold the leader"):
        declare(state, "b", 1, replicas=(1, 2), isr=(2,))
    with pytest.raises(ValueError, match="replicas of"):
        declare(state, "c", 1, replicas=(1, 2), isr=(1, 3))
    assert state.queues("/") == {}


# --- sizes and placement --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("queue_type", "arguments", "policy", "nodes", "size"),
    [
        ("quorum", {}, None, 5, 3),
        ("quorum", {}, None, 2, 2),
        ("quorum", {}, None, 1, 1),
        ("quorum", {"x-quorum-initial-group-size": 5}, None, 5, 5),
        ("quorum", {"x-quorum-initial-group-size": 7}, None, 3, 3),
        # RabbitMQ has no policy key for a quorum queue's initial size.
        ("quorum", {}, {"initial-cluster-size": 1}, 5, 3),
        ("stream", {"x-initial-cluster-size": 2}, None, 5, 2),
        ("stream", {"x-initial-cluster-size": 2}, {"initial-cluster-size": 4}, 5, 4),
        ("stream", {}, {"initial-cluster-size": 0}, 5, 1),
        ("classic", {}, None, 5, 3),
        ("classic", {"x-quorum-initial-group-size": 1}, None, 5, 3),
    ],
)
def test_replica_count(queue_type, arguments, policy, nodes, size):
    count = partitions.replica_count(
        queue_type, arguments, policy, nodes, durable=True, exclusive=False
    )
    assert count == size


def test_exclusive_and_transient_queues_have_one_replica():
    for durable, exclusive in ((False, False), (True, True)):
        assert (
            partitions.replica_count("classic", {}, None, 5, durable=durable, exclusive=exclusive)
            == 1
        )


def test_followers_go_to_the_running_members_holding_fewest_replicas():
    state = cluster(5)
    declare(state, "a", 1, replicas=(1, 2, 3))
    declare(state, "b", 1, replicas=(1, 2, 4))
    assert state.place_replicas(1, 3) == (1, 5, 3)
    assert state.place_replicas(1, 3, among={1, 2, 3, 4}) == (1, 3, 4)
    assert state.place_replicas(2, 1) == (2,)


# --- AlterIsr --------------------------------------------------------------------------------


def test_alter_isr_applies_once_and_bumps_the_partition_epoch():
    state = cluster()
    declare(state, "q", 1, replicas=(1, 2, 3))
    outcome = state.apply(c.AlterIsr("/", "q", 1, 0, 0, (1, 2)))
    assert outcome.changed and not outcome.refused
    assert (outcome.queue.isr, outcome.queue.partition_epoch) == ((1, 2), 1)
    # The same request again (its outcome lost): what it asked for is there, unchanged.
    again = state.apply(c.AlterIsr("/", "q", 1, 0, 0, (1, 2)))
    assert not again.changed and not again.refused and again.queue.partition_epoch == 1


def test_a_stale_alter_isr_is_refused_visibly():
    state = cluster()
    declare(state, "q", 1, replicas=(1, 2, 3))
    state.apply(c.AlterIsr("/", "q", 1, 0, 0, (1, 2)))
    stale = state.apply(c.AlterIsr("/", "q", 1, 0, 0, (1, 3)))
    assert stale.refused == partitions.STALE_PARTITION_EPOCH and not stale.changed
    assert state.queue("/", "q").isr == (1, 2)
    wrong_epoch = state.apply(c.AlterIsr("/", "q", 1, 5, 1, (1,)))
    not_leader = state.apply(c.AlterIsr("/", "q", 2, 0, 1, (1,)))
    assert wrong_epoch.refused == not_leader.refused == partitions.NOT_LEADER
    assert state.queue("/", "q").partition_epoch == 1


def test_alter_isr_keeps_the_leader_and_may_shrink_below_min_isr():
    state = cluster()
    declare(state, "q", 1, replicas=(1, 2, 3), isr=(1, 2, 3))
    with pytest.raises(ValueError, match="hold the leader"):
        state.apply(c.AlterIsr("/", "q", 1, 0, 0, (2, 3)))
    record = state.apply(c.AlterIsr("/", "q", 1, 0, 0, (1,))).queue
    assert record.isr == (1,) and record.under_min_isr
    with pytest.raises(NotFound):
        state.apply(c.AlterIsr("/", "nope", 1, 0, 0, (1,)))


# --- ElectLeaders ----------------------------------------------------------------------------


def test_a_gone_leader_hands_over_to_the_first_in_sync_replica():
    state = cluster()
    declare(state, "q", 1, replicas=(1, 2, 3), isr=(1, 3))
    declare(state, "other", 2, replicas=(2, 1), isr=(2, 1))
    outcome = state.apply(c.ElectLeaders((1,)))
    record = state.queue("/", "q")
    # 2 is a replica but not in sync: never elected.
    assert (record.node, record.isr) == (3, (3,))
    assert (record.leader_epoch, record.partition_epoch) == (1, 1)
    assert [result.queue.name for result in outcome.partitions] == ["q"]
    assert state.queue("/", "other").partition_epoch == 0
    assert state.queues_led(1) == 0 and state.queues_led(3) == 1


def test_no_in_sync_candidate_leaves_the_partition_without_a_leader():
    state = cluster()
    declare(state, "q", 1, replicas=(1, 2, 3))
    assert state.elections_needed((1,))
    state.apply(c.ElectLeaders((1,)))
    record = state.queue("/", "q")
    assert (record.node, record.isr, record.leader_epoch) == (NO_LEADER, (1,), 1)
    assert not record.online
    # Applied twice (or judged again): nothing more changes.
    assert not state.elections_needed((1,))
    assert not state.apply(c.ElectLeaders((1,))).changed
    assert state.queue("/", "q") == record
    # The last in-sync replica returns: it leads again.
    state.apply(c.ElectLeaders(()))
    back = state.queue("/", "q")
    assert (back.node, back.isr, back.leader_epoch, back.partition_epoch) == (1, (1,), 2, 2)


def test_a_leader_not_gone_is_left_alone():
    state = cluster()
    declare(state, "q", 2, replicas=(2, 1), isr=(2, 1))
    assert not state.elections_needed((1, 3))
    assert not state.apply(c.ElectLeaders((1, 3))).changed


# --- grow, shrink, rebalance -----------------------------------------------------------------


def test_grow_adds_a_replica_out_of_sync_where_there_is_none():
    state = cluster(4)
    declare(state, "two", 1, replicas=(1, 2))
    declare(state, "three", 1, replicas=(1, 2, 3))
    declare(state, "has-four", 4, replicas=(4, 1))
    declare(state, "transient", 1, durable=False)
    outcome = state.apply(c.GrowReplicas(4, "all"))
    assert [r.queue.name for r in outcome.partitions] == ["three", "two"]
    three = state.queue("/", "three")
    assert (three.replicas, three.isr, three.partition_epoch) == ((1, 2, 3, 4), (1,), 1)
    assert state.queue("/", "transient").replicas == (1,)
    assert not state.apply(c.GrowReplicas(4, "all")).changed


def test_grow_even_and_patterns():
    state = cluster(4)
    declare(state, "two", 1, replicas=(1, 2))
    declare(state, "three", 1, replicas=(1, 2, 3))
    declare(state, "other-two", 1, replicas=(1, 2))
    outcome = state.apply(c.GrowReplicas(4, "even", queue_pattern="^two"))
    assert [r.queue.name for r in outcome.partitions] == ["two"]
    with pytest.raises(NotFound):
        state.apply(c.GrowReplicas(9))
    with pytest.raises(BadRequest):
        state.apply(c.GrowReplicas(4, "odd"))
    with pytest.raises(BadRequest):
        state.apply(c.GrowReplicas(4, queue_pattern="("))


def test_shrink_removes_replicas_but_never_the_last_nor_an_unfollowed_leader():
    state = cluster()
    declare(state, "follower", 1, replicas=(1, 2, 3), isr=(1, 2))
    declare(state, "leader", 2, replicas=(2, 3, 1), isr=(2, 1))
    declare(state, "alone", 2, replicas=(2,))
    declare(state, "unfollowed", 2, replicas=(2, 3))
    outcome = state.apply(c.ShrinkReplicas(2))
    results = {r.queue.name: r.error for r in outcome.partitions}
    assert results == {
        "follower": "",
        "leader": "",
        "alone": partitions.LAST_NODE,
        "unfollowed": partitions.NO_IN_SYNC_REPLICA,
    }
    follower = state.queue("/", "follower")
    assert (follower.replicas, follower.isr, follower.leader_epoch) == ((1, 3), (1,), 0)
    leader = state.queue("/", "leader")
    assert (leader.node, leader.replicas, leader.isr, leader.leader_epoch) == (1, (3, 1), (1,), 1)
    assert state.queue("/", "unfollowed").replicas == (2, 3)


def test_rebalance_moves_leaders_to_in_sync_replicas_only():
    state = cluster()
    for index in range(6):
        isr = (1, 2) if index % 2 else (1,)
        declare(state, f"q{index}", 1, replicas=(1, 2, 3), isr=isr)
    outcome = state.apply(c.Rebalance())
    moved = {r.queue.name: r.queue.node for r in outcome.partitions}
    # Only the three with 2 in sync can move, and all to 2: 3 is in no ISR.
    assert moved == {"q1": 2, "q3": 2, "q5": 2}
    assert state.queues_led(1) == state.queues_led(2) == 3
    assert not state.apply(c.Rebalance()).changed
    with pytest.raises(BadRequest):
        state.apply(c.Rebalance("lazy"))


def test_a_restarted_node_forgets_its_transient_queue_even_without_a_leader():
    state = cluster()
    declare(state, "t", 2, durable=False)
    state.apply(c.ElectLeaders((2,)))
    assert state.queue("/", "t").node == NO_LEADER
    assert state.has_transient(2)
    state.apply(c.ForgetTransient(2))
    assert state.queue("/", "t") is None


def test_a_restarted_node_leads_its_replicated_queues_in_a_new_epoch():
    state = cluster()
    declare(state, "replicated", 1, replicas=(1, 2, 3), isr=(1, 2, 3))
    declare(state, "alone", 1)
    declare(state, "elsewhere", 2, replicas=(2, 1, 3), isr=(2, 1, 3))
    outcome = state.apply(c.NodeStarted(1, 7))
    # Node 1 may have lost an unfsynced tail its followers hold: it must not lead the epoch
    # it led before it restarted (`ReplicationNode.recover`).
    record = state.queue("/", "replicated")
    assert (record.node, record.isr, record.leader_epoch, record.partition_epoch) == (
        1,
        (1, 2, 3),
        1,
        1,
    )
    assert [result.queue.name for result in outcome.partitions] == ["replicated"]
    assert state.queue("/", "alone").leader_epoch == 0
    assert state.queue("/", "elsewhere").leader_epoch == 0

"""Replica sets of queues and stream partitions: how many replicas a new one gets, where they
go, and the changes the metadata makes to them (issue 12's design: leader/follower
replication with leader epochs and an ISR, under the metadata Raft).

Pure functions over records: `MetadataState` applies their results.

Sizes, as RabbitMQ sizes them:
* a quorum queue: `x-quorum-initial-group-size`, else the default. RabbitMQ has no policy
  key for it (its default is the `quorum_cluster_size` setting, 3; the `target-group-size`
  policy is a target its periodic membership reconciliation grows towards, not a size at
  declare);
* a stream: the `initial-cluster-size` policy, which wins over `x-initial-cluster-size`
  (rabbit_stream_queue's `policy_precedence`), else the default;
* a durable classic queue: the default. RabbitMQ's classic queues are unreplicated since
  mirroring went, but Warren promises that a confirm means fsynced on a quorum for every
  queue a client may lose nothing from, so a classic queue is replicated like a quorum one.
  An exclusive or transient queue has one replica: it lives as long as its connection or
  its node in RabbitMQ too, so copies elsewhere would cost fsyncs and protect nothing.
The default is 3 in a cluster of 3 or more nodes, else the cluster's size; any size is
capped at the cluster's size (RabbitMQ places a larger group on every node) and an
`initial-cluster-size` policy of 0 (valid to its validator) means 1.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

from warrenmq.server.metadata.records import NO_LEADER, QueueRecord

REPLICAS_DEFAULT_MAX = 3
STRATEGIES = ("all", "even")
QUEUE_TYPES = ("all", "classic", "quorum", "stream")
# Per-queue errors, with RabbitMQ's names where it has one (rabbit_quorum_queue).
LAST_NODE = "last_node"
NO_IN_SYNC_REPLICA = "no_in_sync_replica"
# AlterIsr refusals (Kafka's AlterPartition errors).
STALE_PARTITION_EPOCH = "stale_partition_epoch"
NOT_LEADER = "not_leader"


@dataclass(frozen=True, slots=True)
class PartitionResult:
    """One queue a replica command touched: its record afterwards, and the error that left
    it unchanged ("" when it changed)."""

    queue: QueueRecord
    error: str = ""


def replica_count(
    queue_type: str,
    arguments: Mapping[str, Any],
    policy_definition: Mapping[str, Any] | None,
    cluster_size: int,
    *,
    durable: bool,
    exclusive: bool,
) -> int:
    """How many replicas a new queue gets (the module docstring)."""
    cluster_size = max(cluster_size, 1)
    if exclusive or not durable:
        return 1
    size: Any = None
    if queue_type == "quorum":
        size = arguments.get("x-quorum-initial-group-size")
    elif queue_type == "stream":
        size = (policy_definition or {}).get("initial-cluster-size")
        if size is None:
            size = arguments.get("x-initial-cluster-size")
    if not isinstance(size, int) or isinstance(size, bool):
        size = min(REPLICAS_DEFAULT_MAX, cluster_size)
    return max(1, min(size, cluster_size))


def place_replicas(
    leader: int,
    count: int,
    nodes: Collection[int],
    held: Mapping[int, int],
    running: Collection[int] | None = None,
) -> tuple[int, ...]:
    """The leader, then `count` - 1 followers on the other `nodes` holding the fewest
    replicas (`held`), running ones first (RabbitMQ's balanced placement), ties to the
    lowest id."""
    others = sorted(
        (node for node in nodes if node != leader),
        key=lambda node: (running is not None and node not in running, held.get(node, 0), node),
    )
    return (leader, *others[: max(count - 1, 0)])


def matches(pattern: str, subject: str) -> bool:
    """rabbit_re:matches: an unanchored regex search."""
    return re.search(pattern, subject) is not None


def check_pattern(pattern: str) -> None:
    try:
        re.compile(pattern)
    except re.error as error:
        raise ValueError(f"invalid pattern '{pattern}': {error}") from error


def alter_isr(record: QueueRecord, isr: tuple[int, ...]) -> QueueRecord:
    return replace(record, isr=isr, partition_epoch=record.partition_epoch + 1)


def elect(record: QueueRecord, gone: Collection[int]) -> QueueRecord | None:
    """The record after an election (see `commands.ElectLeaders`), or None if it needs none:
    its leader is not gone, or it has no leader and still no candidate."""
    if record.node != NO_LEADER and record.node not in gone:
        return None
    candidates = [node for node in record.replicas if node in record.isr and node not in gone]
    if not candidates:
        if record.node == NO_LEADER:
            return None
        return replace(
            record,
            node=NO_LEADER,
            leader_epoch=record.leader_epoch + 1,
            partition_epoch=record.partition_epoch + 1,
        )
    # Only the gone leader leaves the ISR: a gone follower is the new leader's to remove
    # when it lags (`AlterIsr`).
    isr = tuple(node for node in record.isr if node != record.node)
    return replace(
        record,
        node=candidates[0],
        isr=isr,
        leader_epoch=record.leader_epoch + 1,
        partition_epoch=record.partition_epoch + 1,
    )


def grow(record: QueueRecord, node: int) -> QueueRecord:
    return replace(
        record, replicas=(*record.replicas, node), partition_epoch=record.partition_epoch + 1
    )


def shrink(record: QueueRecord, node: int) -> PartitionResult:
    """The replica on `node` gone from `record` (which has one there)."""
    if record.replicas == (node,):
        return PartitionResult(record, LAST_NODE)
    replicas = tuple(replica for replica in record.replicas if replica != node)
    isr = tuple(replica for replica in record.isr if replica != node)
    if record.node != node:
        return PartitionResult(
            replace(
                record,
                replicas=replicas,
                isr=isr,
                partition_epoch=record.partition_epoch + 1,
            )
        )
    successors = [replica for replica in replicas if replica in isr]
    if not successors:
        return PartitionResult(record, NO_IN_SYNC_REPLICA)
    return PartitionResult(
        replace(
            record,
            node=successors[0],
            replicas=replicas,
            isr=isr,
            leader_epoch=record.leader_epoch + 1,
            partition_epoch=record.partition_epoch + 1,
        )
    )


def move_leader(record: QueueRecord, node: int) -> QueueRecord:
    """Leadership handed to `node`, an in-sync replica."""
    assert node in record.isr, (record, node)
    return replace(
        record,
        node=node,
        leader_epoch=record.leader_epoch + 1,
        partition_epoch=record.partition_epoch + 1,
    )


def rebalanced(records: list[QueueRecord], nodes: Collection[int]) -> list[QueueRecord]:
    """The records whose leaders move so that no node leads more than its share of
    `records` (ceil(len / len(nodes))), each move to the in-sync replica leading fewest,
    and only when that lowers the imbalance (rabbit_amqqueue's iterative rebalance, which
    moves to any replica; here only to the ISR, as the design requires)."""
    if not records or not nodes:
        return []
    share = -(-len(records) // len(nodes))
    leading: dict[int, int] = dict.fromkeys(nodes, 0)
    for record in records:
        leading[record.node] = leading.get(record.node, 0) + 1
    moved = []
    for record in records:
        if leading.get(record.node, 0) <= share:
            continue
        candidates = [node for node in record.isr if node != record.node and node in leading]
        if not candidates:
            continue
        target = min(candidates, key=lambda node: (leading[node], node))
        if leading[target] + 1 >= leading[record.node]:
            continue
        leading[record.node] -= 1
        leading[target] += 1
        moved.append(move_leader(record, target))
    return moved

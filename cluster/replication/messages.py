"""What replication nodes and the metadata controller say to each other (`codec.py` puts it
on the wire).

A partition is named by an opaque key the caller chooses (bytes or str): a queue's messages
log and its acks log are two partitions, a stream partition is one; this layer never looks
inside a key.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

PartitionKey = bytes | str

NO_LEADER = -1
"""`PartitionState.leader` when no ISR member is alive to lead (never an unclean election)."""

NO_EPOCH = -1
"""`EpochAnswer.epoch` when the leader's log holds no epoch at or below the one asked about."""


class FetchError(IntEnum):
    NONE = 0
    FENCED = 1
    """The request named an older leader_epoch than the leader's: refresh the metadata."""
    NOT_LEADER = 2
    """This node does not lead the partition in the epoch named (or saw a newer epoch)."""
    OFFSET_OUT_OF_RANGE = 3
    """The fetch offset is outside the leader's log: below `log_start` (reset there) or past
    its end (truncate again)."""


@dataclass(frozen=True, slots=True)
class PartitionState:
    """One partition's replication metadata, as the metadata Raft holds it."""

    replicas: tuple[int, ...]
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    partition_epoch: int

    @property
    def min_isr(self) -> int:
        return len(self.replicas) // 2 + 1


@dataclass(frozen=True, slots=True)
class EpochQuery:
    """OffsetForLeaderEpoch: where does `epoch` end in the leader's log?"""

    key: PartitionKey
    leader_epoch: int
    epoch: int


@dataclass(frozen=True, slots=True)
class FetchPartition:
    key: PartitionKey
    leader_epoch: int
    fetch_offset: int
    durable_offset: int
    """Everything below this is fsynced in the follower's log (the quorum rule counts it)."""


@dataclass(frozen=True, slots=True)
class FetchRequest:
    """One follower node's request to one leader node, for every partition it follows there."""

    request_id: int
    replica: int
    max_bytes: int
    max_wait_ms: int
    """The leader may hold the request this long while it has nothing new to send."""
    queries: tuple[EpochQuery, ...]
    partitions: tuple[FetchPartition, ...]


@dataclass(frozen=True, slots=True)
class EpochAnswer:
    key: PartitionKey
    error: FetchError
    epoch: int
    """The largest epoch <= the one asked about that the leader's log holds, or NO_EPOCH."""
    end_offset: int
    """Where that epoch ends in the leader's log (its log start under NO_EPOCH)."""


@dataclass(frozen=True, slots=True)
class FetchedPartition:
    key: PartitionKey
    error: FetchError
    high_watermark: int
    log_start: int
    records: bytes
    """Stored batches verbatim (`PartitionLog.read_batches`), starting at the fetch offset."""


@dataclass(frozen=True, slots=True)
class FetchResponse:
    request_id: int
    answers: tuple[EpochAnswer, ...]
    partitions: tuple[FetchedPartition, ...]


@dataclass(frozen=True, slots=True)
class AlterIsr:
    """A leader's proposal to the metadata controller (KIP-497's AlterPartition): accepted only
    while `partition_epoch` is still the partition's."""

    key: PartitionKey
    leader: int
    leader_epoch: int
    partition_epoch: int
    isr: tuple[int, ...]


Message = PartitionState | FetchRequest | FetchResponse | AlterIsr

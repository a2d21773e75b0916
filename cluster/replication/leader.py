"""The leader's side of one partition: followers' progress, the high watermark, ISR changes,
and the answers to fetches and epoch queries.

The high watermark (HW) is the quorum commit point: the smallest durable offset over the
maximal ISR (the committed ISR together with the one an AlterIsr in flight proposes), and it
moves only while the committed ISR holds at least `min_isr` replicas. It never goes down
within a leader epoch. A new leader starts from min(its end, the HW it knew) and its
followers' progress unknown, so nothing new is confirmed before every ISR member has
fetched in the new epoch.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import ReplicationConfig
from .messages import (
    AlterIsr,
    EpochAnswer,
    EpochQuery,
    FetchError,
    FetchPartition,
    PartitionKey,
    PartitionState,
)
from .replica_log import ReplicaLog

UNKNOWN = -1


@dataclass(slots=True)
class FollowerProgress:
    fetch_offset: int = UNKNOWN
    durable_offset: int = UNKNOWN
    caught_up_at: float = 0.0
    """When the follower last had everything the leader had (Kafka's lastCaughtUpTime)."""
    last_fetch_at: float = 0.0
    end_at_last_fetch: int = UNKNOWN
    """The leader's end when the follower last fetched: reaching it later counts as caught
    up at that fetch's time, so a follower under steady appends is not forever behind."""
    hw_sent: int = UNKNOWN
    """The HW the follower was last told: a change is news that ends a held fetch."""


class PartitionLeader:
    """One partition this node leads in one leader epoch. A new epoch is a new object."""

    __slots__ = (
        "key",
        "node_id",
        "log",
        "config",
        "state",
        "epoch_start_offset",
        "high_watermark",
        "followers",
        "proposed_isr",
        "proposed_at",
        "stepped_aside",
    )

    def __init__(
        self,
        key: PartitionKey,
        node_id: int,
        log: ReplicaLog,
        state: PartitionState,
        config: ReplicationConfig,
        now: float,
        known_high_watermark: int = 0,
    ) -> None:
        assert state.leader == node_id and node_id in state.isr, (node_id, state)
        self.key = key
        self.node_id = node_id
        self.log = log
        self.config = config
        self.state = state
        # A follower joins the ISR only once it holds this much: everything this leader
        # inherited, which may be more than the HW it knew (KIP-207's epoch start check).
        self.epoch_start_offset = log.end_offset
        self.high_watermark = max(log.start_offset, min(log.end_offset, known_high_watermark))
        self.followers = {
            replica: FollowerProgress(caught_up_at=now, last_fetch_at=now)
            for replica in state.replicas
            if replica != node_id
        }
        self.proposed_isr: tuple[int, ...] | None = None
        self.proposed_at = 0.0
        # Set when a request named a newer epoch: another leader exists, so this one stops
        # confirming and waits for the metadata to say so.
        self.stepped_aside = False

    @property
    def leader_epoch(self) -> int:
        return self.state.leader_epoch

    def update_state(self, state: PartitionState, now: float) -> None:
        """A new partition_epoch in this leader epoch (ISR or replicas changed)."""
        assert state.leader == self.node_id and state.leader_epoch == self.leader_epoch
        if state.partition_epoch <= self.state.partition_epoch:
            return
        self.state = state
        self.proposed_isr = None
        for replica in state.replicas:
            if replica != self.node_id and replica not in self.followers:
                self.followers[replica] = FollowerProgress(caught_up_at=now, last_fetch_at=now)
        for replica in list(self.followers):
            if replica not in state.replicas:
                del self.followers[replica]

    # -- requests --------------------------------------------------------------------------

    def _epoch_error(self, replica: int, leader_epoch: int) -> FetchError | None:
        if leader_epoch < self.leader_epoch:
            return FetchError.FENCED
        if leader_epoch > self.leader_epoch:
            self.stepped_aside = True
            return FetchError.NOT_LEADER
        if self.stepped_aside or replica not in self.followers:
            return FetchError.NOT_LEADER
        return None

    def answer_epoch(self, replica: int, query: EpochQuery) -> EpochAnswer:
        error = self._epoch_error(replica, query.leader_epoch)
        if error is not None:
            return EpochAnswer(query.key, error, -1, -1)
        if query.epoch >= self.leader_epoch:
            return EpochAnswer(query.key, FetchError.NONE, self.leader_epoch, self.log.end_offset)
        epoch, end_offset = self.log.epoch_end_offset(query.epoch)
        return EpochAnswer(query.key, FetchError.NONE, epoch, end_offset)

    def fetch(self, replica: int, partition: FetchPartition, now: float) -> FetchError:
        """Take in a follower's fetch (its offsets are its acknowledgement) and say whether
        it may be answered with data from `partition.fetch_offset` on."""
        error = self._epoch_error(replica, partition.leader_epoch)
        if error is not None:
            return error
        log = self.log
        end = log.end_offset
        if not log.start_offset <= partition.fetch_offset <= end:
            return FetchError.OFFSET_OUT_OF_RANGE
        progress = self.followers[replica]
        if partition.fetch_offset >= end:
            progress.caught_up_at = now
        elif partition.fetch_offset >= progress.end_at_last_fetch:
            progress.caught_up_at = max(progress.caught_up_at, progress.last_fetch_at)
        progress.last_fetch_at = now
        progress.end_at_last_fetch = end
        progress.fetch_offset = partition.fetch_offset
        progress.durable_offset = min(partition.durable_offset, partition.fetch_offset)
        return FetchError.NONE

    def has_news_for(self, replica: int, fetch_offset: int) -> bool:
        """Whether a fetch from `fetch_offset` would carry records or a new HW."""
        progress = self.followers.get(replica)
        return (
            self.stepped_aside
            or progress is None
            or fetch_offset < self.log.end_offset
            or progress.hw_sent != self.high_watermark
        )

    # -- the high watermark and the ISR ----------------------------------------------------

    def maximal_isr(self) -> set[int]:
        isr = set(self.state.isr)
        if self.proposed_isr is not None:
            isr.update(self.proposed_isr)
        return isr

    def update_high_watermark(self) -> bool:
        """Advance the HW by the quorum rule; True when it moved."""
        if self.stepped_aside or len(self.state.isr) < self.state.min_isr:
            return False
        log = self.log
        durable = min(log.durable_offset, log.end_offset)
        for replica in self.maximal_isr():
            if replica != self.node_id:
                durable = min(durable, self.followers[replica].durable_offset)
        if durable > self.high_watermark:
            self.high_watermark = durable
            return True
        return False

    def propose_isr(self, now: float) -> AlterIsr | None:
        """An AlterIsr to send now, if the ISR should change (or a proposal is due again):
        shrink followers not caught up for `replica_lag_s`, expand those that hold the HW
        and everything this leader inherited durably."""
        if self.stepped_aside:
            return None
        state = self.state
        if self.proposed_isr is not None:
            if now - self.proposed_at < self.config.alter_isr_retry_s:
                return None
            self.proposed_at = now
            return AlterIsr(
                self.key,
                self.node_id,
                state.leader_epoch,
                state.partition_epoch,
                self.proposed_isr,
            )
        lag_s = self.config.replica_lag_s
        enough = max(self.high_watermark, self.epoch_start_offset)
        isr = tuple(
            replica
            for replica in state.replicas
            if replica == self.node_id
            or (replica in state.isr and now - self.followers[replica].caught_up_at <= lag_s)
            or (
                replica not in state.isr
                and self.followers[replica].durable_offset >= enough
                and now - self.followers[replica].caught_up_at <= lag_s
            )
        )
        if set(isr) == set(state.isr):
            return None
        self.proposed_isr = isr
        self.proposed_at = now
        return AlterIsr(self.key, self.node_id, state.leader_epoch, state.partition_epoch, isr)

    def alter_isr_rejected(self) -> None:
        """The controller refused the proposal: think again at the next tick."""
        self.proposed_isr = None

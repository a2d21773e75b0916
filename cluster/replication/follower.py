"""The follower's side of one partition: truncate to where the leader's log agrees, then
fetch from the end, append what comes verbatim and report what is durable.

Phases: TRUNCATING asks the leader where the follower's last epoch ends in the leader's log
(an `EpochQuery`) and cuts the log there; when the leader does not hold that epoch, the
follower cuts off what it holds of later epochs and asks again about its previous one, so
each round removes only what cannot be on the leader. FETCHING then asks for records from
`end_offset` and, so that every fetch reports an exact durable offset, fetches again only once
everything appended is fsynced.
"""

from __future__ import annotations

from enum import Enum

from .messages import (
    NO_EPOCH,
    EpochAnswer,
    EpochQuery,
    FetchedPartition,
    FetchError,
    FetchPartition,
    PartitionKey,
    PartitionState,
)
from .replica_log import ReplicaLog


class Phase(Enum):
    TRUNCATING = "truncating"
    FETCHING = "fetching"


class PartitionFollower:
    """One partition this node follows, under one leader in one leader epoch."""

    __slots__ = (
        "key",
        "log",
        "state",
        "phase",
        "query_epoch",
        "high_watermark",
        "in_flight",
        "fetched_from",
        "retry_at",
    )

    def __init__(
        self,
        key: PartitionKey,
        log: ReplicaLog,
        state: PartitionState,
        high_watermark: int = 0,
    ) -> None:
        self.key = key
        self.log = log
        self.state = state
        self.phase = Phase.TRUNCATING
        self.query_epoch = log.last_term
        if log.end_offset == log.start_offset:
            self.phase = Phase.FETCHING
        self.high_watermark = min(high_watermark, log.end_offset)
        # The id of the request carrying this partition, or None.
        self.in_flight: int | None = None
        self.fetched_from = -1
        self.retry_at = 0.0

    @property
    def leader(self) -> int:
        return self.state.leader

    @property
    def leader_epoch(self) -> int:
        return self.state.leader_epoch

    def ready(self, now: float) -> bool:
        """Whether the partition goes into the next request to its leader."""
        if self.in_flight is not None or now < self.retry_at:
            return False
        if self.phase is Phase.TRUNCATING:
            return True
        return self.log.durable_offset >= self.log.end_offset

    def query(self) -> EpochQuery:
        return EpochQuery(self.key, self.leader_epoch, self.query_epoch)

    def fetch(self) -> FetchPartition:
        log = self.log
        self.fetched_from = log.end_offset
        return FetchPartition(self.key, self.leader_epoch, log.end_offset, log.durable_offset)

    def on_answer(self, answer: EpochAnswer, now: float, backoff_s: float) -> None:
        if answer.error is not FetchError.NONE:
            self.retry_at = now + backoff_s
            return
        log = self.log
        if answer.epoch == NO_EPOCH:
            # The leader holds nothing of this epoch or any before it: nothing here is
            # on the leader from its log start on.
            if (log.start_offset, log.end_offset) != (answer.end_offset, answer.end_offset):
                log.reset(answer.end_offset)
            self.phase = Phase.FETCHING
            return
        epoch, end_offset = log.epoch_end_offset(answer.epoch)
        if epoch == answer.epoch:
            log.truncate(min(end_offset, answer.end_offset))
            self.phase = Phase.FETCHING
            return
        # This log does not hold the leader's epoch: what it holds of later epochs is not on
        # the leader; what it holds of `epoch` may not be either, so ask about that next.
        log.truncate(end_offset)
        if epoch == NO_EPOCH or log.end_offset == log.start_offset:
            self.phase = Phase.FETCHING
        else:
            self.query_epoch = epoch

    def on_fetched(self, fetched: FetchedPartition, now: float, backoff_s: float) -> bool:
        """Take in the answer to a fetch; True when the log grew (and wants an fsync)."""
        log = self.log
        if fetched.error is FetchError.OFFSET_OUT_OF_RANGE:
            if self.fetched_from < fetched.log_start:
                log.reset(fetched.log_start)
            else:
                self.phase = Phase.TRUNCATING
                self.query_epoch = log.last_term
            return False
        if fetched.error is not FetchError.NONE:
            self.retry_at = now + backoff_s
            return False
        grew = False
        if fetched.records and self.fetched_from == log.end_offset:
            log.append_stored(fetched.records)
            grew = True
        self.high_watermark = max(self.high_watermark, min(fetched.high_watermark, log.end_offset))
        return grew

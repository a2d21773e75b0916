"""Timings and bounds of partition replication. Every bound is enforced by the code that
reads it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ReplicationConfig:
    replica_lag_s: float = 10.0
    """A follower that has not fetched up to the leader's end for this long leaves the ISR."""
    alter_isr_retry_s: float = 2.0
    """An AlterIsr with no answer (no new partition_epoch seen) is sent again after this."""
    fetch_max_bytes: int = 8 << 20
    """Most record bytes in one fetch response, every partition together (at least one batch
    always goes, so a batch larger than this still moves)."""
    fetch_max_wait_s: float = 0.5
    """How long a leader may hold a fetch that has nothing new to answer (a long poll)."""
    fetch_timeout_s: float = 5.0
    """A fetch with no response after this long is given up; its partitions are fetched anew."""
    fetch_in_flight_max: int = 2
    """Most fetch requests in flight from one follower node to one leader node. Two let a
    partition whose fsync finished report it while another request is held by the leader."""
    fetch_store_wait_s: float = 0.05
    """How long a follower's ready partitions wait for another of the same leader to fsync
    what it fetched, so that they share its request (`ReplicationNode.poll_fetches`)."""
    fetch_backoff_s: float = 0.1
    """After an error answer, a partition waits this long before it is fetched again."""
    parked_fetches_max: int = 10_000
    """Most fetches a leader node holds at once; past it, fetches are answered at once."""

    def __post_init__(self) -> None:
        for name in ("fetch_max_bytes", "fetch_in_flight_max", "parked_fetches_max"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in (
            "replica_lag_s",
            "alter_isr_retry_s",
            "fetch_max_wait_s",
            "fetch_timeout_s",
            "fetch_store_wait_s",
            "fetch_backoff_s",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")

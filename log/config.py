"""Bounds and policies of one partition log. Every bound is enforced by the log."""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import LogError
from .tail_cache import TailCacheBudget

# Index entries store positions and relative offsets as unsigned 32-bit integers.
_U32_MAX = 0xFFFF_FFFF


@dataclass(frozen=True, slots=True)
class LogConfig:
    segment_bytes_max: int = 64 << 20
    """A segment rolls before an append would take it past this size."""
    index_interval_bytes: int = 4096
    """One sparse index entry per this many bytes of batches."""
    record_bytes_max: int = 16 << 20
    """Largest encoded record (header, exchange, routing key, properties, body)."""
    batch_bytes_max: int = 64 << 20
    """Largest encoded batch. A batch larger than `segment_bytes_max` gets a segment of its own."""
    batch_records_max: int = 100_000
    """Most records in one batch."""
    retention_ms: int | None = None
    """Whole segments whose newest record is older than this are deleted; None keeps all."""
    retention_bytes: int | None = None
    """Oldest whole segments are deleted while the rest still hold this much; None keeps all."""
    tail_cache_bytes_max: int = 8 << 20
    """The newest batches, up to this many bytes, are served from memory: their encoded bytes
    and `partition.CACHED_RECORD_OVERHEAD_BYTES` per record, what Python holds besides."""
    tail_cache_budget: TailCacheBudget | None = field(default=None, compare=False)
    """A bound this log's tail cache shares with every log opened with the same budget (a
    node's message logs): past it the batch cached longest ago goes first, whichever log
    holds it. None: the log's own bound alone. Configs derived with `dataclasses.replace`
    keep the budget."""

    def __post_init__(self) -> None:
        positive = {
            "segment_bytes_max": self.segment_bytes_max,
            "index_interval_bytes": self.index_interval_bytes,
            "record_bytes_max": self.record_bytes_max,
            "batch_bytes_max": self.batch_bytes_max,
            "batch_records_max": self.batch_records_max,
        }
        for name, value in positive.items():
            if value <= 0:
                raise LogError(f"{name} must be positive, got {value}")
        for name in ("segment_bytes_max", "batch_bytes_max"):
            if getattr(self, name) > _U32_MAX:
                raise LogError(f"{name} must fit 32 bits, got {getattr(self, name)}")
        if self.tail_cache_bytes_max < 0:
            raise LogError(
                f"tail_cache_bytes_max must not be negative, got {self.tail_cache_bytes_max}"
            )
        for name, value in (
            ("retention_ms", self.retention_ms),
            ("retention_bytes", self.retention_bytes),
        ):
            if value is not None and value < 0:
                raise LogError(f"{name} must not be negative, got {value}")

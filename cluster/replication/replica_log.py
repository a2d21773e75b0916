"""The part of a partition log that replication drives, as a protocol: `PartitionLog`
(log/partition.py) is one, the simulator's in-memory log another."""

from __future__ import annotations

from typing import Protocol


class ReplicaLog(Protocol):
    @property
    def start_offset(self) -> int: ...

    @property
    def end_offset(self) -> int: ...

    @property
    def durable_offset(self) -> int: ...

    @property
    def last_term(self) -> int: ...

    def epoch_end_offset(self, epoch: int) -> tuple[int, int]: ...

    def append_stored(self, data: bytes | memoryview) -> int: ...

    def truncate(self, offset: int) -> None: ...

    def reset(self, start_offset: int) -> None: ...

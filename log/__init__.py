"""The storage engine: segmented, CRC-checked, crash-recovering partition logs.

`PartitionLog.open(directory, LogConfig(...))` opens (or creates and recovers) one partition;
see `partition.py` for the API and `batch.py` for the on-disk format. The logs' files are
opened through a bounded `DescriptorPool` (`descriptors.py`); a node's logs can share one
bound on their tail caches, a `TailCacheBudget` (`tail_cache.py`).
"""

from .batch import RawRecord, Record
from .config import LogConfig
from .descriptors import DescriptorPool
from .errors import CorruptBatchError, LogError, OffsetOutOfRangeError
from .partition import PartitionLog
from .tail_cache import TailCacheBudget

__all__ = [
    "CorruptBatchError",
    "DescriptorPool",
    "LogConfig",
    "LogError",
    "OffsetOutOfRangeError",
    "PartitionLog",
    "RawRecord",
    "Record",
    "TailCacheBudget",
]

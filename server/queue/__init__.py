"""Queues on the log: a durable queue is a partition log of messages plus an ack log.

`DurableQueue.open(directory, QueueConfig(...))` opens (or creates and recovers) one queue; see
`durable.py` for its state, API and crash guarantees, `ack_log.py` for the ack log's records
and `ranges.py` for the acked-offset set.
"""

from .durable import DurableQueue, Message, QueueConfig
from .errors import QueueError

__all__ = ["DurableQueue", "Message", "QueueConfig", "QueueError"]

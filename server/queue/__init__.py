"""Everything about a work queue.

`LogQueue` (`log_queue.py`) is the engine behind every queue, durable or not: a partition log
of messages plus an ack log (`ack_log.py`, with `ranges.py` for the acked-offset set); see
its docstring for its state, API and crash guarantees. `PriorityQueue` (`priority.py`) is one
engine per priority level. `engine.py` states what an engine is (`QueueEngine`) and what it
hands out (`Message`). `WorkQueue` (`work_queue.py`) is the queue as the broker hosts it:
the engine, its limits, TTL, overflow and x-expires with time passed in, its consumers and
dispatch. `consumer.py` is the consumer interface a queue delivers through (the AMQP
channel implements it). `arguments.py` checks queue and consumer arguments as RabbitMQ does;
`policy.py` picks the policy that applies to a queue and the arguments it makes effective.
Nothing here imports the session, the core or the broker process.
"""

from .engine import Message, QueueEngine
from .errors import QueueError
from .log_queue import LogQueue, QueueConfig

__all__ = ["LogQueue", "Message", "QueueConfig", "QueueEngine", "QueueError"]

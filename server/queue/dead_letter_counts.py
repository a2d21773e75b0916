"""How many messages died in the broker's queues, by queue type, strategy and reason.

rabbitmq_prometheus's global counters (`rabbitmq_global_messages_dead_lettered_<reason>_total`,
labelled `queue_type` and `dead_letter_strategy`) are these numbers. They belong to the
process, not to a queue, so they never go down when a queue is deleted. A message counts
once, when it dies: with a dead-letter exchange (strategy "at_least_once": Warren settles a
dead letter only once its targets stored it, for every queue type), or dropped without one
("disabled"). A dead letter published again after a failed attempt is not counted again.
"""

from __future__ import annotations

AT_LEAST_ONCE = "at_least_once"
DISABLED = "disabled"


class DeadLetterCounts:
    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str, str], int] = {}
        """(queue type, strategy, reason) -> messages."""

    def add(self, queue_type: str, dead_lettering: bool, reason: str, messages: int) -> None:
        if messages:
            key = (queue_type, AT_LEAST_ONCE if dead_lettering else DISABLED, reason)
            self.counts[key] = self.counts.get(key, 0) + messages

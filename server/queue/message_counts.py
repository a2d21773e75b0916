"""How many messages went through a queue or a channel: counters that only ever grow.

The HTTP API derives RabbitMQ's ``message_stats`` (counts and their rates) from them, and
the metrics are these numbers as Prometheus counters, read at scrape time. They are plain
ints bumped where the broker already handles messages in batches (a tick's append, a
dispatch round, an ack frame), so counting costs no per-message object and no extra loop.
They start at zero when the queue is hosted or the channel opened, as RabbitMQ's do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class MessageCounts:
    __slots__ = (
        "published",
        "published_to",
        "delivered",
        "delivered_no_ack",
        "got",
        "got_no_ack",
        "got_empty",
        "settled",
        "acked",
        "redelivered",
        "confirmed",
        "returned_unroutable",
        "dropped_unroutable",
    )

    def __init__(self) -> None:
        self.published = 0
        """A queue's: messages it stored."""
        self.published_to: dict[str, int] = {}
        """A channel's: its publishes by exchange (at most one entry per exchange there is;
        RabbitMQ reports them so)."""
        self.delivered = 0
        """To consumers that acknowledge."""
        self.delivered_no_ack = 0
        self.got = 0
        """basic.get in manual acknowledgement mode."""
        self.got_no_ack = 0
        self.got_empty = 0
        self.settled = 0
        """A queue's: acknowledged, rejected without requeue, or handed out without ack (no-ack
        deliveries and gets settle as they go): `consumer_acks` separates the acks."""
        self.acked = 0
        """A channel's: acknowledged by its client."""
        self.redelivered = 0
        """Deliveries and gets of messages delivered before (the run at the head of each
        batch: a queue hands out its redeliveries before new messages; a priority queue's
        lower levels' redeliveries in the same batch are not counted)."""
        self.confirmed = 0
        self.returned_unroutable = 0
        self.dropped_unroutable = 0

    @property
    def publishes(self) -> int:
        """A channel's publishes to any exchange."""
        return sum(self.published_to.values())

    @property
    def consumer_acks(self) -> int:
        """A queue's messages acknowledged by clients: what it settled, less the no-ack
        deliveries and gets it settled when it handed them out."""
        return self.settled - self.delivered_no_ack - self.got_no_ack

    def handed_out(self, messages: Sequence[Any], no_ack: bool) -> None:
        """Count a batch delivered to one consumer."""
        if no_ack:
            self.delivered_no_ack += len(messages)
        else:
            self.delivered += len(messages)
        if messages[0].redelivered:
            self.redelivered += leading_redeliveries(messages)

    def got_one(self, message: Any, no_ack: bool) -> None:
        """Count a basic.get that found `message` (None: the queue was empty)."""
        if message is None:
            self.got_empty += 1
        elif no_ack:
            self.got_no_ack += 1
        else:
            self.got += 1
        if message is not None and message.redelivered:
            self.redelivered += 1


def leading_redeliveries(messages: Sequence[Any]) -> int:
    count = 0
    for message in messages:
        if not message.redelivered:
            break
        count += 1
    return count

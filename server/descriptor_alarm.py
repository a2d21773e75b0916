"""The file-descriptor alarm: new connections are refused while they would take the descriptors
the rest of the broker needs, as RabbitMQ's file descriptor limit alarm refuses them.

The process's descriptors (soft RLIMIT_NOFILE) are shared: the queue logs' pool takes its
capacity (`log_open_files_max`), `RESERVED` stay for the metadata store, the listeners, HTTP
clients and short-lived files, and the rest is for AMQP connections. At that many connections
the alarm is set (logged once, with RabbitMQ's banner) and a new connection is closed as soon
as it is accepted, before anything is read from it, so that an accept never fails for lack of
a descriptor (asyncio then stops accepting for a second, even the connections that would fit).
The alarm clears, again logged once, when a connection closes below the limit.
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger("warrenmq.server")

RESERVED = 100
# A soft limit of "unlimited" counts as this many (the pool's own assumption).
UNLIMITED = 1 << 20


class DescriptorAlarm:
    def __init__(self, log_files_max: int, limit: int | None = None) -> None:
        if limit is None:
            limit, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
            if limit == resource.RLIM_INFINITY:
                limit = UNLIMITED
        self.limit = limit
        self.connections_max = max(1, limit - log_files_max - RESERVED)
        self.raised = False

    def admit(self, connections: int) -> bool:
        """Whether one more connection fits beside `connections` open ones."""
        if connections < self.connections_max:
            return True
        if not self.raised:
            self.raised = True
            log.error(
                "file descriptor limit alarm set: %d connections use the descriptors left of "
                "%d (RLIMIT_NOFILE) beside the queue logs' and %d reserved. New connections "
                "will not be accepted until this alarm clears",
                connections,
                self.limit,
                RESERVED,
            )
        return False

    def released(self, connections: int) -> None:
        """A connection closed: clear the alarm once there is room again."""
        if self.raised and connections < self.connections_max:
            self.raised = False
            log.warning("file descriptor limit alarm cleared")

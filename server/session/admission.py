"""Vhost and user limits at connection.open and at channel.open, with RabbitMQ's texts
(rabbit_reader 3.10.8; the limits themselves are `warrenmq.server.metadata.limits`).

Connections and channels are counted by walking the broker's connections, and only when a
limit is set: limits are rare and an open is no hot path, so no counters to keep in step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

from warrenmq.server.metadata.limits import MAX_CHANNELS, MAX_CONNECTIONS, limit_reached


class Counted(Protocol):
    """What is counted of a connection: its user, vhost (None until open) and channels."""

    username: str
    closed: bool

    @property
    def vhost_name(self) -> str | None: ...

    @property
    def channel_count(self) -> int: ...


def connection_refusal(
    vhost_limits: Mapping[str, int] | None,
    user_limits: Mapping[str, int] | None,
    connections: Iterable[Counted],
    username: str,
    vhost: str,
) -> str | None:
    """Why connection.open of `username` on `vhost` is refused (530), or None."""
    if vhost_limits is not None and MAX_CONNECTIONS in vhost_limits:
        count = sum(1 for c in connections if not c.closed and c.vhost_name == vhost)
        limit = limit_reached(vhost_limits, MAX_CONNECTIONS, count)
        if limit is not None:
            return (
                f"access to vhost '{vhost}' refused for user '{username}': "
                f"connection limit ({limit}) is reached"
            )
    if user_limits is not None and MAX_CONNECTIONS in user_limits:
        count = sum(
            1
            for c in connections
            if not c.closed and c.vhost_name is not None and c.username == username
        )
        limit = limit_reached(user_limits, MAX_CONNECTIONS, count)
        if limit is not None:
            return (
                f"connection refused for user '{username}': "
                f"user connection limit ({limit}) is reached"
            )
    return None


def channel_refusal(
    user_limits: Mapping[str, int] | None, connections: Iterable[Counted], username: str
) -> str | None:
    """Why one more channel of `username` (on any of their connections) is refused, or None."""
    if user_limits is None or MAX_CHANNELS not in user_limits:
        return None
    count = sum(c.channel_count for c in connections if not c.closed and c.username == username)
    limit = limit_reached(user_limits, MAX_CHANNELS, count)
    if limit is None:
        return None
    return (
        f"number of channels opened for user '{username}' has reached the maximum allowed "
        f"user limit of ({limit})"
    )

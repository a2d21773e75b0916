"""What the HTTP adapter needs of the broker process, and of the AMQP sessions it lists.

``server/broker.py`` implements `Host` and starts the listeners; the adapter never imports
the broker or the session (the arrows of ARCHITECTURE.md): what a request does to queues and
exchanges goes through the core (``server/vhost.py``) and the metadata commands, and the
AMQP connections and channels are only read (and a connection closed) through the
attributes named here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, Protocol

from warrenmq.log.latency import LatencyHistogram
from warrenmq.server.alarms import ResourceMonitor
from warrenmq.server.cluster_node import ClusterNode
from warrenmq.server.config import BrokerConfig
from warrenmq.server.forward.forwarding import Forwarding
from warrenmq.server.metadata import ReplicatedMetadata
from warrenmq.server.queue.consumer import Consumer
from warrenmq.server.queue.dead_letter_counts import DeadLetterCounts
from warrenmq.server.queue.message_counts import MessageCounts
from warrenmq.server.queue.work_queue import WorkQueue
from warrenmq.server.redrive import Redrives
from warrenmq.server.vhost import VirtualHost


class ClientChannel(Protocol):
    """An AMQP channel, as listed by /api/channels and the metrics."""

    number: int
    connection: Any
    """The channel's `ClientConnection`."""
    consumers: Mapping[str, Consumer]
    unacked: Mapping[int, Any]
    counts: MessageCounts
    consumer_prefetch: int
    global_prefetch: int
    flow_active: bool
    confirmed_through: int
    tx_publishes: Collection[Any]
    tx_settles: Collection[Any]
    wire: Any
    """The channel's wire state: `confirm_mode`, `tx_mode`, `publish_seq`."""


class ClientConnection(Protocol):
    """An AMQP connection, as listed by /api/connections (and closed by DELETE)."""

    id: int
    peer: tuple[str, int]
    username: str
    vhost: VirtualHost | None
    channels: Mapping[int, ClientChannel]
    amqp: Any
    """The connection's wire state: `client_properties`, `mechanism`, `frame_bytes_max`,
    `channel_max`, `heartbeat_s`."""
    transport: asyncio.Transport | None
    writable: bool
    blocked: bool
    """Published during a resource alarm: not read until it clears."""
    received_bytes: int
    sent_bytes: int

    def close(self, reply_code: int, text: str) -> None: ...


class Host(Protocol):
    config: BrokerConfig
    confirm_latency: LatencyHistogram
    dead_letter_counts: DeadLetterCounts
    data_dir: Path
    store: ReplicatedMetadata | None
    vhosts: dict[str, VirtualHost]
    connections: Collection[ClientConnection]
    port: int
    """The AMQP listener's port."""
    tls_port: int
    """The AMQP-over-TLS listener's port (0: none)."""
    resources: ResourceMonitor
    """The memory and disk alarms."""
    redrives: Redrives
    node: ClusterNode
    """This broker as a node of the cluster."""
    forwarding: Forwarding
    """The links to the other nodes of the cluster."""

    def sync_vhosts(self) -> None:
        """Host the vhosts the store holds (and drop those it no longer holds)."""
        ...

    def apply_policies(self) -> None:
        """Have every queue take the policies as the metadata now holds them."""
        ...

    def want_dispatch(self, queue: WorkQueue) -> None:
        """Have the tick hand the queue's ready messages to its consumers."""
        ...

    def after_commit(self) -> asyncio.Future[None]:
        """Resolved once everything staged so far is written and fsynced."""
        ...

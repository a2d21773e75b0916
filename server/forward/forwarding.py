"""The broker's links: one dialled to each node leading queues this node's clients use, and
those other nodes dialled here; and the placement of a queue as local or remote."""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING, Any, Protocol

from . import wire
from .entry import EntryLink, RemoteQueue
from .link import log
from .owner import OwnerLink

if TYPE_CHECKING:
    from warrenmq.server.config import BrokerConfig
    from warrenmq.server.vhost import VirtualHost

# A PUBLISH holds a whole message plus its names and properties (bounded by a frame).
_LINK_OVERHEAD_BYTES = 1 << 20


class ForwardingHost(Protocol):
    config: BrokerConfig
    vhosts: dict[str, VirtualHost]
    node_id: int
    replicas: Any

    def queue_leader(self, vhost: str, name: str) -> int: ...

    def node_address(self, node_id: int) -> tuple[str, int]: ...

    def stage_confirm(self, channel: Any, tag: int, refused: bool = False) -> None: ...

    def want_dispatch(self, queue: Any) -> None: ...

    def metadata_index(self) -> int: ...

    def metadata_applied(self, index: int) -> asyncio.Future[Any]: ...


class Forwarding:
    def __init__(self, host: ForwardingHost) -> None:
        self.host = host
        self.links: dict[int, EntryLink] = {}
        self.inbound: list[OwnerLink] = []
        config = host.config
        self._frame_bytes_max = (
            config.message_bytes_max + config.frame_bytes_max + _LINK_OVERHEAD_BYTES
        )
        self._dials: set[asyncio.Future[Any]] = set()
        if not config.cluster_secret:
            log.debug("no cluster secret: links between nodes prove only an empty one")

    def link(self, node: int) -> EntryLink:
        """The link to `node`, dialled now if there is none or the last one was lost."""
        link = self.links.get(node)
        if link is None or link.closed:
            host = self.host
            link = self.links[node] = EntryLink(
                node,
                host.node_id,
                host.config.cluster_secret,
                self._frame_bytes_max,
                host.want_dispatch,
                host.metadata_index,
                host.replicas,
            )
            dial = asyncio.ensure_future(self._dial(link))
            self._dials.add(dial)
            dial.add_done_callback(self._dials.discard)
        return link

    async def _dial(self, link: EntryLink) -> None:
        host, port = self.host.node_address(link.node)
        try:
            await asyncio.get_running_loop().create_connection(lambda: link, host, port)
        except OSError as error:
            link.connection_lost(error)

    def place(self, vhost: VirtualHost, name: str) -> None:
        """Serve the queue `name` (its record exists) where its leader is: another node's is
        a RemoteQueue here, and this node's own stays (or becomes) a local queue."""
        leader = self.host.queue_leader(vhost.name, name)
        if leader == self.host.node_id:
            return
        record = vhost.store.state.queue(vhost.name, name)
        vhost.lead_elsewhere(
            RemoteQueue(
                vhost.name,
                record.name,
                leader,
                record.arguments,
                lambda: self.link(leader),
                self.host.want_dispatch,
            )
        )

    async def boot_of(self, node: int) -> int:
        """The boot `node` runs (`NodeStarted`); LinkError, OSError or NotFound when it
        cannot be reached."""
        link = self.link(node)
        (boot, _) = await link.request(wire.Kind.BOOT, link.next_id())
        return boot

    async def redrive(
        self, node: int, operation: str, vhost: str = "", queue: str = "", argument: str = ""
    ) -> Any:
        """A redrive task operation on `node` (`Redrives.operate`): its answer; LinkError,
        OSError or NotFound when the node cannot be reached."""
        link = self.link(node)
        fields = (operation, vhost, queue, argument)
        (answer,) = await link.request(wire.Kind.REDRIVE, link.next_id(), *fields)
        return json.loads(answer)

    async def view(self, node: int, name: str, argument: Any) -> Any:
        """`node`'s part of a cluster-wide HTTP API figure (`server/http/node_views.py`);
        LinkError, OSError or a ProtocolError when the node cannot be reached or failed."""
        link = self.link(node)
        fields = (name, json.dumps(argument))
        (answer,) = await link.request(wire.Kind.VIEW, link.next_id(), *fields)
        return json.loads(answer)

    def accept(self, transport: asyncio.Transport, data: bytes) -> None:
        """Serve a link another node dialled: the AMQP listener saw its first bytes."""
        host = self.host
        link = OwnerLink(host, host.node_id, host.config.cluster_secret, self._frame_bytes_max)
        self.inbound = [kept for kept in self.inbound if not kept.closed]
        self.inbound.append(link)
        transport.set_protocol(link)
        link.connection_made(transport)
        link.data_received(data)

    def close(self) -> None:
        for link in [*self.links.values(), *self.inbound]:
            link.abort()
        for dial in self._dials:
            dial.cancel()

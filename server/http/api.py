"""What a management API handler works with: the API's state, one call, and its replies.

A handler is ``async def handler(call: Call) -> web.StreamResponse``. The dispatcher
(``management.py``) has matched the route, checked the method, logged the caller in and
applied the route's `Access` rule before it runs; the handler finds the entity (404 when it
does not exist), checks the operation's resource permissions, and acts through the core.
"""

from __future__ import annotations

import enum
import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from aiohttp import web

from warrenmq.amqp import replies
from warrenmq.exchanges.errors import RoutingError
from warrenmq.server.metadata import MetadataState, ReplicatedMetadata
from warrenmq.server.metadata.records import node_name
from warrenmq.server.vhost import VirtualHost

from . import listing
from .auth import Caller
from .errors import JSON_TYPE, ApiError, not_authorised, not_found, object_not_found, refused
from .host import Host
from .rates import Rates
from .values import decode_body

# The RabbitMQ release whose management API (paths, fields, codes) this one follows; tools
# that gate features on `rabbitmq_version` read it.
RABBITMQ_VERSION = "3.10.8"
DEFAULT_EXCHANGE_ALIAS = "amq.default"


class Access(enum.Enum):
    """Who may call a route (rabbit_mgmt_util:is_authorized_*)."""

    ANY = "any management user"
    ADMIN = "administrator"
    MONITOR = "monitoring or administrator"
    VHOST = "administrator, or a user with permissions on the vhost in the path"
    POLICY = "policymaker or administrator, with permissions on the vhost in the path"


class _UserScope:
    """A key for one user's sampled totals."""


# The listeners' names (in `ports()` and the ready line) and RabbitMQ's protocol names for
# them (/api/overview's listeners).
MANAGEMENT = "management"
METRICS = "metrics"
MANAGEMENT_SSL = "management-ssl"
METRICS_SSL = "metrics-ssl"
PROTOCOLS = {
    MANAGEMENT: "http",
    METRICS: "http/prometheus",
    MANAGEMENT_SSL: "https",
    METRICS_SSL: "https/prometheus",
}


class ManagementApi:
    """The management API's state: the broker, rates, the node's identity."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.rates = Rates()
        self.started_at_s = time.monotonic()
        self.node = node_name(host.config.node_id)
        self.listeners: dict[str, int] = {}
        """The HTTP listeners that run (MANAGEMENT, METRICS and their _SSL twins) and
        their ports."""
        self._scopes: dict[str, object] = {}

    def scope_of(self, user: str) -> object:
        """What a user's own totals' rates are sampled under (one per user, as users are
        bounded by the metadata's limits)."""
        scope = self._scopes.get(user)
        if scope is None:
            scope = self._scopes[user] = _UserScope()
        return scope

    @property
    def store(self) -> ReplicatedMetadata:
        store = self.host.store
        assert store is not None, "the broker serves HTTP only once its metadata is open"
        return store

    @property
    def state(self) -> MetadataState:
        return self.store.state


class Call:
    """One request to a route: its path parameters, query, body and caller."""

    def __init__(
        self, api: ManagementApi, request: web.Request, params: Mapping[str, str], caller: Caller
    ) -> None:
        self.api = api
        self.request = request
        self.params = params
        self.caller = caller
        self.query = request.query

    @property
    def state(self) -> MetadataState:
        return self.api.state

    async def body(self) -> dict[str, Any]:
        return decode_body(await self.request.read())

    def name(self, key: str) -> str:
        """A path parameter naming an exchange: "amq.default" is the default exchange."""
        value = self.params[key]
        return "" if value == DEFAULT_EXCHANGE_ALIAS and key in EXCHANGE_PARAMS else value

    def vhost_name(self) -> str | None:
        return self.params.get("vhost")

    def vhost(self) -> VirtualHost:
        """The vhost the path names, hosted (404 when it does not exist)."""
        name = self.params["vhost"]
        if name not in self.state.vhosts:
            raise object_not_found()
        vhost = self.api.host.vhosts.get(name)
        if vhost is None:
            self.api.host.sync_vhosts()
            vhost = self.api.host.vhosts.get(name)
        if vhost is None:
            raise object_not_found()
        return vhost

    def vhosts(self) -> list[str]:
        """The vhosts a list shows: the one in the path (404 if missing), or every vhost the
        caller may see."""
        listed = self.caller.listed_vhosts(self.state)
        name = self.vhost_name()
        if name is None:
            return listed
        if name not in self.state.vhosts:
            raise object_not_found()
        return [name] if name in listed else []

    def check(self, access: str, kind: str, name: str) -> None:
        """The caller may do `access` on the resource (401 "Access refused." if not)."""
        vhost = self.params["vhost"]
        if not self.state.can_access(self.caller.name, vhost, access, kind, name):  # type: ignore[arg-type]
            raise not_authorised("Access refused.")

    def listing(
        self, items: list[dict[str, Any]], defaults: Sequence[str], *, pageable: bool = False
    ) -> web.Response:
        return reply(listing.listing(items, defaults, self.query, pageable=pageable))

    def listing_built_per_page(
        self,
        entries: Sequence[Any],
        keys: Callable[[Any], dict[str, Any]],
        build: Callable[[Any], dict[str, Any]],
        defaults: Sequence[str],
    ) -> web.Response:
        """A pageable list whose items are built only for the page asked, when its order
        allows (`listing.listing_built_per_page`)."""
        return reply(listing.listing_built_per_page(entries, keys, build, defaults, self.query))

    def one(self, item: dict[str, Any]) -> web.Response:
        """A single entity, cut to `columns=` when asked."""
        wanted = listing.columns(self.query)
        return reply(item if wanted is None else listing.keep_columns(item, wanted))


EXCHANGE_PARAMS = frozenset(("exchange", "source", "destination"))


def reply(data: Any, status: int = 200) -> web.Response:
    return web.Response(
        status=status,
        body=json.dumps(data, separators=(",", ":")).encode(),
        content_type=JSON_TYPE,
        headers={"Cache-Control": "no-cache"},
    )


def created() -> web.Response:
    return web.Response(status=201)


def no_content() -> web.Response:
    return web.Response(status=204)


async def core(operation: Any) -> Any:
    """Await a core operation, its AMQP refusal turned into the HTTP API's."""
    try:
        return await operation
    except (RoutingError, replies.ProtocolError) as error:
        raise refused(error) from None


def sync(operation: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a synchronous core operation, its AMQP refusal turned into the HTTP API's."""
    try:
        return operation(*args, **kwargs)
    except (RoutingError, replies.ProtocolError) as error:
        raise refused(error) from None


def vhost_missing() -> ApiError:
    """What a write to a vhost that does not exist is answered with."""
    return not_found("vhost_not_found")

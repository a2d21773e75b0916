"""The management API's routes and its request cycle, in the order cowboy_rest runs them:

1. the path is matched on its percent-decoded segments (so ``%2F`` is the vhost "/"):
   no route, 404 ``{"error": "Object Not Found", "reason": "Not Found"}``;
2. a method the route lacks: 405 with ``Allow``;
3. basic auth, then the route's `Access` rule: 401;
4. the handler: the entity (404), the operation's permissions (401), the core call.

The topic API (``topics``) has its seed's paths, ``/topics/...`` and ``/consumer/...``, and
takes its vhost from ``?vhost=`` (default "/"); it runs the same cycle.

Paths outside those are the web console's files (`console.ConsoleFiles`), public as
RabbitMQ's UI is: the page logs in through the API.

No request ends in a traceback: a refusal is RabbitMQ's status and JSON body, a body larger
than ``http_body_bytes_max`` is 413, and a failure of the broker itself is logged and
answered 500 with a JSON body.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from warrenmq.amqp import replies
from warrenmq.exchanges.errors import RoutingError
from warrenmq.server.metadata import MetadataUnavailable

from . import (
    bindings,
    cluster,
    connections,
    definitions,
    dlq,
    exchanges,
    limits,
    overview,
    policies,
    queues,
    replicas,
    streams,
    topic_batches,
    topics,
    users,
    vhosts,
)
from .api import Access, Call, ManagementApi
from .auth import Caller, log_in
from .console import ConsoleFiles
from .errors import ApiError, not_authorised, object_not_found, refused, unavailable

log = logging.getLogger("warrenmq.server.http")

Handler = Callable[[Call], Awaitable[web.StreamResponse]]
METHOD_ORDER = ("HEAD", "GET", "PUT", "POST", "DELETE", "OPTIONS")
# A binding's destination type in its path: "q" (queue) or "e" (exchange).
DESTINATION_TYPE_PARAM = "dtype"
# The first path segments of the API's routes; any other path is the console's.
API_ROOTS = frozenset(("api", "topics", "consumer"))
DEFAULT_VHOST = "/"


@dataclass(frozen=True, slots=True)
class Route:
    pattern: tuple[str, ...]
    methods: dict[str, Handler]
    access: Access
    vhost_in_query: bool = False
    """The vhost is `?vhost=` (default "/"), not a path segment (the topic API)."""

    def match(self, segments: list[str]) -> dict[str, str] | None:
        if len(segments) != len(self.pattern):
            return None
        params = {}
        for expected, segment in zip(self.pattern, segments, strict=True):
            if expected.startswith("{"):
                if not segment:
                    return None
                params[expected[1:-1]] = segment
            elif expected != segment:
                return None
        if params.get(DESTINATION_TYPE_PARAM, "q") not in bindings.DESTINATION_TYPES:
            return None
        return params

    @property
    def allowed(self) -> str:
        methods = set(self.methods) | {"OPTIONS"} | ({"HEAD"} if "GET" in self.methods else set())
        return ", ".join(method for method in METHOD_ORDER if method in methods)


def route(path: str, access: Access, *, vhost_in_query: bool = False, **methods: Handler) -> Route:
    return Route(tuple(path.strip("/").split("/")), methods, access, vhost_in_query)


ANY, ADMIN, MONITOR, VHOST = Access.ANY, Access.ADMIN, Access.MONITOR, Access.VHOST
ROUTES: tuple[Route, ...] = (
    route("/api/overview", ANY, GET=overview.overview),
    route("/api/whoami", ANY, GET=users.whoami),
    route("/api/nodes", MONITOR, GET=cluster.nodes),
    route("/api/nodes/{node}", MONITOR, GET=cluster.node),
    route("/api/cluster-name", ANY, GET=cluster.get_cluster_name),
    route(
        "/api/cluster/members/{node_id}",
        ADMIN,
        PUT=cluster.add_member,
        DELETE=cluster.remove_member,
    ),
    route("/api/definitions", ADMIN, GET=definitions.export_all, POST=definitions.import_all),
    route(
        "/api/all-configuration",
        ADMIN,
        GET=definitions.export_all,
        POST=definitions.import_all,
    ),
    route(
        "/api/definitions/{vhost}",
        ADMIN,
        GET=definitions.export_vhost,
        POST=definitions.import_vhost,
    ),
    route("/api/connections", ANY, GET=connections.list_connections),
    route(
        "/api/connections/{connection}",
        ANY,
        GET=connections.get_connection,
        DELETE=connections.close_connection,
    ),
    route(
        "/api/connections/{connection}/channels",
        ANY,
        GET=connections.list_connection_channels,
    ),
    route("/api/channels", ANY, GET=connections.list_channels),
    route("/api/channels/{channel}", ANY, GET=connections.get_channel),
    route("/api/consumers", ANY, GET=connections.list_consumers),
    route("/api/consumers/{vhost}", VHOST, GET=connections.list_consumers),
    route("/api/exchanges", VHOST, GET=exchanges.list_exchanges),
    route("/api/exchanges/{vhost}", VHOST, GET=exchanges.list_exchanges),
    route(
        "/api/exchanges/{vhost}/{exchange}",
        VHOST,
        GET=exchanges.get_exchange,
        PUT=exchanges.put_exchange,
        DELETE=exchanges.delete_exchange,
    ),
    route("/api/exchanges/{vhost}/{exchange}/publish", VHOST, POST=exchanges.publish),
    route(
        "/api/exchanges/{vhost}/{exchange}/bindings/source",
        VHOST,
        GET=bindings.list_of_exchange_source,
    ),
    route(
        "/api/exchanges/{vhost}/{exchange}/bindings/destination",
        VHOST,
        GET=bindings.list_of_exchange_destination,
    ),
    route("/api/queues", VHOST, GET=queues.list_queues),
    route("/api/queue-replicas/grow", ADMIN, POST=replicas.grow),
    route("/api/queue-replicas/shrink", ADMIN, POST=replicas.shrink),
    route("/api/queue-replicas/rebalance", ADMIN, POST=replicas.rebalance),
    route("/api/queues/{vhost}", VHOST, GET=queues.list_queues),
    route(
        "/api/queues/{vhost}/{queue}",
        VHOST,
        GET=queues.get_queue,
        PUT=queues.put_queue,
        DELETE=queues.delete_queue,
    ),
    route("/api/queues/{vhost}/{destination}/bindings", VHOST, GET=bindings.list_of_queue),
    route("/api/queues/{vhost}/{queue}/contents", VHOST, DELETE=queues.purge_queue),
    route("/api/queues/{vhost}/{queue}/get", VHOST, POST=queues.get_messages),
    route("/api/bindings", VHOST, GET=bindings.list_all),
    route("/api/bindings/{vhost}", VHOST, GET=bindings.list_all),
    route(
        "/api/bindings/{vhost}/e/{source}/{dtype}/{destination}",
        VHOST,
        GET=bindings.list_between,
        POST=bindings.create,
    ),
    route(
        "/api/bindings/{vhost}/e/{source}/{dtype}/{destination}/{props}",
        VHOST,
        GET=bindings.get,
        DELETE=bindings.delete,
    ),
    route("/api/vhosts", ANY, GET=vhosts.list_vhosts),
    route(
        "/api/vhosts/{vhost}",
        ADMIN,
        GET=vhosts.get_vhost,
        PUT=vhosts.put_vhost,
        DELETE=vhosts.delete_vhost,
    ),
    route("/api/vhosts/{vhost}/permissions", ADMIN, GET=users.list_vhost_permissions),
    route("/api/vhosts/{vhost}/connections", VHOST, GET=connections.list_connections),
    route("/api/vhosts/{vhost}/channels", VHOST, GET=connections.list_channels),
    route("/api/users/without-permissions", ADMIN, GET=users.list_users_without_permissions),
    route("/api/users", ADMIN, GET=users.list_users),
    route(
        "/api/users/{user}",
        ADMIN,
        GET=users.get_user,
        PUT=users.put_user,
        DELETE=users.delete_user,
    ),
    route("/api/users/{user}/permissions", ADMIN, GET=users.list_user_permissions),
    route("/api/permissions", ADMIN, GET=users.list_permissions),
    route(
        "/api/permissions/{vhost}/{user}",
        ADMIN,
        GET=users.get_permission,
        PUT=users.put_permission,
        DELETE=users.delete_permission,
    ),
    # Lists of vhost limits are any vhost user's (filtered); setting one is an administrator's.
    route("/api/vhost-limits", VHOST, GET=limits.list_vhost_limits),
    route("/api/vhost-limits/{vhost}", VHOST, GET=limits.list_vhost_limits),
    route(
        "/api/vhost-limits/{vhost}/{name}",
        ADMIN,
        PUT=limits.put_vhost_limit,
        DELETE=limits.delete_vhost_limit,
    ),
    route("/api/user-limits", ADMIN, GET=limits.list_user_limits),
    route("/api/user-limits/{user}", ADMIN, GET=limits.list_user_limits),
    route(
        "/api/user-limits/{user}/{name}",
        ADMIN,
        PUT=limits.put_user_limit,
        DELETE=limits.delete_user_limit,
    ),
    # Lists are any vhost user's (filtered); one policy is a policymaker's (rabbit_mgmt_wm_*).
    route("/api/policies", VHOST, GET=policies.list_policies),
    route("/api/policies/{vhost}", VHOST, GET=policies.list_policies),
    route(
        "/api/policies/{vhost}/{name}",
        Access.POLICY,
        GET=policies.get_policy,
        PUT=policies.put_policy,
        DELETE=policies.delete_policy,
    ),
    # Before /api/dlq/{vhost}: a vhost named "redrives" has its queues in GET /api/dlq only.
    route("/api/dlq/redrives", VHOST, GET=dlq.list_redrives),
    route("/api/dlq/redrives/{id}", VHOST, GET=dlq.get_redrive, DELETE=dlq.cancel_redrive),
    route("/api/dlq/redrives/{id}/resume", VHOST, POST=dlq.resume_redrive),
    route("/api/dlq", VHOST, GET=dlq.list_dead_letter_queues),
    route("/api/dlq/{vhost}", VHOST, GET=dlq.list_dead_letter_queues),
    route("/api/dlq/{vhost}/{queue}/redrive", VHOST, POST=dlq.start_redrive),
    route("/api/dlq/{vhost}/{queue}/messages", VHOST, GET=dlq.browse),
    route("/api/dlq/{vhost}/{queue}/export", VHOST, GET=dlq.export),
    route("/api/dlq/{vhost}/{queue}/import", VHOST, POST=dlq.import_lines),
    route("/api/streams", ANY, GET=streams.list_streams),
    route("/api/streams/{vhost}", VHOST, GET=streams.list_streams),
    route("/api/streams/{vhost}/{name}", VHOST, GET=streams.get_stream),
    route("/api/groups", ANY, GET=streams.list_groups),
    route("/api/groups/{vhost}", VHOST, GET=streams.list_groups),
    route("/api/super-streams", ANY, GET=streams.list_super_streams),
    route("/api/super-streams/{vhost}", VHOST, GET=streams.list_super_streams),
    route(
        "/api/super-streams/{vhost}/{name}",
        VHOST,
        PUT=streams.put_super_stream,
        DELETE=streams.delete_super_stream,
    ),
    route(
        "/topics/{topic}/messages",
        VHOST,
        vhost_in_query=True,
        GET=topics.get_messages,
        POST=topics.post_messages,
    ),
    route(
        "/topics/{topic}/partitions", VHOST, vhost_in_query=True, GET=topic_batches.get_partitions
    ),
    route("/topics/{topic}/batches", VHOST, vhost_in_query=True, GET=topic_batches.get_batches),
    route("/consumer/commit", VHOST, vhost_in_query=True, POST=topics.commit),
    route("/consumer/offsets", VHOST, vhost_in_query=True, GET=topics.offsets),
    route("/api/aliveness-test/{vhost}", VHOST, GET=overview.aliveness),
    route("/api/health/checks/alarms", ANY, GET=overview.alarms),
    route("/api/health/checks/local-alarms", ANY, GET=overview.local_alarms),
    route("/api/health/checks/virtual-hosts", ANY, GET=overview.no_alarms),
    route("/api/health/checks/port-listener/{port}", ANY, GET=overview.port_listener),
)

_ACCESS_REFUSALS = {
    Access.ADMIN: "Not administrator user",
    Access.MONITOR: "Not monitor user",
    Access.VHOST: "User not authorised to access virtual host",
    Access.POLICY: "User not authorised to access virtual host",
}


# The roots whose requests answer from the metadata: in a cluster they first wait until this
# node's state holds every change acknowledged through any node (`read_barrier`), so a GET
# never answers older than a change already answered elsewhere, nor a PUT or DELETE decide
# from such a state that there is nothing to do (an object "already there" or "not found");
# one that no quorum confirms in time (this node cut off) is answered 503, to be asked
# again. Not the health checks, overview or metrics: they must answer from this node even
# while it is cut off.
_METADATA_READ_ROOTS = frozenset(
    (
        "all-configuration",
        "bindings",
        "definitions",
        "exchanges",
        "permissions",
        "policies",
        "queues",
        "streams",
        "super-streams",
        "user-limits",
        "users",
        "vhost-limits",
        "vhosts",
    )
)


def segments(request: web.Request) -> list[str]:
    """The path's segments, each percent-decoded (400 when one is not UTF-8)."""
    try:
        return [
            urllib.parse.unquote(part, errors="strict")
            for part in request.rel_url.raw_path.split("/")[1:]
        ]
    except UnicodeDecodeError:
        raise ApiError(400, "bad_request", "path is not UTF-8") from None


def find(parts: list[str]) -> tuple[Route, dict[str, str]]:
    for candidate in ROUTES:
        params = candidate.match(parts)
        if params is not None:
            return candidate, params
    raise object_not_found()


def authorise(route_: Route, caller: Caller, params: dict[str, str], api: ManagementApi) -> None:
    access = route_.access
    if access is Access.ANY:
        return
    if access is Access.ADMIN:
        allowed = caller.is_admin
    elif access is Access.MONITOR:
        allowed = caller.is_monitor
    elif access is Access.POLICY and not caller.is_policymaker:
        allowed = False
    else:
        vhost = params.get("vhost")
        state = api.state
        # A vhost that does not exist passes here; the handler answers 404 for it.
        allowed = vhost is None or vhost not in state.vhosts or caller.may_use(state, vhost)
    if not allowed:
        log.warning("HTTP access denied: user '%s' - %s", caller.name, _ACCESS_REFUSALS[access])
        raise not_authorised(_ACCESS_REFUSALS[access])


def application(api: ManagementApi, body_bytes_max: int) -> web.Application:
    console = ConsoleFiles.load()

    async def dispatch(request: web.Request) -> web.StreamResponse:
        try:
            parts = segments(request)
            if parts[0] not in API_ROOTS:
                return console.respond(request.method, parts)
            return await _dispatch(api, request, parts)
        except ApiError as error:
            return error.response()
        except (RoutingError, replies.ProtocolError) as error:
            return refused(error).response()
        except web.HTTPRequestEntityTooLarge as error:
            return ApiError(413, "payload_too_large", error.text or "").response()
        except web.HTTPException as error:
            return ApiError(error.status, error.reason, error.text or "").response()
        except Exception as error:
            log.exception("HTTP %s %s failed", request.method, request.rel_url.raw_path)
            return ApiError(500, "internal_error", f"{type(error).__name__}").response()

    app = web.Application(client_max_size=body_bytes_max)
    app.router.add_route("*", "/{path:.*}", dispatch)
    return app


async def _sync_external_changes(api: ManagementApi) -> None:
    """Pick up users, permissions and vhosts another process changed (`warren users ...`),
    as an AMQP login does."""
    try:
        await api.store.sync_external_changes()
    except Exception as error:
        log.error("reading metadata changes made by other processes failed: %r", error)
    api.host.sync_vhosts()


async def _dispatch(
    api: ManagementApi, request: web.Request, parts: list[str]
) -> web.StreamResponse:
    route_, params = find(parts)
    if route_.vhost_in_query:
        params = {**params, "vhost": request.query.get("vhost", DEFAULT_VHOST)}
    method = "GET" if request.method == "HEAD" else request.method
    if method == "OPTIONS":
        return web.Response(status=200, headers={"Allow": route_.allowed})
    handler = route_.methods.get(method)
    if handler is None:
        return web.Response(status=405, headers={"Allow": route_.allowed})
    host = api.host
    await _sync_external_changes(api)
    store = api.store
    if store.clustered and parts[0] == "api":
        if parts[1] in _METADATA_READ_ROOTS:
            try:
                await store.read_barrier()
            except MetadataUnavailable as error:
                raise unavailable(str(error)) from None
    caller = await log_in(
        api.store,
        request.headers.get("Authorization"),
        request.remote or "",
        host.config.loopback_users,
    )
    authorise(route_, caller, params, api)
    return await handler(Call(api, request, params, caller))

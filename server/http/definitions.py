"""/api/definitions: the topology as RabbitMQ's definitions JSON, exported and imported.

Export holds users (with their password hashes), vhosts, permissions, durable and transient
queues but not exclusive ones, exchanges but not the default and "amq." ones, and the
bindings between what is exported. Import applies users, vhosts, permissions, exchanges,
queues and bindings in RabbitMQ's order, through the metadata commands and the core; what
exists already is left as it is (RabbitMQ does not redeclare it either), and the import is
not atomic: what came before a refused item stays. Users keep the hashes RabbitMQ made, so
their passwords keep working.

Policies are not in Warren yet: an export lists none, an import ignores them (and logs how
many). Topic permissions, parameters and global parameters are likewise ignored.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aiohttp import web

import warrenmq
from warrenmq.exchanges.binding import EXCHANGE, QUEUE, Destination
from warrenmq.server.metadata import DeclareVhost, SetPermissions, SetPolicy

from .api import RABBITMQ_VERSION, Call, ManagementApi, core, no_content, reply
from .bindings import vhost_bindings
from .errors import bad_request, not_found
from .exchanges import vhost_exchanges
from .policies import policy_json
from .queues import vhost_queues
from .users import password_hash_of, put_user_record, tags_of, user_json
from .values import decode_body, parse_bool, to_amqp_table

log = logging.getLogger("warrenmq.server.http")

IGNORED_SECTIONS = ("topic_permissions", "parameters", "global_parameters")
QUEUE_FIELDS = ("name", "vhost", "durable", "auto_delete", "arguments")
EXCHANGE_FIELDS = ("name", "vhost", "type", "durable", "auto_delete", "internal", "arguments")
BINDING_FIELDS = ("source", "vhost", "destination", "destination_type", "routing_key", "arguments")


def _only(item: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    return {field: item[field] for field in fields if field in item}


def _topology(api: ManagementApi, vhosts: list[str]) -> dict[str, list[dict[str, Any]]]:
    queues = [q for v in vhosts for q in vhost_queues(api, v) if not q["exclusive"]]
    exported_queues = {(q["vhost"], q["name"]) for q in queues}
    exchanges = [
        x
        for v in vhosts
        for x in vhost_exchanges(api, v)
        if x["name"] and not x["name"].startswith("amq.")
    ]
    bindings = [
        b
        for v in vhosts
        for b in vhost_bindings(api.state, v)
        if b["source"]
        and (
            (b["destination_type"] == QUEUE and (b["vhost"], b["destination"]) in exported_queues)
            or (b["destination_type"] == EXCHANGE and b["destination"])
        )
    ]
    return {
        "queues": [_only(q, QUEUE_FIELDS) for q in queues],
        "exchanges": [_only(x, EXCHANGE_FIELDS) for x in exchanges],
        "bindings": [_only(b, BINDING_FIELDS) for b in bindings],
    }


def _download(call: Call, response: web.Response) -> web.Response:
    filename = call.query.get("download")
    if filename:
        safe = filename.replace("\r", "").replace("\n", "").replace('"', "")
        response.headers["Content-Disposition"] = f"attachment; filename={safe}"
    return response


async def export_all(call: Call) -> web.Response:
    state = call.state
    document: dict[str, Any] = {
        "rabbit_version": RABBITMQ_VERSION,
        "rabbitmq_version": RABBITMQ_VERSION,
        "product_name": "Warren",
        "product_version": warrenmq.__version__,
        "users": [user_json(user) for user in state.users.values()],
        "vhosts": [
            {"name": v.name, "description": v.description, "tags": list(v.tags)}
            for v in state.vhosts.values()
        ],
        "permissions": [
            {
                "user": p.user,
                "vhost": p.vhost,
                "configure": p.configure,
                "write": p.write,
                "read": p.read,
            }
            for p in state.permissions.values()
        ],
        "topic_permissions": [],
        "parameters": [],
        "global_parameters": [],
        "policies": [policy_json(p) for v in state.vhosts for p in state.policies(v).values()],
    }
    document.update(_topology(call.api, list(state.vhosts)))
    return _download(call, reply(document))


async def export_vhost(call: Call) -> web.Response:
    vhost = call.params["vhost"]
    if vhost not in call.state.vhosts:
        raise bad_request("vhost_not_found")
    topology = _topology(call.api, [vhost])
    document: dict[str, Any] = {
        "rabbit_version": RABBITMQ_VERSION,
        "parameters": [],
        "policies": [
            {k: v for k, v in policy_json(p).items() if k != "vhost"}
            for p in call.state.policies(vhost).values()
        ],
    }
    for section, items in topology.items():
        document[section] = [{k: v for k, v in item.items() if k != "vhost"} for item in items]
    return _download(call, reply(document))


def _parse(body: bytes) -> dict[str, Any]:
    try:
        return decode_body(body)
    except Exception:
        raise bad_request("failed_to_parse_json") from None


def _section(document: dict[str, Any], name: str) -> list[dict[str, Any]]:
    items = document.get(name) or []
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise bad_request(f"{name} must be a list of objects")
    return items


def _field(item: dict[str, Any], key: str, kind: type, default: Any = None) -> Any:
    value = item.get(key, default)
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise bad_request(f"{key} of {item!r} must be a {kind.__name__}")
    return value


def _note_ignored(document: dict[str, Any]) -> None:
    for section in IGNORED_SECTIONS:
        items = document.get(section)
        if items:
            log.warning(
                "definitions import: %d %s ignored (not supported by Warren yet)",
                len(items) if isinstance(items, list) else 1,
                section.replace("_", " "),
            )


async def _import_users(call: Call, users: list[dict[str, Any]]) -> None:
    for user in users:
        name = _field(user, "name", str)
        tags = tags_of(user.get("tags", []))
        fields = {
            k: user[k] for k in ("password", "password_hash", "hashing_algorithm") if k in user
        }
        await put_user_record(call, name, tags, await password_hash_of(fields))


async def _import_topology(
    call: Call, document: dict[str, Any], vhost_of: Callable[[dict[str, Any]], str]
) -> None:
    for item in _section(document, "exchanges"):
        name = _field(item, "name", str)
        vhost = _hosted(call, vhost_of(item))
        if not name or name.startswith("amq.") or call.state.router(vhost.name).get(name):
            continue
        await core(
            vhost.declare_exchange(
                name,
                _field(item, "type", str),
                durable=parse_bool(item.get("durable"), True),
                auto_delete=parse_bool(item.get("auto_delete"), False),
                internal=parse_bool(item.get("internal"), False),
                arguments=to_amqp_table(item.get("arguments")),
                user=None,  # an administrator's import
            )
        )
    for item in _section(document, "queues"):
        name = _field(item, "name", str)
        vhost = _hosted(call, vhost_of(item))
        if name.startswith("amq.") or call.state.queue(vhost.name, name) is not None:
            continue
        await core(
            vhost.declare_queue(
                name,
                durable=parse_bool(item.get("durable"), True),
                exclusive=False,
                auto_delete=parse_bool(item.get("auto_delete"), False),
                arguments=to_amqp_table(item.get("arguments")),
                owner=None,  # type: ignore[arg-type]
                server_named=False,
                user=None,  # an administrator's import, as rabbit_definitions declares
            )
        )
    for item in _section(document, "bindings"):
        vhost = _hosted(call, vhost_of(item))
        kind = _field(item, "destination_type", str, QUEUE)
        if kind not in (QUEUE, EXCHANGE):
            raise bad_request(f"destination_type must be queue or exchange, got {kind!r}")
        destination = Destination(kind, _field(item, "destination", str))
        await core(
            vhost.bind(
                _field(item, "source", str),
                destination,
                _field(item, "routing_key", str, ""),
                to_amqp_table(item.get("arguments")),
            )
        )


def _hosted(call: Call, name: str):
    if name not in call.state.vhosts:
        raise bad_request(f"no vhost '{name}'")
    vhost = call.api.host.vhosts.get(name)
    if vhost is None:
        call.api.host.sync_vhosts()
        vhost = call.api.host.vhosts[name]
    return vhost


async def import_all(call: Call) -> web.Response:
    document = _parse(await call.request.read())
    _note_ignored(document)
    await _import_users(call, _section(document, "users"))
    store = call.api.store
    for item in _section(document, "vhosts"):
        name = _field(item, "name", str)
        if name in call.state.vhosts:
            continue
        metadata = item.get("metadata") if isinstance(item.get("metadata"), dict) else {}
        description = item.get("description", metadata.get("description", ""))
        tags = item.get("tags", metadata.get("tags", []))
        if not isinstance(description, str):
            raise bad_request(f"description of vhost '{name}' must be a string")
        await core(store.apply(DeclareVhost(name, description, tags_of(tags))))
    call.api.host.sync_vhosts()
    grants = [
        SetPermissions(
            _field(item, "user", str),
            _field(item, "vhost", str),
            _field(item, "configure", str),
            _field(item, "write", str),
            _field(item, "read", str),
        )
        for item in _section(document, "permissions")
    ]
    await core(store.apply_all(grants))
    await _import_topology(call, document, lambda item: _field(item, "vhost", str))
    await _import_policies(call, document, lambda item: _field(item, "vhost", str))
    return no_content()


async def import_vhost(call: Call) -> web.Response:
    vhost = call.params["vhost"]
    if vhost not in call.state.vhosts:
        raise not_found("vhost_not_found")
    document = _parse(await call.request.read())
    _note_ignored(document)
    await _import_topology(call, document, lambda item: vhost)
    await _import_policies(call, document, lambda item: vhost)
    return no_content()


async def _import_policies(
    call: Call, document: dict[str, Any], vhost_of: Callable[[dict[str, Any]], str]
) -> None:
    commands = [
        SetPolicy(
            _hosted(call, vhost_of(item)).name,
            _field(item, "name", str),
            item.get("pattern"),
            item.get("definition"),
            item.get("priority", 0),
            item.get("apply-to", "all"),
        )
        for item in _section(document, "policies")
    ]
    if commands:
        await core(call.api.store.apply_all(commands))
        call.api.host.apply_policies()

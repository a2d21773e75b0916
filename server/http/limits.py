"""/api/vhost-limits and /api/user-limits: list, set (PUT) and clear (DELETE) one limit, as
RabbitMQ's management API does (rabbit_mgmt_wm_limits, _limit, _user_limits, _user_limit).

A list holds one item per vhost (user) with limits, `{"vhost": V, "value": {...}}` (`"user"`
for users); PUT /api/vhost-limits/{vhost}/{name} takes `{"value": N}` and sets that one limit,
DELETE clears it, both 204. The metadata commands replace all of a vhost's (user's) limits
at once, so one limit is set by replacing them with the others plus it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from warrenmq.server.metadata import SetUserLimits, SetVhostLimits

from .api import Call, core, no_content
from .errors import bad_request, object_not_found

VHOST_SORT = ("vhost",)
USER_SORT = ("user",)


async def list_vhost_limits(call: Call) -> web.Response:
    limits = call.state.vhost_limits
    items = [
        {"vhost": vhost, "value": dict(limits[vhost])} for vhost in call.vhosts() if vhost in limits
    ]
    return call.listing(items, VHOST_SORT)


async def list_user_limits(call: Call) -> web.Response:
    limits = call.state.user_limits
    wanted = call.params.get("user")
    if wanted is not None and wanted not in call.state.users:
        raise object_not_found()
    users = [wanted] if wanted is not None else sorted(limits)
    items = [{"user": user, "value": dict(limits[user])} for user in users if user in limits]
    return call.listing(items, USER_SORT)


async def put_vhost_limit(call: Call) -> web.Response:
    return await _put(call, "vhost", call.state.vhosts, call.state.vhost_limits, SetVhostLimits)


async def delete_vhost_limit(call: Call) -> web.Response:
    return await _delete(call, "vhost", call.state.vhosts, call.state.vhost_limits, SetVhostLimits)


async def put_user_limit(call: Call) -> web.Response:
    return await _put(call, "user", call.state.users, call.state.user_limits, SetUserLimits)


async def delete_user_limit(call: Call) -> web.Response:
    return await _delete(call, "user", call.state.users, call.state.user_limits, SetUserLimits)


async def _put(
    call: Call, scope: str, owners: Mapping[str, Any], table: Mapping[str, Any], command: Any
) -> web.Response:
    owner, name = call.params[scope], call.params["name"]
    if owner not in owners:
        raise object_not_found()
    body = await call.body()
    if "value" not in body:
        raise bad_request("[{key_missing,value}]")
    current = table.get(owner, {})
    await core(call.api.store.apply(command(owner, {**current, name: body["value"]})))
    return no_content()


async def _delete(
    call: Call, scope: str, owners: Mapping[str, Any], table: Mapping[str, Any], command: Any
) -> web.Response:
    owner, name = call.params[scope], call.params["name"]
    current = table.get(owner, {})
    if owner not in owners or name not in current:
        raise object_not_found()
    remaining = {key: value for key, value in current.items() if key != name}
    await core(call.api.store.apply(command(owner, remaining)))
    return no_content()

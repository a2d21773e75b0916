"""/api/vhost-limits and /api/user-limits: list, set (PUT) and clear (DELETE) one limit, as
RabbitMQ's management API does (rabbit_mgmt_wm_limits, _limit, _user_limits, _user_limit).

A list holds one item per vhost (user) with limits, `{"vhost": V, "value": {...}}` (`"user"`
for users); PUT /api/vhost-limits/{vhost}/{name} takes `{"value": N}` and sets that one limit,
DELETE clears it, both 204. The metadata commands replace all of a vhost's (user's) limits
at once, so one limit is set by replacing them with the others plus it."""

from __future__ import annotations

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


async def put_vhost_limit(call: Call) -> web.Response:
    vhost, name = call.params["vhost"], call.params["name"]
    if vhost not in call.state.vhosts:
        raise object_not_found()
    value = await _value(call)
    current = call.state.vhost_limits.get(vhost, {})
    await core(call.api.store.apply(SetVhostLimits(vhost, {**current, name: value})))
    return no_content()


async def delete_vhost_limit(call: Call) -> web.Response:
    vhost, name = call.params["vhost"], call.params["name"]
    current = call.state.vhost_limits.get(vhost, {})
    if vhost not in call.state.vhosts or name not in current:
        raise object_not_found()
    remaining = {key: value for key, value in current.items() if key != name}
    await core(call.api.store.apply(SetVhostLimits(vhost, remaining)))
    return no_content()


async def list_user_limits(call: Call) -> web.Response:
    limits = call.state.user_limits
    wanted = call.params.get("user")
    if wanted is not None and wanted not in call.state.users:
        raise object_not_found()
    users = [wanted] if wanted is not None else sorted(limits)
    items = [{"user": user, "value": dict(limits[user])} for user in users if user in limits]
    return call.listing(items, USER_SORT)


async def put_user_limit(call: Call) -> web.Response:
    user, name = call.params["user"], call.params["name"]
    if user not in call.state.users:
        raise object_not_found()
    value = await _value(call)
    current = call.state.user_limits.get(user, {})
    await core(call.api.store.apply(SetUserLimits(user, {**current, name: value})))
    return no_content()


async def delete_user_limit(call: Call) -> web.Response:
    user, name = call.params["user"], call.params["name"]
    current = call.state.user_limits.get(user, {})
    if user not in call.state.users or name not in current:
        raise object_not_found()
    remaining = {key: value for key, value in current.items() if key != name}
    await core(call.api.store.apply(SetUserLimits(user, remaining)))
    return no_content()


async def _value(call: Call) -> Any:
    body = await call.body()
    if "value" not in body:
        raise bad_request("[{key_missing,value}]")
    return body["value"]

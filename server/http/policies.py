"""/api/policies: list, show, set (PUT) and clear (DELETE) a vhost's policies through the
metadata commands, then have the running queues take them (`Host.apply_policies`), as a
policy set by `warren policies` or rabbitmqctl reaches them. A list shows the policies of the
vhosts the caller may use; showing, setting or clearing one takes a policymaker or an
administrator (rabbit_mgmt_util:is_authorized_policies)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from warrenmq.server.metadata import ClearPolicy, SetPolicy

from .api import Call, core, created, no_content
from .errors import bad_request, object_not_found

DEFAULT_SORT = ("vhost", "name")


def policy_json(policy: Any) -> dict[str, Any]:
    return {
        "vhost": policy.vhost,
        "name": policy.name,
        "pattern": policy.pattern,
        "apply-to": policy.apply_to,
        "definition": dict(policy.definition),
        "priority": policy.priority,
    }


async def list_policies(call: Call) -> web.Response:
    wanted = call.params.get("vhost")
    if wanted is not None and wanted not in call.state.vhosts:
        raise object_not_found()
    vhosts = [wanted] if wanted is not None else call.caller.listed_vhosts(call.state)
    items = [
        policy_json(policy)
        for vhost in vhosts
        if call.caller.may_use(call.state, vhost)
        for policy in call.state.policies(vhost).values()
    ]
    return call.listing(items, DEFAULT_SORT)


async def get_policy(call: Call) -> web.Response:
    vhost, name = call.params["vhost"], call.params["name"]
    policy = call.state.policies(vhost).get(name) if vhost in call.state.vhosts else None
    if policy is None:
        raise object_not_found()
    return call.one(policy_json(policy))


async def put_policy(call: Call) -> web.Response:
    vhost, name = call.params["vhost"], call.params["name"]
    if vhost not in call.state.vhosts:
        raise object_not_found()
    body = await call.body()
    for key in ("pattern", "definition"):
        if key not in body:
            raise bad_request(f"[{{key_missing,{key}}}]")
    existed = name in call.state.policies(vhost)
    await core(
        call.api.store.apply(
            SetPolicy(
                vhost,
                name,
                body["pattern"],
                body["definition"],
                body.get("priority", 0),
                body.get("apply-to", "all"),
            )
        )
    )
    call.api.host.apply_policies()
    return no_content() if existed else created()


async def delete_policy(call: Call) -> web.Response:
    vhost, name = call.params["vhost"], call.params["name"]
    if vhost not in call.state.vhosts or name not in call.state.policies(vhost):
        raise object_not_found()
    await core(call.api.store.apply(ClearPolicy(vhost, name)))
    call.api.host.apply_policies()
    return no_content()

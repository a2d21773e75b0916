"""/api/users, /api/permissions and /api/whoami, through the metadata commands
(rabbit_mgmt_wm_user[s], rabbit_mgmt_wm_permission[s]).

PUT /api/users/NAME takes `tags` (a list, or one comma-separated string; required, as in
RabbitMQ) and `password` or `password_hash` (with its `hashing_algorithm`): a new password
is hashed off the event loop. A user given neither has no password anyone can log in with.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from warrenmq.server.metadata import (
    AddUser,
    ChangePassword,
    ClearPermissions,
    DeleteUser,
    Permission,
    SetPermissions,
    SetUserTags,
    User,
    passwords,
)

from .api import Call, core, created, no_content, reply
from .errors import bad_request, object_not_found
from .values import json_type, text

USER_SORT = ("name",)
PERMISSION_SORT = ("vhost", "user")


def user_json(user: User) -> dict[str, Any]:
    algorithm, password_hash = passwords.exported(user.password_hash)
    return {
        "name": user.name,
        "password_hash": password_hash,
        "hashing_algorithm": algorithm,
        "tags": list(user.tags),
        "limits": {},
    }


def permission_json(permission: Permission) -> dict[str, str]:
    return {
        "user": permission.user,
        "vhost": permission.vhost,
        "configure": permission.configure,
        "write": permission.write,
        "read": permission.read,
    }


async def whoami(call: Call) -> web.Response:
    return reply({"name": call.caller.name, "tags": list(call.caller.user.tags)})


async def list_users(call: Call) -> web.Response:
    return call.listing([user_json(user) for user in call.state.users.values()], USER_SORT)


async def list_users_without_permissions(call: Call) -> web.Response:
    granted = {user for user, _ in call.state.permissions}
    users = [user_json(u) for name, u in call.state.users.items() if name not in granted]
    return call.listing(users, USER_SORT)


def _user(call: Call) -> User:
    user = call.state.users.get(call.params["user"])
    if user is None:
        raise object_not_found()
    return user


async def get_user(call: Call) -> web.Response:
    return call.one(user_json(_user(call)))


def tags_of(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return tuple(tag.strip() for tag in value.split(",") if tag.strip())
    if isinstance(value, list) and all(isinstance(tag, str) for tag in value):
        return tuple(tag.strip() for tag in value if tag.strip())
    raise bad_request(f"tags must be a string or a list of strings, got {json_type(value)}")


async def password_hash_of(body: dict[str, Any]) -> str:
    """The stored hash for a user's `password` or `password_hash` (400 when both are given
    or the hash is not one this broker verifies); a user given neither (or an empty hash)
    gets a hash of the blank password, with which no login succeeds."""
    if "password" in body and "password_hash" in body:
        raise bad_request("both_password_and_password_hash_are_provided")
    # RabbitMQ exports a user created without a password with an empty hash.
    if body.get("password_hash"):
        algorithm = text(body, "hashing_algorithm", passwords.RABBIT_SHA256)
        stored = passwords.imported(algorithm, text(body, "password_hash"))
        if stored is None:
            raise bad_request(f"unsupported hashing algorithm or password hash: {algorithm}")
        return stored
    password = text(body, "password", "")
    if len(password.encode()) > passwords.PASSWORD_BYTES_MAX:
        raise bad_request(f"password longer than {passwords.PASSWORD_BYTES_MAX} bytes")
    # scrypt takes tens of milliseconds: not on the event loop.
    return await asyncio.to_thread(passwords.hash_password, password)


async def put_user(call: Call) -> web.Response:
    name = call.params["user"]
    body = await call.body()
    if "tags" not in body:
        raise bad_request("tags_not_present")
    tags = tags_of(body["tags"])
    password_hash = await password_hash_of(body)
    return created() if await put_user_record(call, name, tags, password_hash) else no_content()


async def put_user_record(call: Call, name: str, tags: tuple[str, ...], password_hash: str) -> bool:
    """Add the user, or set an existing one's password hash and tags; True if added."""
    store = call.api.store
    if name in call.state.users:
        await core(store.apply_all([ChangePassword(name, password_hash), SetUserTags(name, tags)]))
        return False
    await core(store.apply(AddUser(name, password_hash, tags)))
    return True


async def delete_user(call: Call) -> web.Response:
    user = _user(call)
    await core(call.api.store.apply(DeleteUser(user.name)))
    return no_content()


async def list_permissions(call: Call) -> web.Response:
    items = [permission_json(p) for p in call.state.permissions.values()]
    return call.listing(items, PERMISSION_SORT)


async def list_user_permissions(call: Call) -> web.Response:
    user = _user(call)
    items = [permission_json(p) for p in call.state.permissions.values() if p.user == user.name]
    return call.listing(items, PERMISSION_SORT)


async def list_vhost_permissions(call: Call) -> web.Response:
    vhost = call.params["vhost"]
    if vhost not in call.state.vhosts:
        raise object_not_found()
    items = [permission_json(p) for p in call.state.permissions.values() if p.vhost == vhost]
    return call.listing(items, PERMISSION_SORT)


def _permission(call: Call) -> Permission:
    permission = call.state.permission(call.params["user"], call.params["vhost"])
    if permission is None:
        raise object_not_found()
    return permission


async def get_permission(call: Call) -> web.Response:
    return call.one(permission_json(_permission(call)))


async def put_permission(call: Call) -> web.Response:
    user, vhost = call.params["user"], call.params["vhost"]
    if user not in call.state.users or vhost not in call.state.vhosts:
        raise bad_request("vhost_or_user_not_found")
    body = await call.body()
    missing = [key for key in ("configure", "write", "read") if body.get(key) is None]
    if missing:
        raise bad_request("[" + ",".join(f"{{key_missing,{key}}}" for key in missing) + "]")
    existed = call.state.permission(user, vhost) is not None
    command = SetPermissions(
        user, vhost, text(body, "configure"), text(body, "write"), text(body, "read")
    )
    await core(call.api.store.apply(command))
    return no_content() if existed else created()


async def delete_permission(call: Call) -> web.Response:
    permission = _permission(call)
    await core(call.api.store.apply(ClearPermissions(permission.user, permission.vhost)))
    return no_content()

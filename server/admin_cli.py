"""`warren users|vhosts|policies ...`: manage users, permissions, vhosts, policies and limits.

Two ways, one set of commands and outputs. By default a command goes through a running
broker's management API (`--url`, default $WARREN_MANAGEMENT_URL or http://127.0.0.1:15672;
`--user`/`--password`, default guest/guest), as rabbitmqctl acts on the running node
(`admin_remote.py`). With `--data-dir D` it opens the data dir's metadata store directly
(`D/metadata.sqlite3`) instead: for a broker that is stopped or not yet started, or one whose
API is off. A running broker picks such a change up within a second, or the next time a
client connects (`MetadataStore.sync_external_changes`, keyed on SQLite's data_version); a
policy change then reaches the queues it matches at once. The data dir is never a default: a
command run in the wrong directory must not create a fresh `./data` beside a running broker.

Also runnable without the `warren` entry point: `python -m warrenmq.server.admin_cli users list`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

from warrenmq.exchanges.errors import RoutingError
from warrenmq.server.metadata import commands as c
from warrenmq.server.metadata import passwords
from warrenmq.server.metadata.errors import BadRequest, PreconditionFailed
from warrenmq.server.metadata.limits import USER_LIMITS, VHOST_LIMITS, validate_limits
from warrenmq.server.metadata.store import METADATA_FILE, MetadataStore

from .admin_remote import ApiAdmin
from .api_client import CliError, add_login_arguments


def metadata_path(data_dir: str | os.PathLike[str]) -> Path:
    return Path(data_dir) / METADATA_FILE


def register(commands: Any) -> None:
    """Add `users`, `vhosts` and `policies` to the `warren` sub-parsers."""
    common = argparse.ArgumentParser(add_help=False)
    where = common.add_mutually_exclusive_group()
    where.add_argument(
        "--data-dir",
        help="edit this data directory instead of going through the management API",
    )
    add_login_arguments(common, where)

    users = commands.add_parser("users", help="add, delete and list users; set permissions")
    user_actions = users.add_subparsers(dest="action", metavar="ACTION", required=True)

    add = user_actions.add_parser("add", parents=[common], help="add a user")
    add.add_argument("name")
    add.add_argument(
        "new_password",
        metavar="password",
        nargs="?",
        help="the password (read from stdin if omitted)",
    )
    add.add_argument("--tags", default="", help="comma-separated tags, e.g. administrator")
    add.set_defaults(handler=_run(_add_user))

    delete = user_actions.add_parser("delete", parents=[common], help="delete a user")
    delete.add_argument("name")
    delete.set_defaults(handler=_run(_delete_user))

    listing = user_actions.add_parser("list", parents=[common], help="list users and tags")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(handler=_run(_list_users))

    password = user_actions.add_parser(
        "change-password", parents=[common], help="set a user's password"
    )
    password.add_argument("name")
    password.add_argument(
        "new_password",
        metavar="password",
        nargs="?",
        help="the password (read from stdin if omitted)",
    )
    password.set_defaults(handler=_run(_change_password))

    tags = user_actions.add_parser("set-tags", parents=[common], help="replace a user's tags")
    tags.add_argument("name")
    tags.add_argument("tags", nargs="*")
    tags.set_defaults(handler=_run(_set_tags))

    grant = user_actions.add_parser(
        "set-permissions",
        parents=[common],
        help="set configure/write/read regexes of a user on a vhost",
    )
    grant.add_argument("name")
    grant.add_argument("configure")
    grant.add_argument("write")
    grant.add_argument("read")
    grant.add_argument("--vhost", "-p", default="/", help="the vhost (default /)")
    grant.set_defaults(handler=_run(_set_permissions))

    revoke = user_actions.add_parser(
        "clear-permissions", parents=[common], help="remove a user's permissions on a vhost"
    )
    revoke.add_argument("name")
    revoke.add_argument("--vhost", "-p", default="/", help="the vhost (default /)")
    revoke.set_defaults(handler=_run(_clear_permissions))

    shown = user_actions.add_parser(
        "list-permissions", parents=[common], help="list permissions (of one vhost with --vhost)"
    )
    shown.add_argument("--vhost", "-p", help="only this vhost")
    shown.add_argument("--json", action="store_true", help="print JSON")
    shown.set_defaults(handler=_run(_list_permissions))

    _limit_commands(user_actions, common, "user", "max-connections, max-channels")

    vhosts = commands.add_parser("vhosts", help="add, delete and list virtual hosts")
    vhost_actions = vhosts.add_subparsers(dest="action", metavar="ACTION", required=True)
    vhost_add = vhost_actions.add_parser("add", parents=[common], help="add a vhost")
    vhost_add.add_argument("name")
    vhost_add.add_argument("--description", default="")
    vhost_add.add_argument("--tags", default="", help="comma-separated tags")
    vhost_add.set_defaults(handler=_run(_add_vhost))
    vhost_delete = vhost_actions.add_parser(
        "delete", parents=[common], help="delete a vhost with its exchanges, queues and bindings"
    )
    vhost_delete.add_argument("name")
    vhost_delete.set_defaults(handler=_run(_delete_vhost))
    vhost_list = vhost_actions.add_parser("list", parents=[common], help="list vhosts")
    vhost_list.add_argument("--json", action="store_true", help="print JSON")
    vhost_list.set_defaults(handler=_run(_list_vhosts))
    _limit_commands(vhost_actions, common, "vhost", "max-connections, max-queues")

    policies = commands.add_parser("policies", help="set, clear and list policies")
    policy_actions = policies.add_subparsers(dest="action", metavar="ACTION", required=True)
    policy_set = policy_actions.add_parser(
        "set", parents=[common], help="set or replace a policy (as rabbitmqctl set_policy)"
    )
    policy_set.add_argument("name")
    policy_set.add_argument("pattern", help="regex searched for in queue (exchange) names")
    policy_set.add_argument("definition", help="a JSON object, e.g. '{\"max-length\": 1000}'")
    policy_set.add_argument(
        "--apply-to",
        default="all",
        help="queues, classic_queues, quorum_queues, streams, exchanges or all (default all)",
    )
    policy_set.add_argument("--priority", type=int, default=0, help="the highest applies")
    policy_set.add_argument("--vhost", "-p", default="/", help="the vhost (default /)")
    policy_set.set_defaults(handler=_run(_set_policy))
    policy_clear = policy_actions.add_parser("clear", parents=[common], help="remove a policy")
    policy_clear.add_argument("name")
    policy_clear.add_argument("--vhost", "-p", default="/", help="the vhost (default /)")
    policy_clear.set_defaults(handler=_run(_clear_policy))
    policy_list = policy_actions.add_parser(
        "list", parents=[common], help="list policies (of one vhost with --vhost)"
    )
    policy_list.add_argument("--vhost", "-p", help="only this vhost")
    policy_list.add_argument("--json", action="store_true", help="print JSON")
    policy_list.set_defaults(handler=_run(_list_policies))


def _limit_commands(actions: Any, common: argparse.ArgumentParser, scope: str, keys: str) -> None:
    """set-limits, clear-limits and limits, as rabbitmqctl set_/clear_/list_{scope}_limits."""
    set_limits = actions.add_parser(
        "set-limits",
        parents=[common],
        help=f"replace a {scope}'s limits (as rabbitmqctl set_{scope}_limits)",
    )
    set_limits.add_argument("name")
    set_limits.add_argument(
        "definition", help=f"a JSON object of {keys}, e.g. '{{\"max-connections\": 64}}'"
    )
    set_limits.set_defaults(handler=_run(_set_limits), scope=scope)
    clear_limits = actions.add_parser(
        "clear-limits", parents=[common], help=f"remove every limit of a {scope}"
    )
    clear_limits.add_argument("name")
    clear_limits.set_defaults(handler=_run(_clear_limits), scope=scope)
    listed = actions.add_parser("limits", parents=[common], help=f"list the {scope}s' limits")
    listed.add_argument("--json", action="store_true", help="print JSON")
    listed.set_defaults(handler=_run(_list_limits), scope=scope)


def run(argv: list[str] | None = None) -> int:
    """The `users`/`vhosts`/`policies` commands on their own, without the rest of `warren`."""
    parser = argparse.ArgumentParser(prog="warren")
    register(parser.add_subparsers(dest="command", metavar="COMMAND", required=True))
    args = parser.parse_args(argv)
    return args.handler(args)


Admin = Any
"""`DataDirAdmin` or `admin_remote.ApiAdmin`: the same async methods."""
Handler = Callable[[Admin, argparse.Namespace], Coroutine[Any, Any, None]]


class DataDirAdmin:
    """The metadata store of a data dir, opened by the command itself."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store

    async def add_user(self, name: str, password: str, tags: Sequence[str]) -> None:
        await self.store.apply(c.AddUser(name, passwords.hash_password(password), tuple(tags)))

    async def delete_user(self, name: str) -> None:
        await self.store.apply(c.DeleteUser(name))

    async def change_password(self, name: str, password: str) -> None:
        await self.store.apply(c.ChangePassword(name, passwords.hash_password(password)))

    async def set_tags(self, name: str, tags: Sequence[str]) -> None:
        await self.store.apply(c.SetUserTags(name, tuple(tags)))

    async def users(self) -> list[dict[str, Any]]:
        return [{"name": u.name, "tags": list(u.tags)} for u in self.store.state.users.values()]

    async def set_permissions(
        self, user: str, vhost: str, configure: str, write: str, read: str
    ) -> None:
        await self.store.apply(c.SetPermissions(user, vhost, configure, write, read))

    async def clear_permissions(self, user: str, vhost: str) -> None:
        await self.store.apply(c.ClearPermissions(user, vhost))

    async def permissions(self, vhost: str | None) -> list[dict[str, Any]]:
        return [
            {
                "user": p.user,
                "vhost": p.vhost,
                "configure": p.configure,
                "write": p.write,
                "read": p.read,
            }
            for p in self.store.state.permissions.values()
            if vhost is None or p.vhost == vhost
        ]

    async def add_vhost(self, name: str, description: str, tags: Sequence[str]) -> None:
        await self.store.apply(c.DeclareVhost(name, description, tuple(tags)))

    async def delete_vhost(self, name: str) -> None:
        await self.store.apply(c.DeleteVhost(name))

    async def vhosts(self) -> list[dict[str, Any]]:
        return [
            {"name": v.name, "description": v.description, "tags": list(v.tags)}
            for v in self.store.state.vhosts.values()
        ]

    async def set_policy(self, policy: c.SetPolicy) -> None:
        await self.store.apply(policy)

    async def clear_policy(self, vhost: str, name: str) -> None:
        await self.store.apply(c.ClearPolicy(vhost, name))

    async def policies(self, vhost: str | None) -> list[dict[str, Any]]:
        state = self.store.state
        # The fields of RabbitMQ's GET /api/policies.
        return [
            {
                "vhost": p.vhost,
                "name": p.name,
                "pattern": p.pattern,
                "apply-to": p.apply_to,
                "definition": p.definition,
                "priority": p.priority,
            }
            for name in (state.vhosts if vhost is None else [vhost])
            for p in state.policies(name).values()
        ]

    async def set_limits(self, scope: str, name: str, limits: dict[str, Any]) -> None:
        command = c.SetVhostLimits if scope == "vhost" else c.SetUserLimits
        await self.store.apply(command(name, limits))

    async def limits(self, scope: str) -> list[dict[str, Any]]:
        state = self.store.state
        table = state.vhost_limits if scope == "vhost" else state.user_limits
        # The items of RabbitMQ's GET /api/vhost-limits (/api/user-limits).
        return [{scope: name, "value": dict(value)} for name, value in table.items()]


def _run(handler: Handler) -> Callable[[argparse.Namespace], int]:
    def run_handler(args: argparse.Namespace) -> int:
        return asyncio.run(_with_admin(handler, args))

    return run_handler


async def _with_admin(handler: Handler, args: argparse.Namespace) -> int:
    store = None
    try:
        if args.data_dir is None:
            admin: Admin = ApiAdmin(args)
        else:
            store = await MetadataStore.open(metadata_path(args.data_dir))
            admin = DataDirAdmin(store)
        await handler(admin, args)
    except RoutingError as error:
        # A validation failure spans lines, ending in one ("Validation failed\n\n...\n").
        print(f"Error: {error.reply_text.rstrip()}", file=sys.stderr)
        return 1
    except CliError as error:
        print(f"Error: {error}", file=sys.stderr)
        return 1
    finally:
        if store is not None:
            await store.close()
    return 0


def _password(args: argparse.Namespace) -> str:
    if args.new_password is not None:
        password = args.new_password
    else:
        line = sys.stdin.readline()
        password = line[:-1] if line.endswith("\n") else line
    if password == "":
        # RabbitMQ refuses every login with a blank password; such a user could never log in.
        raise PreconditionFailed("a blank password is not allowed")
    return password


def _split_tags(text: str) -> tuple[str, ...]:
    return tuple(tag.strip() for tag in text.split(",") if tag.strip())


async def _add_user(admin: Admin, args: argparse.Namespace) -> None:
    await admin.add_user(args.name, _password(args), _split_tags(args.tags))
    print(f'Added user "{args.name}".')


async def _delete_user(admin: Admin, args: argparse.Namespace) -> None:
    await admin.delete_user(args.name)
    print(f'Deleted user "{args.name}".')


async def _change_password(admin: Admin, args: argparse.Namespace) -> None:
    await admin.change_password(args.name, _password(args))
    print(f'Changed the password of user "{args.name}".')


async def _set_tags(admin: Admin, args: argparse.Namespace) -> None:
    await admin.set_tags(args.name, tuple(args.tags))
    print(f'Set the tags of user "{args.name}" to [{", ".join(args.tags)}].')


async def _list_users(admin: Admin, args: argparse.Namespace) -> None:
    users = sorted(await admin.users(), key=lambda user: user["name"])
    if args.json:
        print(json.dumps(users))
        return
    print("user\ttags")
    for user in users:
        print(f"{user['name']}\t[{', '.join(user['tags'])}]")


async def _set_permissions(admin: Admin, args: argparse.Namespace) -> None:
    await admin.set_permissions(args.name, args.vhost, args.configure, args.write, args.read)
    print(f'Set permissions for user "{args.name}" in vhost "{args.vhost}".')


async def _clear_permissions(admin: Admin, args: argparse.Namespace) -> None:
    await admin.clear_permissions(args.name, args.vhost)
    print(f'Cleared permissions for user "{args.name}" in vhost "{args.vhost}".')


async def _list_permissions(admin: Admin, args: argparse.Namespace) -> None:
    rows = sorted(await admin.permissions(args.vhost), key=lambda p: (p["user"], p["vhost"]))
    if args.json:
        print(json.dumps(rows))
        return
    print("user\tvhost\tconfigure\twrite\tread")
    for p in rows:
        print(f"{p['user']}\t{p['vhost']}\t{p['configure']}\t{p['write']}\t{p['read']}")


async def _add_vhost(admin: Admin, args: argparse.Namespace) -> None:
    await admin.add_vhost(args.name, args.description, _split_tags(args.tags))
    print(f'Added vhost "{args.name}".')


async def _delete_vhost(admin: Admin, args: argparse.Namespace) -> None:
    await admin.delete_vhost(args.name)
    print(f'Deleted vhost "{args.name}".')


async def _list_vhosts(admin: Admin, args: argparse.Namespace) -> None:
    vhosts = sorted(await admin.vhosts(), key=lambda vhost: vhost["name"])
    if args.json:
        print(json.dumps(vhosts))
        return
    print("name\tdescription")
    for vhost in vhosts:
        print(f"{vhost['name']}\t{vhost['description']}")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


async def _set_policy(admin: Admin, args: argparse.Namespace) -> None:
    try:
        definition = json.loads(args.definition, parse_constant=_reject_constant)
    except ValueError as error:
        # rabbit_policy:parse_set0/8's text.
        raise BadRequest(f"Could not parse JSON document: {error}") from None
    await admin.set_policy(
        c.SetPolicy(args.vhost, args.name, args.pattern, definition, args.priority, args.apply_to)
    )
    print(f'Set policy "{args.name}" in vhost "{args.vhost}".')


async def _clear_policy(admin: Admin, args: argparse.Namespace) -> None:
    await admin.clear_policy(args.vhost, args.name)
    print(f'Cleared policy "{args.name}" in vhost "{args.vhost}".')


async def _list_policies(admin: Admin, args: argparse.Namespace) -> None:
    # As rabbitmqctl list_policies orders them: by priority, lowest first (in each vhost).
    rows = sorted(
        await admin.policies(args.vhost), key=lambda p: (p["vhost"], p["priority"], p["name"])
    )
    if args.json:
        print(json.dumps(rows))
        return
    print("vhost\tname\tpattern\tapply-to\tdefinition\tpriority")
    for p in rows:
        definition = json.dumps(p["definition"], separators=(",", ":"), ensure_ascii=False)
        print(
            f"{p['vhost']}\t{p['name']}\t{p['pattern']}\t{p['apply-to']}\t{definition}\t"
            f"{p['priority']}"
        )


async def _set_limits(admin: Admin, args: argparse.Namespace) -> None:
    try:
        limits = json.loads(args.definition, parse_constant=_reject_constant)
    except ValueError as error:
        raise BadRequest(f"Could not parse JSON document: {error}") from None
    known = VHOST_LIMITS if args.scope == "vhost" else USER_LIMITS
    await admin.set_limits(args.scope, args.name, validate_limits(limits, known))
    print(f'Set the limits of {args.scope} "{args.name}".')


async def _clear_limits(admin: Admin, args: argparse.Namespace) -> None:
    await admin.set_limits(args.scope, args.name, {})
    print(f'Cleared the limits of {args.scope} "{args.name}".')


async def _list_limits(admin: Admin, args: argparse.Namespace) -> None:
    rows = sorted(await admin.limits(args.scope), key=lambda row: row[args.scope])
    if args.json:
        print(json.dumps(rows))
        return
    print(f"{args.scope}\tlimits")
    for row in rows:
        print(f"{row[args.scope]}\t{json.dumps(row['value'], separators=(',', ':'))}")


if __name__ == "__main__":
    sys.exit(run())

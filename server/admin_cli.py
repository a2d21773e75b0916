"""`warren users|vhosts|policies ...`: manage users, permissions, vhosts and policies in a data dir.

The commands open the data dir's metadata store directly (`D/metadata.sqlite3`), so they work
whether or not a broker is running on it. A running broker picks the change up within a second,
or the next time a client connects (`MetadataStore.sync_external_changes`, keyed on SQLite's
data_version); a policy change then reaches the queues it matches at once.

Also runnable without the `warren` entry point: `python -m warrenmq.server.admin_cli users list`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from warrenmq.exchanges.errors import RoutingError
from warrenmq.server.metadata import commands as c
from warrenmq.server.metadata import passwords
from warrenmq.server.metadata.errors import BadRequest, PreconditionFailed
from warrenmq.server.metadata.store import METADATA_FILE, MetadataStore

DATA_DIR_DEFAULT = "./data"


def metadata_path(data_dir: str | os.PathLike[str]) -> Path:
    return Path(data_dir) / METADATA_FILE


def register(commands: Any) -> None:
    """Add `users`, `vhosts` and `policies` to the `warren` sub-parsers."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--data-dir",
        default=os.environ.get("WARREN_DATA_DIR", DATA_DIR_DEFAULT),
        help="the broker's data directory (default: $WARREN_DATA_DIR or ./data)",
    )

    users = commands.add_parser("users", help="add, delete and list users; set permissions")
    user_actions = users.add_subparsers(dest="action", metavar="ACTION", required=True)

    add = user_actions.add_parser("add", parents=[common], help="add a user")
    add.add_argument("name")
    add.add_argument("password", nargs="?", help="the password (read from stdin if omitted)")
    add.add_argument("--tags", default="", help="comma-separated tags, e.g. administrator")
    add.set_defaults(handler=_sync(_add_user))

    delete = user_actions.add_parser("delete", parents=[common], help="delete a user")
    delete.add_argument("name")
    delete.set_defaults(handler=_sync(_delete_user))

    listing = user_actions.add_parser("list", parents=[common], help="list users and tags")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(handler=_sync(_list_users))

    password = user_actions.add_parser(
        "change-password", parents=[common], help="set a user's password"
    )
    password.add_argument("name")
    password.add_argument("password", nargs="?", help="the password (read from stdin if omitted)")
    password.set_defaults(handler=_sync(_change_password))

    tags = user_actions.add_parser("set-tags", parents=[common], help="replace a user's tags")
    tags.add_argument("name")
    tags.add_argument("tags", nargs="*")
    tags.set_defaults(handler=_sync(_set_tags))

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
    grant.set_defaults(handler=_sync(_set_permissions))

    revoke = user_actions.add_parser(
        "clear-permissions", parents=[common], help="remove a user's permissions on a vhost"
    )
    revoke.add_argument("name")
    revoke.add_argument("--vhost", "-p", default="/", help="the vhost (default /)")
    revoke.set_defaults(handler=_sync(_clear_permissions))

    shown = user_actions.add_parser(
        "list-permissions", parents=[common], help="list permissions (of one vhost with --vhost)"
    )
    shown.add_argument("--vhost", "-p", help="only this vhost")
    shown.add_argument("--json", action="store_true", help="print JSON")
    shown.set_defaults(handler=_sync(_list_permissions))

    vhosts = commands.add_parser("vhosts", help="add, delete and list virtual hosts")
    vhost_actions = vhosts.add_subparsers(dest="action", metavar="ACTION", required=True)
    vhost_add = vhost_actions.add_parser("add", parents=[common], help="add a vhost")
    vhost_add.add_argument("name")
    vhost_add.add_argument("--description", default="")
    vhost_add.add_argument("--tags", default="", help="comma-separated tags")
    vhost_add.set_defaults(handler=_sync(_add_vhost))
    vhost_delete = vhost_actions.add_parser(
        "delete", parents=[common], help="delete a vhost with its exchanges, queues and bindings"
    )
    vhost_delete.add_argument("name")
    vhost_delete.set_defaults(handler=_sync(_delete_vhost))
    vhost_list = vhost_actions.add_parser("list", parents=[common], help="list vhosts")
    vhost_list.add_argument("--json", action="store_true", help="print JSON")
    vhost_list.set_defaults(handler=_sync(_list_vhosts))

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
    policy_set.set_defaults(handler=_sync(_set_policy))
    policy_clear = policy_actions.add_parser("clear", parents=[common], help="remove a policy")
    policy_clear.add_argument("name")
    policy_clear.add_argument("--vhost", "-p", default="/", help="the vhost (default /)")
    policy_clear.set_defaults(handler=_sync(_clear_policy))
    policy_list = policy_actions.add_parser(
        "list", parents=[common], help="list policies (of one vhost with --vhost)"
    )
    policy_list.add_argument("--vhost", "-p", help="only this vhost")
    policy_list.add_argument("--json", action="store_true", help="print JSON")
    policy_list.set_defaults(handler=_sync(_list_policies))


def run(argv: list[str] | None = None) -> int:
    """The `users`/`vhosts`/`policies` commands on their own, without the rest of `warren`."""
    parser = argparse.ArgumentParser(prog="warren")
    register(parser.add_subparsers(dest="command", metavar="COMMAND", required=True))
    args = parser.parse_args(argv)
    return args.handler(args)


Handler = Callable[[MetadataStore, argparse.Namespace], Coroutine[Any, Any, None]]


def _sync(handler: Handler) -> Callable[[argparse.Namespace], int]:
    def run_handler(args: argparse.Namespace) -> int:
        return asyncio.run(_with_store(handler, args))

    return run_handler


async def _with_store(handler: Handler, args: argparse.Namespace) -> int:
    store = await MetadataStore.open(metadata_path(args.data_dir))
    try:
        await handler(store, args)
    except RoutingError as error:
        # A validation failure spans lines, ending in one ("Validation failed\n\n...\n").
        print(f"Error: {error.reply_text.rstrip()}", file=sys.stderr)
        return 1
    finally:
        await store.close()
    return 0


def _password(args: argparse.Namespace) -> str:
    if args.password is not None:
        return args.password
    line = sys.stdin.readline()
    return line[:-1] if line.endswith("\n") else line


def _split_tags(text: str) -> tuple[str, ...]:
    return tuple(tag.strip() for tag in text.split(",") if tag.strip())


async def _add_user(store: MetadataStore, args: argparse.Namespace) -> None:
    password = _password(args)
    if password == "":
        # RabbitMQ refuses every login with a blank password; such a user could never log in.
        raise PreconditionFailed("a blank password is not allowed")
    await store.apply(
        c.AddUser(
            args.name,
            passwords.hash_password(password),
            _split_tags(args.tags),
        )
    )
    print(f'Added user "{args.name}".')


async def _delete_user(store: MetadataStore, args: argparse.Namespace) -> None:
    await store.apply(c.DeleteUser(args.name))
    print(f'Deleted user "{args.name}".')


async def _change_password(store: MetadataStore, args: argparse.Namespace) -> None:
    password = _password(args)
    if password == "":
        raise PreconditionFailed("a blank password is not allowed")
    await store.apply(c.ChangePassword(args.name, passwords.hash_password(password)))
    print(f'Changed the password of user "{args.name}".')


async def _set_tags(store: MetadataStore, args: argparse.Namespace) -> None:
    await store.apply(c.SetUserTags(args.name, tuple(args.tags)))
    print(f'Set the tags of user "{args.name}" to [{", ".join(args.tags)}].')


async def _list_users(store: MetadataStore, args: argparse.Namespace) -> None:
    users = sorted(store.state.users.values(), key=lambda user: user.name)
    if args.json:
        print(json.dumps([{"name": u.name, "tags": list(u.tags)} for u in users]))
        return
    print("user\ttags")
    for user in users:
        print(f"{user.name}\t[{', '.join(user.tags)}]")


async def _set_permissions(store: MetadataStore, args: argparse.Namespace) -> None:
    await store.apply(
        c.SetPermissions(args.name, args.vhost, args.configure, args.write, args.read)
    )
    print(f'Set permissions for user "{args.name}" in vhost "{args.vhost}".')


async def _clear_permissions(store: MetadataStore, args: argparse.Namespace) -> None:
    await store.apply(c.ClearPermissions(args.name, args.vhost))
    print(f'Cleared permissions for user "{args.name}" in vhost "{args.vhost}".')


async def _list_permissions(store: MetadataStore, args: argparse.Namespace) -> None:
    rows = [
        p
        for _, p in sorted(store.state.permissions.items())
        if args.vhost is None or p.vhost == args.vhost
    ]
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "user": p.user,
                        "vhost": p.vhost,
                        "configure": p.configure,
                        "write": p.write,
                        "read": p.read,
                    }
                    for p in rows
                ]
            )
        )
        return
    print("user\tvhost\tconfigure\twrite\tread")
    for p in rows:
        print(f"{p.user}\t{p.vhost}\t{p.configure}\t{p.write}\t{p.read}")


async def _add_vhost(store: MetadataStore, args: argparse.Namespace) -> None:
    await store.apply(c.DeclareVhost(args.name, args.description, _split_tags(args.tags)))
    print(f'Added vhost "{args.name}".')


async def _delete_vhost(store: MetadataStore, args: argparse.Namespace) -> None:
    await store.apply(c.DeleteVhost(args.name))
    print(f'Deleted vhost "{args.name}".')


async def _list_vhosts(store: MetadataStore, args: argparse.Namespace) -> None:
    vhosts = sorted(store.state.vhosts.values(), key=lambda vhost: vhost.name)
    if args.json:
        print(
            json.dumps(
                [
                    {"name": v.name, "description": v.description, "tags": list(v.tags)}
                    for v in vhosts
                ]
            )
        )
        return
    print("name\tdescription")
    for vhost in vhosts:
        print(f"{vhost.name}\t{vhost.description}")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


async def _set_policy(store: MetadataStore, args: argparse.Namespace) -> None:
    try:
        definition = json.loads(args.definition, parse_constant=_reject_constant)
    except ValueError as error:
        # rabbit_policy:parse_set0/8's text.
        raise BadRequest(f"Could not parse JSON document: {error}") from None
    await store.apply(
        c.SetPolicy(args.vhost, args.name, args.pattern, definition, args.priority, args.apply_to)
    )
    print(f'Set policy "{args.name}" in vhost "{args.vhost}".')


async def _clear_policy(store: MetadataStore, args: argparse.Namespace) -> None:
    await store.apply(c.ClearPolicy(args.vhost, args.name))
    print(f'Cleared policy "{args.name}" in vhost "{args.vhost}".')


async def _list_policies(store: MetadataStore, args: argparse.Namespace) -> None:
    state = store.state
    vhosts = sorted(state.vhosts) if args.vhost is None else [args.vhost]
    # As rabbitmqctl list_policies orders them: by priority, lowest first.
    rows = [
        p
        for vhost in vhosts
        for p in sorted(state.policies(vhost).values(), key=lambda p: (p.priority, p.name))
    ]
    if args.json:
        # The fields of RabbitMQ's GET /api/policies.
        print(
            json.dumps(
                [
                    {
                        "vhost": p.vhost,
                        "name": p.name,
                        "pattern": p.pattern,
                        "apply-to": p.apply_to,
                        "definition": p.definition,
                        "priority": p.priority,
                    }
                    for p in rows
                ]
            )
        )
        return
    print("vhost\tname\tpattern\tapply-to\tdefinition\tpriority")
    for p in rows:
        definition = json.dumps(p.definition, separators=(",", ":"), ensure_ascii=False)
        print(f"{p.vhost}\t{p.name}\t{p.pattern}\t{p.apply_to}\t{definition}\t{p.priority}")


if __name__ == "__main__":
    sys.exit(run())

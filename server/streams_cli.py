"""`warren streams list|add-super|delete-super` and `warren groups`: streams, super streams
and consumer groups of a running broker, through its HTTP API (`--url`, `--user`,
`--password`, `--vhost`, as every such command).

    warren streams add-super invoices --partitions 3   # exchange + invoices-0 … invoices-2
    warren streams list                                # streams, offsets, tracked offsets
    warren streams delete-super invoices               # the exchange and its partitions
    warren groups                                      # members, assignments, offsets, lag
"""

from __future__ import annotations

import json
from typing import Any

from .api_client import add_connection_arguments, handler, request_json


def register(commands: Any) -> None:
    streams = commands.add_parser("streams", help="list streams, create super streams")
    actions = streams.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="streams and super streams of a vhost")
    listing.add_argument("--json", action="store_true", help="print the API's JSON")
    add_connection_arguments(listing)
    listing.set_defaults(handler=handler(_list))
    add = actions.add_parser("add-super", help="create a super stream and its partitions")
    add.add_argument("name")
    add.add_argument("--partitions", type=int, required=True, help="how many partitions")
    add_connection_arguments(add)
    add.set_defaults(handler=handler(_add_super))
    delete = actions.add_parser(
        "delete-super", help="delete a super stream's exchange and its partition streams"
    )
    delete.add_argument("name")
    add_connection_arguments(delete)
    delete.set_defaults(handler=handler(_delete_super))
    groups = commands.add_parser(
        "groups", help="consumer groups: members, assignments, committed offsets, lag"
    )
    groups.add_argument("--json", action="store_true", help="print the API's JSON")
    add_connection_arguments(groups)
    groups.set_defaults(handler=handler(_groups))


def _list(args: Any) -> None:
    streams = request_json(args, "GET", "api", "streams", args.vhost)
    supers = request_json(args, "GET", "api", "super-streams", args.vhost)
    if args.json:
        print(json.dumps({"streams": streams, "super_streams": supers}, indent=2))
        return
    print(f"{'stream':<32} {'first':>10} {'next':>10} {'bytes':>12} {'consumers':>9}  tracked")
    for stream in streams:
        tracked = ", ".join(f"{tag}={at}" for tag, at in stream["tracked_offsets"].items())
        print(
            f"{stream['name']:<32} {stream['first_offset']:>10} {stream['next_offset']:>10} "
            f"{stream['bytes']:>12} {stream['consumers']:>9}  {tracked}"
        )
    for super_stream in supers:
        print(f"super stream {super_stream['name']}: {', '.join(super_stream['partitions'])}")


def _add_super(args: Any) -> None:
    request_json(
        args,
        "PUT",
        "api",
        "super-streams",
        args.vhost,
        args.name,
        body={"partitions": args.partitions},
    )
    print(f"super stream {args.name}: {args.partitions} partitions")


def _delete_super(args: Any) -> None:
    request_json(args, "DELETE", "api", "super-streams", args.vhost, args.name)
    print(f"super stream {args.name} deleted, with its partitions")


def _groups(args: Any) -> None:
    groups = request_json(args, "GET", "api", "groups", args.vhost)
    if args.json:
        print(json.dumps(groups, indent=2))
        return
    for group in groups:
        members = ", ".join(group["members"]) or "no members"
        print(f"group {group['group']} on {group['super_stream']}: {members}")
        for partition in group["partitions"]:
            member = partition["member"] or ("moving" if partition["moving"] else "-")
            committed = partition["committed_offset"]
            print(
                f"  {partition['partition']:<32} {member:<24} "
                f"committed {'-' if committed is None else committed:>10}  lag {partition['lag']}"
            )

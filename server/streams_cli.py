"""`warren streams list|add-super|delete-super` and `warren groups`: streams, super streams
and consumer groups of a running broker, through its HTTP API (`--url`, `--user`,
`--password`, `--vhost`, as every such command). Lists print as tables (cli_tables), or
with `--json` as the API's JSON.

    warren streams add-super invoices --partitions 3   # exchange + invoices-0 … invoices-2
    warren streams list                                # streams, offsets, tracked offsets
    warren streams delete-super invoices               # the exchange and its partitions
    warren groups                                      # members, assignments, offsets, lag
"""

from __future__ import annotations

from typing import Any

from .api_client import add_connection_arguments, handler, request_json
from .cli_tables import Columns, print_json, print_table

STREAM_COLUMNS: Columns = (
    ("vhost", "vhost"),
    ("stream", "name"),
    ("first", "first_offset"),
    ("last", "last_offset"),
    ("next", "next_offset"),
    ("messages", "messages"),
    ("bytes", "bytes"),
    ("segments", "segments"),
    ("consumers", "consumers"),
    ("tracked offsets", "tracked"),
)
SUPER_STREAM_COLUMNS: Columns = (
    ("vhost", "vhost"),
    ("super stream", "name"),
    ("partitions", "partitions"),
)
# A row per partition of each group; "members" counts the group's members, those without a
# partition too.
GROUP_COLUMNS: Columns = (
    ("vhost", "vhost"),
    ("group", "group"),
    ("super stream", "super_stream"),
    ("members", "member_count"),
    ("partition", "partition"),
    ("owner", "owner"),
    ("committed", "committed_offset"),
    ("lag", "lag"),
)


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
        print_json({"streams": streams, "super_streams": supers})
        return
    print_table(
        STREAM_COLUMNS,
        [
            {
                **stream,
                "tracked": ", ".join(
                    f"{tag}={at}" for tag, at in stream["tracked_offsets"].items()
                ),
            }
            for stream in streams
        ],
    )
    if supers:
        print()
        print_table(
            SUPER_STREAM_COLUMNS,
            [{**item, "partitions": ", ".join(item["partitions"])} for item in supers],
        )


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


def _owner(partition: dict[str, Any]) -> str | None:
    """The member a partition is assigned to; "moving" while it passes to another."""
    if partition["member"] is None and partition["moving"]:
        return "moving"
    return partition["member"]


def _groups(args: Any) -> None:
    groups = request_json(args, "GET", "api", "groups", args.vhost)
    if args.json:
        print_json(groups)
        return
    print_table(
        GROUP_COLUMNS,
        [
            {
                **group,
                **partition,
                "member_count": len(group["members"]),
                "owner": _owner(partition),
            }
            for group in groups
            for partition in group["partitions"]
        ],
    )

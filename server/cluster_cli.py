"""`warren cluster status|up|down|join|leave|remove`.

    warren cluster up --nodes 3 [--data-dir D]    # three local nodes on loopback, free ports
    warren cluster status [--url URL]             # every node: id, address, Raft role...
    warren cluster join 4 10.0.0.4:25672 [--url URL of a member]
    warren cluster leave [--url URL of the node leaving]
    warren cluster remove 3 [--url URL of a member]
    warren cluster down [--data-dir D]

`up` and `down` run local processes (`server/local_cluster.py`), recorded in
D/cluster.json (default D: ./warren-cluster); `up` on a directory of a stopped cluster
starts it again, its data kept. The others act on a running broker through its management
API (GET /api/nodes, PUT and DELETE /api/cluster/members/{id}).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .api_client import CliError, add_login_arguments, handler, request_json
from .cli_tables import Columns, print_json, print_table
from .local_cluster import STATE_FILE, LocalCluster

DATA_DIR_DEFAULT = Path("warren-cluster")
STATUS_COLUMNS: Columns = (
    ("id", "node_id"),
    ("name", "name"),
    ("address", "address"),
    ("http", "http_port"),
    ("role", "role"),
    ("term", "term"),
    ("applied", "applied_index"),
    ("reachable", "reachable"),
)


def register(commands: Any) -> None:
    cluster = commands.add_parser("cluster", help="run and manage a cluster of nodes")
    actions = cluster.add_subparsers(dest="action", metavar="ACTION", required=True)

    status = actions.add_parser("status", help="the nodes, as the node at --url sees them")
    add_login_arguments(status)
    status.add_argument("--json", action="store_true", help="print the API's JSON")
    status.set_defaults(handler=handler(_status))

    up = actions.add_parser("up", help="start local nodes on loopback")
    up.add_argument("--nodes", type=int, default=3, help="how many (default 3)")
    _add_data_dir(up)
    up.set_defaults(handler=handler(_up))

    down = actions.add_parser("down", help="stop the local nodes `up` started")
    _add_data_dir(down)
    down.set_defaults(handler=handler(_down))

    join = actions.add_parser("join", help="add a node started with --join")
    join.add_argument("node_id", type=int)
    join.add_argument("raft_address", help="HOST:PORT of its Raft transport")
    add_login_arguments(join)
    join.set_defaults(handler=handler(_join))

    leave = actions.add_parser("leave", help="the node at --url leaves the cluster")
    add_login_arguments(leave)
    leave.set_defaults(handler=handler(_leave))

    remove = actions.add_parser("remove", help="remove a node from the cluster")
    remove.add_argument("node_id", type=int)
    add_login_arguments(remove)
    remove.set_defaults(handler=handler(_remove))


def _add_data_dir(parser: Any) -> None:
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=DATA_DIR_DEFAULT,
        help=f"the nodes' data, logs and {STATE_FILE} (default ./{DATA_DIR_DEFAULT})",
    )


def _status(args: Any) -> None:
    nodes = request_json(args, "GET", "api", "nodes")
    if args.json:
        print_json(nodes)
        return
    rows = []
    for item in nodes:
        raft = item.get("raft", {})
        host, port = item.get("host"), item.get("amqp_port")
        rows.append(
            {
                **item,
                **raft,
                "address": f"{host}:{port}" if host is not None else None,
            }
        )
    print_table(STATUS_COLUMNS, rows)


def _up(args: Any) -> None:
    if args.nodes < 1:
        raise CliError("--nodes must be at least 1")
    try:
        running = LocalCluster.recorded(args.data_dir)
    except FileNotFoundError:
        running = None
    if running is not None and any(running.running(n) for n in running.nodes):
        raise CliError(f"a cluster recorded in {args.data_dir} runs: `warren cluster down` first")
    cluster = LocalCluster(args.data_dir, args.nodes)
    try:
        cluster.start_all()
    except (RuntimeError, TimeoutError) as error:
        cluster.stop()
        raise CliError(f"the cluster did not start: {error}") from None
    for node in cluster.nodes.values():
        print(f"node {node.node_id}: {node.amqp_url} {node.http_url} (pid {node.pid})")
    print(f"recorded in {args.data_dir / STATE_FILE}; stop with `warren cluster down`")


def _down(args: Any) -> None:
    try:
        cluster = LocalCluster.recorded(args.data_dir)
    except FileNotFoundError as error:
        raise CliError(str(error)) from None
    cluster.stop()
    print(f"stopped {len(cluster.nodes)} nodes")


def _join(args: Any) -> None:
    host, colon, port = args.raft_address.rpartition(":")
    if not (colon and host and port.isdigit()):
        raise CliError(f"not HOST:PORT: {args.raft_address}")
    body = {"host": host.strip("[]"), "port": int(port)}
    request_json(args, "PUT", "api", "cluster", "members", str(args.node_id), body=body)
    print(f"node {args.node_id} added")


def _leave(args: Any) -> None:
    overview = request_json(args, "GET", "api", "overview")
    node = overview.get("node", "")
    _, _, node_id = node.partition("@")
    if not node_id.isdigit():
        raise CliError(f"the broker at {args.url} does not say which node it is")
    request_json(args, "DELETE", "api", "cluster", "members", node_id)
    print(f"node {node_id} left the cluster")


def _remove(args: Any) -> None:
    request_json(args, "DELETE", "api", "cluster", "members", str(args.node_id))
    print(f"node {args.node_id} removed")

"""`warren status|queues|exchanges|bindings|connections|definitions`: a running broker through
its management API, as rabbitmqadmin works (`--url`, default $WARREN_MANAGEMENT_URL or
http://127.0.0.1:15672; `--user`/`--password`, default guest/guest). Lists cover every vhost
the user may see, or the one `--vhost` names. A table for people; `--json` prints the API's
own JSON for scripts. A refusal is one line on stderr and exit status 1.

    warren status
    warren queues                       # = warren queues list
    warren queues show orders --json
    warren queues declare orders --durable --arguments '{"x-max-length": 1000}'
    warren queues purge orders
    warren queues grow warren@3 all      # rabbitmq-queues grow, shrink and rebalance
    warren queues shrink warren@3
    warren queues rebalance all
    warren definitions export > topology.json
    warren definitions import topology.json
"""

from __future__ import annotations

import json
import sys
import urllib.parse
from collections.abc import Callable
from typing import Any

from .api_client import (
    ApiError,
    CliError,
    add_connection_arguments,
    add_login_arguments,
    handler,
    request,
    request_json,
)
from .cli_tables import Columns, print_fields, print_json, print_table

QUEUE_COLUMNS: Columns = (
    ("vhost", "vhost"),
    ("name", "name"),
    ("type", "type"),
    ("durable", "durable"),
    ("messages", "messages"),
    ("ready", "messages_ready"),
    ("unacked", "messages_unacknowledged"),
    ("consumers", "consumers"),
    ("state", "state"),
)
QUEUE_FIELDS: Columns = (
    *QUEUE_COLUMNS,
    ("auto delete", "auto_delete"),
    ("exclusive", "exclusive"),
    ("arguments", "arguments"),
    ("policy", "policy"),
    ("node", "node"),
)
EXCHANGE_COLUMNS: Columns = (
    ("vhost", "vhost"),
    ("name", "name"),
    ("type", "type"),
    ("durable", "durable"),
    ("auto delete", "auto_delete"),
    ("internal", "internal"),
    ("arguments", "arguments"),
)
REPLICA_COLUMNS: Columns = (
    ("vhost", "vhost"),
    ("name", "name"),
    ("size", "size"),
    ("result", "result"),
    ("leader", "leader"),
)
BINDING_COLUMNS: Columns = (
    ("vhost", "vhost"),
    ("source", "source"),
    ("destination", "destination"),
    ("destination type", "destination_type"),
    ("routing key", "routing_key"),
    ("arguments", "arguments"),
)
CONNECTION_COLUMNS: Columns = (
    ("name", "name"),
    ("user", "user"),
    ("vhost", "vhost"),
    ("client", "client"),
    ("channels", "channels"),
    ("state", "state"),
)
STATUS_FIELDS: Columns = (
    ("node", "node"),
    ("product", "product"),
    ("RabbitMQ API", "rabbitmq_version"),
    ("listeners", "listeners"),
    ("connections", "connections"),
    ("channels", "channels"),
    ("exchanges", "exchanges"),
    ("queues", "queues"),
    ("consumers", "consumers"),
    ("messages", "messages"),
    ("ready", "messages_ready"),
    ("unacked", "messages_unacknowledged"),
    ("publish /s", "publish_rate"),
    ("deliver and get /s", "deliver_get_rate"),
)
# The default exchange's name in the API's paths.
DEFAULT_EXCHANGE = "amq.default"


def register(commands: Any) -> None:
    status = commands.add_parser("status", help="a running broker's overview")
    add_login_arguments(status)
    status.set_defaults(handler=handler(_status))
    status.add_argument("--json", action="store_true", help="print the API's JSON")

    queues = _group(commands, "queues", "list, show, declare, delete and purge queues", _queues)
    show = _action(queues, "show", "one queue's state", _show_queue, "queue")
    show.add_argument("--json", action="store_true", help="print the API's JSON")
    declare = _action(
        queues, "declare", "declare a queue (or check an equivalent one)", _declare_queue, "queue"
    )
    declare.add_argument("--durable", action="store_true")
    declare.add_argument("--auto-delete", action="store_true")
    declare.add_argument("--type", choices=("classic", "quorum"), help="x-queue-type")
    declare.add_argument("--arguments", default="{}", help="a JSON object of x-arguments")
    delete = _action(queues, "delete", "delete a queue", _delete_queue, "queue")
    delete.add_argument("--if-empty", action="store_true")
    delete.add_argument("--if-unused", action="store_true")
    _action(queues, "purge", "drop every ready message of a queue", _purge_queue, "queue")
    grow = _replica_action(queues, "grow", "add a replica on a node to the queues", _grow)
    grow.add_argument("node", help="a node id or name (warren@N)")
    grow.add_argument("strategy", choices=("all", "even"), help="even: queues with an even size")
    shrink = _replica_action(queues, "shrink", "remove the replicas on a node", _shrink)
    shrink.add_argument("node", help="a node id or name (warren@N)")
    rebalance = _replica_action(
        queues, "rebalance", "spread the queues' leaders over their in-sync replicas", _rebalance
    )
    rebalance.add_argument("type", choices=("all", "classic", "quorum", "stream"))
    for parser in (grow, rebalance):
        parser.add_argument("--vhost-pattern", default=".*")
        parser.add_argument("--queue-pattern", default=".*")

    exchanges = _group(commands, "exchanges", "list, declare and delete exchanges", _exchanges)
    declare = _action(exchanges, "declare", "declare an exchange", _declare_exchange, "exchange")
    declare.add_argument("type", help="direct, fanout, topic, headers, x-delayed-message ...")
    declare.add_argument("--durable", action="store_true")
    declare.add_argument("--auto-delete", action="store_true")
    declare.add_argument("--internal", action="store_true")
    declare.add_argument("--arguments", default="{}", help="a JSON object of arguments")
    _action(exchanges, "delete", "delete an exchange", _delete_exchange, "exchange")

    bindings = _group(commands, "bindings", "list and add bindings", _bindings)
    bind = _action(
        bindings, "declare", "bind a queue (or an exchange) to an exchange", _bind, "source"
    )
    bind.add_argument("destination")
    bind.add_argument("--destination-type", choices=("queue", "exchange"), default="queue")
    bind.add_argument("--routing-key", default="")
    bind.add_argument("--arguments", default="{}", help="a JSON object of arguments")

    connections = _group(commands, "connections", "list and close client connections", _connections)
    close = _action(connections, "close", "close a connection (320 to the client)", _close, "name")
    close.add_argument("--reason", default="Closed via warren connections close")

    definitions = commands.add_parser(
        "definitions", help="export or import a broker's topology (RabbitMQ's JSON)"
    )
    actions = definitions.add_subparsers(dest="action", metavar="ACTION", required=True)
    # The whole broker's, unless --vhost names one (RabbitMQ's /api/definitions/VHOST).
    export = _action(actions, "export", "write the definitions as JSON", _export, None, None)
    export.add_argument("file", nargs="?", default="-", help="where (default - : stdout)")
    imported = _action(actions, "import", "load definitions from a JSON file", _import, None, None)
    imported.add_argument("file", help="the JSON file (- : stdin)")


def _options(parser: Any, run: Callable[[Any], int], vhost_default: str | None = None) -> None:
    add_connection_arguments(parser, vhost_default)
    parser.set_defaults(handler=run)


def _group(commands: Any, name: str, help_text: str, list_action: Callable[[Any], None]) -> Any:
    """`warren NAME [list]`: listing is what the bare command does."""
    group = commands.add_parser(name, help=help_text)
    _options(group, handler(list_action))
    group.add_argument("--json", action="store_true", help="print the API's JSON")
    actions = group.add_subparsers(dest="action", metavar="ACTION")
    listing = actions.add_parser("list", help=f"list {name} (also without ACTION)")
    _options(listing, handler(list_action))
    listing.add_argument("--json", action="store_true", help="print the API's JSON")
    return actions


def _action(
    actions: Any,
    name: str,
    help_text: str,
    action: Callable[[Any], None],
    subject: str | None,
    vhost_default: str | None = "/",
) -> Any:
    """An ACTION on `subject` (a positional argument), in one vhost: "/" unless told."""
    parser = actions.add_parser(name, help=help_text)
    if subject is not None:
        parser.add_argument(subject)
    _options(parser, handler(action), vhost_default)
    return parser


def _replica_action(actions: Any, name: str, help_text: str, action: Callable[[Any], None]) -> Any:
    """`warren queues grow|shrink|rebalance`: across vhosts, as `rabbitmq-queues` acts."""
    parser = actions.add_parser(name, help=help_text)
    add_login_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the API's JSON")
    parser.set_defaults(handler=handler(action))
    return parser


def _json_argument(text: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as error:
        raise CliError(f"{what} is not JSON: {error}") from None
    if not isinstance(value, dict):
        raise CliError(f"{what} must be a JSON object")
    return value


def _listed(args: Any, kind: str, columns: Columns) -> None:
    segments = ("api", kind) if args.vhost is None else ("api", kind, args.vhost)
    if args.json:
        print_json(request_json(args, "GET", *segments))
        return
    query = urllib.parse.urlencode({"columns": ",".join(key for _, key in columns)})
    print_table(columns, request_json(args, "GET", *segments, query=query))


def _missing(error: ApiError, text: str) -> CliError:
    """A 404 named after what the command was looking for; other refusals as they are."""
    return CliError(text) if error.status == 404 else error


# -- status ------------------------------------------------------------------------------------


def _status(args: Any) -> None:
    overview = request_json(args, "GET", "api", "overview")
    if args.json:
        print_json(overview)
        return
    totals = overview.get("object_totals", {})
    depths = overview.get("queue_totals", {})
    stats = overview.get("message_stats", {})
    listeners = overview.get("listeners", [])
    print_fields(
        STATUS_FIELDS,
        {
            "node": overview.get("node", overview.get("cluster_name")),
            "product": f"{overview['product_name']} {overview['product_version']}",
            "rabbitmq_version": overview["rabbitmq_version"],
            "listeners": ", ".join(f"{lst['protocol']} {lst['port']}" for lst in listeners),
            **totals,
            "messages": depths.get("messages", 0),
            "messages_ready": depths.get("messages_ready", 0),
            "messages_unacknowledged": depths.get("messages_unacknowledged", 0),
            "publish_rate": stats.get("publish_details", {}).get("rate", 0.0),
            "deliver_get_rate": stats.get("deliver_get_details", {}).get("rate", 0.0),
        },
    )


# -- queues ------------------------------------------------------------------------------------


def _queues(args: Any) -> None:
    _listed(args, "queues", QUEUE_COLUMNS)


def _no_queue(args: Any) -> str:
    return f"no queue '{args.queue}' in vhost '{args.vhost}'"


def _show_queue(args: Any) -> None:
    try:
        queue = request_json(args, "GET", "api", "queues", args.vhost, args.queue)
    except ApiError as error:
        raise _missing(error, _no_queue(args)) from None
    if args.json:
        print_json(queue)
    else:
        print_fields(QUEUE_FIELDS, queue)


def _declare_queue(args: Any) -> None:
    arguments = _json_argument(args.arguments, "--arguments")
    if args.type is not None:
        arguments["x-queue-type"] = args.type
    body = {"durable": args.durable, "auto_delete": args.auto_delete, "arguments": arguments}
    request_json(args, "PUT", "api", "queues", args.vhost, args.queue, body=body)
    print(f'Declared queue "{args.queue}" in vhost "{args.vhost}".')


def _delete_queue(args: Any) -> None:
    conditions = {"if-empty": args.if_empty, "if-unused": args.if_unused}
    query = urllib.parse.urlencode({key: "true" for key, wanted in conditions.items() if wanted})
    try:
        request_json(args, "DELETE", "api", "queues", args.vhost, args.queue, query=query)
    except ApiError as error:
        raise _missing(error, _no_queue(args)) from None
    print(f'Deleted queue "{args.queue}" in vhost "{args.vhost}".')


def _purge_queue(args: Any) -> None:
    try:
        request_json(args, "DELETE", "api", "queues", args.vhost, args.queue, "contents")
    except ApiError as error:
        raise _missing(error, _no_queue(args)) from None
    print(f'Purged queue "{args.queue}" in vhost "{args.vhost}".')


def _grow(args: Any) -> None:
    body = {
        "node": args.node,
        "strategy": args.strategy,
        "vhost_pattern": args.vhost_pattern,
        "queue_pattern": args.queue_pattern,
    }
    _replicas_changed(args, "grow", body)


def _shrink(args: Any) -> None:
    _replicas_changed(args, "shrink", {"node": args.node})


def _rebalance(args: Any) -> None:
    body = {
        "type": args.type,
        "vhost_pattern": args.vhost_pattern,
        "queue_pattern": args.queue_pattern,
    }
    _replicas_changed(args, "rebalance", body)


def _replicas_changed(args: Any, action: str, body: dict[str, Any]) -> None:
    results = request_json(args, "POST", "api", "queue-replicas", action, body=body)
    if args.json:
        print_json(results)
    else:
        print_table(REPLICA_COLUMNS, results)


# -- exchanges and bindings ----------------------------------------------------------------------


def _exchanges(args: Any) -> None:
    _listed(args, "exchanges", EXCHANGE_COLUMNS)


def _exchange_in_path(name: str) -> str:
    return name or DEFAULT_EXCHANGE


def _declare_exchange(args: Any) -> None:
    body = {
        "type": args.type,
        "durable": args.durable,
        "auto_delete": args.auto_delete,
        "internal": args.internal,
        "arguments": _json_argument(args.arguments, "--arguments"),
    }
    exchange = _exchange_in_path(args.exchange)
    request_json(args, "PUT", "api", "exchanges", args.vhost, exchange, body=body)
    print(f'Declared exchange "{args.exchange}" in vhost "{args.vhost}".')


def _delete_exchange(args: Any) -> None:
    exchange = _exchange_in_path(args.exchange)
    try:
        request_json(args, "DELETE", "api", "exchanges", args.vhost, exchange)
    except ApiError as error:
        raise _missing(error, f"no exchange '{args.exchange}' in vhost '{args.vhost}'") from None
    print(f'Deleted exchange "{args.exchange}" in vhost "{args.vhost}".')


def _bindings(args: Any) -> None:
    _listed(args, "bindings", BINDING_COLUMNS)


def _bind(args: Any) -> None:
    kind = "q" if args.destination_type == "queue" else "e"
    body = {
        "routing_key": args.routing_key,
        "arguments": _json_argument(args.arguments, "--arguments"),
    }
    source = _exchange_in_path(args.source)
    request(
        args,
        "POST",
        "api",
        "bindings",
        args.vhost,
        "e",
        source,
        kind,
        args.destination,
        data=json.dumps(body).encode(),
    ).close()
    print(f'Bound {args.destination_type} "{args.destination}" to exchange "{args.source}".')


# -- connections ---------------------------------------------------------------------------------


def _connections(args: Any) -> None:
    connections = [
        connection
        for connection in request_json(args, "GET", "api", "connections")
        if args.vhost is None or connection.get("vhost") == args.vhost
    ]
    if args.json:
        print_json(connections)
        return
    for connection in connections:
        client = connection.get("client_properties", {})
        connection["client"] = " ".join(
            str(client[key]) for key in ("product", "version") if key in client
        )
    print_table(CONNECTION_COLUMNS, connections)


def _close(args: Any) -> None:
    try:
        response = request(
            args, "DELETE", "api", "connections", args.name, headers={"X-Reason": args.reason}
        )
    except ApiError as error:
        raise _missing(error, f"no connection '{args.name}'") from None
    response.close()
    print(f'Closed connection "{args.name}".')


# -- definitions ---------------------------------------------------------------------------------


def _export(args: Any) -> None:
    segments = ("api", "definitions") if args.vhost is None else ("api", "definitions", args.vhost)
    definitions = request_json(args, "GET", *segments)
    text = json.dumps(definitions, indent=2, ensure_ascii=False) + "\n"
    if args.file == "-":
        sys.stdout.write(text)
        return
    with open(args.file, "w", encoding="utf-8") as file:
        file.write(text)
    print(f"Exported definitions to {args.file}.", file=sys.stderr)


def _import(args: Any) -> None:
    try:
        if args.file == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(args.file, "rb") as file:
                data = file.read()
    except OSError as error:
        raise CliError(f"cannot read {args.file}: {error.strerror}") from None
    segments = ("api", "definitions") if args.vhost is None else ("api", "definitions", args.vhost)
    request(args, "POST", *segments, data=data).close()
    print(f"Imported definitions from {args.file}.")

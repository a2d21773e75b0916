"""`warren dlq list|peek|redrive|export|import|purge`: the DLQ tools against a running broker,
through its management API (as rabbitmqadmin works): `--url` (default $WARREN_MANAGEMENT_URL
or http://127.0.0.1:15672), `--user`/`--password` (default guest/guest).

    warren dlq list                             # queues dead letters reach, by reason/source
    warren dlq peek orders.dlq -n 5            # browse without consuming: x-death, preview
    warren dlq redrive orders.dlq --rate 500   # back to each one's source queue, in the broker
    warren dlq redrives                         # the tasks; `cancel ID`, `resume ID`, `watch ID`
    warren dlq export orders.dlq > dead.jsonl   # every message, exactly
    warren dlq import orders.dlq < dead.jsonl   # published again, byte for byte
    warren dlq purge orders.dlq
"""

from __future__ import annotations

import json
import sys
import time
import urllib.parse
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from warrenmq.dlq.dead_letter import REASONS

from .api_client import CliError, add_connection_arguments, handler, request, request_json

PREVIEW_CHARS = 60
WATCH_INTERVAL_S = 0.5
WIDE_COLUMNS = 250


def register(commands: Any) -> None:
    dlq = commands.add_parser("dlq", help="browse, export, import and purge dead-letter queues")
    actions = dlq.add_subparsers(dest="action", metavar="ACTION", required=True)

    def action(name: str, help_text: str, action_function: Any, operand: str = "queue") -> Any:
        parser = actions.add_parser(name, help=help_text)
        if operand:
            parser.add_argument(operand)
        add_connection_arguments(parser)
        parser.set_defaults(handler=handler(action_function))
        return parser

    listing = action("list", "queues that receive dead letters, by reason and source", _list, "")
    listing.add_argument("--json", action="store_true", help="print JSON")

    peek = action("peek", "show messages without consuming them", _peek)
    peek.add_argument("-n", type=int, default=20, help="how many (default 20)")
    peek.add_argument("--from", dest="start", type=int, default=0, help="from this offset")
    peek.add_argument("--json", action="store_true", help="print JSON lines")
    redrive = action("redrive", "move dead letters back, in the broker (a task)", _redrive)
    target = redrive.add_mutually_exclusive_group()
    target.add_argument(
        "--to-source", action="store_true", help="to the queue each died in (the default)"
    )
    target.add_argument("--exchange", help="publish to this exchange instead")
    redrive.add_argument("--routing-key", help="with --exchange (default: each one's own key)")
    redrive.add_argument("--reason", choices=REASONS, help="only those that died of this")
    redrive.add_argument("--source", help="only those that died in this queue")
    redrive.add_argument("--rate", type=_rate, help="at most N messages a second (N or N/s)")
    redrive.add_argument("--limit", type=int, help="move at most N messages")
    redrive.add_argument("--dry-run", action="store_true", help="only count what would move")
    redrive.add_argument("--detach", action="store_true", help="do not wait for the task")
    redrive.add_argument("--json", action="store_true", help="print the task as JSON")
    tasks = action("redrives", "list redrive tasks", _redrives, "")
    tasks.add_argument("--json", action="store_true", help="print JSON")
    for name, help_text, function in (
        ("watch", "follow a redrive task's progress", _watch),
        ("cancel", "stop a redrive task after its current batch", _cancel),
        ("resume", "run a cancelled or failed redrive task again", _resume),
    ):
        task = action(name, help_text, function, "id")
        task.add_argument("--json", action="store_true", help="print the task as JSON")
        if name == "resume":
            task.add_argument("--detach", action="store_true", help="do not wait for the task")
    action("export", "write every message as JSON lines to stdout", _export)
    action("import", "publish JSON lines from stdin to the queue again", _import)
    action("purge", "drop every ready message", _purge)


def _peek(args: Any) -> None:
    query = urllib.parse.urlencode({"count": args.n, "from": args.start})
    with request(args, "GET", "api", "dlq", args.vhost, args.queue, "messages", query=query) as r:
        lines = json.load(r)
    if args.json:
        for line in lines:
            print(json.dumps(line))
        return
    for line in lines:
        deaths = line["x_death"]
        first = deaths[-1] if deaths else None
        death = (
            f"{first['reason']} in {first['queue']} x{sum(d['count'] for d in deaths)} "
            f"since {first['time']}"
            if first
            else "no x-death"
        )
        preview = line["body_preview"][:PREVIEW_CHARS].replace("\n", " ")
        print(f"{line['offset']:>8}  {line['state']:<7}  {death}  {preview!r}")


def _export(args: Any) -> None:
    with request(args, "GET", "api", "dlq", args.vhost, args.queue, "export") as response:
        for line in response:
            sys.stdout.write(line.decode())


def _import(args: Any) -> None:
    data = sys.stdin.buffer.read()
    with request(
        args,
        "POST",
        "api",
        "dlq",
        args.vhost,
        args.queue,
        "import",
        data=data,
        content_type="application/x-ndjson",
    ) as response:
        result = json.load(response)
    print(f"imported {result['imported']}, refused {result['refused']}")


def _purge(args: Any) -> None:
    request(args, "DELETE", "api", "queues", args.vhost, args.queue, "contents").close()


def _console() -> Console:
    # Piped, a table keeps whole names on a line rather than fitting 80 columns.
    return Console(width=None if sys.stdout.isatty() else WIDE_COLUMNS)


def _rate(text: str) -> int:
    number = text.removesuffix("/s")
    if not number.isdigit() or int(number) < 1:
        raise ValueError(text)
    return int(number)


def _list(args: Any) -> None:
    queues = request_json(args, "GET", "api", "dlq", args.vhost)
    if args.json:
        print(json.dumps(queues, indent=2))
        return
    table = Table("queue", "messages", "ready", "unacked", "by reason", "by source", "fed by")
    for queue in queues:
        table.add_row(
            queue["name"],
            str(queue["messages"]),
            str(queue["messages_ready"]),
            str(queue["messages_unacknowledged"]),
            _counts(queue["by_reason"]),
            _counts(queue["by_source"]),
            ", ".join(queue["dead_letter_sources"]),
        )
    _console().print(table)


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{key} {count}" for key, count in sorted(counts.items()))


def _redrive(args: Any) -> None:
    body: dict[str, Any] = {"dry_run": args.dry_run}
    if args.exchange is not None:
        body["exchange"] = args.exchange
        if args.routing_key is not None:
            body["routing_key"] = args.routing_key
    elif args.routing_key is not None:
        raise CliError("--routing-key needs --exchange")
    for key in ("reason", "source", "rate", "limit"):
        if getattr(args, key) is not None:
            body[key] = getattr(args, key)
    task = request_json(args, "POST", "api", "dlq", args.vhost, args.queue, "redrive", body=body)
    _follow(args, task)


def _follow(args: Any, task: dict[str, Any]) -> None:
    """Show a task's progress until it stops (Ctrl-C cancels it), then its outcome."""
    if not getattr(args, "detach", False) and task["state"] == "running":
        try:
            task = _progress(args, task)
        except KeyboardInterrupt:
            task = request_json(args, "DELETE", "api", "dlq", "redrives", task["id"])
    if args.json:
        print(json.dumps(task, indent=2))
    else:
        print(_summary(task))
    if task["state"] == "failed":
        raise CliError(task["error"])


def _progress(args: Any, task: dict[str, Any]) -> dict[str, Any]:
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("moved {task.fields[moved]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        bar = progress.add_task(f"redrive {task['id']}", total=task["total"], moved=0)
        while task["state"] == "running":
            progress.update(
                bar, total=task["total"], completed=task["considered"], moved=task["moved"]
            )
            time.sleep(WATCH_INTERVAL_S)
            task = request_json(args, "GET", "api", "dlq", "redrives", task["id"])
    return task


def _summary(task: dict[str, Any]) -> str:
    verb = "would move" if task["dry_run"] else "moved"
    return (
        f"redrive {task['id']} of {task['queue']}: {task['state']}; {verb} {task['moved']}, "
        f"kept {task['kept']} (not selected), skipped {task['skipped']} (nowhere to go), "
        f"of {task['total']}" + (f"; {task['error']}" if task["error"] else "")
    )


def _redrives(args: Any) -> None:
    tasks = request_json(args, "GET", "api", "dlq", "redrives")
    if args.json:
        print(json.dumps(tasks, indent=2))
        return
    table = Table("id", "vhost", "queue", "state", "moved", "kept", "skipped", "total", "error")
    for task in tasks:
        table.add_row(
            task["id"],
            task["vhost"],
            task["queue"],
            task["state"] + (" (dry run)" if task["dry_run"] else ""),
            *(str(task[key]) for key in ("moved", "kept", "skipped", "total")),
            task["error"] or "",
        )
    _console().print(table)


def _watch(args: Any) -> None:
    _follow(args, request_json(args, "GET", "api", "dlq", "redrives", args.id))


def _cancel(args: Any) -> None:
    task = request_json(args, "DELETE", "api", "dlq", "redrives", args.id)
    print(json.dumps(task, indent=2) if args.json else _summary(task))


def _resume(args: Any) -> None:
    _follow(args, request_json(args, "POST", "api", "dlq", "redrives", args.id, "resume"))

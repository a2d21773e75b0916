"""`warren dlq peek|export|import|purge`: the DLQ tools against a running broker, through its
management API (as rabbitmqadmin works): `--url` (default $WARREN_MANAGEMENT_URL or
http://127.0.0.1:15672), `--user`/`--password` (default guest/guest).

    warren dlq peek orders.dlq -n 5            # browse without consuming: x-death, preview
    warren dlq export orders.dlq > dead.jsonl   # every message, exactly
    warren dlq import orders.dlq < dead.jsonl   # published again, byte for byte
    warren dlq purge orders.dlq
"""

from __future__ import annotations

import base64
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

URL_DEFAULT = "http://127.0.0.1:15672"
PREVIEW_CHARS = 60


def register(commands: Any) -> None:
    dlq = commands.add_parser("dlq", help="browse, export, import and purge dead-letter queues")
    actions = dlq.add_subparsers(dest="action", metavar="ACTION", required=True)

    def action(name: str, help_text: str, handler: Any) -> Any:
        parser = actions.add_parser(name, help=help_text)
        parser.add_argument("queue")
        parser.add_argument("--vhost", default="/")
        parser.add_argument("--url", default=os.environ.get("WARREN_MANAGEMENT_URL", URL_DEFAULT))
        parser.add_argument("--user", default="guest")
        parser.add_argument("--password", default="guest")
        parser.set_defaults(handler=lambda args: _run(handler, args))
        return parser

    peek = action("peek", "show messages without consuming them", _peek)
    peek.add_argument("-n", type=int, default=20, help="how many (default 20)")
    peek.add_argument("--from", dest="start", type=int, default=0, help="from this offset")
    peek.add_argument("--json", action="store_true", help="print JSON lines")
    action("export", "write every message as JSON lines to stdout", _export)
    action("import", "publish JSON lines from stdin to the queue again", _import)
    action("purge", "drop every ready message", _purge)


class CliError(Exception):
    pass


def _run(handler: Any, args: Any) -> int:
    try:
        handler(args)
    except CliError as error:
        print(f"Error: {error}", file=sys.stderr)
        return 1
    return 0


def _request(args: Any, method: str, *segments: str, query: str = "", data: bytes | None = None):
    path = "/".join(urllib.parse.quote(segment, safe="") for segment in segments)
    url = f"{args.url.rstrip('/')}/{path}" + (f"?{query}" if query else "")
    token = base64.b64encode(f"{args.user}:{args.password}".encode()).decode()
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Authorization", f"Basic {token}")
    if data is not None:
        request.add_header("Content-Type", "application/x-ndjson")
    try:
        return urllib.request.urlopen(request, timeout=60)
    except urllib.error.HTTPError as error:
        try:
            reason = json.loads(error.read()).get("reason", error.reason)
        except ValueError:
            reason = error.reason
        raise CliError(f"{error.code}: {reason}") from None
    except urllib.error.URLError as error:
        raise CliError(f"cannot reach {args.url}: {error.reason}") from None


def _peek(args: Any) -> None:
    query = urllib.parse.urlencode({"count": args.n, "from": args.start})
    with _request(args, "GET", "api", "dlq", args.vhost, args.queue, "messages", query=query) as r:
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
    with _request(args, "GET", "api", "dlq", args.vhost, args.queue, "export") as response:
        for line in response:
            sys.stdout.write(line.decode())


def _import(args: Any) -> None:
    data = sys.stdin.buffer.read()
    with _request(
        args, "POST", "api", "dlq", args.vhost, args.queue, "import", data=data
    ) as response:
        result = json.load(response)
    print(f"imported {result['imported']}, refused {result['refused']}")


def _purge(args: Any) -> None:
    _request(args, "DELETE", "api", "queues", args.vhost, args.queue, "contents").close()

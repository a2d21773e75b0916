"""What every `warren` command that acts on a running broker shares: the connection options
(`--url`, default $WARREN_MANAGEMENT_URL or http://127.0.0.1:15672; `--user`/`--password`,
default guest/guest; `--vhost`; `--cacertfile`, the CA bundle an https:// URL's certificate
is verified against, default $WARREN_MANAGEMENT_CACERTFILE or the system's) and one request
through the management API, whose errors become a one-line message and exit status 1 (as
rabbitmqadmin reports them)."""

from __future__ import annotations

import base64
import json
import os
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

URL_DEFAULT = "http://127.0.0.1:15672"
TIMEOUT_S = 60


class CliError(Exception):
    pass


class ApiError(CliError):
    """The API refused the request: its HTTP status and RabbitMQ's `reason`."""

    def __init__(self, status: int, reason: Any) -> None:
        super().__init__(f"{status}: {reason}")
        self.status = status
        self.reason = reason


def add_connection_arguments(parser: Any, vhost_default: str | None = "/") -> None:
    """`--vhost` (None: the command means every vhost), and the login arguments."""
    parser.add_argument("--vhost", default=vhost_default)
    add_login_arguments(parser)


def add_login_arguments(parser: Any, url_parser: Any = None) -> None:
    """`--url` (on `url_parser` if given: a mutually exclusive group, say), `--user`,
    `--password`."""
    (url_parser or parser).add_argument(
        "--url",
        default=os.environ.get("WARREN_MANAGEMENT_URL", URL_DEFAULT),
        help=f"the broker's management API (default: $WARREN_MANAGEMENT_URL or {URL_DEFAULT})",
    )
    parser.add_argument("--user", default="guest", help="the API user (default guest)")
    parser.add_argument("--password", default="guest", help="its password (default guest)")
    parser.add_argument(
        "--cacertfile",
        default=os.environ.get("WARREN_MANAGEMENT_CACERTFILE"),
        help="with an https:// URL: the CA bundle (PEM) its certificate is verified against "
        "(default: $WARREN_MANAGEMENT_CACERTFILE or the system's CAs)",
    )


def handler(action: Callable[[Any], None]) -> Callable[[Any], int]:
    """An argparse handler running `action(args)`: 0, or 1 with the error on stderr."""

    def run(args: Any) -> int:
        try:
            action(args)
        except CliError as error:
            print(f"Error: {error}", file=sys.stderr)
            return 1
        return 0

    return run


def request(
    args: Any,
    method: str,
    *segments: str,
    query: str = "",
    data: bytes | None = None,
    content_type: str = "application/json",
    headers: dict[str, str] | None = None,
):
    """The open response of METHOD on the path of `segments` (each percent-encoded)."""
    path = "/".join(urllib.parse.quote(segment, safe="") for segment in segments)
    url = f"{args.url.rstrip('/')}/{path}" + (f"?{query}" if query else "")
    token = base64.b64encode(f"{args.user}:{args.password}".encode()).decode()
    sent = urllib.request.Request(url, data=data, method=method)
    sent.add_header("Authorization", f"Basic {token}")
    if data is not None:
        sent.add_header("Content-Type", content_type)
    for name, value in (headers or {}).items():
        sent.add_header(name, value)
    cacertfile = getattr(args, "cacertfile", None)
    try:
        context = ssl.create_default_context(cafile=cacertfile) if cacertfile else None
    except OSError as error:
        raise CliError(f"cannot read the CA bundle {cacertfile}: {error}") from None
    try:
        return urllib.request.urlopen(sent, timeout=TIMEOUT_S, context=context)
    except urllib.error.HTTPError as error:
        try:
            reason = json.loads(error.read()).get("reason", error.reason)
        except ValueError:
            reason = error.reason
        raise ApiError(error.code, reason) from None
    except urllib.error.URLError as error:
        raise CliError(f"cannot reach {args.url}: {error.reason}") from None


def request_json(args: Any, method: str, *segments: str, query: str = "", body: Any = None):
    """The decoded JSON answer of METHOD (None for an empty answer, as 204)."""
    data = None if body is None else json.dumps(body).encode()
    with request(args, method, *segments, query=query, data=data) as response:
        raw = response.read()
    return json.loads(raw) if raw else None

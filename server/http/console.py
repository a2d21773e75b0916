"""The web console's files (``www/``), served at ``/`` of the management listener as
RabbitMQ's management plugin serves its UI beside ``/api/``.

The files are read once, when the listener starts, into a table keyed by their path under
``www/``: a request is looked up in that table and never reaches the file system, so no path
can name a file outside it. Paths are answered as RabbitMQ 3.10 answers them: ``.`` and
``..`` segments resolve within the directory (one that climbs above it is 404), a segment
that decodes to a separator or NUL is 400, a directory is 403, anything else missing is the
API's JSON 404; only GET and HEAD (405 otherwise, with ``Allow``).

The page itself holds no server logic: everything it shows comes from the JSON API.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from aiohttp import web

from .errors import object_not_found

WWW_DIR = Path(__file__).resolve().parent / "www"
INDEX = "index.html"
ALLOWED = "HEAD, GET, OPTIONS"
# What a browser may do with the page: its own scripts, styles and API, nothing inline, and
# no framing (the page holds credentials).
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; object-src 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
# Named here rather than by the system's mime.types, which varies between machines (a module
# script must come as JavaScript).
CONTENT_TYPES = {
    ".html": "text/html",
    ".css": "text/css",
    ".js": "text/javascript",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
TEXT_TYPES = frozenset(("text/html", "text/css", "text/javascript", "image/svg+xml"))
BAD_SEGMENT_CHARS = frozenset("/\\\0")


@dataclass(frozen=True, slots=True)
class StaticFile:
    body: bytes
    content_type: str

    @property
    def charset(self) -> str | None:
        return "utf-8" if self.content_type in TEXT_TYPES else None


@dataclass(frozen=True, slots=True)
class ConsoleFiles:
    files: dict[str, StaticFile]
    directories: frozenset[str]

    @classmethod
    def load(cls, root: Path = WWW_DIR) -> ConsoleFiles:
        files: dict[str, StaticFile] = {}
        directories = {""}
        for path in sorted(root.rglob("*")):
            relative = path.relative_to(root).as_posix()
            if path.is_dir():
                directories.add(relative)
            elif path.suffix in CONTENT_TYPES:
                files[relative] = StaticFile(path.read_bytes(), CONTENT_TYPES[path.suffix])
        assert INDEX in files, f"the console's {INDEX} is missing from {root}"
        return cls(files, frozenset(directories))

    def respond(self, method: str, segments: list[str]) -> web.StreamResponse:
        """The answer to `method` on the path of these (percent-decoded) segments."""
        if method == "OPTIONS":
            return web.Response(status=200, headers={"Allow": ALLOWED})
        if method not in ("GET", "HEAD"):
            return web.Response(status=405, headers={"Allow": ALLOWED})
        if any(BAD_SEGMENT_CHARS.intersection(segment) for segment in segments):
            return web.Response(status=400)
        relative = resolve(segments)
        if relative is None:
            raise object_not_found()
        found = self.files.get(relative or INDEX)
        if found is not None:
            return web.Response(
                body=found.body,
                content_type=found.content_type,
                charset=found.charset,
                headers=SECURITY_HEADERS,
            )
        if relative in self.directories:
            return web.Response(status=403)
        raise object_not_found()


def resolve(segments: list[str]) -> str | None:
    """The path the segments name under the console's directory ("" for the directory
    itself), or None when ``..`` climbs above it."""
    kept: list[str] = []
    for segment in segments:
        if segment in ("", "."):
            continue
        if segment == "..":
            if not kept:
                return None
            kept.pop()
        else:
            kept.append(segment)
    return str(PurePosixPath(*kept)) if kept else ""

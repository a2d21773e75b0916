"""The web console's files at / of the management listener, over a real socket: every file is
served with its type and the page's security headers, and paths are answered as RabbitMQ 3.10
answers them, so none reaches a file outside the console's directory. (The page in a browser
is test_http_console_browser.py; the same path answers against RabbitMQ are in compat_tests.)"""

from __future__ import annotations

import pytest
from http_api import HttpApi

from warrenmq.server.http.console import WWW_DIR, ConsoleFiles, resolve

OBJECT_NOT_FOUND = {"error": "Object Not Found", "reason": "Not Found"}


@pytest.fixture
def api(module_broker) -> HttpApi:
    return HttpApi(module_broker.management_url)


def shipped_files() -> list[str]:
    return sorted(p.relative_to(WWW_DIR).as_posix() for p in WWW_DIR.rglob("*") if p.is_file())


def test_the_page_is_at_the_root_without_a_login(api):
    reply = api.get("/", auth=False)
    assert reply.status == 200
    assert reply.headers["content-type"] == "text/html; charset=utf-8"
    assert b'<script type="module" src="js/main.js">' in reply.raw
    assert api.get("/index.html", auth=False).raw == reply.raw


@pytest.mark.parametrize("relative", shipped_files())
def test_every_file_of_the_console_is_served_with_its_type(api, relative):
    reply = api.get("/" + relative, auth=False)
    assert reply.status == 200
    assert reply.raw == (WWW_DIR / relative).read_bytes()
    expected = {"html": "text/html", "css": "text/css", "js": "text/javascript"}.get(
        relative.rsplit(".", 1)[-1], "image/svg+xml"
    )
    assert reply.headers["content-type"].split(";")[0] == expected
    assert reply.headers["x-content-type-options"] == "nosniff"
    assert "default-src 'self'" in reply.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in reply.headers["content-security-policy"]


@pytest.mark.parametrize(
    "target",
    [
        "/../console.py",
        "/%2E%2E/management.py",
        "/js/../../console.py",
        "/js/views/../../../../../README.md",
        "/js/../../server/http/console.py",
    ],
)
def test_files_beside_the_console_are_out_of_reach(api, target):
    """(The answers to other paths, and RabbitMQ's to the same, are compat_tests' own.)"""
    reply = api.get(target, auth=False)
    assert (reply.status, reply.json) == (404, OBJECT_NOT_FOUND)


def test_head_gives_the_length_without_the_body(api):
    head = api.request("HEAD", "/index.html", auth=False)
    assert (head.status, head.raw) == (200, b"")
    assert int(head.headers["content-length"]) == (WWW_DIR / "index.html").stat().st_size


def test_unknown_api_paths_stay_json_404s(api):
    for target in ("/api/nope", "/api/index.html"):
        reply = api.get(target)
        assert (reply.status, reply.json) == (404, OBJECT_NOT_FOUND)


def test_resolve_never_leaves_the_directory():
    assert resolve(["", ""]) == ""
    assert resolve(["js", "..", "index.html"]) == "index.html"
    assert resolve(["js", ".", "main.js"]) == "js/main.js"
    assert resolve([".."]) is None
    assert resolve(["js", "..", ".."]) is None


def test_the_table_holds_exactly_the_shipped_files():
    files = ConsoleFiles.load()
    assert sorted(files.files) == shipped_files()
    assert files.directories == {"", "js", "js/views"}

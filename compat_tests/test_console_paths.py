"""The web UI's files beside the management API, as RabbitMQ 3.10's management plugin serves
them: the page at / without a login, paths that climb out of its directory or name nothing
answered with the API's JSON 404, a separator or NUL inside a segment 400, a directory 403,
only GET and HEAD. (Each broker ships its own page; the answers to paths are the same.)"""

from __future__ import annotations

import pytest

OBJECT_NOT_FOUND = {"error": "Object Not Found", "reason": "Not Found"}


def test_the_page_is_served_at_the_root_without_a_login(management):
    reply = management.get("/", auth=False)
    assert reply.status == 200
    assert reply.headers["content-type"].split(";")[0] == "text/html"
    assert reply.raw.lstrip().lower().startswith(b"<!doctype html>")
    assert management.get("/index.html", auth=False).raw == reply.raw
    assert management.get("/js/../index.html", auth=False).raw == reply.raw


@pytest.mark.parametrize(
    "target",
    [
        "/../etc/passwd",
        "/%2e%2e/etc/passwd",
        "/js/%2e%2e/%2e%2e/etc/passwd",
        "/js/../../../../etc/passwd",
        "/no-such-page.html",
        "/api/no-such-route",
        "/api/no/such/route",
    ],
)
def test_paths_outside_the_page_or_missing_are_json_404s(management, target):
    reply = management.get(target, auth=False)
    assert (reply.status, reply.json) == (404, OBJECT_NOT_FOUND)


@pytest.mark.parametrize("target", ["/js/..%2f..%2fetc/passwd", "/js/..%5c..%5cx", "/js/a%00b"])
def test_a_segment_with_a_separator_or_nul_is_400(management, target):
    assert management.get(target, auth=False).status == 400


@pytest.mark.parametrize("target", ["/js", "/js/"])
def test_a_directory_is_403(management, target):
    assert management.get(target, auth=False).status == 403


def test_the_page_is_read_only(management):
    reply = management.post("/index.html", {}, auth=False)
    assert (reply.status, reply.headers["allow"]) == (405, "HEAD, GET, OPTIONS")
    assert management.request("HEAD", "/", auth=False).status == 200

"""The management API client: compat_tests' own (compat_tests/management_client.py), shared so
that the unit tests and the compat tests speak HTTP the same way; the unit tests' users, and
`eventually` (a value read until it is the one expected)."""

import sys
import time
import uuid
from pathlib import Path

# compat_tests is a folder of test modules, not a package; its helpers are found by path.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "compat_tests"))

from management_client import HttpApi, Reply, path  # noqa: E402

__all__ = ["HttpApi", "Reply", "add_user", "eventually", "name", "path"]


def name(prefix: str = "q") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def add_user(api: HttpApi, tags: str, vhost_permissions: dict[str, tuple[str, str, str]]):
    """A new user with `tags` and permissions; returns an HttpApi logged in as them."""
    user = name("user")
    assert api.put(path("api", "users", user), {"password": "pw", "tags": tags}).status == 201
    for vhost, (configure, write, read) in vhost_permissions.items():
        granted = {"configure": configure, "write": write, "read": read}
        assert api.put(path("api", "permissions", vhost, user), granted).status == 201
    return api.as_user(user, "pw")


def eventually(read, expected, timeout_s: float = 10.0):
    """`read()` once it equals `expected` (acks are committed as the broker runs), or its
    last value."""
    deadline = time.monotonic() + timeout_s
    while (value := read()) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return value

"""`warren users|vhosts|policies` through a running broker's management API (the default;
`--data-dir` edits a data dir instead, see `admin_cli.py`).

`ApiAdmin` offers what `admin_cli.DataDirAdmin` offers, with the same refusals where the API
lets it tell them apart (a user or vhost that exists already or is missing), so a command
prints the same either way. The API hashes passwords; the CLI sends them over the connection
`--url` names (use https beyond loopback).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from warrenmq.server.metadata.commands import SetPolicy

from .api_client import ApiError, CliError, request_json


class ApiAdmin:
    def __init__(self, args: Any) -> None:
        self._args = args

    def _call(self, method: str, *segments: str, body: Any = None, missing: str = "") -> Any:
        """One request; a 404 becomes `missing` (when given), a 400 its reason alone (the
        text the data dir's commands print)."""
        try:
            return request_json(self._args, method, *segments, body=body)
        except ApiError as error:
            if error.status == 404 and missing:
                raise CliError(missing) from None
            if error.status == 400:
                raise CliError(str(error.reason).rstrip()) from None
            raise

    def _exists(self, *segments: str) -> bool:
        try:
            request_json(self._args, "GET", *segments)
        except ApiError as error:
            if error.status == 404:
                return False
            raise
        return True

    def _user(self, name: str) -> dict[str, Any]:
        return self._call("GET", "api", "users", name, missing=f"no user '{name}'")

    # -- users ---------------------------------------------------------------------------------

    async def add_user(self, name: str, password: str, tags: Sequence[str]) -> None:
        if self._exists("api", "users", name):
            raise CliError(f"user '{name}' already exists")
        self._call("PUT", "api", "users", name, body={"password": password, "tags": list(tags)})

    async def delete_user(self, name: str) -> None:
        self._call("DELETE", "api", "users", name, missing=f"no user '{name}'")

    async def change_password(self, name: str, password: str) -> None:
        user = self._user(name)
        self._call("PUT", "api", "users", name, body={"password": password, "tags": user["tags"]})

    async def set_tags(self, name: str, tags: Sequence[str]) -> None:
        user = self._user(name)
        # The user's own hash goes back unchanged: a PUT always sets a password.
        body = {
            "password_hash": user["password_hash"],
            "hashing_algorithm": user["hashing_algorithm"],
            "tags": list(tags),
        }
        self._call("PUT", "api", "users", name, body=body)

    async def users(self) -> list[dict[str, Any]]:
        return [
            {"name": user["name"], "tags": list(user["tags"])}
            for user in self._call("GET", "api", "users")
        ]

    # -- permissions ---------------------------------------------------------------------------

    async def set_permissions(
        self, user: str, vhost: str, configure: str, write: str, read: str
    ) -> None:
        body = {"configure": configure, "write": write, "read": read}
        self._call("PUT", "api", "permissions", vhost, user, body=body)

    async def clear_permissions(self, user: str, vhost: str) -> None:
        missing = f"no permissions for user '{user}' in vhost '{vhost}'"
        self._call("DELETE", "api", "permissions", vhost, user, missing=missing)

    async def permissions(self, vhost: str | None) -> list[dict[str, Any]]:
        if vhost is None:
            listed = self._call("GET", "api", "permissions")
        else:
            listed = self._call(
                "GET", "api", "vhosts", vhost, "permissions", missing=f"no vhost '{vhost}'"
            )
        keys = ("user", "vhost", "configure", "write", "read")
        return [{key: item[key] for key in keys} for item in listed]

    # -- vhosts --------------------------------------------------------------------------------

    async def add_vhost(self, name: str, description: str, tags: Sequence[str]) -> None:
        if self._exists("api", "vhosts", name):
            raise CliError(f"vhost '{name}' already exists")
        body = {"description": description, "tags": list(tags)}
        self._call("PUT", "api", "vhosts", name, body=body)

    async def delete_vhost(self, name: str) -> None:
        self._call("DELETE", "api", "vhosts", name, missing=f"no vhost '{name}'")

    async def vhosts(self) -> list[dict[str, Any]]:
        return [
            {"name": v["name"], "description": v["description"], "tags": list(v["tags"])}
            for v in self._call("GET", "api", "vhosts")
        ]

    # -- policies ------------------------------------------------------------------------------

    async def set_policy(self, policy: SetPolicy) -> None:
        body = {
            "pattern": policy.pattern,
            "definition": policy.definition,
            "priority": policy.priority,
            "apply-to": policy.apply_to,
        }
        missing = f"no vhost '{policy.vhost}'"
        self._call("PUT", "api", "policies", policy.vhost, policy.name, body=body, missing=missing)

    async def clear_policy(self, vhost: str, name: str) -> None:
        # rabbitmqctl clear_policy's text for a policy (or vhost) that is not there.
        self._call("DELETE", "api", "policies", vhost, name, missing="Parameter does not exist")

    async def policies(self, vhost: str | None) -> list[dict[str, Any]]:
        if vhost is None:
            return self._call("GET", "api", "policies")
        return self._call("GET", "api", "policies", vhost, missing=f"no vhost '{vhost}'")

    # -- limits --------------------------------------------------------------------------------

    async def set_limits(self, scope: str, name: str, limits: dict[str, Any]) -> None:
        """Replace the limits (validated already) one by one: the API sets one at a time."""
        root = f"{scope}-limits"
        missing = f"no {scope} '{name}'"
        self._call("GET", "api", f"{scope}s", name, missing=missing)
        current = self._call("GET", "api", root, name, missing=missing)
        for key in current[0]["value"] if current else {}:
            if key not in limits:
                self._call("DELETE", "api", root, name, key)
        for key, value in limits.items():
            self._call("PUT", "api", root, name, key, body={"value": value}, missing=missing)

    async def limits(self, scope: str) -> list[dict[str, Any]]:
        return self._call("GET", "api", f"{scope}-limits")

"""A plain HTTP client of the management API, as rabbitmqadmin is one: one request, the status,
the headers and the body (decoded from JSON when it is JSON). The compat tests' own, as pika is
their AMQP client; the unit tests have the same one in tests/http_api.py."""

from __future__ import annotations

import base64
import http.client
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    raw: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.raw)


def path(*segments: str) -> str:
    """A path from segments, each percent-encoded as RabbitMQ's clients do ("/" -> "%2F")."""
    return "/" + "/".join(quote(segment, safe="") for segment in segments)


class HttpApi:
    def __init__(self, base_url: str, user: str = "guest", password: str = "guest") -> None:
        parts = urlsplit(base_url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.user = user
        self.password = password

    def as_user(self, user: str, password: str) -> HttpApi:
        return HttpApi(f"http://{self.host}:{self.port}", user, password)

    def request(
        self,
        method: str,
        target: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        headers: dict[str, str] | None = None,
        auth: bool = True,
    ) -> Reply:
        sent = dict(headers or {})
        if auth:
            token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode()
            sent["Authorization"] = "Basic " + token
        data = raw if raw is not None else None if body is None else json.dumps(body).encode()
        if data is not None:
            sent.setdefault("Content-Type", "application/json")
        connection = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            connection.request(method, target, data, sent)
            response = connection.getresponse()
            return Reply(
                response.status,
                {key.lower(): value for key, value in response.getheaders()},
                response.read(),
            )
        finally:
            connection.close()

    def get(self, target: str, **kwargs) -> Reply:
        return self.request("GET", target, **kwargs)

    def put(self, target: str, body: Any = None, **kwargs) -> Reply:
        return self.request("PUT", target, body, **kwargs)

    def post(self, target: str, body: Any = None, **kwargs) -> Reply:
        return self.request("POST", target, body, **kwargs)

    def delete(self, target: str, **kwargs) -> Reply:
        return self.request("DELETE", target, **kwargs)

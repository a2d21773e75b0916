"""What the data source asks the broker, over its HTTP listener (the management port): a
topic's partitions and offsets, stored batches, and publishes through the topic API. Basic
auth with a broker user, as the management API takes it. Picklable: Spark ships it to the
executors inside the reader and the writer.

`url` names one or more nodes, comma-separated (`http://user:pass@host:15672,http://...`):
each request goes to the first that answers, the way a Kafka client walks its bootstrap
servers.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

REQUEST_TIMEOUT_S = 60.0
FETCH_BYTES = 4 << 20
FIRST_OFFSET_HEADER = "X-Warren-First-Offset"


class WarrenError(Exception):
    """A request the broker refused, or that no node answered."""


class OffsetOutOfRange(WarrenError):
    """The offset asked for is below the partition's first retained one: retention deleted
    the records between them."""

    def __init__(self, message: str, first_offset: int) -> None:
        super().__init__(message)
        self.first_offset = first_offset


@dataclass(frozen=True)
class Partition:
    index: int
    stream: str
    first_offset: int
    next_offset: int
    offset_for_timestamp: int | None = None


@dataclass(frozen=True)
class Node:
    base: str
    authorization: str


def nodes_of(url: str, user: str | None, password: str | None) -> tuple[Node, ...]:
    """The nodes `url` lists, each with its Basic credentials (the URL's own, else `user` and
    `password`, else guest)."""
    found = []
    for part in url.split(","):
        parsed = urllib.parse.urlsplit(part.strip())
        if not parsed.scheme or not parsed.hostname:
            raise ValueError(f"url must be http(s)://[user:password@]host:port, got {part!r}")
        name = urllib.parse.unquote(parsed.username) if parsed.username else user or "guest"
        secret = urllib.parse.unquote(parsed.password) if parsed.password else password
        credentials = f"{name}:{secret if secret is not None else 'guest'}".encode()
        port = f":{parsed.port}" if parsed.port else ""
        found.append(
            Node(
                f"{parsed.scheme}://{parsed.hostname}{port}{parsed.path.rstrip('/')}",
                "Basic " + base64.b64encode(credentials).decode("ascii"),
            )
        )
    return tuple(found)


@dataclass(frozen=True)
class Client:
    nodes: tuple[Node, ...]
    vhost: str = "/"

    def _request(
        self, path: str, query: dict[str, Any], body: bytes | None = None
    ) -> tuple[bytes, Any]:
        query = {"vhost": self.vhost, **query}
        target = f"{path}?{urllib.parse.urlencode(query)}"
        failures = []
        for node in self.nodes:
            request = urllib.request.Request(
                node.base + target,
                data=body,
                method="GET" if body is None else "POST",
                headers={"Authorization": node.authorization, "Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
                    return response.read(), response.headers
            except urllib.error.HTTPError as error:
                payload = error.read()
                if error.code == 416:
                    raise OffsetOutOfRange(
                        _reason(payload), int(error.headers[FIRST_OFFSET_HEADER])
                    ) from None
                raise WarrenError(
                    f"{error.code} from {node.base}{path}: {_reason(payload)}"
                ) from None
            except (urllib.error.URLError, OSError) as error:
                failures.append(f"{node.base}: {error}")
        raise WarrenError("no node answered: " + "; ".join(failures))

    def partitions(self, topic: str, timestamp_ms: int | None = None) -> list[Partition]:
        query = {} if timestamp_ms is None else {"timestamp": timestamp_ms}
        data, _ = self._request(f"/topics/{_quoted(topic)}/partitions", query)
        return [
            Partition(
                item["partition"],
                item["stream"],
                item["first_offset"],
                item["next_offset"],
                item.get("offset_for_timestamp"),
            )
            for item in json.loads(data)["partitions"]
        ]

    def batches(self, topic: str, partition: int, offset: int, max_bytes: int = FETCH_BYTES):
        """Stored batches from the one holding `offset` (empty at the end); raises
        OffsetOutOfRange below the first retained offset."""
        data, _ = self._request(
            f"/topics/{_quoted(topic)}/batches",
            {"partition": partition, "offset": offset, "max_bytes": max_bytes},
        )
        return data

    def publish(self, topic: str, message: dict[str, Any]) -> list[dict[str, Any]]:
        """POST /topics/T/messages: the records' {"partition", "offset"} once fsynced."""
        data, _ = self._request(
            f"/topics/{_quoted(topic)}/messages", {}, json.dumps(message).encode()
        )
        return json.loads(data)["offsets"]


def _quoted(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def _reason(payload: bytes) -> str:
    try:
        return str(json.loads(payload).get("reason"))
    except (ValueError, AttributeError):
        return payload[:200].decode("utf-8", "replace")

"""Dead letters as people and scripts read them: a message's decoded x-death and properties,
and a JSON line that carries the message exactly (for `warren dlq peek` and `export`)."""

from __future__ import annotations

import base64
import datetime
import decimal
from typing import Any

from warrenmq.amqp import frames

BODY_PREVIEW_BYTES = 256


def _plain(value: Any) -> Any:
    """A decoded AMQP field value as JSON can hold it."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, datetime.datetime):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, decimal.Decimal):
        return str(value)
    return value


def describe(
    offset: int,
    exchange: bytes,
    routing_key: bytes,
    properties: bytes,
    body: bytes,
    *,
    in_flight: bool,
    redelivered: bool,
) -> dict[str, Any]:
    """One message as `peek` shows it: where it was published, its properties and headers
    decoded, its x-death entries (newest first), a body preview, and the exact bytes of its
    properties and body (base64) so that `import` can publish it again unchanged."""
    decoded = frames.decode_properties(properties)
    fields = {
        name: _plain(getattr(decoded, name))
        for name in (
            "content_type",
            "content_encoding",
            "delivery_mode",
            "priority",
            "correlation_id",
            "reply_to",
            "expiration",
            "message_id",
            "timestamp",
            "message_type",
            "user_id",
            "app_id",
        )
        if getattr(decoded, name) is not None
    }
    headers = decoded.headers or {}
    deaths = headers.get("x-death")
    return {
        "offset": offset,
        "state": "unacked" if in_flight else "ready",
        "redelivered": redelivered,
        "exchange": exchange.decode("utf-8", "replace"),
        "routing_key": routing_key.decode("utf-8", "replace"),
        "properties": fields,
        "headers": _plain({k: v for k, v in headers.items() if k != "x-death"}),
        "x_death": _plain(deaths) if isinstance(deaths, list) else [],
        "body_bytes": len(body),
        "body_preview": body[:BODY_PREVIEW_BYTES].decode("utf-8", "replace"),
        "raw_properties": base64.b64encode(properties).decode(),
        "raw_body": base64.b64encode(body).decode(),
    }


def raw_message(line: dict[str, Any]) -> tuple[str, bytes, bytes]:
    """(routing key, property bytes, body) of an exported line, as it was stored."""
    return (
        line["routing_key"],
        base64.b64decode(line["raw_properties"], validate=True),
        base64.b64decode(line["raw_body"], validate=True),
    )

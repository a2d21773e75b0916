"""JSON to AMQP values and back, as RabbitMQ's management API converts them.

Into AMQP (rabbit_misc:to_amqp_table): an object is a table, an array an array, a string a
longstr, an integer a long, another number a double, true/false a bool; null is refused.
Out of AMQP (rabbit_misc:amqp_table): strings as they are (bytes that are not UTF-8 as
"Not UTF-8, base64 is: ..."), decimals as numbers, timestamps as seconds.

Request bodies are decoded as rabbit_mgmt_util:decode does: an empty body (or ``null``) is
an empty object, anything but an object is refused with RabbitMQ's reasons.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import math
import urllib.parse
from collections.abc import Mapping
from typing import Any

from pamqp import commands

from warrenmq.server.metadata import encoding
from warrenmq.server.metadata.records import binding_arguments_digest

from .errors import ApiError, bad_request

# The JSON a request may nest (a table in a table ...): as deep as a stored argument may be.
DEPTH_MAX = encoding.DEPTH_MAX
DOUBLY_ENCODED = (
    "invalid payload: the request body JSON-decoded to a string. Is the input doubly-JSON-encoded?"
)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def decode_body(body: bytes) -> dict[str, Any]:
    """A request body as an object (rabbit_mgmt_util:decode)."""
    if body.strip() in (b"", b"null", b"undefined"):
        return {}
    try:
        value = json.loads(body, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        raise bad_request("not_json") from None
    if isinstance(value, dict):
        return value
    if isinstance(value, bool) or value is None:
        return {}
    if isinstance(value, str):
        raise bad_request(DOUBLY_ENCODED)
    raise bad_request("not_json")


def to_amqp(value: Any, depth: int = 0) -> Any:
    """A JSON value as an AMQP field value (400 for null, or nesting beyond DEPTH_MAX)."""
    if depth > DEPTH_MAX:
        raise bad_request(f"arguments nested deeper than {DEPTH_MAX}")
    if value is None:
        raise bad_request("null_not_allowed")
    if isinstance(value, dict):
        return {str(key): to_amqp(item, depth + 1) for key, item in value.items()}
    if isinstance(value, list):
        return [to_amqp(item, depth + 1) for item in value]
    return value


def to_amqp_table(value: Any) -> dict[str, Any]:
    """`arguments` of a request: an object (a missing one is empty)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad_request(f"arguments must be an object, got {json_type(value)}")
    return to_amqp(value)


def to_json(value: Any) -> Any:
    """An AMQP field value (as pamqp decodes it) as JSON."""
    if isinstance(value, bool) or value is None or isinstance(value, int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return "Not UTF-8, base64 is: " + base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, datetime.datetime):
        return int(value.timestamp())
    if isinstance(value, Mapping):
        return {str(key): to_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(item) for item in value]
    return str(value)


def json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def parse_bool(value: Any, default: bool) -> bool:
    """rabbit_misc:parse_bool: true/false, or their strings; anything else is refused."""
    if value is None:
        return default
    if value is True or value == "true":
        return True
    if value is False or value == "false":
        return False
    raise ApiError(400, "bad_request", ["not_boolean", value])


def text(body: Mapping[str, Any], key: str, default: str | None = None) -> str:
    """A string field of a request body (400 when it is something else, or missing without
    a default)."""
    value = body.get(key, default)
    if value is None:
        raise bad_request(f"[{{key_missing,{key}}}]")
    if not isinstance(value, str):
        raise bad_request(f"{key} must be a string, got {json_type(value)}")
    return value


def integer(body: Mapping[str, Any], key: str, default: int | None = None) -> int:
    """An integer field, given as a number (truncated) or a string of digits
    (rabbit_misc:parse_int)."""
    value = body.get(key, default)
    if value is None:
        raise bad_request(f"[{{key_missing,{key}}}]")
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return int(value)
    raise ApiError(400, "bad_request", ["not_integer", value])


# -- bindings' properties keys (rabbit_mgmt_format:pack_binding_props) -------------------------


def quote_binding(name: str) -> str:
    """rabbit_http_util:quote_plus, with "~" escaped too (it separates the key's parts)."""
    return urllib.parse.quote_plus(name, safe="").replace("~", "%7E")


def arguments_hash(arguments: Mapping[str, Any] | None) -> str:
    """A short, stable text for a binding's arguments: equal exactly when the broker treats
    two argument tables as the same binding (RabbitMQ hashes the Erlang term instead)."""
    digest = bytes.fromhex(binding_arguments_digest(arguments or {}))[:4]
    return base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


def properties_key(routing_key: str, arguments: Mapping[str, Any] | None) -> str:
    if arguments:
        return quote_binding(routing_key) + "~" + quote_binding(arguments_hash(arguments))
    return quote_binding(routing_key) if routing_key else "~"


def split_properties_key(key: str) -> tuple[str, str | None]:
    """(routing key, arguments hash or None) of a properties key; 400 when it is not one."""
    parts = key.split("~")
    if len(parts) > 2:
        raise bad_request(f"{{too_many_tokens,{json.dumps(key)}}}")
    routing_key = urllib.parse.unquote_plus(parts[0])
    hashed = parts[1] if len(parts) == 2 else ""
    return routing_key, (urllib.parse.unquote_plus(hashed) if hashed else None)


# -- message properties (rabbit_mgmt_format:basic_properties / to_basic_properties) ------------

_PROPERTY_NAMES = {
    "content_type": "content_type",
    "content_encoding": "content_encoding",
    "headers": "headers",
    "delivery_mode": "delivery_mode",
    "priority": "priority",
    "correlation_id": "correlation_id",
    "reply_to": "reply_to",
    "expiration": "expiration",
    "message_id": "message_id",
    "timestamp": "timestamp",
    "type": "message_type",
    "user_id": "user_id",
    "app_id": "app_id",
    "cluster_id": "cluster_id",
}
_INTEGER_PROPERTIES = ("delivery_mode", "priority", "timestamp")
_OCTET_MAX = 255
_TIMESTAMP_MAX = 253402300799  # 9999-12-31T23:59:59Z: what a datetime can hold


def properties_to_json(properties: Any) -> dict[str, Any]:
    """A message's decoded properties as RabbitMQ's JSON (set ones only)."""
    shown: dict[str, Any] = {}
    for name, attribute in _PROPERTY_NAMES.items():
        value = getattr(properties, attribute)
        if value is None or (attribute == "cluster_id" and value == ""):
            continue
        shown[name] = to_json(value)
    return shown


def properties_from_json(given: Any) -> commands.Basic.Properties:
    """Publish's `properties` object as message properties (400 as RabbitMQ refuses them)."""
    if not isinstance(given, dict):
        raise bad_request(f"properties must be an object, got {json_type(given)}")
    values: dict[str, Any] = {}
    for name, value in given.items():
        attribute = _PROPERTY_NAMES.get(name)
        if attribute is None:
            continue
        if name == "headers":
            values[attribute] = to_amqp_table(value)
        elif name in _INTEGER_PROPERTIES:
            if isinstance(value, bool) or not isinstance(value, int):
                raise bad_request(f"{{not_int,{name}}}")
            limit = _TIMESTAMP_MAX if name == "timestamp" else _OCTET_MAX
            if not 0 <= value <= limit:
                raise bad_request(f"{name} out of range: {value}")
            values[attribute] = (
                datetime.datetime.fromtimestamp(value, datetime.UTC)
                if name == "timestamp"
                else value
            )
        elif isinstance(value, str):
            if len(value.encode()) > _OCTET_MAX:
                raise bad_request(f"{name} longer than {_OCTET_MAX} bytes")
            values[attribute] = value
        else:
            raise bad_request(f"{{not_string,{name}}}")
    return commands.Basic.Properties(**values)

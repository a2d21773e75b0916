"""/api/exchanges: list, show, declare (PUT), delete and publish, through the core
(rabbit_mgmt_wm_exchange*). The default exchange is "amq.default" in paths.

Publishing waits, as RabbitMQ's publisher-confirmed publish does, until the message is
stored (fsynced when it is persistent and a durable queue took it), and answers whether it
was routed. The core's refusal of a publish is answered as RabbitMQ's channel error is:
400 with the reply code and text.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from aiohttp import web

from warrenmq.amqp import frames, replies
from warrenmq.exchanges.binding import EXCHANGE
from warrenmq.exchanges.errors import RoutingError
from warrenmq.exchanges.router import Exchange
from warrenmq.server.vhost import Published, check_expiration

from .api import Call, ManagementApi, core, created, no_content, reply, vhost_missing
from .errors import bad_request, object_not_found
from .values import parse_bool, properties_from_json, text, to_amqp_table, to_json

DEFAULT_SORT = ("vhost", "name")
PUBLISH_KEYS = ("routing_key", "properties", "payload", "payload_encoding")


def exchange_json(vhost: str, exchange: Exchange) -> dict[str, Any]:
    return {
        "name": exchange.name,
        "vhost": vhost,
        "type": exchange.type,
        "durable": exchange.durable,
        "auto_delete": exchange.auto_delete,
        "internal": exchange.internal,
        "arguments": to_json(dict(exchange.arguments)),
    }


def vhost_exchanges(api: ManagementApi, vhost: str) -> list[dict[str, Any]]:
    return [exchange_json(vhost, x) for x in api.state.router(vhost).exchanges()]


async def list_exchanges(call: Call) -> web.Response:
    items = [item for vhost in call.vhosts() for item in vhost_exchanges(call.api, vhost)]
    return call.listing(items, DEFAULT_SORT, pageable=True)


def _exchange(call: Call) -> Exchange:
    vhost = call.vhost()
    exchange = call.state.router(vhost.name).get(call.name("exchange"))
    if exchange is None:
        raise object_not_found()
    return exchange


async def get_exchange(call: Call) -> web.Response:
    exchange = _exchange(call)
    item = exchange_json(call.params["vhost"], exchange)
    item["incoming"] = []
    item["outgoing"] = []
    return call.one(item)


async def put_exchange(call: Call) -> web.Response:
    """Declare (201), or redeclare an equivalent exchange (204; 400 if not equivalent)."""
    if call.params["vhost"] not in call.state.vhosts:
        raise vhost_missing()
    vhost = call.vhost()
    name = call.name("exchange")
    body = await call.body()
    type_name = text(body, "type", "direct")
    durable = parse_bool(body.get("durable"), False)
    auto_delete = parse_bool(body.get("auto_delete"), False)
    internal = parse_bool(body.get("internal"), False)
    arguments = to_amqp_table(body.get("arguments"))
    call.check("configure", EXCHANGE, name)
    existed = call.state.router(vhost.name).get(name) is not None
    await core(
        vhost.declare_exchange(
            name,
            type_name,
            durable=durable,
            auto_delete=auto_delete,
            internal=internal,
            arguments=arguments,
            user=call.caller.name,
        )
    )
    return no_content() if existed else created()


async def delete_exchange(call: Call) -> web.Response:
    exchange = _exchange(call)
    call.check("configure", EXCHANGE, exchange.name)
    if_unused = call.query.get("if-unused") == "true"
    await core(call.vhost().delete_exchange(exchange.name, if_unused=if_unused))
    return no_content()


class Stored:
    """The publisher the core reports a failed write to (as it does a channel's confirm)."""

    failed = False

    def publish_failed(self, tag: int) -> None:
        self.failed = True


def channel_error(code: int, text: str) -> Any:
    """A publish refused as RabbitMQ's HTTP publish answers its channel's closure."""
    return bad_request(f"{code} {replies.format_reply_text(code, text)}")


async def publish(call: Call) -> web.Response:
    exchange = _exchange(call)
    body = await call.body()
    missing = [key for key in PUBLISH_KEYS if body.get(key) is None]
    if missing:
        raise bad_request("[" + ",".join(f"{{key_missing,{key}}}" for key in missing) + "]")
    routing_key = text(body, "routing_key")
    payload = body["payload"]
    if not isinstance(payload, str):
        raise bad_request("payload_not_string")
    encoding = body["payload_encoding"]
    if encoding == "string":
        message = payload.encode("utf-8")
    elif encoding == "base64":
        try:
            message = base64.b64decode(payload, validate=True)
        except binascii.Error:
            raise bad_request("not_base64") from None
    else:
        raise bad_request(f"{{unsupported_encoding,{encoding}}}")
    properties = properties_from_json(body["properties"])
    call.check("write", EXCHANGE, exchange.name)
    config = call.api.host.config
    if len(message) > config.message_bytes_max:
        raise channel_error(
            replies.PRECONDITION_FAILED,
            f"message size {len(message)} is larger than configured max size "
            f"{config.message_bytes_max}",
        )
    if properties.user_id is not None and properties.user_id != call.caller.name:
        raise channel_error(
            replies.PRECONDITION_FAILED,
            f"user_id property set to '{properties.user_id}' but authenticated user was "
            f"'{call.caller.name}'",
        )
    stored = Stored()
    try:
        if properties.expiration is not None:
            check_expiration(properties.expiration)
        outcome = call.vhost().publish(
            exchange.name,
            routing_key,
            frames.encode_properties(properties),
            message,
            properties.delivery_mode == 2,
            properties.expiration is not None,
            (stored, 0),
        )
    except RoutingError as error:
        raise channel_error(error.reply_code, error.reply_text) from None
    except replies.ProtocolError as error:
        raise channel_error(error.code, error.text) from None
    await call.api.host.after_commit()
    if stored.failed or outcome is Published.REFUSED:
        raise bad_request("rejected Unable to publish message. Check queue limits.")
    return reply({"routed": outcome is not Published.UNROUTABLE})

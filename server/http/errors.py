"""Refusals as RabbitMQ's management API answers them: a status and ``{"error", "reason"}``.

RabbitMQ 3.10 answers every authorisation failure with 401 (there is no 403): a failed login
also carries ``WWW-Authenticate``, a user without the right tag or vhost does not. An AMQP
refusal of the operation behind a request maps as ``rabbit_mgmt_util:direct_request`` maps
it: 404 stays 404, 403 and 530 become 401 "Access refused.", anything else 400 with the
refusal's text.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from warrenmq.amqp import replies
from warrenmq.exchanges.errors import RoutingError

AUTH_REALM = 'Basic realm="RabbitMQ Management"'
JSON_TYPE = "application/json"


class ApiError(Exception):
    """A request refused with `status` and RabbitMQ's JSON body. The reason is a text, or
    what RabbitMQ makes of an Erlang tuple: a list (``["not_boolean", "yes"]``)."""

    def __init__(
        self, status: int, error: str, reason: Any, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(f"{status} {error}: {reason}")
        self.status = status
        self.error = error
        self.reason = reason
        self.headers = headers or {}

    def response(self) -> web.Response:
        return web.Response(
            status=self.status,
            body=json.dumps(
                {"error": self.error, "reason": self.reason}, separators=(",", ":")
            ).encode(),
            content_type=JSON_TYPE,
            headers=self.headers,
        )


def bad_request(reason: str) -> ApiError:
    return ApiError(400, "bad_request", reason)


def not_found(reason: str) -> ApiError:
    """A 404 with a reason (an entity the request names is missing)."""
    return ApiError(404, "not_found", reason)


def object_not_found() -> ApiError:
    """What RabbitMQ's web dispatcher answers for a path or resource that does not exist."""
    return ApiError(404, "Object Not Found", "Not Found")


def not_authorised(reason: str) -> ApiError:
    """The user logged in but may not do this."""
    return ApiError(401, "not_authorised", reason)


def login_failed() -> ApiError:
    return ApiError(401, "not_authorized", "Login failed", {"WWW-Authenticate": AUTH_REALM})


def unavailable(reason: str) -> ApiError:
    """What this node cannot answer now but may later (a metadata read no quorum confirmed)."""
    return ApiError(503, "service_unavailable", reason)


def refused(error: RoutingError | replies.ProtocolError) -> ApiError:
    """The refusal of a core operation (an AMQP reply code and text) as the HTTP API's."""
    if isinstance(error, RoutingError):
        code, text = error.reply_code, error.reply_text
    else:
        code, text = error.code, error.text
    if code == replies.NOT_FOUND:
        return not_found(text)
    if code in (replies.ACCESS_REFUSED, replies.NOT_ALLOWED):
        return not_authorised("Access refused.")
    return bad_request(text)

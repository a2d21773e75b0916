"""/api/bindings and the binding lists of exchanges and queues (rabbit_mgmt_wm_binding[s]).

A binding is named in paths by its ends and its *properties key*: the routing key, quoted,
then "~" and a hash of its arguments when it has any. The default exchange's implicit
binding of every queue (routing key = the queue's name) is listed as RabbitMQ lists it, and
cannot be created or deleted.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from aiohttp import web

from warrenmq.exchanges.binding import EXCHANGE, QUEUE, Binding, Destination
from warrenmq.server.metadata import MetadataState

from .api import Call, core, created, no_content, sync
from .errors import bad_request, object_not_found
from .values import (
    arguments_hash,
    properties_key,
    split_properties_key,
    text,
    to_amqp_table,
    to_json,
)

DEFAULT_SORT = ("vhost", "source", "type", "destination", "routing_key", "properties_key")
DESTINATION_TYPES = {"q": QUEUE, "e": EXCHANGE}


def binding_json(vhost: str, source: str, binding: Binding) -> dict[str, Any]:
    return {
        "source": source,
        "vhost": vhost,
        "destination": binding.destination.name,
        "destination_type": binding.destination.kind,
        "routing_key": binding.routing_key,
        "arguments": to_json(dict(binding.arguments)),
        "properties_key": properties_key(binding.routing_key, binding.arguments),
    }


def _default_binding(queue: str) -> Binding:
    return Binding(Destination(QUEUE, queue), queue, {})


def vhost_bindings(state: MetadataState, vhost: str) -> list[dict[str, Any]]:
    """Every binding of a vhost, the default exchange's implicit ones first."""
    listed = [binding_json(vhost, "", _default_binding(name)) for name in state.queues(vhost)]
    listed += [binding_json(vhost, source, b) for source, b in state.bindings(vhost)]
    return listed


async def list_all(call: Call) -> web.Response:
    items = [item for vhost in call.vhosts() for item in vhost_bindings(call.state, vhost)]
    return call.listing(items, DEFAULT_SORT)


def destination_bindings(call: Call, destination: Destination) -> list[dict[str, Any]]:
    vhost = call.vhost().name
    router = call.state.router(vhost)
    listed = []
    if destination.kind == QUEUE:
        listed.append(binding_json(vhost, "", _default_binding(destination.name)))
    listed += [binding_json(vhost, s, b) for s, b in router.bindings_to(destination)]
    return listed


async def list_of_queue(call: Call) -> web.Response:
    vhost = call.vhost()
    name = call.params["destination"]
    if call.state.queue(vhost.name, name) is None:
        raise object_not_found()
    return call.listing(destination_bindings(call, Destination(QUEUE, name)), DEFAULT_SORT)


async def list_of_exchange_source(call: Call) -> web.Response:
    vhost = call.vhost()
    source = call.name("exchange")
    router = call.state.router(vhost.name)
    if router.get(source) is None:
        raise object_not_found()
    if source == "":
        queues = call.state.queues(vhost.name)
        items = [binding_json(vhost.name, "", _default_binding(q)) for q in queues]
    else:
        items = [binding_json(vhost.name, source, b) for b in router.bindings(source)]
    return call.listing(items, DEFAULT_SORT)


async def list_of_exchange_destination(call: Call) -> web.Response:
    vhost = call.vhost()
    name = call.name("exchange")
    if call.state.router(vhost.name).get(name) is None:
        raise object_not_found()
    items = destination_bindings(call, Destination(EXCHANGE, name))
    return call.listing(items, DEFAULT_SORT)


def _ends(call: Call) -> tuple[str, Destination]:
    kind = DESTINATION_TYPES[call.params["dtype"]]
    return call.name("source"), Destination(kind, call.name("destination"))


def _between(call: Call, source: str, destination: Destination) -> list[Binding]:
    router = call.state.router(call.vhost().name)
    if source == "" and destination.kind == QUEUE:
        if call.state.queue(router.vhost, destination.name) is None:
            return []
        return [_default_binding(destination.name)]
    return [b for b in router.bindings(source) if b.destination == destination]


async def list_between(call: Call) -> web.Response:
    source, destination = _ends(call)
    vhost = call.vhost().name
    items = [binding_json(vhost, source, b) for b in _between(call, source, destination)]
    return call.listing(items, DEFAULT_SORT)


def _check_bind(call: Call, source: str, destination: Destination) -> None:
    """queue.bind's and exchange.bind's permissions: write to the destination, read from the
    source."""
    call.check("write", destination.kind, destination.name)
    call.check("read", EXCHANGE, source)


async def create(call: Call) -> web.Response:
    """POST: bind; 201 with the new binding's path (relative) in Location."""
    source, destination = _ends(call)
    vhost = call.vhost()
    body = await call.body()
    routing_key = text(body, "routing_key", "")
    arguments = to_amqp_table(body.get("arguments"))
    _check_bind(call, source, destination)
    if destination.kind == QUEUE and destination.name in vhost.queues:
        # An exclusive queue of a connection is locked to everyone else (405), as for AMQP.
        sync(vhost.get_queue, destination.name, None)
    await core(vhost.bind(source, destination, routing_key, arguments))
    response = created()
    location = "/".join(
        urllib.parse.quote_plus(part, safe="")
        for part in (destination.name, properties_key(routing_key, arguments))
    )
    response.headers["Location"] = location
    return response


def _binding(call: Call) -> tuple[str, Binding]:
    """The binding the path names (404 when there is none, 400 for a malformed key)."""
    source, destination = _ends(call)
    routing_key, hashed = split_properties_key(call.params["props"])
    for binding in _between(call, source, destination):
        if binding.arguments:
            same_arguments = hashed == arguments_hash(binding.arguments)
        else:
            same_arguments = hashed is None
        if binding.routing_key == routing_key and same_arguments:
            return source, binding
    raise object_not_found()


async def get(call: Call) -> web.Response:
    source, binding = _binding(call)
    return call.one(binding_json(call.vhost().name, source, binding))


async def delete(call: Call) -> web.Response:
    source, binding = _binding(call)
    if source == "":
        raise bad_request("operation not permitted on the default exchange")
    _check_bind(call, source, binding.destination)
    vhost = call.vhost()
    await core(vhost.unbind(source, binding.destination, binding.routing_key, binding.arguments))
    return no_content()

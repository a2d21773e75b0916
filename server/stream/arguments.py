"""A stream's queue.declare and basic.consume arguments, checked as RabbitMQ 3.10 checks them.

Declare, in RabbitMQ's order: the values of the arguments a stream takes (``queue.arguments``'
checks, in their order; an x-max-age without a leading count crashes RabbitMQ's channel:
541), then the other known arguments, refused ("invalid arg 'x-max-priority' for queue 'q' in
vhost '/' of queue type rabbit_stream_queue", the first in the table's order), a server-named
queue, then rabbit_stream_queue:declare's checks (auto-delete, exclusive, non-durable, the
segment size bound). Warren's own queue arguments mean nothing to a stream and, as in
RabbitMQ 3.10, are kept unchecked. Consume: x-stream-offset, then consumer arguments a
stream does not take, then the prefetch a stream consumer needs (acks are its credit), then
no-ack.

The log config of a stream follows its effective arguments: `x-stream-max-segment-size-bytes`
(RabbitMQ's default 500 MB), `x-max-age` and `x-max-length-bytes` (retention by whole
segment, never the active one).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from warrenmq.exchanges.errors import PreconditionFailed
from warrenmq.log import LogConfig
from warrenmq.server.errors import internal_error, not_implemented
from warrenmq.server.queue import arguments as queue_arguments

from . import offset_spec

TYPE_MODULE = "rabbit_stream_queue"
SEGMENT_BYTES_DEFAULT = 500_000_000
# rabbit_stream_queue's ?MAX_STREAM_MAX_SEGMENT_SIZE.
SEGMENT_BYTES_MAX = 3_000_000_000
# rabbit_amqqueue:declare_args/0 of 3.10 less what rabbit_stream_queue:capabilities/0 takes.
_REFUSED_DECLARE_ARGUMENTS = frozenset(
    (
        "x-expires",
        "x-message-ttl",
        "x-dead-letter-exchange",
        "x-dead-letter-routing-key",
        "x-max-length",
        "x-max-in-memory-length",
        "x-max-in-memory-bytes",
        "x-max-priority",
        "x-overflow",
        "x-queue-mode",
        "x-queue-version",
        "x-single-active-consumer",
        "x-quorum-initial-group-size",
        "x-delivery-limit",
        "x-dead-letter-strategy",
    )
)
# rabbit_stream_queue:capabilities/0's queue arguments.
_STREAM_ARGUMENTS = frozenset(
    (
        "x-max-length-bytes",
        "x-queue-type",
        "x-max-age",
        "x-stream-max-segment-size-bytes",
        "x-initial-cluster-size",
        "x-queue-leader-locator",
    )
)


def _check_max_age(value: Any, arguments: Mapping[str, Any]) -> str | None:
    if isinstance(value, str):
        try:
            offset_spec.interval_ms(value)
        except offset_spec.Unreadable:
            # RabbitMQ's channel crashes on it: 541, the connection closed.
            raise internal_error("") from None
    return queue_arguments.check_max_age(value, arguments)


_DECLARE_CHECKS = tuple(
    (key, _check_max_age if key == "x-max-age" else check)
    for key, check in queue_arguments.DECLARE_CHECKS
    if key in _STREAM_ARGUMENTS
)
# rabbit_amqqueue:consume_args/0 less the stream's consumer arguments (x-stream-offset).
_REFUSED_CONSUME_ARGUMENTS = frozenset(("x-priority", "x-cancel-on-ha-failover"))
OFFSET_ARGUMENT = "x-stream-offset"


def _type_refusal(key: str, queue: str, vhost: str) -> PreconditionFailed:
    return PreconditionFailed(
        f"invalid arg '{key}' for {queue_arguments.resource('queue', queue, vhost)} "
        f"of queue type {TYPE_MODULE}"
    )


def check_declare(
    queue: str,
    vhost: str,
    *,
    durable: bool,
    exclusive: bool,
    auto_delete: bool,
    server_named: bool,
    arguments: Mapping[str, Any],
) -> None:
    queue_arguments.check_arguments(_DECLARE_CHECKS, queue, vhost, arguments)
    for key in arguments:
        if key in _REFUSED_DECLARE_ARGUMENTS:
            raise _type_refusal(key, queue, vhost)
    if server_named:
        raise PreconditionFailed(f"Cannot declare a server-named queue for type {TYPE_MODULE}")
    name = queue_arguments.resource("queue", queue, vhost)
    if auto_delete:
        raise PreconditionFailed(f"invalid property 'auto-delete' for {name}")
    if exclusive:
        raise PreconditionFailed(f"invalid property 'exclusive-owner' for {name}")
    if not durable:
        raise PreconditionFailed(f"invalid property 'non-durable' for {name}")
    segment_bytes = arguments.get("x-stream-max-segment-size-bytes")
    if isinstance(segment_bytes, int) and segment_bytes > SEGMENT_BYTES_MAX:
        raise PreconditionFailed("Exceeded max value for x-stream-max-segment-size-bytes")


def check_consume(
    queue: str,
    vhost: str,
    arguments: Mapping[str, Any],
    *,
    prefetch_count: int,
    no_ack: bool,
    now_ms: int,
) -> offset_spec.OffsetSpec:
    """The consumer's start, once its arguments and mode pass RabbitMQ's checks."""
    name = queue_arguments.resource("queue", queue, vhost)
    try:
        spec = offset_spec.parse(arguments.get(OFFSET_ARGUMENT), now_ms)
    except offset_spec.Invalid as error:
        raise PreconditionFailed(f"invalid arg '{OFFSET_ARGUMENT}' for {name}: {error}") from None
    except offset_spec.Unreadable:
        # RabbitMQ's channel process crashes on these values: its connection closes with a
        # bare "INTERNAL_ERROR".
        raise internal_error("") from None
    for key in arguments:
        if key in _REFUSED_CONSUME_ARGUMENTS:
            raise _type_refusal(key, queue, vhost)
    if not prefetch_count:
        raise PreconditionFailed(f"consumer prefetch count is not set for '{name}'")
    if no_ack:
        raise not_implemented(f"automatic acknowledgement not supported by stream queues {name}")
    return spec


def _int(arguments: Mapping[str, Any], key: str) -> int | None:
    value = arguments.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def log_config(base: LogConfig, arguments: Mapping[str, Any]) -> LogConfig:
    """The stream log's config for its effective arguments (validated at declare)."""
    segment_bytes = _int(arguments, "x-stream-max-segment-size-bytes")
    max_age = arguments.get("x-max-age")
    retention_ms = None
    if isinstance(max_age, (str, bytes)):
        text = max_age.decode() if isinstance(max_age, bytes) else max_age
        retention_ms = offset_spec.interval_ms(text)
    return dataclasses.replace(
        base,
        # RabbitMQ takes 0 (every chunk then gets a segment of its own).
        segment_bytes_max=max(1, SEGMENT_BYTES_DEFAULT if segment_bytes is None else segment_bytes),
        retention_ms=retention_ms,
        retention_bytes=_int(arguments, "x-max-length-bytes"),
    )

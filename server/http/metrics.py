"""Prometheus metrics with rabbitmq_prometheus's names, read from the broker at scrape time.

As RabbitMQ's plugin: ``/metrics`` sums each metric over its objects (no queue or channel
labels: cheap with 100,000 queues), ``/metrics/per-object`` gives one sample per queue
(``vhost``, ``queue``), channel (``channel``; its publishes also by ``vhost`` and ``exchange``)
and connection (``channel`` too: RabbitMQ labels a connection's samples with its process,
under that name). Both carry the totals
(``rabbitmq_connections``, ``_channels``, ``_consumers``, ``_queues``) and
``rabbitmq_build_info`` / ``rabbitmq_identity_info``. Warren adds its own under ``warren_``:
each queue's stored messages, message log size and segment count, and stale acks (after a
visibility timeout); the log's fsync and the publisher confirms' latency as histograms;
consumer groups' lag (``warren_consumer_group_lag``: per partition on ``/metrics/per-object``,
per group on ``/metrics``) and tracked offsets' lag (``warren_stream_tracked_offset_lag``).
RabbitMQ 3.10's dead-letter counters (`rabbitmq_global_messages_dead_lettered_*_total`) count
every queue's, including those deleted since.

Little is counted for the metrics: a scrape reads the counters the broker keeps anyway
(`MessageCounts`, queue depths) on the event loop, then formats the text in a thread. The
histograms take one observation per fsync and per tick, never per message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Iterator
from typing import Any

from aiohttp import web
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

import warrenmq
from warrenmq.dlq.dead_letter import DELIVERY_LIMIT, EXPIRED, MAXLEN, REASONS, REJECTED
from warrenmq.log.partition import FSYNC_LATENCY
from warrenmq.server.alarms import DISK, MEMORY, disk_free_bytes, resident_memory_bytes
from warrenmq.server.queue.dead_letter_counts import DeadLetterCounts
from warrenmq.server.stream.groups import GROUP_TAG_PREFIX
from warrenmq.server.stream.stream import Stream

from .api import RABBITMQ_VERSION, ManagementApi
from .connections import connection_name, open_connections
from .streams import group_lags

REGISTRIES = ("per-object",)

# (name, type, help, value of a queue)
QUEUE_METRICS: tuple[tuple[str, str, str, Any], ...] = (
    (
        "rabbitmq_queue_messages_ready",
        "gauge",
        "Messages ready to be delivered to consumers",
        lambda q: q.engine.ready_count,
    ),
    (
        "rabbitmq_queue_messages_unacked",
        "gauge",
        "Messages delivered to consumers but not yet acknowledged",
        lambda q: q.engine.unacked_count,
    ),
    (
        "rabbitmq_queue_messages",
        "gauge",
        "Sum of ready and unacknowledged messages - total queue depth",
        lambda q: q.engine.ready_count + q.engine.unacked_count,
    ),
    ("rabbitmq_queue_consumers", "gauge", "Consumers on a queue", lambda q: q.consumer_count),
    (
        "warren_queue_messages_published_total",
        "counter",
        "Total number of messages the queue stored",
        lambda q: q.counts.published,
    ),
    (
        "warren_queue_message_log_bytes",
        "gauge",
        "Bytes of the queue's message log on disk",
        lambda q: q.engine.message_log_bytes,
    ),
    (
        "warren_queue_message_log_segments",
        "gauge",
        "Segment files of the queue's message log",
        lambda q: q.engine.message_log_segments,
    ),
    (
        "warren_queue_stale_acks_total",
        "counter",
        "Acks and rejects of deliveries that a visibility timeout had already given back",
        lambda q: q.stale_settles,
    ),
)
# rabbitmq_global_messages_dead_lettered_<reason>_total's help texts (rabbit_global_counters).
DEAD_LETTERED_HELP = {
    REJECTED: "Total number of messages dead-lettered due to basic.reject or basic.nack",
    EXPIRED: "Total number of messages dead-lettered due to message TTL exceeded",
    MAXLEN: "Total number of messages dead-lettered due to overflow drop-head or "
    "reject-publish-dlx",
    DELIVERY_LIMIT: "Total number of messages dead-lettered due to delivery-limit exceeded",
}
assert set(DEAD_LETTERED_HELP) == set(REASONS)
CHANNEL_METRICS: tuple[tuple[str, str, str, Any], ...] = (
    ("rabbitmq_channel_consumers", "gauge", "Consumers on a channel", lambda c: len(c.consumers)),
    (
        "rabbitmq_channel_messages_unacked",
        "gauge",
        "Delivered but not yet acknowledged messages",
        lambda c: len(c.unacked),
    ),
    (
        "rabbitmq_channel_messages_unconfirmed",
        "gauge",
        "Published but not yet confirmed messages",
        lambda c: c.wire.publish_seq - c.confirmed_through if c.wire.confirm_mode else 0,
    ),
    (
        "rabbitmq_channel_messages_uncommitted",
        "gauge",
        "Messages received in a transaction but not yet committed",
        lambda c: len(c.tx_publishes),
    ),
    (
        "rabbitmq_consumer_prefetch",
        "gauge",
        "Limit of unacknowledged messages for each consumer",
        lambda c: c.consumer_prefetch,
    ),
    (
        "rabbitmq_channel_prefetch",
        "gauge",
        "Total limit of unacknowledged messages for all consumers on a channel",
        lambda c: c.global_prefetch,
    ),
    (
        "rabbitmq_channel_messages_confirmed_total",
        "counter",
        "Total number of messages published into an exchange and confirmed on the channel",
        lambda c: c.counts.confirmed,
    ),
    (
        "rabbitmq_channel_messages_unroutable_returned_total",
        "counter",
        "Total number of messages published as mandatory into an exchange and returned to "
        "the publisher as unroutable",
        lambda c: c.counts.returned_unroutable,
    ),
    (
        "rabbitmq_channel_messages_unroutable_dropped_total",
        "counter",
        "Total number of messages published as non-mandatory into an exchange and dropped "
        "as unroutable",
        lambda c: c.counts.dropped_unroutable,
    ),
    (
        "rabbitmq_channel_get_ack_total",
        "counter",
        "Total number of messages fetched with basic.get in manual acknowledgement mode",
        lambda c: c.counts.got,
    ),
    (
        "rabbitmq_channel_get_total",
        "counter",
        "Total number of messages fetched with basic.get in automatic acknowledgement mode",
        lambda c: c.counts.got_no_ack,
    ),
    (
        "rabbitmq_channel_messages_delivered_ack_total",
        "counter",
        "Total number of messages delivered to consumers in manual acknowledgement mode",
        lambda c: c.counts.delivered,
    ),
    (
        "rabbitmq_channel_messages_delivered_total",
        "counter",
        "Total number of messages delivered to consumers in automatic acknowledgement mode",
        lambda c: c.counts.delivered_no_ack,
    ),
    (
        "rabbitmq_channel_messages_redelivered_total",
        "counter",
        "Total number of messages redelivered to consumers",
        lambda c: c.counts.redelivered,
    ),
    (
        "rabbitmq_channel_messages_acked_total",
        "counter",
        "Total number of messages acknowledged by consumers",
        lambda c: c.counts.acked,
    ),
    (
        "rabbitmq_channel_get_empty_total",
        "counter",
        "Total number of times basic.get operations fetched no message",
        lambda c: c.counts.got_empty,
    ),
)
CONNECTION_METRICS: tuple[tuple[str, str, str, Any], ...] = (
    (
        "rabbitmq_connection_incoming_bytes_total",
        "counter",
        "Total number of bytes received on a connection",
        lambda c: c.received_bytes,
    ),
    (
        "rabbitmq_connection_outgoing_bytes_total",
        "counter",
        "Total number of bytes sent on a connection",
        lambda c: c.sent_bytes,
    ),
    (
        "rabbitmq_connection_channels",
        "gauge",
        "Channels on a connection",
        lambda c: len(c.channels),
    ),
)


def _family(name: str, kind: str, help_text: str, labels: list[str]) -> Metric:
    if kind == "counter":
        return CounterMetricFamily(name, help_text, labels=labels)
    return GaugeMetricFamily(name, help_text, labels=labels)


def _families(
    metrics: tuple[tuple[str, str, str, Any], ...],
    objects: list[tuple[list[str], Any]],
    label_names: list[str],
    per_object: bool,
) -> Iterator[Metric]:
    """One family per metric: a sample per object, or (aggregated) one sum without labels."""
    for name, kind, help_text, value_of in metrics:
        family = _family(name, kind, help_text, label_names if per_object else [])
        if per_object:
            for labels, item in objects:
                family.add_metric(labels, value_of(item))
        else:
            family.add_metric([], sum(value_of(item) for _, item in objects))
        yield family


def collect(api: ManagementApi, per_object: bool) -> list[Metric]:
    """Every metric family, read from the broker now (on the event loop)."""
    queues = [
        ([vhost.name, queue.name], queue)
        for vhost in list(api.host.vhosts.values())
        for queue in list(vhost.queues.values())
    ]
    connections = open_connections(api)
    channels = []
    connection_objects = []
    for connection in connections:
        name = connection_name(connection)
        connection_objects.append(([name], connection))
        for channel in list(connection.channels.values()):
            channels.append(([f"{name} ({channel.number})"], channel))
    families = list(_families(QUEUE_METRICS, queues, ["vhost", "queue"], per_object))
    families += _families(CHANNEL_METRICS, channels, ["channel"], per_object)
    families.append(_published(channels, per_object))
    families += _families(CONNECTION_METRICS, connection_objects, ["channel"], per_object)
    for name, help_text, value in (
        ("rabbitmq_connections", "Connections currently open", len(connections)),
        ("rabbitmq_channels", "Channels currently open", len(channels)),
        (
            "rabbitmq_consumers",
            "Consumers currently connected",
            sum(queue.consumer_count for _, queue in queues),
        ),
        ("rabbitmq_queues", "Queues available", len(queues)),
        *_resources(api),
    ):
        families.append(GaugeMetricFamily(name, help_text, value=value))
    build = GaugeMetricFamily(
        "rabbitmq_build_info",
        "RabbitMQ & Erlang/OTP version info",
        labels=["rabbitmq_version", "product_name", "product_version"],
    )
    build.add_metric([RABBITMQ_VERSION, "Warren", warrenmq.__version__], 1)
    identity = GaugeMetricFamily(
        "rabbitmq_identity_info",
        "RabbitMQ node & cluster identity info",
        labels=["rabbitmq_node", "rabbitmq_cluster"],
    )
    identity.add_metric([api.node, api.node], 1)
    return [
        *families,
        _group_lags(api, per_object),
        _tracked_offset_lags(queues, per_object),
        *_dead_lettered(api.host.dead_letter_counts),
        *_latencies(api),
        build,
        identity,
    ]


def _resources(api: ManagementApi) -> list[tuple[str, str, int]]:
    """The alarms and what they watch, with rabbitmq_prometheus's names and help texts."""
    resources = api.host.resources
    return [
        (
            "rabbitmq_alarms_memory_used_watermark",
            "is 1 if VM memory watermark alarm is in effect",
            int(MEMORY in resources.alarms),
        ),
        (
            "rabbitmq_alarms_free_disk_space_watermark",
            "is 1 if free disk space watermark alarm is in effect",
            int(DISK in resources.alarms),
        ),
        ("rabbitmq_process_resident_memory_bytes", "Memory used in bytes", resident_memory_bytes()),
        (
            "rabbitmq_resident_memory_limit_bytes",
            "Memory high watermark in bytes",
            resources.memory_limit_bytes,
        ),
        (
            "rabbitmq_disk_space_available_bytes",
            "Disk space available in bytes",
            disk_free_bytes(api.host.data_dir),
        ),
        (
            "rabbitmq_disk_space_available_limit_bytes",
            "Free disk space low watermark in bytes",
            resources.disk_free_limit_bytes,
        ),
    ]


def _dead_lettered(counts: DeadLetterCounts) -> Iterator[Metric]:
    """The process's dead letters, one family per reason, labelled as RabbitMQ 3.10 labels
    them (`queue_type` is the module that implements the type: rabbit_classic_queue ...)."""
    by_reason: dict[str, list[tuple[list[str], int]]] = {reason: [] for reason in REASONS}
    for (queue_type, strategy, reason), messages in list(counts.counts.items()):
        by_reason[reason].append(([f"rabbit_{queue_type}_queue", strategy], messages))
    for reason in REASONS:
        family = CounterMetricFamily(
            f"rabbitmq_global_messages_dead_lettered_{reason}_total",
            DEAD_LETTERED_HELP[reason],
            labels=["queue_type", "dead_letter_strategy"],
        )
        for labels, messages in by_reason[reason]:
            family.add_metric(labels, messages)
        yield family


def _group_lags(api: ManagementApi, per_object: bool) -> Metric:
    """Each consumer group's lag: per partition, or (aggregated) summed per group, which
    keeps /metrics at one sample per group however many partitions its super stream has.
    Groups whose members are all gone still count: their committed offsets remain."""
    labels = ["vhost", "group", "stream"] + (["partition"] if per_object else [])
    family = GaugeMetricFamily(
        "warren_consumer_group_lag",
        "Messages between a consumer group's committed offset and the end of a partition",
        labels=labels,
    )
    for vhost in list(api.host.vhosts.values()):
        for super_stream, group, lags in group_lags(vhost):
            labels = [vhost.name, group, super_stream]
            if per_object:
                for partition, lag in lags:
                    family.add_metric([*labels, partition], lag)
            else:
                family.add_metric(labels, sum(lag for _, lag in lags))
    return family


def _tracked_offset_lags(queues: list[tuple[list[str], Any]], per_object: bool) -> Metric:
    """The lag of every tracked offset of a stream (consumer groups' are in
    warren_consumer_group_lag), per tag, or (aggregated) their sum."""
    family = GaugeMetricFamily(
        "warren_stream_tracked_offset_lag",
        "Messages between a tracked consumer's offset and the end of its stream",
        labels=["vhost", "stream", "tag"] if per_object else [],
    )
    total = 0
    for labels, queue in queues:
        if not isinstance(queue, Stream):
            continue
        for tag, offset in queue.tracked.items():
            if tag.startswith(GROUP_TAG_PREFIX):
                continue
            if per_object:
                family.add_metric([*labels, tag], queue.lag(offset))
            else:
                total += queue.lag(offset)
    if not per_object:
        family.add_metric([], total)
    return family


def _latencies(api: ManagementApi) -> Iterator[Metric]:
    for name, help_text, histogram in (
        (
            "warren_log_fsync_seconds",
            "Time a log's group commit spent in fsync (one observation per commit, which "
            "covers every file written since the last)",
            FSYNC_LATENCY,
        ),
        (
            "warren_confirm_latency_seconds",
            "Time from the first publish of a tick to its publisher confirms going out (one "
            "observation per tick: a batch of confirms)",
            api.host.confirm_latency,
        ),
    ):
        buckets = [(floatToGoString(bound), count) for bound, count in histogram.cumulative()]
        yield HistogramMetricFamily(name, help_text, buckets=buckets, sum_value=histogram.sum_s)


def _published(channels: list[tuple[list[str], Any]], per_object: bool) -> Metric:
    """Publishes per channel and exchange, labelled as RabbitMQ labels them."""
    labels = ["channel", "vhost", "exchange"] if per_object else []
    family = CounterMetricFamily(
        "rabbitmq_channel_messages_published_total",
        "Total number of messages published into an exchange on a channel",
        labels=labels,
    )
    if not per_object:
        family.add_metric([], sum(channel.counts.publishes for _, channel in channels))
        return family
    for (name,), channel in channels:
        vhost = channel.connection.vhost
        for exchange, count in list(channel.counts.published_to.items()):
            family.add_metric([name, vhost.name if vhost else "", exchange], count)
    return family


class _Collected(Collector):
    """A registry's view of families already read."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self._families


def render(families: list[Metric]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collected(families))
    return generate_latest(registry)


def application(api: ManagementApi) -> web.Application:
    async def metrics(request: web.Request) -> web.Response:
        registry = request.match_info.get("registry")
        if registry is not None and registry not in REGISTRIES:
            return web.Response(status=404, text="Unknown Registry")
        families = collect(api, per_object=registry == "per-object")
        body = await asyncio.to_thread(render, families)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/metrics/{registry}", metrics)
    return app

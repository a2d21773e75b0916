"""Prometheus metrics as rabbitmq_prometheus serves them: names, types, labels, and values that
follow AMQP traffic. RabbitMQ samples its metrics (every 0.5 s on the reference node), so
values are polled for."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

SETTLE_S_MAX = 15.0


def scrape(url: str) -> dict[str, tuple[str, dict[tuple, float]]]:
    """{family: (type, {sorted label pairs: value})}."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    families = {}
    for family in text_string_to_metric_families(text):
        samples = {}
        for sample in family.samples:
            samples[tuple(sorted(sample.labels.items()))] = sample.value
        families[family.name] = (family.type, samples)
    return families


def test_aggregated_metrics_have_rabbitmqs_names_and_types(metrics_url):
    families = scrape(metrics_url + "/metrics")
    for name, kind in (
        ("rabbitmq_queue_messages_ready", "gauge"),
        ("rabbitmq_queue_messages_unacked", "gauge"),
        ("rabbitmq_queue_messages", "gauge"),
        ("rabbitmq_connections", "gauge"),
        ("rabbitmq_channels", "gauge"),
        ("rabbitmq_consumers", "gauge"),
        ("rabbitmq_queues", "gauge"),
        # prometheus_client names a counter family without its _total.
        ("rabbitmq_channel_messages_published", "counter"),
        ("rabbitmq_channel_messages_delivered", "counter"),
        ("rabbitmq_channel_messages_confirmed", "counter"),
        ("rabbitmq_connection_incoming_bytes", "counter"),
    ):
        assert name in families, name
        assert families[name][0] == kind, name
    # Aggregated: one sample, no queue or channel label.
    assert list(families["rabbitmq_queue_messages_ready"][1]) == [()]
    assert list(families["rabbitmq_channel_messages_published"][1]) == [()]
    build_labels = dict(next(iter(families["rabbitmq_build_info"][1])))
    assert "rabbitmq_version" in build_labels
    assert {"rabbitmq_node", "rabbitmq_cluster"} <= set(
        dict(next(iter(families["rabbitmq_identity_info"][1])))
    )


def test_per_object_queue_metrics_follow_the_queue(metrics_url, connection, uid):
    channel = connection.channel()
    queue = f"{uid}-metered"
    channel.queue_declare(queue, auto_delete=True)
    channel.confirm_delivery()
    for _ in range(3):
        channel.basic_publish("", queue, b"x")
    labels = (("queue", queue), ("vhost", "/"))
    deadline = time.monotonic() + SETTLE_S_MAX
    while True:
        families = scrape(metrics_url + "/metrics/per-object")
        ready = families["rabbitmq_queue_messages_ready"][1].get(labels)
        if ready == 3 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert ready == 3
    assert families["rabbitmq_queue_messages"][1][labels] == 3
    assert families["rabbitmq_queue_consumers"][1][labels] == 0
    # A channel's publishes, by the exchange they went to.
    published = families["rabbitmq_channel_messages_published"][1]
    to_default = [
        value
        for labels, value in published.items()
        if dict(labels).keys() == {"channel", "vhost", "exchange"}
        and dict(labels)["exchange"] == ""
        and dict(labels)["vhost"] == "/"
    ]
    assert max(to_default) >= 3


def test_an_unknown_registry_is_404(metrics_url):
    with pytest.raises(urllib.error.HTTPError) as excinfo:
        urllib.request.urlopen(metrics_url + "/metrics/compat-no-such-registry", timeout=10)
    assert excinfo.value.code == 404

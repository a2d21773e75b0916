"""/metrics and /metrics/per-object: RabbitMQ's metric names and labels, Warren's own, values
that follow the broker, and the text format Prometheus parses."""

from __future__ import annotations

import urllib.request

import pika
import pytest
from brokers import ThreadBroker
from http_api import HttpApi, path
from prometheus_client.parser import text_string_to_metric_families


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    running = ThreadBroker(tmp_path_factory.mktemp("broker")).start()
    yield running
    running.stop()


def scrape(broker, registry: str = "") -> dict[str, dict[tuple, float]]:
    """{metric family name: {labels as sorted pairs: value}}."""
    url = broker.metrics_url + "/metrics" + (f"/{registry}" if registry else "")
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def test_per_object_metrics_follow_queues_channels_and_connections(broker):
    api = HttpApi(broker.management_url)
    api.put(path("api", "queues", "/", "metered"), {"durable": True})
    connection = broker.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    for _ in range(3):
        channel.basic_publish("", "metered", b"x" * 100, pika.BasicProperties(delivery_mode=2))
    consumer = connection.channel()
    consumer.basic_qos(prefetch_count=1)
    consumer.basic_consume("metered", lambda *args: None)
    connection.process_data_events(0.3)
    samples = scrape(broker, "per-object")
    queue = (("queue", "metered"), ("vhost", "/"))
    assert samples["rabbitmq_queue_messages_ready"][queue] == 2
    assert samples["rabbitmq_queue_messages_unacked"][queue] == 1
    assert samples["rabbitmq_queue_messages"][queue] == 3
    assert samples["rabbitmq_queue_consumers"][queue] == 1
    assert samples["warren_queue_message_log_segments"][queue] == 1
    assert samples["warren_queue_message_log_bytes"][queue] > 300
    [(labels, published)] = samples["rabbitmq_channel_messages_published_total"].items()
    assert published == 3
    assert dict(labels)["exchange"] == "" and dict(labels)["vhost"] == "/"
    assert samples["warren_queue_messages_published_total"][queue] == 3
    assert sum(samples["rabbitmq_channel_messages_confirmed_total"].values()) == 3
    assert sum(samples["rabbitmq_channel_messages_delivered_ack_total"].values()) == 1
    assert samples["rabbitmq_connections"][()] == 1
    assert samples["rabbitmq_channels"][()] == 2
    assert samples["rabbitmq_queues"][()] >= 1
    [received] = samples["rabbitmq_connection_incoming_bytes_total"].values()
    assert received > 300
    connection.close()


def test_aggregated_metrics_carry_no_object_labels(broker):
    samples = scrape(broker)
    assert set(samples["rabbitmq_queue_messages_ready"]) == {()}
    assert set(samples["rabbitmq_channel_messages_published_total"]) == {()}
    assert set(samples["warren_queue_message_log_bytes"]) == {()}
    [(labels, value)] = samples["rabbitmq_build_info"].items()
    assert dict(labels)["product_name"] == "Warren" and value == 1
    assert "rabbitmq_identity_info" in samples


def test_an_unknown_registry_is_404(broker):
    with pytest.raises(urllib.error.HTTPError) as excinfo:
        urllib.request.urlopen(broker.metrics_url + "/metrics/nope", timeout=10)
    assert excinfo.value.code == 404


def test_metrics_types_are_rabbitmqs(broker):
    url = broker.metrics_url + "/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    assert "# TYPE rabbitmq_channel_messages_published_total counter" in text
    assert "# TYPE rabbitmq_queue_messages_ready gauge" in text

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


def test_per_object_queue_metrics_follow_the_queue(broker, metrics_url, connection, uid):
    channel = connection.channel()
    queue = f"{uid}-metered"
    channel.queue_declare(queue, auto_delete=True)
    channel.confirm_delivery()
    for _ in range(3):
        channel.basic_publish("", queue, b"x")
    labels = (("queue", queue), ("vhost", "/"))
    deadline = time.monotonic() + SETTLE_S_MAX
    while True:
        # A queue's samples are on the node leading it, and only there.
        scraped = [scrape(url + "/metrics/per-object") for url in broker.metrics_urls]
        showing = [f for f in scraped if labels in f["rabbitmq_queue_messages_ready"][1]]
        ready = showing[0]["rabbitmq_queue_messages_ready"][1][labels] if showing else None
        if ready == 3 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert ready == 3
    assert len(showing) == 1
    assert showing[0]["rabbitmq_queue_messages"][1][labels] == 3
    assert showing[0]["rabbitmq_queue_consumers"][1][labels] == 0
    # A channel's publishes, by the exchange they went to, on the node of its connection.
    published = scrape(metrics_url + "/metrics/per-object")["rabbitmq_channel_messages_published"][
        1
    ]
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


def dead_lettered(metrics_urls: list[str], reason: str, queue_type: str) -> float:
    """rabbitmq_global_messages_dead_lettered_<reason>_total of one queue type, every
    strategy summed (a classic queue's dead-lettering is at-most-once in RabbitMQ, at-least-once
    in Warren), over every node: as RabbitMQ's, a node counts what its own queues dead-letter,
    and a cluster's total is the sum over its nodes."""
    total = 0.0
    for metrics_url in metrics_urls:
        samples = scrape(metrics_url + "/metrics")[
            f"rabbitmq_global_messages_dead_lettered_{reason}"
        ][1]
        total += sum(
            value for labels, value in samples.items() if ("queue_type", queue_type) in labels
        )
    return total


def test_dead_letters_are_counted_by_reason(broker, metrics_url, connection, uid):
    metrics_urls = broker.metrics_urls
    channel = connection.channel()
    channel.confirm_delivery()
    target = f"{uid}-dead"
    channel.queue_declare(target, auto_delete=True)
    to_target = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": target}
    classic = "rabbit_classic_queue"
    reasons = ("rejected", "expired", "maxlen", "delivery_limit")
    before = {reason: dead_lettered(metrics_urls, reason, classic) for reason in reasons[:3]} | {
        "delivery_limit": dead_lettered(metrics_urls, "delivery_limit", "rabbit_quorum_queue")
    }

    channel.queue_declare(f"{uid}-rejects", auto_delete=True, arguments=to_target)
    channel.basic_publish("", f"{uid}-rejects", b"r")
    method, _, _ = channel.basic_get(f"{uid}-rejects")
    channel.basic_reject(method.delivery_tag, requeue=False)
    # Without a dead-letter exchange a rejected message is dropped, and counted all the same.
    channel.queue_declare(f"{uid}-drops", auto_delete=True)
    channel.basic_publish("", f"{uid}-drops", b"d")
    method, _, _ = channel.basic_get(f"{uid}-drops")
    channel.basic_reject(method.delivery_tag, requeue=False)
    channel.queue_declare(
        f"{uid}-expires", auto_delete=True, arguments={**to_target, "x-message-ttl": 0}
    )
    channel.basic_publish("", f"{uid}-expires", b"e")
    channel.queue_declare(
        f"{uid}-full", auto_delete=True, arguments={**to_target, "x-max-length": 1}
    )
    channel.basic_publish("", f"{uid}-full", b"m1")
    channel.basic_publish("", f"{uid}-full", b"m2")
    limited = f"{uid}-limited"
    channel.queue_declare(
        limited,
        durable=True,
        arguments={**to_target, "x-queue-type": "quorum", "x-delivery-limit": 0},
    )
    try:
        channel.basic_publish("", limited, b"l")
        deadline = time.monotonic() + SETTLE_S_MAX
        while (got := channel.basic_get(limited))[0] is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # basic.reject: a failed delivery on 3.10 and on RabbitMQ 4.3 alike (a nack counts
        # toward the limit on 3.10 only: test_dead_lettering pins both).
        channel.basic_reject(got[0].delivery_tag, requeue=True)
        expected = {"rejected": 2, "expired": 1, "maxlen": 1, "delivery_limit": 1}
        deadline = time.monotonic() + SETTLE_S_MAX
        while True:
            counted = {
                reason: dead_lettered(metrics_urls, reason, classic) - before[reason]
                for reason in reasons[:3]
            } | {
                "delivery_limit": dead_lettered(
                    metrics_urls, "delivery_limit", "rabbit_quorum_queue"
                )
                - before["delivery_limit"]
            }
            if counted == expected or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert counted == expected
    finally:
        channel.queue_delete(limited)

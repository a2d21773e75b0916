"""/metrics and /metrics/per-object: RabbitMQ's metric names and labels, Warren's own, values
that follow the broker, and the text format Prometheus parses."""

from __future__ import annotations

import time
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


def histogram_count(broker, name: str) -> float:
    [count] = scrape(broker)[f"{name}_count"].values()
    return count


def test_an_fsync_and_a_confirm_are_observed_in_their_histograms(broker):
    fsyncs = histogram_count(broker, "warren_log_fsync_seconds")
    confirms = histogram_count(broker, "warren_confirm_latency_seconds")
    connection = broker.connect()
    channel = connection.channel()
    channel.queue_declare("synced", durable=True)
    channel.confirm_delivery()
    # A persistent message is confirmed only after its group commit's fsync.
    channel.basic_publish("", "synced", b"x", pika.BasicProperties(delivery_mode=2))
    connection.close()
    samples = scrape(broker)
    assert samples["warren_log_fsync_seconds_count"][()] > fsyncs
    assert samples["warren_confirm_latency_seconds_count"][()] > confirms
    assert samples["warren_log_fsync_seconds_sum"][()] > 0
    # Cumulative buckets, the last of them every observation.
    buckets = samples["warren_confirm_latency_seconds_bucket"]
    assert buckets[(("le", "+Inf"),)] == samples["warren_confirm_latency_seconds_count"][()]
    assert list(buckets.values()) == sorted(buckets.values())


def test_dead_letters_are_counted_by_reason_and_strategy(broker):
    def counted(reason: str, strategy: str) -> float:
        samples = scrape(broker).get(f"rabbitmq_global_messages_dead_lettered_{reason}_total", {})
        labels = (("dead_letter_strategy", strategy), ("queue_type", "rabbit_classic_queue"))
        return samples.get(labels, 0)

    before = {
        (reason, strategy): counted(reason, strategy)
        for reason in ("rejected", "expired", "maxlen")
        for strategy in ("at_least_once", "disabled")
    }
    connection = broker.connect()
    channel = connection.channel()
    channel.queue_declare("dl-target")
    to_target = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dl-target"}
    for name, arguments in (("dl-source", to_target), ("dl-dropping", {})):
        channel.queue_declare(name, arguments=arguments)
        channel.basic_publish("", name, b"r")
        method, _, _ = channel.basic_get(name)
        channel.basic_reject(method.delivery_tag, requeue=False)
    channel.queue_declare("dl-ttl", arguments={**to_target, "x-message-ttl": 0})
    channel.basic_publish("", "dl-ttl", b"e")
    channel.queue_declare("dl-short", arguments={"x-max-length": 1})
    for body in (b"1", b"2", b"3"):
        channel.basic_publish("", "dl-short", body)
    channel.queue_declare("dl-short", passive=True)
    deadline = time.monotonic() + 10
    while channel.queue_declare("dl-target", passive=True).method.message_count < 2:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    connection.close()
    grown = {key: counted(*key) - value for key, value in before.items()}
    assert grown == {
        ("rejected", "at_least_once"): 1,
        ("rejected", "disabled"): 1,
        ("expired", "at_least_once"): 1,
        ("expired", "disabled"): 0,
        ("maxlen", "at_least_once"): 0,
        ("maxlen", "disabled"): 2,
    }


def test_an_ack_after_the_visibility_timeout_is_counted_stale(broker):
    connection = broker.connect()
    channel = connection.channel()
    channel.queue_declare("invisible", arguments={"x-visibility-timeout": 100})
    channel.basic_publish("", "invisible", b"slow")
    method, _, _ = channel.basic_get("invisible")
    # Back in the queue once its visibility timeout passed: the first get's tag is stale.
    deadline = time.monotonic() + 10
    while (again := channel.basic_get("invisible"))[0] is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    channel.basic_ack(method.delivery_tag)
    channel.basic_ack(again[0].delivery_tag)
    channel.queue_declare("invisible", passive=True)
    samples = scrape(broker, "per-object")
    assert samples["warren_queue_stale_acks_total"][(("queue", "invisible"), ("vhost", "/"))] == 1
    assert scrape(broker)["warren_queue_stale_acks_total"][()] >= 1
    connection.close()


def ack_below(offset_max: int):
    """A consumer callback that acks the deliveries below `offset_max` of each partition and
    holds the rest unacked: the committed (tracked) offset stops at `offset_max`."""

    def on_message(channel, method, properties, body) -> None:
        if properties.headers["x-stream-offset"] < offset_max:
            channel.basic_ack(method.delivery_tag)

    return on_message


def labelled(**labels: str) -> tuple:
    """Labels as `scrape` keys them."""
    return tuple(sorted(labels.items()))


def wait_for(broker, registry: str, name: str, labels: tuple, value: float) -> dict:
    """The scrape once `name{labels}` reads `value` (the broker commits acks as it runs)."""
    deadline = time.monotonic() + 10
    while True:
        samples = scrape(broker, registry)
        if samples.get(name, {}).get(labels) == value or time.monotonic() > deadline:
            return samples
        time.sleep(0.05)


def test_consumer_group_lag_per_partition_and_per_group(broker):
    api = HttpApi(broker.management_url)
    assert api.put(path("api", "super-streams", "/", "lagging"), {"partitions": 2}).status == 201
    connection = broker.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    for partition, count in ((0, 6), (1, 4)):
        pinned = pika.BasicProperties(headers={"x-stream-partition": partition})
        for _ in range(count):
            channel.basic_publish("lagging", "any", b"m", pinned)
    member = connection.channel()
    member.basic_qos(prefetch_count=100)
    member.basic_consume(
        "lagging",
        ack_below(2),
        consumer_tag="lag-member",
        arguments={"x-consumer-group": "billing", "x-stream-offset": "first"},
    )
    connection.process_data_events(time_limit=0.5)
    group = labelled(vhost="/", group="billing", stream="lagging")
    first = labelled(vhost="/", group="billing", stream="lagging", partition="lagging-0")
    samples = wait_for(broker, "per-object", "warren_consumer_group_lag", first, 4)
    lags = samples["warren_consumer_group_lag"]
    assert lags[first] == 4
    assert lags[labelled(vhost="/", group="billing", stream="lagging", partition="lagging-1")] == 2
    assert scrape(broker)["warren_consumer_group_lag"][group] == 6
    # The group's committed offsets are not counted again as plain tracked offsets.
    tracked = scrape(broker, "per-object").get("warren_stream_tracked_offset_lag", {})
    assert not [labels for labels in tracked if dict(labels)["stream"].startswith("lagging")]
    connection.close()
    # Every member gone: the committed offsets remain, and so does the lag.
    assert (
        wait_for(broker, "", "warren_consumer_group_lag", group, 6)["warren_consumer_group_lag"][
            group
        ]
        == 6
    )


def test_a_tracked_consumers_lag_is_the_stream_after_its_acked_prefix(broker):
    connection = broker.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare("tracked-lag", durable=True, arguments={"x-queue-type": "stream"})
    for _ in range(5):
        channel.basic_publish("", "tracked-lag", b"m")
    channel.basic_qos(prefetch_count=100)
    channel.basic_consume(
        "tracked-lag", ack_below(3), consumer_tag="reader", arguments={"x-stream-offset": "first"}
    )
    connection.process_data_events(time_limit=0.5)
    labels = labelled(vhost="/", stream="tracked-lag", tag="reader")
    samples = wait_for(broker, "per-object", "warren_stream_tracked_offset_lag", labels, 2)
    assert samples["warren_stream_tracked_offset_lag"][labels] == 2
    assert scrape(broker)["warren_stream_tracked_offset_lag"][()] >= 2
    connection.close()

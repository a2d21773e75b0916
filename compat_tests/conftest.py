"""The compat harness: every test runs against Warren and against a reference RabbitMQ.

The ``broker`` fixture is parametrized over ``["warren", "rabbitmq"]`` (and
``"warren-cluster"`` when ``WARREN_COMPAT_CLUSTER=1``, as ``make test-cluster`` sets) and
session-scoped:

* ``warren`` starts ``warren serve --port <free> --data-dir <tmp>`` as a subprocess and waits
  for its "Warren listening on HOST:PORT" line;
* ``warren-cluster`` starts three such nodes as one cluster: clients connect to node 1 and
  every queue they declare (but an exclusive one) is led by node 2 or 3, so each test runs
  through forwarding;
* ``rabbitmq`` uses ``WARREN_REFERENCE_URL`` when it is set, else boots a private RabbitMQ
  node (``rabbitmq_reference.py``). When neither is possible the rabbitmq runs are skipped,
  except under ``CI=true``, where they fail: a green CI must have checked the reference.

A test asserts what RabbitMQ does; it passes against the reference first. A test of a Warren
extension is marked ``@pytest.mark.warren_only`` and skipped against RabbitMQ. Where Warren
follows a RabbitMQ later than the reference (3.10), the reference's behaviour is kept in a
test marked ``@pytest.mark.reference_only`` (skipped against Warren) beside the
``warren_only`` test of the later behaviour, so that what 3.10 does stays observed.
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pika
import pytest

# This folder is not a package (pytest runs in importlib mode, and the repository root must
# stay off sys.path), so its helper modules are found by putting the folder itself there.
sys.path.insert(0, str(Path(__file__).parent))
from compat_harness import (  # noqa: E402
    Broker,
    WarrenBroker,
    WarrenClusterBroker,
    start_reference,
)
from management_client import HttpApi  # noqa: E402

# The cluster run (`make test-cluster`) is asked for: it is the suite again, on three nodes.
BROKERS = ["warren", "rabbitmq"] + (
    ["warren-cluster"] if os.environ.get("WARREN_COMPAT_CLUSTER") == "1" else []
)


@pytest.fixture(scope="session", params=BROKERS)
def broker(request):
    if request.param.startswith("warren"):
        started: Broker = (
            WarrenClusterBroker() if request.param == "warren-cluster" else WarrenBroker()
        )
        try:
            started.start()
        except BaseException:
            started.destroy()
            raise
    else:
        started = start_reference()
    yield started
    started.destroy()


# What forwarding does not do yet (issue 11): by file, the test functions expected to fail on
# the cluster ("[quorum]": only their quorum-queue runs). They still run; every other test must
# pass there. Remove a line once its test passes across nodes.
_STREAMS = "a stream led by another node is not consumed through forwarding yet"
_DEAD_LETTERS = "dead-lettering, delivery counts and delivery limits across nodes"
_TIMEOUTS = "consumer and visibility timeouts of a queue led elsewhere use the entry's defaults"
CLUSTER_GAPS = {
    "test_consumer_timeout.py": {
        "test_a_timed_out_consumer_is_cancelled_and_its_deliveries_requeued": _TIMEOUTS,
        "test_a_basic_get_delivery_past_the_timeout_closes_the_channel": _TIMEOUTS,
        "test_without_consumer_cancel_notify_the_channel_is_closed": _TIMEOUTS,
    },
    "test_dead_lettering.py": {
        "test_a_refused_message_is_dead_lettered_with_reason_rejected[quorum]": _DEAD_LETTERS,
        "test_queue_ttl_dead_letters_with_reason_expired[quorum]": _DEAD_LETTERS,
        "test_per_message_ttl_moves_expiration_into_x_death[quorum]": _DEAD_LETTERS,
        "test_x_delivery_count_x_acquired_count_and_the_delivery_limit": _DEAD_LETTERS,
        "test_nacks_never_count_toward_the_delivery_limit_and_a_reject_does": _DEAD_LETTERS,
        "test_a_dead_letter_carries_its_failed_deliveries_round_a_retry_loop": _DEAD_LETTERS,
        "test_a_closed_channel_beyond_the_limit_dead_letters": _DEAD_LETTERS,
        "test_x_death_field_types_on_the_wire": _DEAD_LETTERS,
        "test_quorum_queues_default_to_a_delivery_limit_of_20": _DEAD_LETTERS,
    },
    "test_metrics.py": {
        "test_dead_letters_are_counted_by_reason": _DEAD_LETTERS,
    },
    "test_policies.py": {
        "test_a_delivery_limit_policy_on_a_quorum_queue": _DEAD_LETTERS,
    },
    "test_streams.py": {
        "test_consume_refusals_are_rabbitmqs": _STREAMS,
        "test_no_ack_get_and_purge_close_the_connection": _STREAMS,
        "test_offsets_first_number_last_next_and_time": _STREAMS,
        "test_deliveries_keep_the_publishers_headers_and_properties": _STREAMS,
        "test_acks_are_credit": _STREAMS,
        "test_nack_and_reject_close_the_connection": _STREAMS,
        "test_a_closed_channel_puts_nothing_back_and_delete_counts_nothing": _STREAMS,
        "test_a_stream_survives_a_restart": _STREAMS,
        "test_many_messages_replay_in_order": _STREAMS,
        "test_a_named_consumer_resumes_after_its_contiguous_acks_across_a_restart": _STREAMS,
        "test_an_idempotent_producer_appends_each_message_once_across_a_restart": _STREAMS,
        "test_a_filtered_consumer_gets_exactly_what_it_asked_for": _STREAMS,
    },
    "test_topics.py": {
        "test_what_http_posts_a_pika_stream_consumer_reads": _STREAMS,
    },
    "test_visibility_timeout.py": {
        "test_an_unacked_delivery_comes_back_alone_after_its_visibility_timeout": _TIMEOUTS,
        "test_extending_keeps_a_delivery_invisible": _TIMEOUTS,
    },
}


def _cluster_gap(nodeid: str) -> str | None:
    """Why a warren-cluster test is expected to fail, or None."""
    path, _, test = nodeid.partition("compat_tests/")[2].partition("::")
    function, _, params = test.partition("[")
    gaps = CLUSTER_GAPS.get(path, {})
    if "quorum" in params and f"{function}[quorum]" in gaps:
        return gaps[f"{function}[quorum]"]
    return gaps.get(function)


def pytest_collection_modifyitems(items):
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or callspec.params.get("broker") != "warren-cluster":
            continue
        reason = _cluster_gap(item.nodeid)
        if reason is not None:
            item.add_marker(pytest.mark.xfail(reason=f"cluster: {reason}", strict=False))


@pytest.fixture(autouse=True)
def _warren_only(request):
    """Skip a ``warren_only`` test when it is parametrized with the reference broker, and a
    ``reference_only`` test when it is parametrized with Warren."""
    callspec = getattr(request.node, "callspec", None)
    broker = callspec.params.get("broker") if callspec is not None else None
    if request.node.get_closest_marker("warren_only") is not None and broker == "rabbitmq":
        pytest.skip("a Warren extension: RabbitMQ does not do this")
    if request.node.get_closest_marker("reference_only") is not None and broker != "rabbitmq":
        pytest.skip("what the reference RabbitMQ 3.10 does: Warren follows a later RabbitMQ")


@pytest.fixture
def uid() -> str:
    """A short unique prefix, so tests sharing one broker never share entity names."""
    return f"compat-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def seeded(broker) -> Broker:
    broker.seed()
    return broker


@pytest.fixture
def connection(broker):
    """A pika BlockingConnection as guest on "/", closed after the test."""
    conn = pika.BlockingConnection(broker.params())
    yield conn
    if conn.is_open:
        conn.close()


@pytest.fixture
def channel(connection):
    return connection.channel()


@pytest.fixture
def open_connection(broker):
    """A factory of extra pika BlockingConnections, all closed after the test."""
    opened: list[pika.BlockingConnection] = []

    def factory(**kwargs) -> pika.BlockingConnection:
        conn = pika.BlockingConnection(broker.params(**kwargs))
        opened.append(conn)
        return conn

    yield factory
    for conn in opened:
        if conn.is_open:
            conn.close()


@pytest.fixture
def management(broker) -> HttpApi:
    """The broker's management API as guest (skipped for a broker that serves none)."""
    if broker.management_url is None:
        pytest.skip(f"{broker.name}: no management API to test")
    return HttpApi(broker.management_url)


@pytest.fixture
def metrics_url(broker) -> str:
    if broker.metrics_url is None:
        pytest.skip(f"{broker.name}: no Prometheus metrics to test")
    return broker.metrics_url

"""scripts/rabbitmq_cluster.py: three reference RabbitMQ nodes joined into one cluster by its
command line, a quorum queue with a member on each, one node SIGKILLed, and nothing left after
`stop`. Runs where the Debian rabbitmq-server can (skipped elsewhere, failed under CI=true,
as the compat suite's reference runs are)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pika
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import rabbitmq_cluster  # noqa: E402

RUNNING_WAIT_S = 30.0


@pytest.fixture
def rabbitmq_available():
    reason = rabbitmq_cluster.unavailable_reason()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true needs a reference RabbitMQ: {reason}")
        pytest.skip(reason)


@pytest.mark.slow
def test_start_joins_three_nodes_and_stop_leaves_nothing(rabbitmq_available, tmp_path, capsys):
    state = tmp_path / "cluster.json"
    assert rabbitmq_cluster.main(["start", "--nodes", "3", "--state", str(state)]) == 0
    urls = capsys.readouterr().out.split()
    cluster = rabbitmq_cluster.RabbitMQCluster(
        [rabbitmq_cluster.ReferenceNode(**node) for node in json.loads(state.read_text())]
    )
    try:
        assert urls == cluster.urls and len(set(urls)) == 3
        names = {node.nodename for node in cluster.nodes}
        assert cluster.running_nodes() == names

        arguments = {"x-queue-type": "quorum", "x-quorum-initial-group-size": 3}
        first = pika.BlockingConnection(pika.URLParameters(urls[1]))
        first.channel().queue_declare("cluster-q", durable=True, arguments=arguments)
        first.channel().basic_publish("", "cluster-q", b"through node 2")
        first.close()
        members = cluster.queue_members("cluster-q")
        assert set(members["members"]) == names and members["leader"] in names

        last = pika.BlockingConnection(pika.URLParameters(urls[2]))
        _, _, body = last.channel().basic_get("cluster-q", auto_ack=True)
        last.close()
        assert body == b"through node 2"

        killed = cluster.nodes[2]
        cluster.kill(killed)
        assert not killed.alive()
        deadline = time.monotonic() + RUNNING_WAIT_S
        while cluster.running_nodes() != names - {killed.nodename}:
            assert time.monotonic() < deadline, cluster.running_nodes()
            time.sleep(0.2)
    finally:
        assert rabbitmq_cluster.main(["stop", "--state", str(state)]) == 0
    assert not state.exists()
    for node in cluster.nodes:
        assert not node.alive() and not Path(node.base_dir).exists()

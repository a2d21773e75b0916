"""Replica sets on a 3-node cluster (`warren cluster up`): a quorum queue declared with
x-quorum-initial-group-size=3 has a member on every node in /api/queues (its ISR its leader
alone until the data path replicates), `warren queues shrink` takes a node's replicas away
and `warren queues grow` gives them back, through the HTTP API with its JSON errors."""

from __future__ import annotations

import json

import pytest
from cluster_nodes import amqp, api, down, up, warren
from http_api import eventually, name, path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # Replicating: followers copy the queues and join the ISR once caught up.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WARREN_REPLICATE", "1")
        running = up(tmp_path_factory.mktemp("cluster"), 3)
    yield running
    down(running)


def members(cluster, queue: str) -> tuple[list[str], list[str], str]:
    item = api(cluster, 1).get(path("api", "queues", "/", queue)).json
    return item["members"], item["isr"], item["leader"]


def login(cluster) -> list[str]:
    return ["--url", cluster.nodes[2].http_url]


def test_a_quorum_queue_of_three_is_shrunk_and_grown_again(cluster):
    queue = name("qq")
    connection = amqp(cluster, 1)
    connection.channel().queue_declare(
        queue,
        durable=True,
        arguments={"x-queue-type": "quorum", "x-quorum-initial-group-size": 3},
    )
    connection.close()
    item = api(cluster, 1).get(path("api", "queues", "/", queue)).json
    assert item["leader"] == item["node"] == "warren@1"
    assert sorted(item["members"]) == ["warren@1", "warren@2", "warren@3"]
    assert item["members"][0] == "warren@1"
    # In sync on its leader alone at first; the followers join once they fetched it all.
    assert item["isr"][0] == "warren@1" and item["leader_epoch"] == 0
    assert eventually(lambda: sorted(members(cluster, queue)[1]), item["members"]) == sorted(
        item["members"]
    )
    # Node 2 sees the same members, and all three online.
    assert eventually(
        lambda: sorted(api(cluster, 2).get(path("api", "queues", "/", queue)).json["online"]),
        ["warren@1", "warren@2", "warren@3"],
    )

    printed = warren("queues", "shrink", "warren@3", "--json", *login(cluster))
    results = {r["name"]: r for r in json.loads(printed)}
    assert results[queue]["result"] == "ok" and results[queue]["size"] == 2
    assert sorted(members(cluster, queue)[0]) == ["warren@1", "warren@2"]

    printed = warren("queues", "grow", "3", "all", "--queue-pattern", f"^{queue}$", *login(cluster))
    assert queue in printed and "ok" in printed
    assert sorted(members(cluster, queue)[0]) == ["warren@1", "warren@2", "warren@3"]
    # The new replica joins the ISR once it caught up (fetched the whole, empty, queue); the
    # leader stays.
    everyone = ["warren@1", "warren@2", "warren@3"]
    assert eventually(lambda: sorted(members(cluster, queue)[1]), everyone) == everyone
    assert members(cluster, queue)[2] == "warren@1"


def test_shrinking_a_queue_led_alone_answers_per_queue_errors(cluster):
    queue = name("single")
    connection = amqp(cluster, 3)
    connection.channel().queue_declare(
        queue, durable=True, arguments={"x-quorum-initial-group-size": 1, "x-queue-type": "quorum"}
    )
    connection.close()
    answer = api(cluster, 1).post("/api/queue-replicas/shrink", {"node": "warren@3"})
    assert answer.status == 200
    (result,) = [r for r in answer.json if r["name"] == queue]
    assert (result["result"], result["size"]) == ("last_node", 1)


def test_replica_requests_are_checked(cluster):
    http = api(cluster, 1)
    refused = http.post("/api/queue-replicas/grow", {"node": "warren@9"})
    assert refused.status == 400 and "not running" in refused.json["reason"]
    refused = http.post("/api/queue-replicas/grow", {"node": 2, "strategy": "odd"})
    assert refused.status == 400 and "strategy" in refused.json["reason"]
    refused = http.post("/api/queue-replicas/rebalance", {"type": "lazy"})
    assert refused.status == 400
    refused = http.post("/api/queue-replicas/shrink", {"node": "nobody"})
    assert refused.status == 400
    assert http.post("/api/queue-replicas/rebalance", {}).status == 200

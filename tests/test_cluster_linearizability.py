"""The cluster's metadata is linearizable, checked on a history recorded against three real
`warren serve` processes whose metadata leader is SIGKILLed midway, with the Raft
simulator's checker (`cluster/raft/linearizability.py`).

The metadata is modelled as registers (`KvModel`), each written and read through every
node, by clients on threads of their own:
* a policy, through the HTTP API: PUT /api/policies/%2F/{key} (a new max-length each time)
  writes, GET reads its value (404: never written);
* a queue's existence, through AMQP: queue.declare writes "present", queue.delete writes
  absent (None), a passive queue.declare reads it (404: absent).
A write whose answer never came (connection lost, timeout, an error reply: the cluster
says "outcome unknown" for those) is recorded without a return, as the checker allows: it
may have taken effect at any time after its call, or never. A read that failed constrains
nothing and is left out.

Reads are linearizable because the node answering a passive declare or a metadata GET
first waits for a ReadIndex point (`ReplicatedMetadata.read_barrier`); without it, a
follower that had not yet applied a write another node answered OK read the value before.
"""

from __future__ import annotations

import itertools
import random
import threading
import time

import pika
import pytest
from cluster_nodes import down, leader, up
from http_api import HttpApi, name, path

from warrenmq.cluster.raft.linearizability import KvModel, Operation, check

PRESENT = "present"
CLIENTS = 4
BEFORE_KILL_S = 4.0
AFTER_KILL_S = 10.0
HTTP_TIMEOUT_S = 15.0


class History:
    def __init__(self) -> None:
        self.operations: list[Operation] = []
        self._lock = threading.Lock()

    def record(self, client: int, input: tuple, call: int, output, ret: int | None) -> None:
        with self._lock:
            self.operations.append(Operation(client, input, call, output, ret))


class Client:
    """One client: random operations on random keys through random live nodes."""

    def __init__(self, number: int, cluster, keys, history, stop, live) -> None:
        self.number = number
        self.cluster = cluster
        self.policies, self.queues = keys
        self.history = history
        self.stop = stop
        self.live = live
        self.random = random.Random(number)
        self.values = itertools.count(number * 1_000_000)
        self.channels: dict[int, pika.adapters.blocking_connection.BlockingChannel] = {}

    def run(self) -> None:
        while not self.stop.is_set():
            node = self.random.choice(self.live[0])
            if self.random.random() < 0.5:
                self.policy_operation(node, self.random.choice(self.policies))
            else:
                self.queue_operation(node, self.random.choice(self.queues))
        for channel in self.channels.values():
            try:
                channel.connection.close()
            except pika.exceptions.AMQPError:
                pass

    def policy_operation(self, node: int, key: str) -> None:
        http = HttpApi(self.cluster.nodes[node].http_url)
        target = path("api", "policies", "/", key)
        call = time.monotonic_ns()
        if self.random.random() < 0.5:
            value = next(self.values)
            definition = {"pattern": "^no-such-queue$", "definition": {"max-length": value}}
            try:
                status = http.put(target, definition).status
            except OSError:
                status = None
            ok = status in (201, 204)
            self.history.record(
                self.number, ("put", key, value), call, None, time.monotonic_ns() if ok else None
            )
            return
        try:
            reply = http.get(target)
        except OSError:
            return
        if reply.status == 404:
            value = None
        elif reply.status == 200:
            value = reply.json["definition"]["max-length"]
        else:
            return
        self.history.record(self.number, ("get", key), call, value, time.monotonic_ns())

    def queue_operation(self, node: int, key: str) -> None:
        try:
            channel = self.channel(node)
        except pika.exceptions.AMQPError:
            return
        choice = self.random.random()
        call = time.monotonic_ns()
        try:
            if choice < 0.5:
                channel.queue_declare(key, passive=True)
                value = PRESENT
            elif choice < 0.75:
                channel.queue_declare(key, durable=True)
                self.record_write(key, PRESENT, call, time.monotonic_ns())
                return
            else:
                channel.queue_delete(key)
                self.record_write(key, None, call, time.monotonic_ns())
                return
        except pika.exceptions.ChannelClosedByBroker as closed:
            self.channels.pop(node, None)
            if choice < 0.5 and closed.reply_code == 404:
                value = None
            else:
                if choice >= 0.5:
                    self.record_write(key, PRESENT if choice < 0.75 else None, call, None)
                return
        except pika.exceptions.AMQPError:
            self.channels.pop(node, None)
            if choice >= 0.5:
                self.record_write(key, PRESENT if choice < 0.75 else None, call, None)
            return
        self.history.record(self.number, ("get", key), call, value, time.monotonic_ns())

    def record_write(self, key: str, value, call: int, ret: int | None) -> None:
        self.history.record(self.number, ("put", key, value), call, None, ret)

    def channel(self, node: int):
        channel = self.channels.get(node)
        if channel is None or not channel.is_open:
            parameters = pika.ConnectionParameters(
                "127.0.0.1",
                self.cluster.nodes[node].amqp_port,
                socket_timeout=5,
                blocked_connection_timeout=HTTP_TIMEOUT_S,
            )
            channel = pika.BlockingConnection(parameters).channel()
            self.channels[node] = channel
        return channel


@pytest.fixture
def cluster(tmp_path):
    running = up(tmp_path / "cluster", 3)
    yield running
    down(running)


@pytest.mark.slow
def test_metadata_written_and_read_through_every_node_across_a_leader_kill_is_linearizable(
    cluster,
):
    keys = ([name("policy") for _ in range(2)], [name("queue") for _ in range(2)])
    history = History()
    stop = threading.Event()
    live = [(1, 2, 3)]  # the nodes clients use, replaced as a whole
    clients = [Client(n, cluster, keys, history, stop, live) for n in range(CLIENTS)]
    threads = [threading.Thread(target=client.run) for client in clients]
    for thread in threads:
        thread.start()
    try:
        time.sleep(BEFORE_KILL_S)
        killed = leader(cluster)
        live[0] = tuple(node for node in (1, 2, 3) if node != killed)
        killed_ns = time.monotonic_ns()
        cluster.kill(killed)
        time.sleep(AFTER_KILL_S)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    operations = history.operations
    returned = [op for op in operations if op.ret is not None]
    after_kill = [op for op in returned if op.call > killed_ns]
    assert len({op.input[0] for op in returned}) == 2, "no reads or no writes answered"
    assert after_kill
    result = check(operations, KvModel())
    assert result.ok is True, result.failing_part

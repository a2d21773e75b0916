"""Replicas that come and go on a 3-node cluster (`warren cluster up`, replication on: the
default in a cluster): a follower down while its queue takes publishes and acks fetches what
it missed when it returns, and joins the ISR again, even when the leader deleted the acked
segments meanwhile; `warren queues grow` adds a replica that copies the leader's log while a
publisher keeps going; `warren queues shrink` takes a follower away with its files.

Each test starts its own cluster. The helpers of tests/test_cluster_replication.py (written
for the same data path) publish with confirms, consume, read /api/queues and poll."""

from __future__ import annotations

import dataclasses
import re
import threading
from pathlib import Path

import pytest
from cluster_nodes import amqp, down, up, warren
from http_api import eventually, name
from test_cluster_replication import (
    ALL_MEMBERS,
    PERSISTENT,
    bodies_for,
    consume_all,
    node_id,
    poll,
    publish_confirmed,
    queue_state,
    replicas,
)

from warrenmq.log import LogConfig, PartitionLog
from warrenmq.server.queue.ack_log import CLIP
from warrenmq.server.queue.log_queue import ACKS_DIR, MESSAGES_DIR, QueueConfig
from warrenmq.server.vhost import directory_name

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

NODES = (1, 2, 3)
QUORUM = {"x-queue-type": "quorum"}
# A dead follower leaves the ISR once it has not caught up for the core's replica_lag_s
# (10 s); one that returns, or a new one, joins it once it holds the leader's HW.
ISR_WAIT_S = 40.0
# Small message log segments (WARREN_SEGMENT_BYTES_MAX, the broker's segment_bytes_max): a
# few dozen of these messages fill one, so acking the first 300 of 500 lets the leader
# delete whole segments (`LogQueue._apply_synced_flushes`).
SEGMENT_BYTES = 4096
# The background publisher of the grow test: between two confirmed publishes.
PUBLISH_PAUSE_S = 0.01
PROGRESS_WAIT_S = 20.0


@pytest.fixture
def environment(monkeypatch):
    """Replication on (`--replicate`, whatever this process's environment says); the
    nodes, restarted ones too, get this process's environment."""
    monkeypatch.setenv("WARREN_REPLICATE", "1")
    return monkeypatch


@pytest.fixture
def small_segments(environment):
    environment.setenv("WARREN_SEGMENT_BYTES_MAX", str(SEGMENT_BYTES))


@pytest.fixture
def cluster(tmp_path, environment):
    running = up(tmp_path / "cluster", 3)
    try:
        yield running
    finally:
        down(running)


@pytest.fixture
def small_segment_cluster(tmp_path, small_segments):
    running = up(tmp_path / "cluster", 3)
    try:
        yield running
    finally:
        down(running)


# -- helpers -------------------------------------------------------------------------------


def declare(cluster, node: int, queue: str, arguments: dict | None = None) -> dict:
    """`queue`, durable quorum, declared through `node`: its state once every node knows it."""
    connection = amqp(cluster, node)
    connection.channel().queue_declare(
        queue, durable=True, arguments={**QUORUM, **(arguments or {})}
    )
    connection.close()
    for other in NODES:
        known = poll(lambda n=other: queue_state(cluster, n, queue), lambda _: True, 10.0)
        assert known is not None, f"node {other} does not know {queue}"
    return queue_state(cluster, node, queue)


def wait_state(cluster, node: int, queue: str, done, timeout_s: float = ISR_WAIT_S) -> dict | None:
    return poll(lambda: queue_state(cluster, node, queue), done, timeout_s)


def queue_directory(cluster, node: int, queue: str) -> Path:
    return (
        cluster.directory / f"node-{node}" / "queues" / directory_name("/") / directory_name(queue)
    )


def open_log(cluster, node: int, queue: str, part: str, config: LogConfig) -> PartitionLog:
    directory = queue_directory(cluster, node, queue) / part
    # PartitionLog.open creates a missing directory: a missing replica must fail, not be made.
    assert directory.is_dir(), f"node {node} has no replica of {queue} at {directory}"
    return PartitionLog.open(directory, config)


def message_log(cluster, node: int, queue: str, segment_bytes: int | None = None):
    """(start offset, every record) of `node`'s copy of the queue's messages log."""
    config = QueueConfig().message_log
    if segment_bytes is not None:
        config = dataclasses.replace(config, segment_bytes_max=segment_bytes)
    log = open_log(cluster, node, queue, MESSAGES_DIR, config)
    try:
        return log.start_offset, list(log.records_from(0))
    finally:
        log.close()


def ack_log(cluster, node: int, queue: str) -> tuple[int, int, list[tuple[int, int]]]:
    """(start offset, end offset, (offset, kind) of every record) of `node`'s copy of the
    queue's acks log; a record's kind is its first byte (`server/queue/ack_log.py`: 1 DELTA,
    2 CLIP, ...)."""
    log = open_log(cluster, node, queue, ACKS_DIR, QueueConfig().ack_log)
    try:
        kinds = [(record.offset, record.body[0]) for record in log.records_from(0)]
        return log.start_offset, log.end_offset, kinds
    finally:
        log.close()


REPLICATION_ERROR = "ERROR warrenmq.server.replication"
PROBLEM = re.compile(r" ERROR |Traceback")


def problems(cluster, lines: int = 12) -> str:
    """What the nodes logged that looks wrong (the last `lines` of each): for failure
    messages."""
    shown = []
    for node in sorted(cluster.nodes):
        path = cluster.log_path(node)
        if not path.exists():
            continue
        found = [
            line for line in path.read_text(errors="replace").splitlines() if PROBLEM.search(line)
        ]
        if found:
            shown.append(f"node-{node}.log:\n  " + "\n  ".join(found[-lines:]))
    return "\n".join(shown) or "(no errors in the node logs)"


def consume_and_ack_first(cluster, node: int, queue: str, count: int) -> list[bytes]:
    """The first `count` messages consumed through `node`, each acked; the rest that were
    prefetched go back to the queue with the connection."""
    connection = amqp(cluster, node)
    channel = connection.channel()
    channel.basic_qos(prefetch_count=50)
    received: list[bytes] = []
    for method, _, body in channel.consume(queue, inactivity_timeout=10):
        assert method is not None, f"only {len(received)} of {count} arrived through warren@{node}"
        received.append(body)
        channel.basic_ack(method.delivery_tag)
        if len(received) == count:
            break
    channel.cancel()
    connection.close()
    return received


def replication_errors(cluster) -> list[str]:
    """The errors the nodes' replication host logged (`Replicas`: a failed fetch answer,
    store or turn), each with its node."""
    found = []
    for node in sorted(cluster.nodes):
        path = cluster.log_path(node)
        if path.exists():
            text = path.read_text(errors="replace")
            found += [
                f"node-{node}.log: {line}"
                for line in text.splitlines()
                if REPLICATION_ERROR in line
            ]
    return found


class Publisher:
    """A client on a thread of its own publishing persistent, mandatory messages with
    confirms through `node` until stopped: what was confirmed, and any error (the cluster
    stays healthy meanwhile, so there should be none)."""

    def __init__(self, cluster, node: int, queue: str) -> None:
        self.cluster, self.node, self.queue = cluster, node, queue
        self.confirmed: list[bytes] = []
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Publisher:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        assert not self._thread.is_alive(), (
            f"the publisher hangs after {len(self.confirmed)} confirms (a confirm that never "
            f"came): {replicas(queue_state(self.cluster, self.node, self.queue))}"
        )

    def wait_for(self, more: int, timeout_s: float = PROGRESS_WAIT_S) -> None:
        """Until `more` publishes more than now were confirmed."""
        target = len(self.confirmed) + more
        reached = eventually(
            lambda: len(self.confirmed) >= target or bool(self.errors), True, timeout_s
        )
        assert reached and not self.errors, (
            f"the publisher is stuck at {len(self.confirmed)} confirms, errors {self.errors}: "
            f"{replicas(queue_state(self.cluster, self.node, self.queue))}"
        )

    def _run(self) -> None:
        try:
            connection = amqp(self.cluster, self.node)
            channel = connection.channel()
            channel.confirm_delivery()
            index = 0
            while not self._stop.wait(PUBLISH_PAUSE_S):
                body = f"{self.queue}-bg-{index:05d}".encode()
                channel.basic_publish("", self.queue, body, PERSISTENT, mandatory=True)
                self.confirmed.append(body)
                index += 1
            connection.close()
        except BaseException as error:
            self.errors.append(error)


# -- the tests -----------------------------------------------------------------------------


def test_a_follower_down_during_publishing_catches_up_when_it_returns(small_segment_cluster):
    cluster = small_segment_cluster
    queue = name("returns")
    state = declare(cluster, 1, queue)
    assert state["leader"] == "warren@1", replicas(state)
    assert sorted(state["members"]) == ALL_MEMBERS, replicas(state)
    state = wait_state(cluster, 1, queue, lambda s: sorted(s["isr"]) == ALL_MEMBERS)
    assert state is not None and sorted(state["isr"]) == ALL_MEMBERS, replicas(state)

    cluster.kill(3)
    # Out of the ISR once it lags replica_lag_s: confirms then need warren@1 and warren@2.
    state = wait_state(cluster, 1, queue, lambda s: "warren@3" not in s["isr"])
    assert state is not None and sorted(state["isr"]) == ["warren@1", "warren@2"], (
        f"warren@3 is still in the ISR {ISR_WAIT_S} s after it was killed: {replicas(state)}"
    )
    published = bodies_for(queue, 500)
    publish_confirmed(cluster, 1, queue, published)
    consumed = consume_and_ack_first(cluster, 1, queue, 300)
    assert consumed == published[:300]

    cluster.start(3)
    cluster.wait_listening(3)
    for node in (1, 3):
        state = wait_state(cluster, node, queue, lambda s: sorted(s["isr"]) == ALL_MEMBERS)
        assert state is not None and sorted(state["isr"]) == ALL_MEMBERS, (
            f"warren@{node} shows {queue}'s ISR not back to 3 members {ISR_WAIT_S} s after "
            f"warren@3 restarted: {replicas(state)}\n{problems(cluster)}"
        )
        assert state["leader"] == "warren@1", replicas(state)
    down(cluster)

    leader_start, leader_records = message_log(cluster, 1, queue, SEGMENT_BYTES)
    start, records = message_log(cluster, 3, queue, SEGMENT_BYTES)
    print(f"warren@1's messages log starts at {leader_start}, warren@3's at {start}")
    assert leader_start > 0, (
        f"the leader deleted none of the acked messages' {SEGMENT_BYTES}-byte segments"
    )
    assert [record.body for record in leader_records] == published[leader_start:]
    copied = [record for record in records if record.offset >= leader_start]
    assert [r.body for r in copied] == [r.body for r in leader_records], (
        f"warren@3's messages log from offset {leader_start} holds {len(copied)} messages, "
        f"the leader's {len(leader_records)}"
    )
    # Verbatim: offsets, terms, timestamps, exchange, routing key, properties.
    assert copied == leader_records, "warren@3's records differ from the leader's"

    leader_start, leader_end, leader_kinds = ack_log(cluster, 1, queue)
    start, end, kinds = ack_log(cluster, 3, queue)
    # The follower holds the leader's ack records (the 300 acks among them); past its end,
    # the leader has only what its clean shutdown wrote last (a CLIP at its exact delivered
    # mark, and what follows it), its own uncommitted tail.
    assert kinds == [k for k in leader_kinds if start <= k[0] < end], (
        f"warren@3's acks log [{start}, {end}) differs from the leader's "
        f"[{leader_start}, {leader_end})\n{problems(cluster)}"
    )
    tail = [k for k in leader_kinds if k[0] >= end]
    assert not tail or tail[0][1] == CLIP, (
        f"(offset, kind) past warren@3's end on the leader: {tail}\n{problems(cluster)}"
    )


def test_grow_adds_a_replica_that_catches_up_while_publishers_run(cluster):
    queue = name("grown")
    state = declare(cluster, 1, queue, {"x-quorum-initial-group-size": 2})
    assert len(state["members"]) == 2, replicas(state)
    (third,) = [node for node in NODES if f"warren@{node}" not in state["members"]]
    leader = node_id(state["leader"])
    confirmed = set(publish_confirmed(cluster, 1, queue, bodies_for(queue, 300)))

    with Publisher(cluster, 1, queue) as publisher:
        publisher.wait_for(20)
        only = f"^{re.escape(queue)}$"
        url = cluster.nodes[2].http_url
        printed = warren(
            "queues", "grow", f"warren@{third}", "all", "--queue-pattern", only, "--url", url
        )
        assert queue in printed and "ok" in printed, printed
        state = wait_state(cluster, 1, queue, lambda s: sorted(s["members"]) == ALL_MEMBERS, 10)
        assert state is not None and sorted(state["members"]) == ALL_MEMBERS, replicas(state)
        state = wait_state(cluster, 1, queue, lambda s: f"warren@{third}" in s["isr"])
        assert state is not None and sorted(state["isr"]) == ALL_MEMBERS, (
            f"warren@{third} is not in {queue}'s ISR {ISR_WAIT_S} s after it grew there: "
            f"{replicas(state)}\n{problems(cluster)}"
        )
        assert state["leader"] == f"warren@{leader}", replicas(state)
        # Publishes confirmed with the new replica in the ISR, then stop.
        publisher.wait_for(50)
    assert not publisher.errors, f"the publisher failed: {publisher.errors}"
    confirmed |= set(publisher.confirmed)
    print(f"{len(publisher.confirmed)} published in the background")

    received = consume_all(cluster, 1, queue, confirmed)
    missing = confirmed - received
    assert not missing, f"{len(missing)} of {len(confirmed)} confirmed messages are not consumable"
    state = queue_state(cluster, 1, queue)
    assert state is not None and sorted(state["isr"]) == ALL_MEMBERS, replicas(state)
    down(cluster)

    leader_start, leader_records = message_log(cluster, leader, queue)
    start, records = message_log(cluster, third, queue)
    leader_bodies = [record.body for record in leader_records]
    assert set(leader_bodies) >= confirmed
    assert [record.body for record in records] == leader_bodies, (
        f"warren@{third}'s messages log holds {len(records)} messages from offset {start}, "
        f"the leader's {len(leader_records)} from {leader_start}"
    )
    assert records == leader_records, f"warren@{third}'s records differ from the leader's"
    assert not replication_errors(cluster), "\n".join(replication_errors(cluster))


def test_shrink_removes_the_replica_and_its_files(cluster):
    queue = name("shrunk")
    state = declare(cluster, 1, queue)
    assert state["leader"] == "warren@1", replicas(state)
    assert sorted(state["members"]) == ALL_MEMBERS, replicas(state)
    before = set(publish_confirmed(cluster, 1, queue, bodies_for(queue, 100)))
    state = wait_state(cluster, 1, queue, lambda s: sorted(s["isr"]) == ALL_MEMBERS)
    assert state is not None and sorted(state["isr"]) == ALL_MEMBERS, replicas(state)
    directory = queue_directory(cluster, 3, queue)
    assert directory.is_dir(), f"warren@3 holds no replica of {queue} at {directory}"

    printed = warren("queues", "shrink", "warren@3", "--url", cluster.nodes[2].http_url)
    assert queue in printed and "ok" in printed, printed
    for node in NODES:
        state = wait_state(cluster, node, queue, lambda s: len(s["members"]) == 2, 10)
        assert state is not None and sorted(state["members"]) == ["warren@1", "warren@2"], (
            f"warren@{node} shows {replicas(state)}"
        )
        assert sorted(state["isr"]) == ["warren@1", "warren@2"], replicas(state)
        assert state["leader"] == "warren@1", replicas(state)

    # Renamed away at once (NAME.deleted-...), its files deleted in a worker thread.
    def remains() -> list[str]:
        vhost = directory.parent
        return sorted(p.name for p in vhost.iterdir() if p.name.startswith(directory.name))

    left = eventually(remains, [], 10)
    assert left == [], f"warren@3 still holds {left} in {directory.parent}\n{problems(cluster)}"
    for node in (1, 2):
        assert queue_directory(cluster, node, queue).is_dir(), f"warren@{node} lost its replica"

    # Through the node that no longer holds a replica, which forwards to the leader.
    after = set(publish_confirmed(cluster, 3, queue, bodies_for(queue, 100, "after")))
    received = consume_all(cluster, 3, queue, before | after)
    assert not (before | after) - received, (
        f"{len((before | after) - received)} of {len(before | after)} confirmed messages are "
        f"not consumable after the shrink\n{problems(cluster)}"
    )
    # A fetch of warren@3's that the leader held (a long poll) or was reading when the shrink
    # came is no error: it is answered, or dropped, quietly.
    assert not replication_errors(cluster), "\n".join(replication_errors(cluster))

"""Queue replication's data path on a 3-node cluster (`warren cluster up`, every node started
with `WARREN_REPLICATE=1`, i.e. `warren serve --replicate`): the followers of a durable quorum
queue copy its leader's logs and join its ISR, a confirm means fsynced on a majority, a
SIGKILLed leader is replaced by an in-sync follower that serves every confirmed message, and
the old leader restarted comes back as a follower. A stream's log and its tracked offsets
are replicated the same way: after a failover the new leader serves every confirmed record,
and a tracked consumer resumes after what it acked.

The nodes get the setting through their environment: `up` runs `warren cluster up`, which
starts them with its own environment, and `LocalCluster.start` (a restart) with this
process's, so setting it here (monkeypatch) reaches every node, restarted ones too."""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue as queues
import threading
import time
from pathlib import Path

import pika
import pika.exceptions
import pytest
from cluster_nodes import amqp, api, down, up
from http_api import name, path

from warrenmq.log import PartitionLog, Record
from warrenmq.server.queue.log_queue import MESSAGES_DIR, QueueConfig
from warrenmq.server.vhost import directory_name

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

NODES = (1, 2, 3)
ALL_MEMBERS = ["warren@1", "warren@2", "warren@3"]
QUORUM = {"x-queue-type": "quorum"}
PERSISTENT = pika.BasicProperties(delivery_mode=2)
ISR_WAIT_S = 20.0
# A publisher that waits this long for its next confirm, or a consume that takes longer,
# fails the test instead of hanging it.
CONFIRM_STALL_S = 15.0
CONSUME_WAIT_S = 40.0
FAILOVER_WAIT_S = 20.0
FAILOVER_MAX_S = 10.0
# A basic.get is tried again through the next survivor this often while the queue fails over.
RETRY_S = 0.25


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    monkeypatch.setenv("WARREN_REPLICATE", "1")
    running = up(tmp_path / "cluster", 3)
    try:
        for node in running.nodes.values():
            environment = Path(f"/proc/{node.pid}/environ").read_bytes().split(b"\0")
            assert b"WARREN_REPLICATE=1" in environment, f"node {node.node_id} has no setting"
        yield running
    finally:
        down(running)


def node_id(member: str) -> int:
    return int(member.partition("@")[2])


def replicas(state: dict | None) -> dict | None:
    """What a failure message shows of a queue's state."""
    keys = ("leader", "members", "online", "isr", "leader_epoch", "messages")
    return None if state is None else {key: state.get(key) for key in keys}


def queue_state(cluster, node: int, queue: str) -> dict | None:
    """The queue as `node`'s /api/queues shows it (leader, members, isr...), or None when the
    node does not answer or does not know it."""
    try:
        reply = api(cluster, node).get(path("api", "queues", "/", queue))
    except OSError:
        return None
    return reply.json if reply.status == 200 else None


def poll(read, done, timeout_s: float):
    """`read()` until `done` holds for its value (None, and exceptions, never do), or its
    last value after `timeout_s`."""
    deadline_s = time.monotonic() + timeout_s
    while True:
        try:
            value = read()
        except Exception:
            value = None
        if value is not None and done(value):
            return value
        if time.monotonic() > deadline_s:
            return value
        time.sleep(0.1)


def isr_of_all_three(cluster, node: int, queue: str) -> dict | None:
    return poll(
        lambda: queue_state(cluster, node, queue),
        lambda state: sorted(state["isr"]) == ALL_MEMBERS,
        ISR_WAIT_S,
    )


def declare(cluster, node: int, queue: str, arguments=QUORUM) -> None:
    connection = amqp(cluster, node)
    connection.channel().queue_declare(queue, durable=True, arguments=arguments)
    connection.close()
    for other in NODES:
        known = poll(lambda n=other: queue_state(cluster, n, queue), lambda _: True, 10.0)
        assert known is not None, f"node {other} does not know {queue}"
    state = queue_state(cluster, node, queue)
    assert sorted(state["members"]) == ALL_MEMBERS, replicas(state)


def within(stall_s: float, what: str, function, *args, progress=lambda: None):
    """`function(*args)` in a thread of its own: its result, or its exception raised here;
    an AssertionError naming `what` if it has not returned and `progress()` has not changed
    for `stall_s` (a blocking pika call has no timeout of its own; the thread is left to end
    with its connection)."""
    outcome: queues.Queue[tuple[bool, object]] = queues.Queue()

    def run() -> None:
        try:
            outcome.put((True, function(*args)))
        except BaseException as error:
            outcome.put((False, error))

    threading.Thread(target=run, daemon=True).start()
    seen, since_s = progress(), time.monotonic()
    while True:
        try:
            ok, value = outcome.get(timeout=0.2)
            break
        except queues.Empty:
            now_s = time.monotonic()
            if (current := progress()) != seen:
                seen, since_s = current, now_s
            elif now_s - since_s > stall_s:
                raise AssertionError(f"{what}: no progress for {stall_s} s") from None
    if not ok:
        raise value  # type: ignore[misc]
    return value


def publish_confirmed(cluster, node: int, queue: str, bodies: list[bytes]) -> set[bytes]:
    """Each body published persistent, mandatory and confirmed through `node`: a nack, a
    return or confirms that stop coming fail the test (the cluster is healthy meanwhile)."""
    progress = {"confirmed": 0}

    def publish() -> set[bytes]:
        connection = amqp(cluster, node)
        channel = connection.channel()
        channel.confirm_delivery()
        for body in bodies:
            channel.basic_publish("", queue, body, PERSISTENT, mandatory=True)
            progress["confirmed"] += 1
        connection.close()
        return set(bodies)

    try:
        return within(
            CONFIRM_STALL_S,
            f"publishing {len(bodies)} through warren@{node}",
            publish,
            progress=lambda: progress["confirmed"],
        )
    except AssertionError as error:
        raise AssertionError(
            f"{error} ({progress['confirmed']} confirmed; a confirm waits for an ISR of 2 or "
            f"more: {replicas(queue_state(cluster, node, queue))})"
        ) from None


def bodies_for(queue: str, count: int, tag: str = "m") -> list[bytes]:
    return [f"{queue}-{tag}-{i:04d}".encode() for i in range(count)]


def consume_all(cluster, node: int, queue: str, expected: set[bytes]) -> set[bytes]:
    """Every body consumed (and acked) through `node` until `expected` all arrived, or none
    came for 5 s."""
    what = f"consuming through warren@{node}"
    return within(CONSUME_WAIT_S, what, _consume, cluster, node, queue, expected)


def _consume(cluster, node: int, queue: str, expected: set[bytes]) -> set[bytes]:
    connection = amqp(cluster, node)
    channel = connection.channel()
    channel.basic_qos(prefetch_count=200)
    received: set[bytes] = set()
    deadline_s = time.monotonic() + CONSUME_WAIT_S - 5
    for method, _, body in channel.consume(queue, inactivity_timeout=5):
        if method is None:
            break
        received.add(body)
        channel.basic_ack(method.delivery_tag)
        if expected <= received or time.monotonic() > deadline_s:
            break
    channel.cancel()
    connection.close()
    return received


def first_get(cluster, nodes: list[int], queue: str, timeout_s: float) -> tuple[float, int] | None:
    """A basic.get on `queue` tried through each of `nodes` in turn, a new try every RETRY_S,
    each in a thread of its own (a try may wait on the dead leader, or hang): when the first
    got a message, and through which node; None if none did within `timeout_s`. The message
    is left unacked and its connection closed, so it is requeued (redelivered later)."""
    answers: queues.Queue[tuple[float, int]] = queues.Queue()

    def attempt(node: int) -> None:
        try:
            connection = amqp(cluster, node)
            try:
                method, _, _ = connection.channel().basic_get(queue, auto_ack=False)
                if method is not None:
                    answers.put((time.monotonic(), node))
            finally:
                connection.close()
        except Exception:
            pass

    # Every refused try logs a warning of pika's: hundreds while the queue fails over.
    pika_log = logging.getLogger("pika")
    level = pika_log.level
    pika_log.setLevel(logging.CRITICAL)
    try:
        deadline_s = time.monotonic() + timeout_s
        for node in itertools.cycle(nodes):
            threading.Thread(target=attempt, args=(node,), daemon=True).start()
            try:
                return answers.get(timeout=RETRY_S)
            except queues.Empty:
                if time.monotonic() > deadline_s:
                    return None
        raise AssertionError("unreachable")
    finally:
        pika_log.setLevel(level)


def kill_leader_and_fail_over(cluster, queue: str) -> tuple[int, float, int]:
    """SIGKILL the queue's leader: (the killed node, the seconds until a survivor's basic.get
    got a message, the survivor that answered)."""
    state = queue_state(cluster, 1, queue)
    killed = node_id(state["leader"])
    survivors = [node for node in NODES if node != killed]
    killed_at = time.monotonic()
    cluster.kill(killed)
    answered = first_get(cluster, survivors, queue, FAILOVER_WAIT_S)
    assert answered is not None, (
        f"no survivor served {queue} within {FAILOVER_WAIT_S} s of killing warren@{killed} "
        f"(it showed {replicas(state)}; now {replicas(queue_state(cluster, survivors[0], queue))})"
    )
    answered_at, through = answered
    return killed, answered_at - killed_at, through


def new_leader(cluster, node: int, queue: str, killed: int) -> dict | None:
    return poll(
        lambda: queue_state(cluster, node, queue),
        lambda state: state["leader"] not in (None, f"warren@{killed}"),
        FAILOVER_WAIT_S,
    )


def replica_records(cluster, node: int, queue: str, part: str = MESSAGES_DIR) -> list[Record]:
    """The records of `node`'s copy of a queue's log (`part`: a stream's is "")."""
    directory = (
        cluster.directory / f"node-{node}" / "queues" / directory_name("/") / directory_name(queue)
    ) / part
    # PartitionLog.open creates a missing directory: a missing replica must fail, not be made.
    assert directory.is_dir(), f"node {node} has no replica of {queue} at {directory}"
    log = PartitionLog.open(directory, QueueConfig().message_log)
    try:
        return list(log.records_from(0))
    finally:
        log.close()


def test_followers_hold_the_leaders_messages(cluster):
    queue = name("replicated")
    declare(cluster, 1, queue)
    published = bodies_for(queue, 300)
    publish_confirmed(cluster, 1, queue, published)
    state = isr_of_all_three(cluster, 1, queue)
    assert state is not None and sorted(state["isr"]) == ALL_MEMBERS, (
        f"the ISR of {queue} is not all 3 members after {ISR_WAIT_S} s: {replicas(state)}"
    )
    leader = node_id(state["leader"])
    down(cluster)

    records = {node: replica_records(cluster, node, queue) for node in NODES}
    for node in NODES:
        bodies = [record.body for record in records[node]]
        assert bodies == published, (
            f"warren@{node}'s replica ({'leader' if node == leader else 'follower'}) holds "
            f"{len(bodies)} messages, not the 300 published in order"
        )
    # Copied byte for byte: offsets, terms, timestamps, exchange, routing key, properties.
    for node in NODES:
        assert records[node] == records[leader], f"warren@{node}'s records differ from the leader's"


def test_a_killed_leader_is_replaced_and_loses_no_confirmed_message(cluster):
    queue = name("failover")
    declare(cluster, 1, queue)
    leader = node_id(queue_state(cluster, 1, queue)["leader"])
    publisher = next(node for node in NODES if node != leader)
    confirmed = publish_confirmed(cluster, publisher, queue, bodies_for(queue, 300))

    killed, took_s, through = kill_leader_and_fail_over(cluster, queue)
    print(f"failover took {took_s:.2f} s")
    assert took_s < FAILOVER_MAX_S, f"failover took {took_s:.2f} s"

    state = new_leader(cluster, through, queue, killed)
    assert state is not None and state["leader"] not in (None, f"warren@{killed}"), (
        f"/api/queues on warren@{through} shows no new leader: {replicas(state)}"
    )
    assert state["leader"] in state["isr"], replicas(state)

    received = consume_all(cluster, through, queue, confirmed)
    missing = confirmed - received
    assert not missing, f"{len(missing)} of {len(confirmed)} confirmed messages lost"


def test_a_restarted_leader_follows(cluster):
    queue = name("rejoin")
    declare(cluster, 1, queue)
    leader = node_id(queue_state(cluster, 1, queue)["leader"])
    publisher = next(node for node in NODES if node != leader)
    confirmed = publish_confirmed(cluster, publisher, queue, bodies_for(queue, 300))
    killed, _, through = kill_leader_and_fail_over(cluster, queue)
    state = new_leader(cluster, through, queue, killed)
    assert state is not None and state["leader"] not in (None, f"warren@{killed}"), (
        f"/api/queues on warren@{through} shows no new leader: {replicas(state)}"
    )

    cluster.start(killed)
    cluster.wait_listening(killed)
    for node in (through, killed):
        state = isr_of_all_three(cluster, node, queue)
        assert state is not None and sorted(state["isr"]) == ALL_MEMBERS, (
            f"warren@{node} shows {queue}'s ISR not back to 3 members after {ISR_WAIT_S} s: "
            f"{replicas(state)}"
        )
        assert state["leader"] != f"warren@{killed}", (
            f"the old leader leads again: {replicas(state)}"
        )

    # Through the restarted node: a follower now, which forwards to the new leader.
    more = publish_confirmed(cluster, killed, queue, bodies_for(queue, 50, "after"))
    received = consume_all(cluster, through, queue, confirmed | more)
    assert not more - received, f"{len(more - received)} of the 50 published after are missing"
    assert not confirmed - received, (
        f"{len(confirmed - received)} of the 300 confirmed before the kill are missing"
    )


STREAM = {"x-queue-type": "stream"}


def read_stream(cluster, node: int, stream: str, count: int) -> list[bytes]:
    """`count` records read through `node` from the stream's first offset, in order."""
    connection = amqp(cluster, node)
    channel = connection.channel()
    channel.basic_qos(prefetch_count=100)
    bodies: list[bytes] = []
    for method, _, body in channel.consume(
        stream, arguments={"x-stream-offset": "first"}, inactivity_timeout=5
    ):
        if method is None:
            break
        bodies.append(body)
        channel.basic_ack(method.delivery_tag)
        if len(bodies) == count:
            break
    channel.cancel()
    connection.close()
    return bodies


def read_as(cluster, node: int, stream: str, tag: str, count: int, **arguments) -> list[bytes]:
    """`count` records read and acked through `node` by a consumer tagged `tag`: from where
    that tag's tracked offset says, without an `x-stream-offset` in `arguments`."""
    connection = amqp(cluster, node)
    channel = connection.channel()
    channel.basic_qos(prefetch_count=10)
    bodies: list[bytes] = []

    def take(channel, method, properties, body) -> None:
        if len(bodies) < count:
            bodies.append(body)
            channel.basic_ack(method.delivery_tag)

    channel.basic_consume(stream, take, consumer_tag=tag, arguments=arguments)
    deadline_s = time.monotonic() + 10
    while len(bodies) < count and time.monotonic() < deadline_s:
        connection.process_data_events(time_limit=0.1)
    # The acks go out as pika processes events (process_data_events returns once it did
    # something, so it is called until the time is up).
    until_s = time.monotonic() + 0.5
    while time.monotonic() < until_s:
        connection.process_data_events(time_limit=0.05)
    # pika nacks what it holds beyond `count` as it closes, and a stream refuses a nack by
    # closing the connection (540, as RabbitMQ does).
    with contextlib.suppress(pika.exceptions.AMQPError):
        connection.close()
    return bodies


def test_a_stream_is_replicated_and_read_whole_after_its_leader_is_killed(cluster):
    stream = name("stream")
    declare(cluster, 1, stream, STREAM)
    state = isr_of_all_three(cluster, 1, stream)
    assert state is not None, f"the ISR of {stream} is not all 3 members: {replicas(state)}"
    leader = node_id(state["leader"])
    publisher = next(node for node in NODES if node != leader)
    published = bodies_for(stream, 300)
    publish_confirmed(cluster, publisher, stream, published)
    first = {"x-stream-offset": "first"}
    assert read_as(cluster, publisher, stream, "reader", 100, **first) == published[:100]

    cluster.kill(leader)
    survivors = [node for node in NODES if node != leader]
    read: list[bytes] = []
    deadline_s = time.monotonic() + FAILOVER_WAIT_S
    while read != published and time.monotonic() < deadline_s:
        for node in survivors:
            try:
                read = within(
                    CONSUME_WAIT_S, f"reading {stream}", read_stream, cluster, node, stream, 300
                )
            except Exception:
                read = []
            if read == published:
                break
        time.sleep(RETRY_S)
    assert read == published, (
        f"{len(read)} records read after the failover, not the 300 confirmed, in order "
        f"({replicas(queue_state(cluster, survivors[0], stream))})"
    )
    # The tracked offset of what "reader" acked is replicated too: it resumes after it.
    assert read_as(cluster, survivors[0], stream, "reader", 10) == published[100:110]
    down(cluster)
    # The survivors hold the same log, record for record (offsets, epochs, timestamps).
    first, second = (replica_records(cluster, node, stream, "") for node in survivors)
    assert [record.body for record in first] == published
    assert first == second


def test_a_priority_queue_is_replicated_level_by_level_and_fails_over_in_priority_order(cluster):
    queue = name("priority")
    declare(cluster, 1, queue, {"x-max-priority": 3})
    state = isr_of_all_three(cluster, 1, queue)
    assert state is not None, f"the ISR of {queue} is not all 3 members: {replicas(state)}"
    leader = node_id(state["leader"])
    publisher = next(node for node in NODES if node != leader)
    connection = amqp(cluster, publisher)
    channel = connection.channel()
    channel.confirm_delivery()
    sent = [(i % 4, f"{queue}-{i:03d}".encode()) for i in range(120)]
    for priority, body in sent:
        properties = pika.BasicProperties(delivery_mode=2, priority=priority)
        channel.basic_publish("", queue, body, properties, mandatory=True)
    connection.close()

    killed, _, through = kill_leader_and_fail_over(cluster, queue)
    assert killed == leader
    state = new_leader(cluster, through, queue, killed)
    assert state is not None and state["leader"] != f"warren@{killed}", replicas(state)
    connection = amqp(cluster, through)
    channel = connection.channel()
    got = []
    while True:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            break
        got.append((properties.priority or 0, body))
    connection.close()
    # Every confirmed message, the highest priority first, each level in publish order (the
    # one kill_leader_and_fail_over took and gave back is redelivered: in order all the same).
    assert sorted(set(got), key=lambda m: (-m[0], m[1])) == sorted(
        sent, key=lambda m: (-m[0], m[1])
    )
    assert [p for p, _ in got] == sorted((p for p, _ in got), reverse=True)


def test_a_consumer_waiting_on_a_restarted_leader_gets_what_its_followers_then_report(cluster):
    """Every node killed and restarted, nothing published since: the restarted leader's HW
    moves only as its followers report what they hold, and that alone must wake its
    consumers (it did not: a stream consumer waiting from before got nothing)."""
    stream = name("restarted")
    declare(cluster, 1, stream, STREAM)
    state = isr_of_all_three(cluster, 1, stream)
    assert state is not None, replicas(state)
    leader = node_id(state["leader"])
    published = bodies_for(stream, 50)
    publish_confirmed(cluster, leader, stream, published)
    for node in NODES:
        cluster.kill(node)
    first, last = [node for node in NODES if node != leader]
    for node in (leader, first):
        cluster.start(node)
    for node in (leader, first):
        cluster.wait_listening(node)
    # The last follower is down and in the ISR: the HW cannot move yet.
    connection = poll(lambda: amqp(cluster, leader), lambda _: True, FAILOVER_WAIT_S)
    channel = connection.channel()
    channel.basic_qos(prefetch_count=100)
    read: list[bytes] = []
    consumed = poll(
        lambda: channel.basic_consume(
            stream,
            lambda ch, method, properties, body: read.append(body),
            arguments={"x-stream-offset": "first"},
        ),
        lambda _: True,
        FAILOVER_WAIT_S,
    )
    assert consumed is not None, f"{stream} could not be consumed on its restarted leader"
    cluster.start(last)
    deadline_s = time.monotonic() + FAILOVER_WAIT_S
    while len(read) < len(published) and time.monotonic() < deadline_s:
        connection.process_data_events(time_limit=0.1)
    with contextlib.suppress(pika.exceptions.AMQPError):
        connection.close()
    assert read == published, f"{len(read)} of the 50 confirmed records delivered"

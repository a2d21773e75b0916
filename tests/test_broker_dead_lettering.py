"""Dead-lettering in a running broker: the hand-off between a queue and its dead-letter
targets (a dead letter leaves its queue only once every target holds it durably)."""

from __future__ import annotations

import asyncio
import errno
import threading
import time

import pika

SOURCE, TARGET = "dl-source", "dl-target"


def wait_for(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_dead_letter_leaves_its_queue_only_once_its_target_committed(start_broker, tmp_path):
    running = start_broker(tmp_path)
    connection = running.connect()
    channel = connection.channel()
    channel.queue_declare(TARGET, durable=True)
    channel.queue_declare(
        SOURCE,
        durable=True,
        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": TARGET},
    )
    channel.confirm_delivery()
    channel.basic_publish("", SOURCE, b"doomed", pika.BasicProperties(delivery_mode=2))
    queues = running.broker.vhosts["/"].queues
    source, target = queues[SOURCE], queues[TARGET]
    # The target's fsync waits until the test lets it through.
    release = threading.Event()
    commit = target.commit

    async def held_commit() -> None:
        await running.loop.run_in_executor(None, release.wait)
        await commit()

    target.commit = held_commit
    try:
        method, _, _ = channel.basic_get(SOURCE)
        channel.basic_reject(method.delivery_tag, requeue=False)
        wait_for(lambda: target.ready_count == 1)
        time.sleep(0.2)
        # Written to the target, not yet durable there: still in flight in the source.
        assert source.engine.unacked_count == 1
    finally:
        release.set()
    wait_for(lambda: source.engine.unacked_count == 0)
    method, properties, body = channel.basic_get(TARGET, auto_ack=True)
    assert body == b"doomed"
    assert properties.headers["x-death"][0]["queue"] == SOURCE
    connection.close()


def test_a_dead_letter_its_target_could_not_store_is_kept_and_published_again(
    start_broker, tmp_path
):
    """A full disk under the dead-letter queue: the expired message stays in its source (in
    flight), and once the target can write again it arrives, once."""
    running = start_broker(tmp_path)
    connection = running.connect()
    channel = connection.channel()
    channel.queue_declare(TARGET, durable=True)
    channel.queue_declare(
        SOURCE,
        durable=True,
        arguments={
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": TARGET,
            "x-message-ttl": 50,
        },
    )
    queues = running.broker.vhosts["/"].queues
    source, target = queues[SOURCE], queues[TARGET]
    append = target.engine.append
    attempts = []
    disk_full = threading.Event()
    disk_full.set()

    def append_unless_full(records, timestamp_ms=None):
        attempts.append(len(records))
        if disk_full.is_set():
            raise OSError(errno.ENOSPC, "No space left on device")
        return append(records, timestamp_ms)

    target.engine.append = append_unless_full
    channel.confirm_delivery()
    channel.basic_publish("", SOURCE, b"doomed", pika.BasicProperties(delivery_mode=2))
    wait_for(lambda: attempts)
    # Not retried at once (which would spin: die, fail, die again every tick); kept.
    time.sleep(0.5)
    assert len(attempts) == 1
    assert source.engine.unacked_count == 1 and target.ready_count == 0
    disk_full.clear()
    wait_for(lambda: target.ready_count == 1)
    wait_for(lambda: source.engine.unacked_count == 0)
    method, properties, body = channel.basic_get(TARGET, auto_ack=True)
    assert body == b"doomed" and properties.headers["x-death"][0]["reason"] == "expired"
    assert channel.basic_get(TARGET)[0] is None
    connection.close()


class ReversedJournal:
    """The vhost's dead-letter journal, except that the first hand-off's write ends only
    after the second's did (or then fails, `fail_first`): two journal writes of one source
    that end in the reverse of the order they began."""

    def __init__(self, journal, fail_first: bool = False) -> None:
        self._journal = journal
        self._fail_first = fail_first
        self.records = 0
        self._second_recorded: asyncio.Future[None] | None = None

    async def record(self, queue, items, positions) -> int:
        self.records += 1
        if self.records == 1:
            self._second_recorded = asyncio.get_running_loop().create_future()
            await self._second_recorded
            if self._fail_first:
                raise OSError(errno.EIO, "Input/output error")
            return await self._journal.record(queue, items, positions)
        handoff_id = await self._journal.record(queue, items, positions)
        if self.records == 2:
            assert self._second_recorded is not None
            self._second_recorded.set_result(None)
        return handoff_id

    def __getattr__(self, name):
        return getattr(self._journal, name)


def reject_in_two_handoffs(running, journal: ReversedJournal) -> tuple[object, object]:
    """m0 and m1 published to SOURCE (dead-lettering to TARGET) and rejected one at a time:
    two hand-offs, m0's first. Returns the source and target queues."""
    connection = running.connect()
    channel = connection.channel()
    channel.queue_declare(TARGET, durable=True)
    channel.queue_declare(
        SOURCE,
        durable=True,
        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": TARGET},
    )
    vhost = running.broker.vhosts["/"]
    vhost.journal = journal
    channel.confirm_delivery()
    for body in (b"m0", b"m1"):
        channel.basic_publish("", SOURCE, body, pika.BasicProperties(delivery_mode=2))
    tags = [channel.basic_get(SOURCE)[0].delivery_tag for _ in range(2)]
    channel.basic_reject(tags[0], requeue=False)
    wait_for(lambda: journal.records == 1)
    channel.basic_reject(tags[1], requeue=False)
    connection.close()
    return vhost.queues[SOURCE], vhost.queues[TARGET]


def test_dead_letters_reach_their_target_in_the_order_they_died(start_broker, tmp_path):
    """The second hand-off's journal write ends first; it still waits for the first one, so
    the target holds the dead letters as they died in their queue."""
    running = start_broker(tmp_path)
    source, target = reject_in_two_handoffs(
        running, ReversedJournal(running.broker.vhosts["/"].journal)
    )
    wait_for(lambda: target.ready_count == 2)
    wait_for(lambda: source.engine.unacked_count == 0)
    connection = running.connect()
    channel = connection.channel()
    bodies = [channel.basic_get(TARGET, auto_ack=True)[2] for _ in range(2)]
    assert bodies == [b"m0", b"m1"]
    connection.close()


def test_a_dead_letter_whose_journal_write_failed_is_published_again_after_the_next(
    start_broker, tmp_path
):
    """The first hand-off's journal write fails after the second's succeeded: the second is
    not held back for ever, and the first's dead letter stays in its queue (in flight) and
    arrives later, once: none lost, none doubled."""
    running = start_broker(tmp_path)
    journal = ReversedJournal(running.broker.vhosts["/"].journal, fail_first=True)
    source, target = reject_in_two_handoffs(running, journal)
    wait_for(lambda: target.ready_count == 2)
    wait_for(lambda: source.engine.unacked_count == 0)
    connection = running.connect()
    channel = connection.channel()
    bodies = [channel.basic_get(TARGET, auto_ack=True)[2] for _ in range(2)]
    assert bodies == [b"m1", b"m0"]
    assert channel.basic_get(TARGET)[0] is None
    assert channel.basic_get(SOURCE)[0] is None
    connection.close()


# --- BCC keys --------------------------------------------------------------------------------

BCC_EXCHANGE, BCC_DLX = "bcc-x", "bcc-dlx"
DEAD_KEYS = ("k", "cc", "bcc")


def declare_bcc_topology(channel, source_arguments=None) -> dict[str, str]:
    """A source bound to BCC_EXCHANGE by k, cc and bcc, dead-lettering to BCC_DLX, where a
    queue per key (`dead[key]`) collects the dead letters routed by that key."""
    channel.exchange_declare(BCC_EXCHANGE, "direct", durable=True)
    channel.exchange_declare(BCC_DLX, "direct", durable=True)
    channel.queue_declare(
        SOURCE,
        durable=True,
        arguments={"x-dead-letter-exchange": BCC_DLX, **(source_arguments or {})},
    )
    dead = {}
    for key in DEAD_KEYS:
        channel.queue_bind(SOURCE, BCC_EXCHANGE, key)
        dead[key] = f"dl-{key}"
        channel.queue_declare(dead[key], durable=True)
        channel.queue_bind(dead[key], BCC_DLX, key)
    return dead


def publish_with_bcc(channel, body: bytes = b"secret", **properties) -> None:
    channel.confirm_delivery()
    channel.basic_publish(
        BCC_EXCHANGE,
        "k",
        body,
        pika.BasicProperties(delivery_mode=2, headers={"CC": ["cc"], "BCC": ["bcc"]}, **properties),
    )


def assert_dead_by_every_key(channel, dead: dict[str, str], reason: str) -> None:
    """One dead letter in each key's queue, delivered with the first key, BCC never shown."""
    for key in DEAD_KEYS:
        wait_for(
            lambda key=key: channel.queue_declare(dead[key], passive=True).method.message_count
        )
        method, properties, body = channel.basic_get(dead[key], auto_ack=True)
        assert (method.routing_key, body) == ("k", b"secret"), key
        assert "BCC" not in properties.headers, key
        assert properties.headers["CC"] == ["cc"]
        death = properties.headers["x-death"][0]
        assert death["reason"] == reason
        assert death["routing-keys"] == ["k", "cc"]
        assert channel.basic_get(dead[key])[0] is None, key


def test_a_dead_letter_is_routed_by_its_bcc_keys_after_a_restart(start_broker, tmp_path):
    running = start_broker(tmp_path)
    connection = running.connect()
    channel = connection.channel()
    dead = declare_bcc_topology(channel)
    publish_with_bcc(channel)
    connection.close()
    running.stop()
    running = start_broker(tmp_path)
    connection = running.connect()
    channel = connection.channel()
    method, properties, _ = channel.basic_get(SOURCE)
    # Never delivered, before or after the restart.
    assert "BCC" not in properties.headers
    channel.basic_reject(method.delivery_tag, requeue=False)
    assert_dead_by_every_key(channel, dead, "rejected")
    connection.close()


def test_bcc_keys_survive_a_requeue_and_route_a_delivery_limit_death(start_broker, tmp_path):
    running = start_broker(tmp_path)
    connection = running.connect()
    channel = connection.channel()
    dead = declare_bcc_topology(channel, {"x-delivery-limit": 1})
    publish_with_bcc(channel)
    # basic.reject: a failed delivery, which the limit counts (RabbitMQ 4.3; a nack is not).
    for _ in range(2):
        method, properties, _ = channel.basic_get(SOURCE)
        assert "BCC" not in properties.headers
        channel.basic_reject(method.delivery_tag, requeue=True)
    assert_dead_by_every_key(channel, dead, "delivery_limit")
    connection.close()


def test_an_expired_message_is_dead_lettered_by_its_bcc_keys(start_broker, tmp_path):
    running = start_broker(tmp_path)
    connection = running.connect()
    channel = connection.channel()
    dead = declare_bcc_topology(channel)
    publish_with_bcc(channel, expiration="0")
    assert_dead_by_every_key(channel, dead, "expired")
    connection.close()


def test_a_dead_letter_keeps_its_bcc_keys_unless_a_dead_letter_routing_key_replaced_them(
    start_broker, tmp_path
):
    """RabbitMQ's dead letter carries the keys it was routed by: dying again (no dead-letter
    routing key) it goes to its BCC keys again; once a dead-letter routing key routed it, not."""
    running = start_broker(tmp_path)
    connection = running.connect()
    channel = connection.channel()
    channel.exchange_declare(BCC_DLX, "direct", durable=True)
    channel.queue_declare("by-bcc", durable=True)
    channel.queue_bind("by-bcc", BCC_DLX, "bcc")
    # Both dead-letter queues die into BCC_DLX by their messages' own keys.
    for name in ("dead-by-keys", "dead-by-dlrk"):
        channel.queue_declare(name, durable=True, arguments={"x-dead-letter-exchange": BCC_DLX})
    channel.queue_declare(
        "dies-by-keys", durable=True, arguments={"x-dead-letter-exchange": BCC_DLX}
    )
    channel.queue_bind("dead-by-keys", BCC_DLX, "dies-by-keys")
    channel.queue_declare(
        "dies-by-dlrk",
        durable=True,
        arguments={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "dead-by-dlrk"},
    )
    channel.confirm_delivery()
    bcc = pika.BasicProperties(delivery_mode=2, headers={"BCC": ["bcc"]})
    for queue in ("dies-by-keys", "dies-by-dlrk"):
        channel.basic_publish("", queue, queue.encode(), bcc)
        method, _, _ = channel.basic_get(queue)
        channel.basic_reject(method.delivery_tag, requeue=False)
    # dies-by-keys went to dead-by-keys (its key) and by-bcc (its BCC key).
    wait_for(lambda: channel.queue_declare("by-bcc", passive=True).method.message_count == 1)
    assert channel.basic_get("by-bcc", auto_ack=True)[2] == b"dies-by-keys"
    for queue in ("dead-by-keys", "dead-by-dlrk"):
        wait_for(lambda q=queue: channel.queue_declare(q, passive=True).method.message_count)
        method, properties, body = channel.basic_get(queue)
        assert body == queue.replace("dead", "dies").encode()
        assert "BCC" not in properties.headers
        channel.basic_reject(method.delivery_tag, requeue=False)
    # Dying again: the dead letter routed by its keys goes to its BCC key again, the one a
    # dead-letter routing key routed does not.
    wait_for(lambda: channel.queue_declare("by-bcc", passive=True).method.message_count == 1)
    time.sleep(0.2)
    assert channel.basic_get("by-bcc", auto_ack=True)[2] == b"dies-by-keys"
    assert channel.basic_get("by-bcc")[0] is None
    connection.close()


def test_a_confirmed_message_keeps_its_bcc_keys_through_a_sigkill(warren_process):
    """The keys are durable when the publish is confirmed, as the message is."""
    warren_process.start()
    connection = warren_process.connect()
    channel = connection.channel()
    dead = declare_bcc_topology(channel)
    publish_with_bcc(channel)
    warren_process.kill()
    warren_process.start()
    connection = warren_process.connect()
    channel = connection.channel()
    method, _, _ = channel.basic_get(SOURCE)
    channel.basic_reject(method.delivery_tag, requeue=False)
    assert_dead_by_every_key(channel, dead, "rejected")
    connection.close()

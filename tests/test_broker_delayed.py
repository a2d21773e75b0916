"""Delayed messages in a running broker (in-process): x-delayed-message exchanges as the
plugin defines them (routing when due, x-delay negated, mandatory, confirms, exchange
deletion, restarts), and the exactly-once hand-off from a store to its queues, including
after a stop at each point of it."""

from __future__ import annotations

import threading
import time

import pika
import pika.exceptions
import pytest

from warrenmq.server.delayed.exchanges import RETRY_DELAY_MS, DelayedExchanges

PERSISTENT = 2


def wait_for(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def delayed_exchange(channel, name="dx", routing="direct", durable=True, **arguments):
    channel.exchange_declare(
        name,
        "x-delayed-message",
        durable=durable,
        arguments={"x-delayed-type": routing, **arguments},
    )


def publish(channel, exchange, key, body, delay_ms=None, mandatory=False, **headers):
    if delay_ms is not None:
        headers["x-delay"] = delay_ms
    channel.basic_publish(
        exchange,
        key,
        body,
        pika.BasicProperties(delivery_mode=PERSISTENT, headers=headers or None),
        mandatory=mandatory,
    )


def drain(channel, queue):
    got = []
    while True:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return got
        got.append((body, properties.headers))


def store_of(running, exchange="dx", vhost="/"):
    return running.broker.vhosts[vhost].delayed.stores[exchange]


@pytest.fixture
def broker(start_broker, tmp_path):
    return start_broker(tmp_path / "data")


@pytest.fixture
def channel(broker):
    connection = broker.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    yield channel
    if connection.is_open:
        connection.close()


def test_held_messages_are_routed_in_due_order_when_due_with_x_delay_negated(channel):
    delayed_exchange(channel)
    channel.queue_declare("q", durable=True)
    channel.queue_bind("q", "dx", "k")
    delays = [500, 100, 300, 200, 100, 400]
    sent = {}
    for index, delay in enumerate(delays):
        body = b"%d-%d" % (index, delay)
        sent[body] = time.monotonic() + delay / 1000
        publish(channel, "dx", "k", body, delay)
    arrived = []
    for method, properties, body in channel.consume("q", inactivity_timeout=3):
        if method is None:
            break
        arrived.append(body)
        # Never early (the client's clock may run ahead of the broker's by a millisecond).
        assert time.monotonic() >= sent[body] - 0.002, body
        assert properties.headers == {"x-delay": -int(body.split(b"-")[1])}
        channel.basic_ack(method.delivery_tag)
        if len(arrived) == len(delays):
            break
    assert arrived == [b"1-100", b"4-100", b"3-200", b"2-300", b"5-400", b"0-500"]


@pytest.mark.parametrize("value", [None, 0, -5, "soon", True])
def test_without_a_usable_delay_a_message_is_routed_at_once(channel, value):
    delayed_exchange(channel, routing="fanout")
    channel.queue_declare("q")
    channel.queue_bind("q", "dx")
    publish(channel, "dx", "any", b"now", value)
    assert [body for body, _ in drain(channel, "q")] == [b"now"]


@pytest.mark.parametrize(
    ("routing", "binding", "arguments", "key", "headers"),
    [
        ("direct", "k", None, "k", {}),
        ("topic", "orders.*", None, "orders.new", {}),
        ("fanout", "", None, "whatever", {}),
        ("headers", "", {"x-match": "all", "kind": "order"}, "", {"kind": "order"}),
    ],
)
def test_a_due_message_is_routed_by_the_bindings_of_its_time(
    channel, routing, binding, arguments, key, headers
):
    delayed_exchange(channel, routing=routing)
    channel.queue_declare("early")
    channel.queue_declare("late")
    channel.queue_bind("early", "dx", binding, arguments)
    publish(channel, "dx", key, b"m", 300, **headers)
    # Bound after the publish, unbound before it is due: routing happens when it is due.
    channel.queue_bind("late", "dx", binding, arguments)
    channel.queue_unbind("early", "dx", binding, arguments)
    wait_for(lambda: channel.queue_declare("late", passive=True).method.message_count == 1)
    assert [body for body, _ in drain(channel, "late")] == [b"m"]
    assert drain(channel, "early") == []


def test_a_mandatory_held_message_is_returned_at_once_and_routed_when_due(channel):
    """The plugin cannot know at publish where a held message will go: its route is empty,
    so a mandatory one is returned with 312 NO_ROUTE (rabbitmq-delayed-message-exchange#7);
    it is still held, and routed when due."""
    delayed_exchange(channel)
    channel.queue_declare("q")
    channel.queue_bind("q", "dx", "k")
    with pytest.raises(pika.exceptions.UnroutableError) as returned:
        publish(channel, "dx", "k", b"held", 200, mandatory=True)
    (message,) = returned.value.messages
    assert (message.method.reply_code, message.method.reply_text, message.body) == (
        312,
        "NO_ROUTE",
        b"held",
    )
    publish(channel, "dx", "k", b"not mandatory", 200)
    time.sleep(0.4)
    assert [body for body, _ in drain(channel, "q")] == [b"held", b"not mandatory"]


def test_a_confirm_means_the_held_message_is_stored(broker, channel):
    delayed_exchange(channel)
    release = threading.Event()
    publish(channel, "dx", "k", b"first", 3_600_000)
    store = store_of(broker)
    commit = store.commit

    async def held_commit():
        await broker.loop.run_in_executor(None, release.wait)
        await commit()

    store.commit = held_commit
    confirmed = threading.Event()

    def publisher():
        connection = broker.connect()
        own = connection.channel()
        own.confirm_delivery()
        publish(own, "dx", "k", b"second", 3_600_000)
        confirmed.set()
        connection.close()

    thread = threading.Thread(target=publisher)
    thread.start()
    try:
        wait_for(lambda: store.engine.ready_count == 2)
        time.sleep(0.2)
        assert not confirmed.is_set(), "confirmed before the store's fsync"
    finally:
        release.set()
        thread.join(5)
    assert confirmed.is_set() and store.held_count == 2


def test_a_due_message_is_done_in_its_store_only_once_its_queue_committed(broker, channel):
    delayed_exchange(channel)
    channel.queue_declare("q", durable=True)
    channel.queue_bind("q", "dx", "k")
    queue = broker.broker.vhosts["/"].queues["q"]
    release = threading.Event()
    commit = queue.commit

    async def held_commit():
        await broker.loop.run_in_executor(None, release.wait)
        await commit()

    queue.commit = held_commit
    try:
        publish(channel, "dx", "k", b"due", 50)
        store = store_of(broker)
        wait_for(lambda: queue.ready_count == 1)
        time.sleep(0.2)
        assert (store.engine.handing_off, store.held_count) == (1, 1)
    finally:
        release.set()
    wait_for(lambda: store.held_count == 0)


def test_a_queue_that_failed_to_store_a_due_message_gets_it_again_alone(broker, channel):
    delayed_exchange(channel, routing="fanout")
    for queue in ("a", "b"):
        channel.queue_declare(queue, durable=True)
        channel.queue_bind(queue, "dx")
    engine = broker.broker.vhosts["/"].queues["b"].engine
    append = engine.append
    failures = []

    def fail_once(records, timestamp_ms=None):
        if not failures:
            failures.append(records)
            raise OSError(28, "No space left on device")
        return append(records, timestamp_ms)

    engine.append = fail_once
    publish(channel, "dx", "", b"due", 50)
    started = time.monotonic()
    wait_for(lambda: channel.queue_declare("b", passive=True).method.message_count == 1)
    assert failures and time.monotonic() - started >= RETRY_DELAY_MS / 1000
    assert [body for body, _ in drain(channel, "a")] == [b"due"]
    assert [body for body, _ in drain(channel, "b")] == [b"due"]
    wait_for(lambda: store_of(broker).held_count == 0)


def test_deleting_the_exchange_drops_what_it_holds(broker, channel):
    delayed_exchange(channel)
    channel.queue_declare("q")
    channel.queue_bind("q", "dx", "k")
    publish(channel, "dx", "k", b"dropped", 300)
    directory = store_of(broker).engine.directory
    channel.exchange_delete("dx")
    assert not directory.exists()
    delayed_exchange(channel)
    channel.queue_bind("q", "dx", "k")
    publish(channel, "dx", "k", b"kept", 100)
    time.sleep(0.5)
    assert [body for body, _ in drain(channel, "q")] == [b"kept"]


def test_an_auto_delete_exchange_drops_what_it_holds_with_its_last_binding(broker, channel):
    channel.exchange_declare(
        "dx", "x-delayed-message", auto_delete=True, arguments={"x-delayed-type": "direct"}
    )
    channel.queue_declare("q")
    channel.queue_bind("q", "dx", "k")
    publish(channel, "dx", "k", b"dropped", 60_000)
    directory = store_of(broker).engine.directory
    channel.queue_delete("q")
    wait_for(lambda: not directory.exists())
    assert broker.broker.vhosts["/"].delayed.stores == {}


def test_exchange_to_exchange_alternate_and_dead_letter_routes_hold_in_a_delayed_exchange(
    channel,
):
    delayed_exchange(channel, routing="fanout")
    channel.queue_declare("held")
    channel.queue_bind("held", "dx")
    channel.exchange_declare("front", "fanout")
    channel.queue_declare("now")
    channel.queue_bind("now", "front")
    channel.exchange_bind("dx", "front")
    channel.exchange_declare("nowhere", "direct", arguments={"alternate-exchange": "dx"})
    channel.queue_declare("dies", arguments={"x-dead-letter-exchange": "dx", "x-message-ttl": 0})
    publish(channel, "front", "", b"e2e", 200)
    publish(channel, "nowhere", "k", b"alternate", 200)
    publish(channel, "", "dies", b"dead letter", 200)
    assert [body for body, _ in drain(channel, "now")] == [b"e2e"]
    assert drain(channel, "held") == []
    time.sleep(0.5)
    assert sorted(body for body, _ in drain(channel, "held")) == [
        b"alternate",
        b"dead letter",
        b"e2e",
    ]


def test_a_due_message_passes_another_delayed_exchange_and_an_internal_one(broker, channel):
    """x-delay is negated when due, so the next delayed exchange routes it at once; the
    broker routes it, so an internal delayed exchange reached by a binding still routes it."""
    delayed_exchange(channel, "first", routing="fanout")
    channel.exchange_declare(
        "second",
        "x-delayed-message",
        internal=True,
        arguments={"x-delayed-type": "fanout"},
    )
    channel.exchange_bind("second", "first")
    channel.queue_declare("q")
    channel.queue_bind("q", "second")
    publish(channel, "first", "", b"once", 200)
    wait_for(lambda: channel.queue_declare("q", passive=True).method.message_count == 1)
    assert drain(channel, "q") == [(b"once", {"x-delay": -200})]
    # Held once: the second exchange never had anything to store.
    assert "second" not in broker.broker.vhosts["/"].delayed.stores


def test_a_delayed_exchanges_alternate_takes_what_its_bindings_miss_when_due(channel):
    channel.exchange_declare("ae", "fanout")
    channel.queue_declare("ae-q")
    channel.queue_bind("ae-q", "ae")
    delayed_exchange(channel, **{"alternate-exchange": "ae"})
    publish(channel, "dx", "unbound", b"m", 200)
    assert drain(channel, "ae-q") == []
    time.sleep(0.4)
    assert [body for body, _ in drain(channel, "ae-q")] == [b"m"]


def test_a_transaction_holds_its_messages_at_commit(broker):
    connection = broker.connect()
    channel = connection.channel()
    delayed_exchange(channel)
    channel.tx_select()
    publish(channel, "dx", "k", b"rolled back", 60_000)
    channel.tx_rollback()
    assert "dx" not in broker.broker.vhosts["/"].delayed.stores
    publish(channel, "dx", "k", b"committed", 60_000)
    channel.tx_commit()
    # The plugin's messages_delayed.
    assert broker.broker.vhosts["/"].delayed.held_count("dx") == 1
    connection.close()


def test_a_restart_keeps_a_durable_exchanges_messages_and_drops_a_transient_ones(
    start_broker, tmp_path
):
    running = start_broker(tmp_path / "data")
    connection = running.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    delayed_exchange(channel, "durable-x")
    delayed_exchange(channel, "transient-x", durable=False)
    channel.queue_declare("q", durable=True)
    channel.queue_bind("q", "durable-x", "k")
    channel.queue_bind("q", "transient-x", "k")
    # Before the first publish: the 3.6 s message is due 3.6 s after it was published, and the
    # confirms of the publishes after it take their time on a busy machine.
    started = time.monotonic()
    for delay in (3_600, 3_000, 3_300):
        publish(channel, "durable-x", "k", b"%d" % delay, delay)
    publish(channel, "transient-x", "k", b"transient", 3_000)
    transient_directory = store_of(running, "transient-x").engine.directory
    connection.close()
    running.stop()
    assert time.monotonic() - started < 2.5, "stopped too late to test a restart"
    running = start_broker(tmp_path / "data")
    assert not transient_directory.exists()
    connection = running.connect()
    channel = connection.channel()
    wait_for(lambda: channel.queue_declare("q", passive=True).method.message_count == 3)
    assert time.monotonic() - started >= 3.6 - 0.002
    assert [body for body, _ in drain(channel, "q")] == [b"3000", b"3300", b"3600"]
    assert store_of(running, "durable-x").held_count == 0
    connection.close()


# -- exactly once across a stop at each point of the hand-off -------------------------------


def _fanout_with_two_queues(running):
    connection = running.connect()
    channel = connection.channel()
    channel.confirm_delivery()
    delayed_exchange(channel, routing="fanout")
    for queue in ("a", "b"):
        channel.queue_declare(queue, durable=True)
        channel.queue_bind(queue, "dx")
    for index in range(300):
        publish(channel, "dx", "", b"%d" % index, 50)
    return connection


def _after_restart(start_broker, tmp_path, monkeypatch):
    """Start again; every message's hand-off must have been left open, for recovery."""
    resume = DelayedExchanges._resume
    resumed = []

    def counted_resume(self, store, intents):
        resumed.append(len(intents))
        resume(self, store, intents)

    monkeypatch.setattr(DelayedExchanges, "_resume", counted_resume)
    running = start_broker(tmp_path / "data")
    assert resumed == [300]
    connection = running.connect()
    channel = connection.channel()
    wait_for(lambda: store_of(running).held_count == 0)
    time.sleep(0.2)
    got = {queue: [body for body, _ in drain(channel, queue)] for queue in ("a", "b")}
    connection.close()
    return got


EVERY_MESSAGE = sorted(b"%d" % index for index in range(300))


def _ended(self, store):
    """What `_handed_off` does for the next hand-off, without marking anything done."""
    store.hand_offs -= 1
    self._wake(store)


def test_a_stop_after_the_queues_stored_and_before_done_duplicates_nothing(
    start_broker, tmp_path, monkeypatch
):
    running = start_broker(tmp_path / "data")
    confirmed = []

    def confirm_without_done(self, handoff):
        confirmed.append(handoff)
        _ended(self, handoff.store)

    monkeypatch.setattr(DelayedExchanges, "_handed_off", confirm_without_done)
    connection = _fanout_with_two_queues(running)
    wait_for(lambda: sum(len(h.stagings) for h in confirmed) == 300)
    connection.close()
    running.stop()
    monkeypatch.undo()
    got = _after_restart(start_broker, tmp_path, monkeypatch)
    assert sorted(got["a"]) == sorted(got["b"]) == EVERY_MESSAGE


def test_a_stop_after_the_intent_and_before_staging_loses_nothing(
    start_broker, tmp_path, monkeypatch
):
    running = start_broker(tmp_path / "data")
    intended = []

    def never_stage(self, store, stagings):
        intended.extend(stagings)
        _ended(self, store)

    monkeypatch.setattr(DelayedExchanges, "_stage", never_stage)
    connection = _fanout_with_two_queues(running)
    wait_for(lambda: len(intended) == 300)
    connection.close()
    running.stop()
    monkeypatch.undo()
    got = _after_restart(start_broker, tmp_path, monkeypatch)
    assert sorted(got["a"]) == sorted(got["b"]) == EVERY_MESSAGE


def test_a_stop_after_one_queue_of_two_stored_stages_on_the_other_alone(
    start_broker, tmp_path, monkeypatch
):
    running = start_broker(tmp_path / "data")
    stage = DelayedExchanges._stage

    def stage_on_a_only(self, store, stagings):
        halves = [s._replace(queues=[q for q in s.queues if q.name == "a"]) for s in stagings]
        stage(self, store, halves)

    monkeypatch.setattr(DelayedExchanges, "_stage", stage_on_a_only)
    monkeypatch.setattr(
        DelayedExchanges, "_handed_off", lambda self, handoff: _ended(self, handoff.store)
    )
    connection = _fanout_with_two_queues(running)
    queues = running.broker.vhosts["/"].queues
    wait_for(lambda: queues["a"].ready_count == 300)
    assert queues["b"].ready_count == 0
    connection.close()
    running.stop()
    monkeypatch.undo()
    got = _after_restart(start_broker, tmp_path, monkeypatch)
    assert sorted(got["a"]) == sorted(got["b"]) == EVERY_MESSAGE


def test_the_management_api_lists_the_type_and_declares_and_publishes_through_it(broker):
    from http_api import HttpApi

    api = HttpApi(broker.management_url)
    types = {t["name"]: t["description"] for t in api.get("/api/overview").json["exchange_types"]}
    assert types["x-delayed-message"] == "Delayed Message Exchange."
    declared = api.put(
        "/api/exchanges/%2F/dx",
        {"type": "x-delayed-message", "arguments": {"x-delayed-type": "fanout"}},
    )
    assert declared.status == 201
    assert api.put("/api/queues/%2F/q", {}).status == 201
    assert api.post("/api/bindings/%2F/e/dx/q/q", {"routing_key": ""}).status == 201
    published = api.post(
        "/api/exchanges/%2F/dx/publish",
        {
            "routing_key": "",
            "properties": {"headers": {"x-delay": 200}},
            "payload": "later",
            "payload_encoding": "string",
        },
    )
    # Held, not routed yet: as for a mandatory AMQP publish, it reached no queue.
    assert published.json == {"routed": False}
    wait_for(lambda: broker.broker.vhosts["/"].queues["q"].ready_count == 1)

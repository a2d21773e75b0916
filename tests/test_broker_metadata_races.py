"""Commands racing in the window between proposing a metadata change and its applying: the
metadata applies a command only after its Raft entry is fsynced (in a worker thread), so
other connections run meanwhile and may act on the state as it was. The tests on the
broker's loop make each race happen deterministically; the client-level ones (auto-delete,
exclusive, passive) check that either order ends as RabbitMQ's would."""

from __future__ import annotations

import asyncio

import pika
import pika.exceptions
import pytest
from brokers import DURABLE_QUEUE

from warrenmq.exchanges.errors import RoutingError
from warrenmq.server.metadata import commands as mc


def publish_and_count(vhost, name: str) -> int:
    vhost.publish("", name, b"", b"body", persistent=False)
    queue = vhost.get_queue(name, "o")
    return queue.ready_count


def test_declares_of_one_new_queue_with_other_arguments_one_is_refused_406(tmp_path, start_broker):
    running = start_broker(tmp_path / "data")
    vhost = running.broker.vhosts["/"]

    async def race():
        return await asyncio.gather(
            vhost.declare_queue("q", **DURABLE_QUEUE),
            vhost.declare_queue("q", **{**DURABLE_QUEUE, "arguments": {"x-max-length": 5}}),
            return_exceptions=True,
        )

    first, second = running.call(race())
    assert first is vhost.queues["q"]
    assert isinstance(second, RoutingError) and second.reply_code == 406
    assert "x-max-length" in str(second)


def test_an_exclusive_declare_racing_another_connections_declare_locks_it_out_405(
    tmp_path, start_broker
):
    running = start_broker(tmp_path / "data")
    vhost = running.broker.vhosts["/"]

    async def race():
        return await asyncio.gather(
            vhost.declare_queue("q", **{**DURABLE_QUEUE, "exclusive": True, "owner": "a"}),
            vhost.declare_queue("q", **{**DURABLE_QUEUE, "exclusive": True, "owner": "b"}),
            return_exceptions=True,
        )

    owned, locked = running.call(race())
    assert owned is vhost.queues["q"] and owned.exclusive_owner == "a"
    assert isinstance(locked, RoutingError) and locked.reply_code == 405


@pytest.mark.parametrize("declare_first", [False, True])
def test_a_delete_racing_a_declare_of_the_queue_leaves_what_the_later_one_says(
    tmp_path, start_broker, declare_first
):
    running = start_broker(tmp_path / "data")
    vhost = running.broker.vhosts["/"]

    async def race():
        queue = await vhost.declare_queue("q", **DURABLE_QUEUE)
        vhost.publish("", "q", b"", b"old", persistent=False)
        if declare_first:
            return await asyncio.gather(
                vhost.declare_queue("q", **DURABLE_QUEUE), vhost.delete_queue(queue)
            )
        return await asyncio.gather(
            vhost.delete_queue(queue), vhost.declare_queue("q", **DURABLE_QUEUE)
        )

    results = running.call(race())
    state = vhost.store.state
    if declare_first:
        assert "q" not in vhost.queues and state.queue("/", "q") is None
    else:
        deleted_count, declared = results
        assert deleted_count == 1
        # A new, empty queue, hosted and usable: not the deleted one.
        assert declared is vhost.queues["q"] and state.queue("/", "q") is not None
        assert declared.ready_count == 0
        assert running.call(run(publish_and_count, vhost, "q")) == 1


def test_two_deletes_racing_one_counts_the_messages_the_other_finds_it_gone(tmp_path, start_broker):
    running = start_broker(tmp_path / "data")
    vhost = running.broker.vhosts["/"]

    async def race():
        queue = await vhost.declare_queue("q", **DURABLE_QUEUE)
        vhost.publish("", "q", b"", b"one", persistent=False)
        vhost.get_queue("q", "o")
        return await asyncio.gather(vhost.delete_queue(queue), vhost.delete_queue(queue))

    # RabbitMQ answers a delete of a queue that is gone with delete-ok, 0 messages.
    assert running.call(race()) == [1, 0]
    assert "q" not in vhost.queues and vhost.store.state.queue("/", "q") is None


def test_a_declare_between_a_deletes_apply_and_its_retiring_keeps_its_own_files(
    tmp_path, start_broker
):
    """The delete's record is gone but its caller has not resumed yet (a loop iteration
    later): a declare then makes a new queue, whose directory the old queue's retiring must
    not take away. The queue is retired as its delete applies (the broker reacts to every
    applied entry, wherever proposed), so the caller's own retiring finds nothing left."""
    running = start_broker(tmp_path / "data")
    vhost = running.broker.vhosts["/"]

    async def race():
        old = await vhost.declare_queue("q", **DURABLE_QUEUE)
        deleting = asyncio.ensure_future(vhost.delete_queue(old))
        while vhost.store.state.queue("/", "q") is not None:
            await asyncio.sleep(0)
        assert not deleting.done(), "the delete's caller has not resumed yet"
        assert "q" not in vhost.queues and old.deleted, "retired as its delete applied"
        new = await vhost.declare_queue("q", **DURABLE_QUEUE)
        await deleting
        return old, new

    old, new = running.call(race())
    assert new is not old and vhost.queues["q"] is new
    assert vhost.queue_directory("q").is_dir()
    assert running.call(run(publish_and_count, vhost, "q")) == 1


def test_a_vhost_deleted_while_a_declare_in_it_is_pending_leaks_no_storage(tmp_path, start_broker):
    running = start_broker(tmp_path / "data")
    broker = running.broker

    async def race():
        await broker.store.apply(mc.DeclareVhost("v"))
        broker.sync_vhosts()
        vhost = broker.vhosts["v"]

        async def delete_vhost():
            await broker.store.apply(mc.DeleteVhost("v"))
            broker.sync_vhosts()

        declared, _ = await asyncio.gather(
            vhost.declare_queue("q", **DURABLE_QUEUE), delete_vhost(), return_exceptions=True
        )
        return vhost, declared

    vhost, declared = running.call(race())
    # The declare applied first, then the vhost went, before the declare's caller resumed
    # to host the queue: it answers 404 (the connection is closed with 320 anyway), and the
    # storage it opened is deleted, not leaked.
    assert "v" not in broker.vhosts and "v" not in broker.store.state.vhosts
    assert isinstance(declared, RoutingError) and declared.reply_code == 404
    assert not vhost.queues and not vhost._opening
    assert not vhost.queue_directory("q").exists()


async def run(function, *args):
    return function(*args)


def test_an_auto_delete_queue_declared_again_right_after_its_last_consumer_left(
    tmp_path, start_broker
):
    """The last cancel deletes the queue in the background; a declare arriving before or
    after that delete applies gets a queue that works either way."""
    running = start_broker(tmp_path / "data")
    connection = running.connect()
    channel = connection.channel()
    for round_number in range(20):
        channel.queue_declare("auto", auto_delete=True)
        tag = channel.basic_consume("auto", lambda *args: None)
        channel.basic_cancel(tag)
        channel.queue_declare("auto", auto_delete=True)
        channel.basic_publish("", "auto", b"round %d" % round_number)
        method, _, body = channel.basic_get("auto", auto_ack=True)
        assert body == b"round %d" % round_number, round_number
    connection.close()


def test_an_exclusive_queue_taken_over_right_after_its_owner_closed(tmp_path, start_broker):
    """The owner's close deletes its exclusive queue in the background: another connection's
    declare is refused 405 while it is not yet deleted, and then owns a working queue."""
    running = start_broker(tmp_path / "data")
    for round_number in range(10):
        owner = running.connect()
        owner.channel().queue_declare("mine", exclusive=True)
        owner.close()
        successor = running.connect()
        for _ in range(100):
            channel = successor.channel()
            try:
                channel.queue_declare("mine", exclusive=True)
                break
            except pika.exceptions.ChannelClosedByBroker as error:
                assert error.reply_code == 405, error
        else:
            raise AssertionError("the closed owner's exclusive queue was never deleted")
        channel.basic_publish("", "mine", b"round %d" % round_number)
        assert channel.basic_get("mine", auto_ack=True)[2] == b"round %d" % round_number
        successor.close()


def test_a_passive_declare_on_another_connection_sees_a_declare_answered(tmp_path, start_broker):
    running = start_broker(tmp_path / "data")
    declaring, checking = running.connect(), running.connect()
    declarer, checker = declaring.channel(), checking.channel()
    for i in range(50):
        declarer.queue_declare(f"q{i}", durable=True)
        assert checker.queue_declare(f"q{i}", passive=True).method.message_count == 0
    declaring.close()
    checking.close()

"""Vhost and user limits in the metadata state machine: set, replace, clear, validation texts
(rabbit_parameter_validation's), max-queues at the limit and one past it with RabbitMQ's
text, the limits leaving with their vhost or user, snapshots, and the store (a reopen, and
changes another process made)."""

from __future__ import annotations

import asyncio

import pytest

from warrenmq.server.metadata import commands as c
from warrenmq.server.metadata import passwords
from warrenmq.server.metadata.errors import BadRequest, NotFound, PreconditionFailed
from warrenmq.server.metadata.state import MetadataState
from warrenmq.server.metadata.store import MetadataStore


def fresh() -> MetadataState:
    state = MetadataState()
    state.apply(c.DeclareVhost("/"))
    state.apply(c.DeclareVhost("v1"))
    state.apply(c.AddUser("u", passwords.hash_password("p", log2_n=1)))
    return state


def refusal(command) -> str:
    with pytest.raises(BadRequest) as refused:
        fresh().apply(command)
    assert refused.value.reply_code == 400
    return refused.value.reply_text


def test_set_replace_and_clear():
    state = fresh()
    outcome = state.apply(c.SetVhostLimits("v1", {"max-queues": 2, "max-connections": 5}))
    assert outcome.writes == (
        ("put_limits", "vhost", "v1", {"max-connections": 5, "max-queues": 2}),
    )
    assert state.apply(c.SetVhostLimits("v1", {"max-connections": 5, "max-queues": 2})).changed is (
        False
    )
    state.apply(c.SetVhostLimits("v1", {"max-queues": 3}))
    assert state.vhost_limits == {"v1": {"max-queues": 3}}
    assert state.apply(c.SetVhostLimits("v1", {})).writes == (("delete_limits", "vhost", "v1"),)
    assert state.vhost_limits == {}
    state.apply(c.SetUserLimits("u", {"max-channels": 0, "max-connections": -1}))
    assert state.user_limits == {"u": {"max-channels": 0, "max-connections": -1}}


def test_missing_vhost_or_user():
    with pytest.raises(NotFound):
        fresh().apply(c.SetVhostLimits("nope", {"max-queues": 1}))
    with pytest.raises(NotFound):
        fresh().apply(c.SetUserLimits("nope", {"max-channels": 1}))


def test_validation_texts():
    assert refusal(c.SetVhostLimits("/", {"max-queues": "1"})) == (
        'Validation failed\n\nmax-queues should be a number, actually was <<"1">>\n'
    )
    assert refusal(c.SetVhostLimits("/", {"max-channels": 1, "max-queues": True})) == (
        "Validation failed\n\nmax-queues should be a number, actually was true\n"
        'Unrecognised terms [{<<"max-channels">>,1}] in vhost-limits\n'
    )
    assert refusal(c.SetUserLimits("u", {"max-queues": 1})) == (
        'Validation failed\n\nUnrecognised terms [{<<"max-queues">>,1}] in user-limits\n'
    )
    assert "should be a JSON object" in refusal(c.SetUserLimits("u", [1]))


def test_max_queues_at_the_limit_and_one_past_it():
    state = fresh()
    state.apply(c.SetVhostLimits("v1", {"max-queues": 2}))
    state.apply(c.DeclareQueue("v1", "a"))
    state.apply(c.DeclareQueue("v1", "b"))
    # A redeclaration is no new queue.
    assert state.apply(c.DeclareQueue("v1", "b")).changed is False
    with pytest.raises(PreconditionFailed) as refused:
        state.apply(c.DeclareQueue("v1", "c"))
    assert refused.value.reply_code == 406
    assert refused.value.reply_text == (
        "cannot declare queue 'c': queue limit in vhost 'v1' (2) is reached"
    )
    state.apply(c.DeclareQueue("/", "c"))  # other vhosts are not limited
    state.apply(c.DeleteQueue("v1", "a"))
    state.apply(c.DeclareQueue("v1", "c"))


@pytest.mark.parametrize("limit, allowed", [(0, 0), (-1, 5)])
def test_zero_allows_no_queue_and_negative_no_limit(limit, allowed):
    state = fresh()
    state.apply(c.SetVhostLimits("v1", {"max-queues": limit}))
    for index in range(allowed):
        state.apply(c.DeclareQueue("v1", f"q{index}"))
    if limit >= 0:
        with pytest.raises(PreconditionFailed):
            state.apply(c.DeclareQueue("v1", "one-more"))


def test_limits_leave_with_their_vhost_and_user():
    state = fresh()
    state.apply(c.SetVhostLimits("v1", {"max-queues": 1}))
    state.apply(c.SetUserLimits("u", {"max-channels": 1}))
    state.apply(c.DeleteVhost("v1"))
    state.apply(c.DeleteUser("u"))
    assert state.vhost_limits == {} and state.user_limits == {}


def test_snapshot_round_trip_keeps_limits_even_below_the_queue_count():
    state = fresh()
    state.apply(c.DeclareQueue("v1", "a"))
    state.apply(c.DeclareQueue("v1", "b"))
    state.apply(c.SetVhostLimits("v1", {"max-queues": 1}))
    state.apply(c.SetUserLimits("u", {"max-connections": 3}))
    snapshot = state.snapshot()
    copy = MetadataState.from_snapshot(snapshot)
    assert copy.snapshot() == snapshot
    assert copy.vhost_limits == {"v1": {"max-queues": 1}}


def test_limits_survive_a_reopen_and_sync_from_another_process(tmp_path):
    path = tmp_path / "m.sqlite3"

    async def scenario():
        store = await MetadataStore.open(path)
        await store.apply(c.DeclareVhost("v1"))
        await store.apply(c.DeclareQueue("v1", "a", durable=True))
        await store.apply(c.DeclareQueue("v1", "b", durable=True))
        await store.apply(c.SetVhostLimits("v1", {"max-queues": 1}))
        await store.apply(c.SetUserLimits("guest", {"max-channels": 4}))
        await store.close()

        broker = await MetadataStore.open(path)
        assert sorted(broker.state.queues("v1")) == ["a", "b"]
        assert broker.state.vhost_limits == {"v1": {"max-queues": 1}}
        assert broker.state.user_limits == {"guest": {"max-channels": 4}}

        cli = await MetadataStore.open(path)  # what `warren vhosts set-limits ...` does
        await cli.apply(c.SetVhostLimits("/", {"max-connections": 2}))
        await cli.apply(c.SetUserLimits("guest", {}))
        await cli.apply(c.DeleteVhost("v1"))
        await cli.close()

        await broker.sync_external_changes()
        assert broker.state.vhost_limits == {"/": {"max-connections": 2}}
        assert broker.state.user_limits == {}
        await broker.close()

        store = await MetadataStore.open(path)
        assert store.state.vhost_limits == {"/": {"max-connections": 2}}
        await store.close()

    asyncio.run(scenario())

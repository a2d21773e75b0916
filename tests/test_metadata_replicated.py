"""`ReplicatedMetadata`: the broker's metadata through a one-member Raft group, its SQLite
rows kept as a view. Upgrade in place of a data dir that has rows and no log; restart from
snapshot + log; transient entities dropped on restart by a log entry; CLI edits proposed;
a SIGKILL after `apply` returned loses nothing."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from warrenmq.cluster.group import ProposalLost
from warrenmq.cluster.raft.core import NotLeader
from warrenmq.exchanges.errors import RoutingError
from warrenmq.server.metadata import commands as c
from warrenmq.server.metadata import passwords, replicated
from warrenmq.server.metadata.encoding import decode_commands
from warrenmq.server.metadata.replicated import RAFT_DIRECTORY, ReplicatedMetadata
from warrenmq.server.metadata.store import METADATA_FILE, MetadataStore, StoreFailed

DURABLE = [
    c.DeclareVhost("v"),
    c.DeclareExchange("/", "x", "topic", durable=True, arguments={"alternate-exchange": "ae"}),
    c.DeclareQueue("/", "q", durable=True, arguments={"x-max-length": 10}),
    c.Bind("/", "x", "q", routing_key="a.#"),
    c.SetPolicy("/", "p", "^q$", {"max-length": 5}),
]
TRANSIENT = [
    c.DeclareExchange("/", "tx", "fanout"),
    c.DeclareQueue("/", "tq"),
    c.DeclareQueue("/", "eq", exclusive=True, owner="connection-1"),
    c.Bind("/", "x", "tq"),
    c.Bind("/", "tx", "q"),
]


def entities(state) -> dict:
    """The state's snapshot without its users (each data dir salts guest's hash anew)."""
    document = json.loads(state.snapshot())
    del document["users"]
    return document


def log_commands(metadata: ReplicatedMetadata) -> list[c.Command]:
    raft = metadata.group.raft
    commands: list[c.Command] = []
    for entry in raft.entries_between(raft.first_index, raft.last_index + 1):
        if entry.data:
            commands.extend(decode_commands(entry.data))
    return commands


def test_a_data_dir_with_rows_and_no_log_is_upgraded_in_place(tmp_path):
    async def scenario():
        # What a broker before the log left: rows only (MetadataStore is that code, unchanged).
        rows = await MetadataStore.open(tmp_path / METADATA_FILE)
        for command in DURABLE:
            await rows.apply(command)
        expected = rows.state.snapshot()
        await rows.close()
        assert not (tmp_path / RAFT_DIRECTORY).exists()

        metadata = await ReplicatedMetadata.open(tmp_path)
        assert metadata.state.snapshot() == expected
        seeded = log_commands(metadata)
        assert (
            c.DeclareQueue(
                "/", "q", durable=True, arguments={"x-max-length": 10}, server_named=True
            )
            in seeded
        )
        await metadata.close()
        # The log is the truth now: a restart replays it, not the rows.
        metadata = await ReplicatedMetadata.open(tmp_path)
        assert metadata.state.snapshot() == expected
        await metadata.close()

    asyncio.run(scenario())


def test_a_fresh_data_dir_starts_with_the_default_vhost_and_user(tmp_path):
    async def scenario():
        metadata = await ReplicatedMetadata.open(tmp_path)
        assert "/" in metadata.state.vhosts
        assert await metadata.authenticate("guest", "guest") is not None
        await metadata.close()

    asyncio.run(scenario())


def test_restart_keeps_durable_entities_and_drops_transient_ones_by_a_log_entry(tmp_path):
    async def scenario():
        metadata = await ReplicatedMetadata.open(tmp_path)
        for command in DURABLE + TRANSIENT:
            await metadata.apply(command)
        assert metadata.state.queue("/", "tq") is not None
        await metadata.close()

        rows = await MetadataStore.open(tmp_path / "reference.sqlite3")
        for command in DURABLE + TRANSIENT:
            await rows.apply(command)
        await rows.close()
        reloaded = await MetadataStore.open(tmp_path / "reference.sqlite3")
        durable_projection = entities(reloaded.state)
        await reloaded.close()

        metadata = await ReplicatedMetadata.open(tmp_path)
        assert entities(metadata.state) == durable_projection
        assert metadata.state.queue("/", "tq") is None
        assert metadata.state.queue("/", "eq") is None
        assert c.ForgetTransient() in log_commands(metadata)
        last_index = metadata.group.raft.last_index
        await metadata.close()
        metadata = await ReplicatedMetadata.open(tmp_path)
        # Nothing transient left: the next restart appends no second ForgetTransient.
        assert metadata.group.raft.last_index == last_index + 1  # the new term's no-op
        await metadata.close()

    asyncio.run(scenario())


async def with_queues(data_dir, count: int) -> ReplicatedMetadata:
    """Open the metadata and declare `count` durable queues q0, q1, ..."""
    metadata = await ReplicatedMetadata.open(data_dir)
    for i in range(count):
        await metadata.apply(c.DeclareQueue("/", f"q{i}", durable=True))
    return metadata


def test_restart_from_a_snapshot_and_the_log_after_it(tmp_path, monkeypatch):
    monkeypatch.setattr(replicated, "SNAPSHOT_ENTRIES", 20)

    async def scenario():
        metadata = await with_queues(tmp_path, 50)
        assert metadata.group.storage.snapshot is not None
        expected = metadata.state.snapshot()
        await metadata.close()
        metadata = await ReplicatedMetadata.open(tmp_path)
        assert metadata.state.snapshot() == expected
        await metadata.close()

    asyncio.run(scenario())


def test_rows_behind_the_snapshot_are_rewritten_from_the_state(tmp_path, monkeypatch):
    monkeypatch.setattr(replicated, "SNAPSHOT_ENTRIES", 20)

    async def scenario():
        metadata = await with_queues(tmp_path, 30)
        await metadata.close()
        # The view lost its last transactions (a power loss: it does not fsync).
        with sqlite3.connect(tmp_path / METADATA_FILE) as db:
            db.execute("DELETE FROM queues WHERE name != 'q0'")
            db.execute("UPDATE meta SET value = '1' WHERE key = 'log_index'")
        metadata = await ReplicatedMetadata.open(tmp_path)
        await metadata.close()
        with sqlite3.connect(tmp_path / METADATA_FILE) as db:
            names = {name for (name,) in db.execute("SELECT name FROM queues")}
        assert names == {f"q{i}" for i in range(30)}

    asyncio.run(scenario())


def test_apply_all_is_one_entry_and_stops_at_a_refusal(tmp_path):
    async def scenario():
        metadata = await ReplicatedMetadata.open(tmp_path)
        before = metadata.group.raft.last_index
        with pytest.raises(RoutingError):
            await metadata.apply_all(
                [c.DeclareQueue("/", "kept", durable=True), c.DeclareQueue("/", "amq.reserved")]
            )
        assert metadata.group.raft.last_index == before + 1
        assert metadata.state.queue("/", "kept") is not None
        await metadata.close()

    asyncio.run(scenario())


def test_a_cli_edit_while_running_enters_the_log(tmp_path):
    async def scenario():
        metadata = await ReplicatedMetadata.open(tmp_path)
        cli = await MetadataStore.open(tmp_path / METADATA_FILE)  # `warren users add --data-dir`
        await cli.apply(c.AddUser("alice", passwords.hash_password("secret")))
        await cli.close()
        outcomes = await metadata.sync_external_changes()
        assert [o.changed for o in outcomes] == [True]
        assert "alice" in metadata.state.users
        assert any(isinstance(command, c.AddUser) for command in log_commands(metadata)[-1:])
        await metadata.close()
        # An edit made while no broker runs is proposed at the next start.
        cli = await MetadataStore.open(tmp_path / METADATA_FILE)
        await cli.apply(c.DeleteUser("alice"))
        await cli.close()
        metadata = await ReplicatedMetadata.open(tmp_path)
        assert "alice" not in metadata.state.users
        await metadata.close()

    asyncio.run(scenario())


CHILD = textwrap.dedent(
    """
    import asyncio, sys
    from warrenmq.server.metadata import commands as c
    from warrenmq.server.metadata.replicated import ReplicatedMetadata

    async def main():
        metadata = await ReplicatedMetadata.open(sys.argv[1])
        for i in range(200):
            await metadata.apply(c.DeclareQueue("/", f"q{i}", durable=True))
            print(i, flush=True)
        await asyncio.sleep(60)

    asyncio.run(main())
    """
)


def test_sigkill_after_apply_returned_loses_nothing(tmp_path):
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        acknowledged = -1
        for line in child.stdout:
            acknowledged = int(line)
            if acknowledged == 120:
                break
        child.kill()
        child.wait(10)
    finally:
        if child.poll() is None:
            child.kill()

    async def check():
        metadata = await ReplicatedMetadata.open(tmp_path)
        for i in range(acknowledged + 1):
            assert metadata.state.queue("/", f"q{i}") is not None, i
        # The rows, which nobody waited for, caught up with the log at the restart.
        await metadata.rows.flushed()
        rows = {
            cmd.name
            for cmd in await metadata.rows.stored_commands()
            if isinstance(cmd, c.DeclareQueue)
        }
        assert {f"q{i}" for i in range(acknowledged + 1)} <= rows
        await metadata.close()

    asyncio.run(check())


def fail_the_first_proposal(metadata, error: Exception) -> list[bytes]:
    """Have the group's next proposal fail with `error`, nothing proposed; returns the list
    its data goes in (cleared, the next one fails again)."""
    propose = metadata.group.propose
    failed: list[bytes] = []

    def fail_the_first(data: bytes):
        if not failed:
            failed.append(data)
            future = asyncio.get_running_loop().create_future()
            future.set_exception(error)
            return future
        return propose(data)

    metadata.group.propose = fail_the_first
    return failed


def test_a_repeatable_command_whose_outcome_a_leader_change_lost_is_proposed_again(tmp_path):
    """A node starting while its cluster elects saw a proposal fail with ProposalLost (the
    outcome unknown) and gave up its start; a command harmless twice is proposed again."""

    async def scenario():
        metadata = await ReplicatedMetadata.open(tmp_path)
        lost = fail_the_first_proposal(
            metadata, ProposalLost("applied before the leader's answer arrived")
        )
        command = c.RegisterNode(1, "127.0.0.1", 5672, 0, 15672)
        with pytest.raises(StoreFailed):
            await metadata.apply(command)
        lost.clear()
        outcome = await metadata.apply_idempotent(command)
        assert outcome.changed and lost
        assert metadata.state.nodes[1].amqp_port == 5672
        await metadata.close()

    asyncio.run(scenario())


def test_a_proposal_that_reached_no_leader_is_proposed_again(tmp_path):
    """A node starting in a cluster queued its seed for a leader it had no link to yet; the
    group gave up on it (NotLeader: never sent) and the start failed. It is proposed again."""

    async def scenario():
        metadata = await ReplicatedMetadata.open(tmp_path)
        refused = fail_the_first_proposal(metadata, NotLeader(3))
        outcome = await metadata.apply(c.RegisterNode(1, "127.0.0.1", 5672, 0, 15672))
        assert outcome.changed and refused
        await metadata.close()

    asyncio.run(scenario())

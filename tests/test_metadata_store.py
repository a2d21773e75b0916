"""The SQLite-backed metadata store: seeding, persistence across reopen (durable kept, transient
dropped), authentication, changes from another process, group commit, failure, and a crash
(SIGKILL) right after `apply` returned."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from warrenmq.exchanges.errors import RoutingError
from warrenmq.server.metadata import commands as c
from warrenmq.server.metadata import passwords
from warrenmq.server.metadata import store as store_module
from warrenmq.server.metadata.state import MetadataState
from warrenmq.server.metadata.store import MetadataStore, StoreFailed

HASH = passwords.hash_password("pw", log2_n=2, salt=b"saltsalt")


def run(coroutine):
    return asyncio.run(coroutine)


async def reopened(path: Path) -> MetadataState:
    store = await MetadataStore.open(path)
    try:
        return store.state
    finally:
        await store.close()


def test_schema_1_loses_its_loopback_only_column_and_keeps_everything_else(tmp_path, caplog):
    import sqlite3

    path = tmp_path / "metadata.sqlite3"

    async def create():
        store = await MetadataStore.open(path)
        await store.apply(c.AddUser("bob", HASH, ("monitoring",)))
        await store.close()

    run(create())
    # Schema 1 as it was: the same tables, users with a loopback_only column.
    with sqlite3.connect(path) as db:
        db.execute("ALTER TABLE users ADD COLUMN loopback_only INTEGER NOT NULL DEFAULT 0")
        db.execute("UPDATE users SET loopback_only = 1 WHERE name = 'guest'")
        db.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    state = run(reopened(path))
    assert set(state.users) == {"guest", "bob"} and state.users["bob"].tags == ("monitoring",)
    assert "user 'guest' was loopback-only" in caplog.text
    with sqlite3.connect(path) as db:
        columns = [row[1] for row in db.execute("PRAGMA table_info(users)")]
        version = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
    assert columns == ["name", "password_hash", "tags"] and version == ("2",)
    assert set(run(reopened(path)).users) == {"guest", "bob"}


def test_first_open_seeds_guest_once(tmp_path):
    path = tmp_path / "metadata.sqlite3"

    async def scenario():
        store = await MetadataStore.open(path)
        assert set(store.state.vhosts) == {"/"}
        guest = store.state.users["guest"]
        assert guest.tags == ("administrator",)
        permission = store.state.permission("guest", "/")
        assert (permission.configure, permission.write, permission.read) == (".*", ".*", ".*")
        assert await store.authenticate("guest", "guest") == guest
        await store.apply(c.DeleteUser("guest"))
        await store.close()
        # A deleted default user is not recreated on the next start.
        state = await reopened(path)
        assert "guest" not in state.users and "/" in state.vhosts

    run(scenario())


def test_pragmas_wal_and_full_sync(tmp_path):
    async def scenario():
        store = await MetadataStore.open(tmp_path / "m.sqlite3")
        async with store._db.execute("PRAGMA journal_mode") as cursor:
            assert (await cursor.fetchone())[0] == "wal"
        async with store._db.execute("PRAGMA synchronous") as cursor:
            assert (await cursor.fetchone())[0] == 2  # FULL
        await store.close()

    run(scenario())


def test_authenticate(tmp_path):
    async def scenario():
        store = await MetadataStore.open(tmp_path / "m.sqlite3")
        await store.apply(c.AddUser("bob", passwords.hash_password("right", log2_n=4)))
        assert (await store.authenticate("bob", "right")).name == "bob"
        assert await store.authenticate("bob", "right") is not None  # cached path
        assert await store.authenticate("bob", "wrong") is None
        assert await store.authenticate("bob", "") is None
        assert await store.authenticate("nobody", "right") is None
        # A changed password invalidates what was cached for the old one.
        await store.apply(c.ChangePassword("bob", passwords.hash_password("new", log2_n=4)))
        assert await store.authenticate("bob", "right") is None
        assert await store.authenticate("bob", "new") is not None
        results = await asyncio.gather(*(store.authenticate("bob", "new") for _ in range(5)))
        assert all(user is not None for user in results)
        await store.close()

    run(scenario())


def test_durable_entities_survive_reopen_transient_ones_do_not(tmp_path):
    path = tmp_path / "m.sqlite3"

    async def scenario():
        store = await MetadataStore.open(path)
        await store.apply(c.DeclareVhost("v1", "desc", ("t",)))
        await store.apply(c.AddUser("bob", HASH, ("monitoring",)))
        await store.apply(c.SetPermissions("bob", "v1", "^b", ".*", ""))
        await store.apply(
            c.DeclareExchange(
                "/", "de", "headers", durable=True, arguments={"alternate-exchange": "amq.fanout"}
            )
        )
        await store.apply(c.DeclareExchange("/", "te", "fanout"))
        await store.apply(c.DeclareQueue("/", "dq", durable=True, arguments={"x-max-length": 7}))
        await store.apply(c.DeclareQueue("/", "tq"))
        await store.apply(c.DeclareQueue("/", "xq", durable=True, exclusive=True, owner="c1"))
        arguments = {"x-match": "all", "k": b"\x01", "f": 2.5}
        await store.apply(c.Bind("/", "de", "dq", arguments=arguments))
        await store.apply(c.Bind("/", "de", "tq"))
        await store.apply(c.Bind("/", "te", "dq"))
        await store.apply(c.Bind("/", "amq.topic", "de", "exchange", routing_key="a.#"))
        await store.close()

        state = await reopened(path)
        assert state.vhosts["v1"].description == "desc" and state.vhosts["v1"].tags == ("t",)
        assert state.users["bob"].tags == ("monitoring",)
        assert state.permission("bob", "v1").configure == "^b"
        assert state.router("/").get("de").arguments == {"alternate-exchange": "amq.fanout"}
        assert state.router("/").get("te") is None
        assert set(state.queues("/")) == {"dq"}
        assert state.queue("/", "dq").arguments == {"x-max-length": 7}
        bindings = sorted(
            (source, b.destination.name, b.routing_key) for source, b in state.bindings("/")
        )
        assert bindings == [("amq.topic", "de", "a.#"), ("de", "dq", "")]
        assert state.router("/").route("de", "", {"k": b"\x01", "f": 2.5}) == frozenset({"dq"})
        assert state.router("/").route("amq.topic", "a.b", {"k": b"\x01", "f": 2.5}) == (
            frozenset({"dq"})
        )

    run(scenario())


def test_deletes_reach_disk_with_their_cascades(tmp_path):
    path = tmp_path / "m.sqlite3"

    async def scenario():
        store = await MetadataStore.open(path)
        await store.apply(c.DeclareVhost("v1"))
        await store.apply(c.DeclareQueue("v1", "gone-with-vhost", durable=True))
        await store.apply(c.DeclareExchange("/", "src", "direct", durable=True))
        await store.apply(c.DeclareExchange("/", "ad", "fanout", durable=True, auto_delete=True))
        await store.apply(c.DeclareQueue("/", "q", durable=True))
        await store.apply(c.DeclareQueue("/", "q2", durable=True))
        await store.apply(c.Bind("/", "src", "q", routing_key="k"))
        await store.apply(c.Bind("/", "ad", "q"))
        await store.apply(c.Bind("/", "amq.direct", "src", "exchange"))
        await store.apply(c.Bind("/", "amq.direct", "q2", routing_key="u", arguments={"a": 1}))
        await store.apply(c.DeleteExchange("/", "src"))
        await store.apply(c.DeleteQueue("/", "q"))  # auto-deletes "ad"
        await store.apply(c.Unbind("/", "amq.direct", "q2", routing_key="u", arguments={"a": 1}))
        await store.apply(c.DeleteVhost("v1"))
        await store.close()

        state = await reopened(path)
        assert set(state.queues("/")) == {"q2"}
        assert state.router("/").get("src") is None and state.router("/").get("ad") is None
        assert state.bindings("/") == []
        assert "v1" not in state.vhosts
        store = await MetadataStore.open(path)
        for table in ("exchanges", "bindings"):
            async with store._db.execute(f"SELECT count(*) FROM {table}") as cursor:
                assert (await cursor.fetchone())[0] == 0, table
        await store.close()

    run(scenario())


def test_concurrent_applies_are_group_committed_and_all_kept(tmp_path):
    path = tmp_path / "m.sqlite3"

    async def scenario():
        store = await MetadataStore.open(path)
        writes = 0
        original = store._write

        async def counting(batch):
            nonlocal writes
            writes += 1
            await original(batch)

        store._write = counting
        await asyncio.gather(
            *(store.apply(c.DeclareQueue("/", f"q{i}", durable=True)) for i in range(200))
        )
        # 200 commands, far fewer transactions: later ones joined the one being written.
        assert writes < 50
        await store.close()
        assert len((await reopened(path)).queues("/")) == 200

    run(scenario())


def test_apply_all_writes_what_came_before_a_refusal(tmp_path):
    path = tmp_path / "m.sqlite3"

    async def scenario():
        store = await MetadataStore.open(path)
        with pytest.raises(RoutingError):
            await store.apply_all(
                [
                    c.DeclareQueue("/", "a", durable=True),
                    c.DeclareQueue("/", "a", durable=False),
                    c.DeclareQueue("/", "b", durable=True),
                ]
            )
        outcomes = await store.apply_all([c.DeclareVhost("v2"), c.DeclareVhost("v3")])
        assert [o.created for o in outcomes] == [True, True]
        await store.close()
        state = await reopened(path)
        assert set(state.queues("/")) == {"a"} and {"v2", "v3"} <= set(state.vhosts)

    run(scenario())


def test_failed_write_stops_the_store(tmp_path):
    async def scenario():
        store = await MetadataStore.open(tmp_path / "m.sqlite3")

        async def broken(batch):
            raise OSError("disk gone")

        store._write = broken
        with pytest.raises(StoreFailed):
            await store.apply(c.DeclareQueue("/", "q", durable=True))
        with pytest.raises(StoreFailed):
            await store.apply(c.DeclareQueue("/", "transient"))
        with pytest.raises(StoreFailed):
            await store.sync_external_changes()
        await store.close()

    run(scenario())


def test_a_write_refused_for_a_full_disk_is_written_once_space_returns(tmp_path, monkeypatch):
    monkeypatch.setattr(store_module, "DISK_FULL_RETRY_S", 0.01)
    path = tmp_path / "m.sqlite3"

    async def scenario():
        store = await MetadataStore.open(path)
        original = store._write
        refusals = [
            OSError(errno.ENOSPC, "No space left on device"),
            sqlite3.OperationalError("database or disk is full"),
        ]
        refusals[1].sqlite_errorcode = sqlite3.SQLITE_FULL

        async def full_then_space(batch):
            if refusals:
                raise refusals.pop(0)
            await original(batch)

        store._write = full_then_space
        await asyncio.gather(
            store.apply(c.DeclareQueue("/", "a", durable=True)),
            store.apply(c.DeclareQueue("/", "b", durable=True)),
        )
        assert refusals == []
        await store.apply(c.DeclareQueue("/", "c", durable=True))
        await store.close()
        assert set((await reopened(path)).queues("/")) == {"a", "b", "c"}

    run(scenario())


def test_closing_gives_up_a_write_waiting_for_space(tmp_path, monkeypatch):
    monkeypatch.setattr(store_module, "DISK_FULL_RETRY_S", 0.01)

    async def scenario():
        store = await MetadataStore.open(tmp_path / "m.sqlite3")

        async def full(batch):
            raise OSError(errno.ENOSPC, "No space left on device")

        store._write = full
        declare = asyncio.ensure_future(store.apply(c.DeclareQueue("/", "q", durable=True)))
        await asyncio.sleep(0.05)
        assert not declare.done(), "waiting for space"
        await store.close()
        with pytest.raises(StoreFailed):
            await declare

    run(scenario())


def test_changes_from_another_process_are_synced(tmp_path):
    path = tmp_path / "m.sqlite3"

    async def scenario():
        broker = await MetadataStore.open(path)
        await broker.apply(c.DeclareVhost("v1"))
        await broker.apply(c.DeclareQueue("v1", "q", durable=True))
        await broker.apply(c.DeclareQueue("v1", "t"))
        assert await broker.sync_external_changes() == []

        cli = await MetadataStore.open(path)  # what `warren users ...` does
        await cli.apply(c.AddUser("bob", HASH, ("management",)))
        await cli.apply(c.SetPermissions("bob", "/", ".*", "", ""))
        await cli.apply(c.ChangePassword("guest", HASH))
        await cli.apply(c.SetPermissions("guest", "/", "^x", ".*", ".*"))
        await cli.apply(c.DeclareVhost("v2"))
        await cli.apply(c.DeleteVhost("v1"))
        await cli.close()

        outcomes = await broker.sync_external_changes()
        state = broker.state
        assert state.users["bob"].tags == ("management",)
        assert state.permission("bob", "/").configure == ".*"
        assert state.users["guest"].password_hash == HASH
        assert state.permission("guest", "/").configure == "^x"
        assert "v2" in state.vhosts and "v1" not in state.vhosts
        deleted = [o.deleted_queues for o in outcomes if o.deleted_queues]
        assert deleted == [("q", "t")]  # the broker drops their storage
        assert await broker.sync_external_changes() == []

        cli = await MetadataStore.open(path)
        await cli.apply(c.ClearPermissions("bob", "/"))
        await cli.apply(c.DeleteUser("guest"))
        await cli.close()
        await broker.sync_external_changes()
        assert broker.state.permission("bob", "/") is None and "guest" not in broker.state.users
        await broker.close()

    run(scenario())


CRASHER = textwrap.dedent(
    """
    import asyncio, sys
    from warrenmq.server.metadata import commands as c
    from warrenmq.server.metadata.store import MetadataStore

    async def main():
        store = await MetadataStore.open(sys.argv[1])
        i = 0
        while True:
            await store.apply(c.DeclareQueue("/", f"q{i}", durable=True))
            print(i, flush=True)
            i += 1

    asyncio.run(main())
    """
)


def test_sigkill_after_apply_returned_loses_nothing(tmp_path):
    path = tmp_path / "m.sqlite3"
    process = subprocess.Popen(
        [sys.executable, "-c", CRASHER, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        confirmed = -1
        while confirmed < 30:
            line = process.stdout.readline()
            assert line, "the writer died"
            confirmed = int(line)
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
        process.stdout.close()
    queues = run(reopened(path)).queues("/")
    assert all(f"q{i}" in queues for i in range(confirmed + 1))


# --- random commands: what survives a reopen is exactly the durable part -------------------

DURABLE_COMMANDS = st.one_of(
    st.builds(c.DeclareVhost, st.sampled_from(["v1", "v2"])),
    st.builds(c.DeleteVhost, st.sampled_from(["v1", "v2"])),
    st.builds(
        c.SetPermissions,
        st.just("guest"),
        st.sampled_from(["/", "v1"]),
        st.sampled_from(["", ".*"]),
        st.just(".*"),
        st.just(".*"),
    ),
    st.builds(c.ClearPermissions, st.just("guest"), st.sampled_from(["/", "v1"])),
    st.builds(
        c.SetPolicy,
        st.sampled_from(["/", "v1"]),
        st.sampled_from(["p1", "p2"]),
        st.sampled_from([".*", "^q"]),
        st.sampled_from([{"max-length": 1}, {"message-ttl": 5, "dead-letter-exchange": "é"}]),
        st.sampled_from([0, 1.5]),
        st.sampled_from(["all", "queues"]),
    ),
    st.builds(c.ClearPolicy, st.sampled_from(["/", "v1"]), st.sampled_from(["p1", "p2"])),
    st.builds(
        c.DeclareExchange,
        st.sampled_from(["/", "v1"]),
        st.sampled_from(["e1", "e2"]),
        st.sampled_from(["direct", "topic"]),
        st.booleans(),
        st.booleans(),
    ),
    st.builds(c.DeleteExchange, st.sampled_from(["/", "v1"]), st.sampled_from(["e1", "e2"])),
    st.builds(
        lambda vhost, name, durable, owner: c.DeclareQueue(
            vhost, name, durable, owner is not None, False, {}, owner
        ),
        st.sampled_from(["/", "v1"]),
        st.sampled_from(["q1", "q2"]),
        st.booleans(),
        st.sampled_from([None, "c1"]),
    ),
    st.builds(c.DeleteQueue, st.sampled_from(["/", "v1"]), st.sampled_from(["q1", "q2"])),
    st.builds(
        c.Bind,
        st.sampled_from(["/", "v1"]),
        st.sampled_from(["e1", "e2", "amq.direct"]),
        st.sampled_from(["q1", "q2", "e1", "e2"]),
        st.sampled_from(["queue", "exchange"]),
        st.sampled_from(["", "k"]),
    ),
    st.builds(
        c.Unbind,
        st.sampled_from(["/", "v1"]),
        st.sampled_from(["e1", "e2", "amq.direct"]),
        st.sampled_from(["q1", "q2", "e1", "e2"]),
        st.sampled_from(["queue", "exchange"]),
        st.sampled_from(["", "k"]),
    ),
)


def durable_projection(snapshot: bytes) -> bytes:
    """The snapshot restricted to what RabbitMQ keeps over a restart."""
    document = json.loads(snapshot)
    durable_exchanges = {(e[0], e[1]) for e in document["exchanges"] if e[3]}
    kept_queues = {(q[0], q[1]) for q in document["queues"] if q[2] and q[5] is None}
    document["exchanges"] = [e for e in document["exchanges"] if (e[0], e[1]) in durable_exchanges]
    document["queues"] = [q for q in document["queues"] if (q[0], q[1]) in kept_queues]

    def durable_end(vhost, kind, name):
        if kind == "queue":
            return (vhost, name) in kept_queues
        return name.startswith("amq.") or (vhost, name) in durable_exchanges

    document["bindings"] = [
        b
        for b in document["bindings"]
        if durable_end(b[0], "exchange", b[1]) and durable_end(b[0], b[2], b[3])
    ]
    return MetadataState.from_snapshot(json.dumps(document).encode()).snapshot()


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(DURABLE_COMMANDS, max_size=25))
def test_reopen_restores_exactly_the_durable_projection(commands):
    async def scenario(path):
        store = await MetadataStore.open(path)
        for command in commands:
            try:
                await store.apply(command)
            except (RoutingError, ValueError):
                pass
        expected = durable_projection(store.state.snapshot())
        await store.close()
        assert (await reopened(path)).snapshot() == expected

    with tempfile.TemporaryDirectory() as directory:
        run(scenario(Path(directory) / "m.sqlite3"))


def test_concurrent_syncs_both_see_the_change(tmp_path):
    path = tmp_path / "m.sqlite3"

    async def scenario():
        broker = await MetadataStore.open(path)
        cli = await MetadataStore.open(path)
        await cli.apply(c.AddUser("late", HASH))
        await cli.close()

        async def sync_then_look():
            await broker.sync_external_changes()
            return "late" in broker.state.users

        assert await asyncio.gather(sync_then_look(), sync_then_look()) == [True, True]
        await broker.close()

    run(scenario())

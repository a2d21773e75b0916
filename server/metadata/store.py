"""The metadata store: the state machine in memory, its durable rows in SQLite (aiosqlite).

`await store.apply(command)` applies the command to `store.state` (validation happens there,
synchronously, so commands take effect in call order), then writes the rows it changed in one
transaction and returns only once that transaction is on disk. Commands arriving while a
transaction is being written join the next one (group commit), so a burst of declares costs
one fsync per batch, not one per command.

Durability: WAL journal with `synchronous=FULL`, so each commit fsyncs the WAL before COMMIT
returns; an `apply` that returned survives a process crash and a power loss. (NORMAL would
survive a process crash only; metadata changes are rare enough that the extra fsync is free.)
A failed write leaves memory ahead of disk, so the store stops accepting commands
(`StoreFailed`) instead of serving state it may not have kept; the broker should stop. A
full disk is the exception: the transaction is tried again every `DISK_FULL_RETRY_S` until
it is written, its callers (and those of the commands queued behind it) waiting meanwhile,
so the store carries on by itself once space returns, with nothing lost and no restart.

Changes made by another process (`warren users|vhosts|policies ...` against the same data dir
while a broker runs) are picked up by `sync_external_changes()`: SQLite's `PRAGMA data_version`
changes exactly when another connection has committed, so the check is one cheap query; when
it changed, vhosts, users, permissions, policies and limits are re-read and the differences applied
to the state as commands. The broker calls it before authenticating each new connection and
once a second; the CLI only ever edits those five tables.

The policies and limits tables came after schema 2 without a version of their own: they are
only added (CREATE TABLE IF NOT EXISTS), and a broker that predates them has none to lose.
Limits ("vhost" or "user" scope, a JSON object) are the CLI's to edit too.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import hashlib
import hmac
import json
import logging
import os
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import aiosqlite

from warrenmq.exchanges.errors import RoutingError
from warrenmq.server.metadata import commands as c
from warrenmq.server.metadata import encoding, passwords
from warrenmq.server.metadata.password_checks import PasswordChecks
from warrenmq.server.metadata.records import (
    ADMINISTRATOR,
    DEFAULT_PASSWORD,
    DEFAULT_USER,
    DEFAULT_VHOST,
    Policy,
    User,
    binding_arguments_digest,
)
from warrenmq.server.metadata.state import (
    Limits,
    MetadataState,
    Outcome,
    Write,
    snapshot_commands,
)

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 2
# The store's file in a data directory (the broker and `warren admin` open the same one).
METADATA_FILE = "metadata.sqlite3"
BUSY_TIMEOUT_MS = 5_000
# The database and its journal files: the broker's user only (password hashes).
FILE_MODE = 0o600
# At most this many password verifications run at once: each scrypt holds 16 MiB.
VERIFICATIONS_CONCURRENT_MAX = 2
# Successful logins remembered (keyed by an HMAC under a per-process key, never the password),
# so reconnect storms do not pay the KDF each time.
VERIFIED_LOGINS_MAX = 1024
# Commands whose rows go into one transaction at most.
BATCH_WRITES_MAX = 10_000
# How often a transaction refused for a full disk is tried again.
DISK_FULL_RETRY_S = 0.5

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS vhosts (
    name TEXT PRIMARY KEY, description TEXT NOT NULL, tags TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS users (
    name TEXT PRIMARY KEY, password_hash TEXT NOT NULL, tags TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS permissions (
    user TEXT NOT NULL, vhost TEXT NOT NULL, configure TEXT NOT NULL, write TEXT NOT NULL,
    read TEXT NOT NULL, PRIMARY KEY (user, vhost));
CREATE TABLE IF NOT EXISTS policies (
    vhost TEXT NOT NULL, name TEXT NOT NULL, pattern TEXT NOT NULL, apply_to TEXT NOT NULL,
    priority TEXT NOT NULL, definition TEXT NOT NULL, PRIMARY KEY (vhost, name));
CREATE TABLE IF NOT EXISTS limits (
    scope TEXT NOT NULL, name TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY (scope, name));
CREATE TABLE IF NOT EXISTS exchanges (
    vhost TEXT NOT NULL, name TEXT NOT NULL, type TEXT NOT NULL, auto_delete INTEGER NOT NULL,
    internal INTEGER NOT NULL, arguments TEXT NOT NULL, PRIMARY KEY (vhost, name));
CREATE TABLE IF NOT EXISTS queues (
    vhost TEXT NOT NULL, name TEXT NOT NULL, auto_delete INTEGER NOT NULL,
    arguments TEXT NOT NULL, PRIMARY KEY (vhost, name));
CREATE TABLE IF NOT EXISTS bindings (
    vhost TEXT NOT NULL, source TEXT NOT NULL, destination_kind TEXT NOT NULL,
    destination TEXT NOT NULL, routing_key TEXT NOT NULL, arguments_digest TEXT NOT NULL,
    arguments TEXT NOT NULL,
    PRIMARY KEY (vhost, source, destination_kind, destination, routing_key, arguments_digest));
CREATE INDEX IF NOT EXISTS bindings_by_destination
    ON bindings (vhost, destination_kind, destination);
"""


_ENTITY_TABLES = (
    "vhosts",
    "users",
    "permissions",
    "policies",
    "limits",
    "exchanges",
    "queues",
    "bindings",
)


def _owner_only(path: Path) -> None:
    """Create the database file readable by its owner only (it holds the password hashes),
    and take group and other access from one made before. SQLite gives the journal files it
    creates the database file's mode."""
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, FILE_MODE))
    for name in (path, *(path.with_name(path.name + suffix) for suffix in ("-wal", "-shm"))):
        try:
            os.chmod(name, FILE_MODE)
        except FileNotFoundError:
            pass


def _disk_full(error: BaseException) -> bool:
    if isinstance(error, sqlite3.Error):
        return getattr(error, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL
    return isinstance(error, OSError) and error.errno == errno.ENOSPC


class StoreFailed(Exception):
    """A metadata write failed: memory may be ahead of disk, so no further commands apply."""


class MetadataStore:
    """The metadata state plus its SQLite persistence; one per data directory."""

    def __init__(self, db: aiosqlite.Connection, path: Path, state: MetadataState) -> None:
        self._db = db
        self.path = path
        self.state = state
        self._queued_writes: list[Write] = []
        self._queued_waiters: list[asyncio.Future[None]] = []
        self._write_calls = 0
        self._flusher: asyncio.Task[None] | None = None
        self.write_delay_s = 0.0
        # Set while the flusher waits out `write_delay_s`; done to write at once.
        self._hurry: asyncio.Future[None] | None = None
        self._failure: BaseException | None = None
        self._closing = False
        self._data_version = 0
        self._syncing = asyncio.Lock()
        self._password_checks = PasswordChecks(VERIFICATIONS_CONCURRENT_MAX)
        self._verified_key = os.urandom(32)
        self._verified: collections.OrderedDict[bytes, None] = collections.OrderedDict()

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        limits: Limits | None = None,
        load: bool = True,
        synchronous: str = "FULL",
        write_delay_s: float = 0.0,
    ) -> MetadataStore:
        """Open (creating if needed) the store at `path` and load its durable state.

        On the very first open the default vhost "/" and the user guest/guest (administrator,
        full permissions on "/") are created, as RabbitMQ's default_user is; never again
        afterwards, so a deleted guest stays deleted. (The broker's loopback_users setting,
        not the store, keeps guest to loopback addresses.)

        `load=False` leaves `state` empty: for a caller whose state comes from elsewhere (the
        replicated metadata, which keeps these rows as a view of its log, `replicated.py`).
        `synchronous` is SQLite's: "FULL" fsyncs every transaction, "NORMAL" (for such a view)
        survives a process crash but may lose the last transactions to a power loss.
        `write_delay_s` (for such a view, whose writers do not wait for their rows) gathers
        the rows queued over that long into one transaction; `flushed` writes them at once.
        """
        assert synchronous in ("FULL", "NORMAL")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        _owner_only(path)
        db = await aiosqlite.connect(path, isolation_level=None)
        try:
            await db.execute("PRAGMA journal_mode=WAL")
            await db.execute(f"PRAGMA synchronous={synchronous}")
            await db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
            await db.executescript(_SCHEMA)
            store = cls(db, path, MetadataState(limits))
            store.write_delay_s = write_delay_s
            await store._initialise()
            store._data_version = await store._read_data_version()
            if load:
                await store._load()
        except BaseException:
            await db.close()
            raise
        return store

    async def close(self) -> None:
        # A transaction waiting for disk space gives up: what it held was never acknowledged.
        self._closing = True
        self._write_now()
        if self._flusher is not None:
            await asyncio.shield(self._flusher)
        self._password_checks.close()
        await self._db.close()

    # --- commands --------------------------------------------------------------------------

    async def apply(self, command: c.Command) -> Outcome:
        """Apply `command`; returns once its rows (if any are durable) are on disk.

        Raises the state's RoutingError (nothing changed), or StoreFailed.
        """
        if self._failure is not None:
            raise StoreFailed("metadata store failed earlier") from self._failure
        outcome = self.state.apply(command)
        if outcome.writes:
            await self._persist(outcome.writes)
        return outcome

    async def apply_all(self, commands: Iterable[c.Command]) -> list[Outcome]:
        """Apply commands in order, their rows in one transaction. On a refused command, the
        ones before it stay applied (and are written) and its error is raised."""
        if self._failure is not None:
            raise StoreFailed("metadata store failed earlier") from self._failure
        outcomes: list[Outcome] = []
        writes: list[Write] = []
        try:
            for command in commands:
                outcome = self.state.apply(command)
                outcomes.append(outcome)
                writes.extend(outcome.writes)
        finally:
            if writes:
                await self._persist(tuple(writes))
        return outcomes

    async def _persist(self, writes: tuple[Write, ...]) -> None:
        # Shielded: a caller cancelled while waiting does not cancel the shared transaction.
        await asyncio.shield(self.write_rows(writes))

    def write_rows(self, writes: Iterable[Write], log_index: int = 0) -> asyncio.Future[None]:
        """Queue rows to write (in the next transaction); the future is done once they are
        committed. `log_index`, when given, is recorded with them: the replicated log's index
        of the command they come from (`written_log_index`)."""
        if self._failure is not None:
            raise StoreFailed("metadata store failed earlier") from self._failure
        waiter = asyncio.get_running_loop().create_future()
        self._write_calls += 1
        self._queued_writes.extend(writes)
        if log_index:
            self._queued_writes.append(("log_index", log_index))
        self._queued_waiters.append(waiter)
        if self._flusher is None:
            self._flusher = asyncio.ensure_future(self._flush())
        elif len(self._queued_writes) >= BATCH_WRITES_MAX:
            self._write_now()
        return waiter

    def _write_now(self) -> None:
        if self._hurry is not None and not self._hurry.done():
            self._hurry.set_result(None)

    def rewrite_rows(self, state: MetadataState, log_index: int) -> asyncio.Future[None]:
        """Replace every row by the durable projection of `state` (a view that fell behind
        a snapshot catches up this way)."""
        seed = MetadataState(state.limits)
        writes: list[Write] = [("delete_all",)]
        for command in snapshot_commands(state):
            writes.extend(seed.apply(command).writes)
        return self.write_rows(writes, log_index)

    async def written_log_index(self) -> int:
        """The log index recorded with the last rows written (0: none)."""
        async with self._db.execute("SELECT value FROM meta WHERE key = 'log_index'") as cursor:
            row = await cursor.fetchone()
        return 0 if row is None else int(row[0])

    async def flushed(self) -> None:
        """Until every row queued so far is written."""
        self._write_now()
        if self._queued_waiters:
            await asyncio.shield(asyncio.gather(*self._queued_waiters, return_exceptions=True))

    async def _flush(self) -> None:
        try:
            if self.write_delay_s and not self._closing:
                self._hurry = asyncio.get_running_loop().create_future()
                await asyncio.wait([self._hurry], timeout=self.write_delay_s)
                self._hurry = None
            while self._queued_waiters:
                writes = self._queued_writes[:BATCH_WRITES_MAX]
                # Waiters are released only when every write queued before them is on disk.
                if len(self._queued_writes) > BATCH_WRITES_MAX:
                    waiters: list[asyncio.Future[None]] = []
                else:
                    waiters, self._queued_waiters = self._queued_waiters, []
                del self._queued_writes[: len(writes)]
                try:
                    await self._write_when_space(writes)
                except BaseException as error:
                    self._failure = error
                    logger.error("metadata write failed; refusing further changes: %r", error)
                    failed = StoreFailed(f"metadata write failed: {error!r}")
                    for waiter in waiters + self._queued_waiters:
                        if not waiter.done():
                            waiter.set_exception(failed)
                    self._queued_waiters = []
                    self._queued_writes = []
                    return
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)
        finally:
            self._flusher = None

    async def _write_when_space(self, writes: list[Write]) -> None:
        """Write the transaction, trying again while the disk is full."""
        waited = False
        while True:
            try:
                await self._write(writes)
            except Exception as error:
                if not _disk_full(error) or self._closing:
                    raise
                if not waited:
                    logger.error(
                        "metadata write failed, the disk is full; trying again every %.1f s: %r",
                        DISK_FULL_RETRY_S,
                        error,
                    )
                    waited = True
                await asyncio.sleep(DISK_FULL_RETRY_S)
                continue
            if waited:
                logger.warning("metadata written again: disk space is back")
            return

    async def _write(self, writes: list[Write]) -> None:
        db = self._db
        await db.execute("BEGIN IMMEDIATE")
        try:
            for write in writes:
                for sql, parameters in _statements(write):
                    await db.execute(sql, parameters)
            await db.execute("COMMIT")
        except BaseException:
            # SQLite has already rolled back after some errors (a full disk among them).
            if db.in_transaction:
                await db.execute("ROLLBACK")
            raise

    # --- authentication --------------------------------------------------------------------

    async def authenticate(self, username: str, password: str, source: str = "") -> User | None:
        """The user if the password is right, else None (RabbitMQ refuses blank passwords).

        The KDF runs in a thread, at most VERIFICATIONS_CONCURRENT_MAX at once, fairly between
        client addresses (`source`), and as long for a user that does not exist
        (`password_checks`). The caller still has to check the peer address against its
        loopback_users (`loopback_refused`).
        """
        if password == "":
            return None
        user = self.state.users.get(username)
        if user is not None:
            key = hmac.new(
                self._verified_key,
                b"\0".join(
                    (
                        username.encode("utf-8"),
                        user.password_hash.encode(),
                        password.encode("utf-8"),
                    )
                ),
                hashlib.sha256,
            ).digest()
            if key in self._verified:
                self._verified.move_to_end(key)
                return user
        stored = None if user is None else user.password_hash
        if not await self._password_checks.check(password, stored, source):
            return None
        assert user is not None
        self._verified[key] = None
        if len(self._verified) > VERIFIED_LOGINS_MAX:
            self._verified.popitem(last=False)
        # The user may have changed while the KDF ran; answer for the current record.
        current = self.state.users.get(username)
        if current is None or current.password_hash != user.password_hash:
            return None
        return current

    # --- other writers ---------------------------------------------------------------------

    async def sync_external_changes(self) -> list[Outcome]:
        """Apply what another process committed to vhosts, users, permissions and policies since
        the last look; returns the outcomes (a deleted vhost's queues are in `deleted_queues`)."""
        if self._failure is not None:
            raise StoreFailed("metadata store failed earlier") from self._failure
        # One sync at a time: a second caller waits for the first to finish applying, so no
        # caller returns before a change already seen by another is in the state.
        async with self._syncing:
            outcomes = []
            for command in await self.external_changes():
                try:
                    outcomes.append(await self.apply(command))
                except RoutingError as error:
                    logger.warning("ignoring external metadata change %r: %s", command, error)
            return outcomes

    async def external_changes(self, *, since_open: bool = False) -> list[c.Command]:
        """The commands that bring the state's vhosts, users, permissions, policies and
        limits to what the rows hold, if another process committed since the last look (or,
        `since_open`, whatever it committed while no one looked). Holds `_syncing` or is
        called before anyone else can look."""
        version = await self._read_data_version()
        if version == self._data_version and not since_open:
            return []
        # Recorded before reading: a commit that lands while we read is seen next time.
        self._data_version = version
        while True:
            # The diff is only right if the rows read hold every change of ours the state
            # holds: read again if one was queued meanwhile (the state changes with it).
            await self.flushed()
            queued = self._write_calls
            vhosts, users, permissions = await self._read_access_rows()
            policies = await self._read_policy_rows()
            limit_rows = await self._read_limit_rows()
            if queued == self._write_calls and not self._queued_waiters:
                break
        commands = _reconcile(self.state, vhosts, users, permissions)
        commands += _reconcile_policies(self.state, policies, {name for name, _, _ in vhosts})
        commands += _reconcile_limits(self.state, limit_rows)
        return commands

    async def _read_data_version(self) -> int:
        async with self._db.execute("PRAGMA data_version") as cursor:
            row = await cursor.fetchone()
        assert row is not None
        return int(row[0])

    # --- loading ---------------------------------------------------------------------------

    async def _initialise(self) -> None:
        db = self._db
        async with db.execute("SELECT value FROM meta WHERE key = 'schema_version'") as cursor:
            row = await cursor.fetchone()
        if row is not None:
            if int(row[0]) == 1:
                await self._migrate_from_schema_1()
            elif int(row[0]) != SCHEMA_VERSION:
                raise StoreFailed(
                    f"{self.path}: metadata schema {row[0]}, this broker reads {SCHEMA_VERSION}"
                )
            return
        seed = MetadataState()
        writes: list[Write] = []
        for command in default_commands():
            writes.extend(seed.apply(command).writes)
        await db.execute("BEGIN IMMEDIATE")
        try:
            await db.execute(
                "INSERT INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
            )
            for write in writes:
                for sql, parameters in _statements(write):
                    await db.execute(sql, parameters)
            await db.execute("COMMIT")
        except BaseException:
            await db.execute("ROLLBACK")
            raise

    async def _migrate_from_schema_1(self) -> None:
        """Schema 1 kept a per-user loopback-only flag. The broker's loopback_users setting is
        now the one source, as in RabbitMQ, so the column goes; the users it flagged are
        logged, for an operator to list in loopback_users if they must stay local."""
        db = self._db
        await db.execute("BEGIN IMMEDIATE")
        try:
            # Another process (the CLI, a second broker) may have migrated since we looked.
            async with db.execute("SELECT value FROM meta WHERE key = 'schema_version'") as cursor:
                row = await cursor.fetchone()
            assert row is not None
            flagged = []
            if int(row[0]) == 1:
                async with db.execute("SELECT name FROM users WHERE loopback_only") as cursor:
                    flagged = [name for (name,) in await cursor.fetchall()]
                await db.execute("ALTER TABLE users DROP COLUMN loopback_only")
                await db.execute(
                    "UPDATE meta SET value = ? WHERE key = 'schema_version'",
                    (str(SCHEMA_VERSION),),
                )
            await db.execute("COMMIT")
        except BaseException:
            await db.execute("ROLLBACK")
            raise
        for name in flagged:
            logger.warning(
                "%s: user '%s' was loopback-only in the metadata; that is now the broker's "
                "loopback_users setting (default: guest)",
                self.path,
                name,
            )

    async def _read_access_rows(self) -> tuple[list, list, list]:
        db = self._db
        async with db.execute("SELECT name, description, tags FROM vhosts") as cursor:
            vhosts = list(await cursor.fetchall())
        async with db.execute("SELECT name, password_hash, tags FROM users") as cursor:
            users = list(await cursor.fetchall())
        async with db.execute(
            "SELECT user, vhost, configure, write, read FROM permissions"
        ) as cursor:
            permissions = list(await cursor.fetchall())
        return vhosts, users, permissions

    async def _read_policy_rows(self) -> list:
        async with self._db.execute(
            "SELECT vhost, name, pattern, apply_to, priority, definition FROM policies"
            " ORDER BY vhost, name"
        ) as cursor:
            return list(await cursor.fetchall())

    async def _read_limit_rows(self) -> list:
        async with self._db.execute(
            "SELECT scope, name, value FROM limits ORDER BY scope, name"
        ) as cursor:
            return list(await cursor.fetchall())

    async def reload(self) -> None:
        """Replace `state` by what the rows hold."""
        self.state = MetadataState(self.state.limits)
        await self._load()

    async def _load(self) -> None:
        for command in await self.stored_commands():
            try:
                self.state.apply(command)
            except RoutingError as error:
                # Only a row orphaned by a concurrent writer (a declare racing a CLI vhost
                # delete) can fail here; it is dropped from memory, as its vhost is gone.
                logger.warning("skipping stored metadata %r: %s", command, error)

    async def stored_commands(self) -> list[c.Command]:
        """Commands that build, from an empty state, what the rows hold."""
        db = self._db
        vhosts, users, permissions = await self._read_access_rows()
        policies = await self._read_policy_rows()
        async with db.execute(
            "SELECT vhost, name, type, auto_delete, internal, arguments FROM exchanges"
            " ORDER BY vhost, name"
        ) as cursor:
            exchanges = list(await cursor.fetchall())
        async with db.execute(
            "SELECT vhost, name, auto_delete, arguments FROM queues ORDER BY vhost, name"
        ) as cursor:
            queues = list(await cursor.fetchall())
        async with db.execute(
            "SELECT vhost, source, destination_kind, destination, routing_key, arguments"
            " FROM bindings ORDER BY vhost, source, destination_kind, destination, routing_key,"
            " arguments_digest"
        ) as cursor:
            bindings = list(await cursor.fetchall())
        loaded: list[c.Command] = []
        loaded.extend(_reconcile(MetadataState(), vhosts, users, permissions))
        loaded.extend(
            _reconcile_policies(MetadataState(), policies, {name for name, _, _ in vhosts})
        )
        for vhost, name, type_name, auto_delete, internal, arguments in exchanges:
            loaded.append(
                c.DeclareExchange(
                    vhost,
                    name,
                    type_name,
                    True,
                    bool(auto_delete),
                    bool(internal),
                    encoding.table_from_json(arguments),
                )
            )
        for vhost, name, auto_delete, arguments in queues:
            loaded.append(
                c.DeclareQueue(
                    vhost,
                    name,
                    durable=True,
                    auto_delete=bool(auto_delete),
                    arguments=encoding.table_from_json(arguments),
                    server_named=True,
                )
            )
        for vhost, source, kind, destination, routing_key, arguments in bindings:
            loaded.append(
                c.Bind(
                    vhost,
                    source,
                    destination,
                    kind,
                    routing_key,
                    encoding.table_from_json(arguments),
                )
            )
        # Last: a vhost may hold more queues than a max-queues set since allows.
        loaded.extend(_reconcile_limits(MetadataState(), await self._read_limit_rows()))
        return loaded


def default_commands(
    vhost: str = DEFAULT_VHOST, user: str = DEFAULT_USER, password: str = DEFAULT_PASSWORD
) -> list[c.Command]:
    """What a first start creates: RabbitMQ's default vhost and default user."""
    return [
        c.DeclareVhost(vhost, "Default virtual host"),
        c.AddUser(user, passwords.hash_password(password), (ADMINISTRATOR,)),
        c.SetPermissions(user, vhost, ".*", ".*", ".*"),
    ]


def _reconcile(
    state: MetadataState, vhosts: list, users: list, permissions: list
) -> list[c.Command]:
    """Commands that turn the state's vhosts, users and permissions into the given rows."""
    commands: list[c.Command] = []
    vhost_names = set()
    for name, description, tags in vhosts:
        vhost_names.add(name)
        if name not in state.vhosts:
            commands.append(c.DeclareVhost(name, description, tuple(json.loads(tags))))
    user_names = set()
    for name, password_hash, tags_json in users:
        user_names.add(name)
        tags = tuple(json.loads(tags_json))
        current = state.users.get(name)
        if current is None:
            commands.append(c.AddUser(name, password_hash, tags))
            continue
        if current.password_hash != password_hash:
            commands.append(c.ChangePassword(name, password_hash))
        if current.tags != tags:
            commands.append(c.SetUserTags(name, tags))
    wanted = set()
    for user, vhost, configure, write, read in permissions:
        wanted.add((user, vhost))
        current_permission = state.permissions.get((user, vhost))
        if current_permission is None or (
            current_permission.configure,
            current_permission.write,
            current_permission.read,
        ) != (configure, write, read):
            commands.append(c.SetPermissions(user, vhost, configure, write, read))
    for user, vhost in sorted(state.permissions):
        if (user, vhost) not in wanted and user in user_names and vhost in vhost_names:
            commands.append(c.ClearPermissions(user, vhost))
    for name in sorted(state.users):
        if name not in user_names:
            commands.append(c.DeleteUser(name))
    for name in sorted(state.vhosts):
        if name not in vhost_names:
            commands.append(c.DeleteVhost(name))
    return commands


def _reconcile_policies(state: MetadataState, rows: list, vhost_names: set[str]) -> list[c.Command]:
    """Commands that turn the state's policies into the given rows, for vhosts that stay (a
    vhost's deletion takes its policies with it)."""
    commands: list[c.Command] = []
    wanted = set()
    for vhost, name, pattern, apply_to, priority_json, definition_json in rows:
        wanted.add((vhost, name))
        policy = Policy(
            vhost, name, pattern, apply_to, json.loads(priority_json), json.loads(definition_json)
        )
        current = state.policies(vhost).get(name) if vhost in state.vhosts else None
        if current != policy:
            commands.append(
                c.SetPolicy(vhost, name, pattern, policy.definition, policy.priority, apply_to)
            )
    for vhost in sorted(vhost_names & set(state.vhosts)):
        for name in sorted(state.policies(vhost)):
            if (vhost, name) not in wanted:
                commands.append(c.ClearPolicy(vhost, name))
    return commands


def _reconcile_limits(state: MetadataState, rows: list) -> list[c.Command]:
    """Commands that turn the state's vhost and user limits into the given rows (a deleted
    vhost or user takes its limits with it)."""
    commands: list[c.Command] = []
    wanted: dict[tuple[str, str], dict] = {(scope, name): json.loads(v) for scope, name, v in rows}
    for (scope, name), value in sorted(wanted.items()):
        current = (state.vhost_limits if scope == "vhost" else state.user_limits).get(name)
        if current != value:
            command = c.SetVhostLimits if scope == "vhost" else c.SetUserLimits
            commands.append(command(name, value))
    for name in sorted(state.vhost_limits):
        if ("vhost", name) not in wanted:
            commands.append(c.SetVhostLimits(name, {}))
    for name in sorted(state.user_limits):
        if ("user", name) not in wanted:
            commands.append(c.SetUserLimits(name, {}))
    return commands


def _statements(write: Write) -> list[tuple[str, tuple[Any, ...]]]:
    kind = write[0]
    if kind == "log_index":
        return [("INSERT OR REPLACE INTO meta (key, value) VALUES ('log_index', ?)", (write[1],))]
    if kind == "delete_all":
        return [(f"DELETE FROM {table}", ()) for table in _ENTITY_TABLES]
    if kind == "put_vhost":
        vhost = write[1]
        return [
            (
                "INSERT OR REPLACE INTO vhosts (name, description, tags) VALUES (?, ?, ?)",
                (vhost.name, vhost.description, json.dumps(list(vhost.tags))),
            )
        ]
    if kind == "delete_vhost":
        name = write[1]
        return [
            (f"DELETE FROM {table} WHERE {column} = ?", (name,))
            for table, column in (
                ("vhosts", "name"),
                ("permissions", "vhost"),
                ("policies", "vhost"),
                ("exchanges", "vhost"),
                ("queues", "vhost"),
                ("bindings", "vhost"),
            )
        ] + [("DELETE FROM limits WHERE scope = 'vhost' AND name = ?", (name,))]
    if kind == "put_user":
        user = write[1]
        return [
            (
                "INSERT OR REPLACE INTO users (name, password_hash, tags) VALUES (?, ?, ?)",
                (user.name, user.password_hash, json.dumps(list(user.tags))),
            )
        ]
    if kind == "delete_user":
        return [
            ("DELETE FROM users WHERE name = ?", (write[1],)),
            ("DELETE FROM permissions WHERE user = ?", (write[1],)),
            ("DELETE FROM limits WHERE scope = 'user' AND name = ?", (write[1],)),
        ]
    if kind == "put_permission":
        p = write[1]
        return [
            (
                "INSERT OR REPLACE INTO permissions (user, vhost, configure, write, read)"
                " VALUES (?, ?, ?, ?, ?)",
                (p.user, p.vhost, p.configure, p.write, p.read),
            )
        ]
    if kind == "delete_permission":
        return [("DELETE FROM permissions WHERE user = ? AND vhost = ?", (write[1], write[2]))]
    if kind == "put_policy":
        policy = write[1]
        return [
            (
                "INSERT OR REPLACE INTO policies (vhost, name, pattern, apply_to, priority,"
                " definition) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    policy.vhost,
                    policy.name,
                    policy.pattern,
                    policy.apply_to,
                    json.dumps(policy.priority),
                    json.dumps(policy.definition, ensure_ascii=False),
                ),
            )
        ]
    if kind == "delete_policy":
        return [("DELETE FROM policies WHERE vhost = ? AND name = ?", (write[1], write[2]))]
    if kind == "put_limits":
        _, scope, name, value = write
        return [
            (
                "INSERT OR REPLACE INTO limits (scope, name, value) VALUES (?, ?, ?)",
                (scope, name, json.dumps(value)),
            )
        ]
    if kind == "delete_limits":
        return [("DELETE FROM limits WHERE scope = ? AND name = ?", (write[1], write[2]))]
    if kind == "put_exchange":
        _, vhost, exchange = write
        return [
            (
                "INSERT OR REPLACE INTO exchanges (vhost, name, type, auto_delete, internal,"
                " arguments) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    vhost,
                    exchange.name,
                    exchange.type,
                    int(exchange.auto_delete),
                    int(exchange.internal),
                    encoding.table_to_json(exchange.arguments),
                ),
            )
        ]
    if kind == "delete_exchange":
        _, vhost, name = write
        return [
            ("DELETE FROM exchanges WHERE vhost = ? AND name = ?", (vhost, name)),
            (
                "DELETE FROM bindings WHERE vhost = ? AND (source = ? OR"
                " (destination_kind = 'exchange' AND destination = ?))",
                (vhost, name, name),
            ),
        ]
    if kind == "put_queue":
        record = write[1]
        return [
            (
                "INSERT OR REPLACE INTO queues (vhost, name, auto_delete, arguments)"
                " VALUES (?, ?, ?, ?)",
                (
                    record.vhost,
                    record.name,
                    int(record.auto_delete),
                    encoding.table_to_json(record.arguments),
                ),
            )
        ]
    if kind == "delete_queue":
        _, vhost, name = write
        return [
            ("DELETE FROM queues WHERE vhost = ? AND name = ?", (vhost, name)),
            (
                "DELETE FROM bindings WHERE vhost = ? AND destination_kind = 'queue'"
                " AND destination = ?",
                (vhost, name),
            ),
        ]
    if kind in ("put_binding", "delete_binding"):
        _, vhost, source, binding = write
        key = (
            vhost,
            source,
            binding.destination.kind,
            binding.destination.name,
            binding.routing_key,
            binding_arguments_digest(binding.arguments),
        )
        if kind == "delete_binding":
            return [
                (
                    "DELETE FROM bindings WHERE vhost = ? AND source = ? AND destination_kind = ?"
                    " AND destination = ? AND routing_key = ? AND arguments_digest = ?",
                    key,
                )
            ]
        return [
            (
                "INSERT OR REPLACE INTO bindings (vhost, source, destination_kind, destination,"
                " routing_key, arguments_digest, arguments) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (*key, encoding.table_to_json(binding.arguments)),
            )
        ]
    raise AssertionError(f"unknown metadata write {kind!r}")

"""The broker's metadata, replicated: every change is a command in a Raft log.

Design
======

`ReplicatedMetadata` is what the broker holds as its metadata store (`apply`, `apply_all`,
`state`, `authenticate`, `sync_external_changes`, `close`: the interface `MetadataStore` had).
Underneath, it is a `warrenmq.cluster.group.RaftGroup` whose state machine (`MetadataMachine`)
is the `MetadataState`:

* `apply(command)` encodes the command (`encoding.encode_commands`) and proposes it; the
  group appends it to the log, fsyncs, commits and applies it: `MetadataState.apply` runs in
  log order on every member. The caller's await returns once the command is applied HERE, so
  what a connection declared it can use at once (read-your-writes), with the outcome or the
  state's refusal (RoutingError) the command met in the log. Validation happens when the
  entry applies, not when it is proposed: a command refused is still a log entry, refused the
  same way by every replica. `apply_all` proposes its commands as ONE entry: applied in order,
  stopping at the first refused, atomically with respect to a crash.
* A one-node broker is a one-member group (node id 1, no transport): the same code path a
  cluster runs, committing after its own fsync, which runs in a worker thread while the
  event loop serves the other connections; the commands proposed meanwhile share the next
  fsync (see `cluster/group.py`). Commands proposed as one entry (`apply_all`, the seed, the
  definitions import) share one too. The state changes only when an entry applies, so a
  caller that checks the state before proposing (the vhost's declare) must expect a command
  proposed before its own, not yet applied, to change it first: see `VirtualHost`.
* Snapshots are `MetadataState.snapshot()` (every entity, transient ones included), taken
  every `SNAPSHOT_ENTRIES` applied entries; the log before them is dropped. A restart
  restores the snapshot and re-applies the log after it: the state is a function of the log.
* A restarted broker then proposes `ForgetTransient` if the state holds transient exchanges,
  transient or exclusive queues: they did not survive the restart, exactly as before, but
  now by a log entry rather than by not having been stored.

The SQLite rows (`metadata.sqlite3`, `MetadataStore` with `load=False`) stay, as a VIEW of the
applied state: each applied command's rows are queued and written, those of
`ROWS_WRITE_DELAY_S` in one transaction, with the log index they come from. Nobody waits for
them: the log entry is what makes a command durable. They earn their place three ways:
`warren users|vhosts|policies --data-dir D` reads and edits them with no broker or Raft log
involved; a broker picks such an edit up by diffing the rows against its state
(`sync_external_changes`, keyed on SQLite's data_version as before) and PROPOSES the
difference, so a CLI edit enters the log like any other change; and an existing single-node
data dir is upgraded in place: a broker that finds no Raft log proposes what its rows hold as
the log's first command (fresh data dirs go the same way, the rows then holding the default
vhost and user). Since the log is the durable truth, the view commits with
`synchronous=NORMAL` (no fsync): after a crash or a power loss it may lack its last
transactions, which the log index recorded with them tells a restart to write again (or,
behind a snapshot, to rewrite whole). The CLI edits only users, vhosts, permissions,
policies and limits; an edit made offline is proposed at the next start, after the view has
caught up with the log.

Failure: a full disk stalls the log writes (`RaftGroup` retries them; callers wait and carry
on when space returns) and the row writes (`MetadataStore` retries them). Any other
failure of either makes the store refuse further commands (`StoreFailed`), as before.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from warrenmq.cluster.group import GroupConfig, GroupStopped, ProposalLost, RaftGroup
from warrenmq.cluster.raft.core import RaftError
from warrenmq.exchanges.errors import RoutingError
from warrenmq.server.metadata import commands as c
from warrenmq.server.metadata.encoding import decode_commands, encode_commands
from warrenmq.server.metadata.records import User
from warrenmq.server.metadata.state import Limits, MetadataState, Outcome
from warrenmq.server.metadata.store import METADATA_FILE, MetadataStore, StoreFailed

logger = logging.getLogger(__name__)

# The metadata group's Raft log, hard state and snapshot, beside the SQLite view.
RAFT_DIRECTORY = "metadata-raft"
SNAPSHOT_ENTRIES = 20_000
# The rows are a view nobody waits for: the commands of this long share one transaction.
ROWS_WRITE_DELAY_S = 0.1
_NODE_ID = 1
# The Raft files hold password hashes too.
_DIRECTORY_MODE = 0o700


@dataclass
class EntryResult:
    """What applying one log entry did, handed to whoever proposed it."""

    outcomes: list[Outcome] = field(default_factory=list)
    error: Exception | None = None
    """The refusal that stopped the entry's commands (those before it stayed applied)."""


class MetadataMachine:
    """The `RaftGroup` state machine: `MetadataState` plus its SQLite view."""

    def __init__(self, rows: MetadataStore, rows_log_index: int) -> None:
        self.rows = rows
        # Entries up to here already have their rows in the view (a restart replays them).
        self._rows_log_index = rows_log_index

    @property
    def state(self) -> MetadataState:
        return self.rows.state

    def apply(self, index: int, data: bytes) -> EntryResult:
        result = EntryResult()
        try:
            commands = decode_commands(data)
        except ValueError as error:
            # Only this module proposes, so this is a bug or a foreign writer; every replica
            # refuses it the same way, which keeps them equal.
            logger.error("metadata log entry %d does not decode: %s", index, error)
            result.error = error
            return result
        writes = []
        state = self.rows.state
        for command in commands:
            try:
                outcome = state.apply(command)
            except Exception as error:  # the state changed nothing: deterministic everywhere
                result.error = error
                break
            result.outcomes.append(outcome)
            writes.extend(outcome.writes)
        if writes and index > self._rows_log_index:
            try:
                # Nobody waits for the view (module docstring); a failed write is logged,
                # and the commands after it refused.
                self.rows.write_rows(writes, index).add_done_callback(_retrieved)
            except StoreFailed as error:
                result.error = error
        return result

    def skip(self, index: int) -> None:
        pass

    def snapshot(self) -> bytes:
        return self.rows.state.snapshot()

    def restore(self, index: int, data: bytes) -> None:
        self.rows.state = MetadataState.from_snapshot(data, self.rows.state.limits)
        if index > self._rows_log_index:
            logger.warning("the metadata rows are behind snapshot %d; rewriting them", index)
            self.rows.rewrite_rows(self.rows.state, index)
            self._rows_log_index = index


class ReplicatedMetadata:
    """The broker's metadata store: see the module docstring."""

    def __init__(self, rows: MetadataStore, group: RaftGroup) -> None:
        self.rows = rows
        self.group = group
        self.path = rows.path
        self._syncing = asyncio.Lock()

    @property
    def state(self) -> MetadataState:
        return self.rows.state

    @classmethod
    async def open(
        cls, data_dir: str | os.PathLike[str], *, limits: Limits | None = None
    ) -> ReplicatedMetadata:
        """Open the data dir's metadata: recover the log, upgrade or seed it from the rows
        if it is new, take in offline CLI edits and drop what did not survive a restart."""
        data_dir = Path(data_dir)
        rows = await MetadataStore.open(
            data_dir / METADATA_FILE,
            limits=limits,
            load=False,
            synchronous="NORMAL",
            write_delay_s=ROWS_WRITE_DELAY_S,
        )
        group: RaftGroup | None = None
        try:
            raft_dir = data_dir / RAFT_DIRECTORY
            raft_dir.mkdir(mode=_DIRECTORY_MODE, parents=True, exist_ok=True)
            machine = MetadataMachine(rows, await rows.written_log_index())
            group = RaftGroup(
                GroupConfig(node_id=_NODE_ID, data_dir=raft_dir, snapshot_entries=SNAPSHOT_ENTRIES),
                machine,
            )
            new_log = group.storage.snapshot is None and group.storage.last_index == 0
            await group.start()
            await group.wait_leading()
            metadata = cls(rows, group)
            if new_log:
                await metadata._seed_from_rows()
            else:
                await metadata._take_offline_edits()
            if metadata.state.has_transient():
                await metadata.apply(c.ForgetTransient())
        except BaseException:
            if group is not None:
                await group.stop()
            await rows.close()
            raise
        return metadata

    async def _seed_from_rows(self) -> None:
        """A new log starts with what the rows hold: the upgrade of a data dir that predates
        the log, or a fresh one's defaults. One entry, so a crash leaves all or nothing."""
        scratch = MetadataState(self.state.limits)
        seed = []
        for command in await self.rows.stored_commands():
            try:
                scratch.apply(command)
            except RoutingError as error:
                # A row orphaned by a concurrent writer (a declare racing a CLI vhost delete);
                # its vhost is gone, as loading the rows always treated it.
                logger.warning("skipping stored metadata %r: %s", command, error)
                continue
            seed.append(command)
        if seed:
            await self.apply_all(seed)
            logger.info("metadata log started from %d stored rows", len(seed))

    async def _take_offline_edits(self) -> None:
        await self._propose_changes(await self.rows.external_changes(since_open=True))

    async def close(self) -> None:
        await self.rows.flushed()
        await self.group.stop()
        await self.rows.close()

    # --- commands --------------------------------------------------------------------------

    async def apply(self, command: c.Command) -> Outcome:
        """Apply `command` through the log; returns once it is applied here and its rows
        written. Raises the state's RoutingError (nothing changed), or StoreFailed."""
        return (await self._propose([command]))[0]

    async def apply_all(self, commands: list[c.Command]) -> list[Outcome]:
        """Apply commands in order, as one log entry. On a refused command, the ones before
        it stay applied (and are written) and its error is raised."""
        return await self._propose(list(commands))

    async def _propose(self, commands: list[c.Command]) -> list[Outcome]:
        if self.group.fatal_error is not None:
            raise StoreFailed("metadata log failed earlier") from self.group.fatal_error
        try:
            proposed = self.group.propose(encode_commands(commands))
            # Shielded: a caller cancelled while waiting does not take the entry back.
            applied = await asyncio.shield(proposed)
        except (GroupStopped, ProposalLost) as error:
            raise StoreFailed(f"metadata change not applied: {error}") from error
        except RaftError as error:
            raise StoreFailed(f"metadata change refused by the log: {error}") from error
        result: EntryResult = applied.result
        if result.error is not None:
            raise result.error
        return result.outcomes

    # --- authentication --------------------------------------------------------------------

    async def authenticate(self, username: str, password: str, source: str = "") -> User | None:
        return await self.rows.authenticate(username, password, source)

    # --- other writers ---------------------------------------------------------------------

    async def sync_external_changes(self) -> list[Outcome]:
        """Propose what another process committed to the rows (vhosts, users, permissions,
        policies, limits) since the last look; returns the outcomes."""
        async with self._syncing:
            return await self._propose_changes(await self.rows.external_changes())

    async def _propose_changes(self, commands: list[c.Command]) -> list[Outcome]:
        outcomes = []
        for command in commands:
            try:
                outcomes.append(await self.apply(command))
            except RoutingError as error:
                logger.warning("ignoring external metadata change %r: %s", command, error)
        return outcomes


def _retrieved(future: asyncio.Future[None]) -> None:
    if not future.cancelled():
        future.exception()

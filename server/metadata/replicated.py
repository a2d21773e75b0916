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
  every `SNAPSHOT_ENTRIES` applied entries (the broker's `metadata_snapshot_entries`); the
  log before them is dropped. A restart
  restores the snapshot and re-applies the log after it: the state is a function of the log.
* A restarted broker then proposes `ForgetTransient` if the state holds transient exchanges,
  transient or exclusive queues: they did not survive the restart, exactly as before, but
  now by a log entry rather than by not having been stored.

A cluster (`open(..., node_id, peers)`, even with this node its only peer: one that others
can join later) runs the same group with a transport: `propose` works on every member (a
follower forwards to the leader) and resolves once the entry is applied HERE, so
read-your-writes holds on the node a client uses. A proposal made while no leader is known
is retried for `LEADER_WAIT_S`. `open` returns once a leader is known and this node has
applied what it has learnt committed (a joining node: once it has an entry or a snapshot).
Then:
* a brand-new log is seeded by every bootstrap node with the same entry headed by
  `ExpectNew`: the first to apply wins, the others' are refused by every replica alike (a
  joining node never seeds: its log comes from the cluster);
* a restarted member forgets only the transient and exclusive queues IT led
  (`ForgetTransient(node)`): another node's exclusive queues still have their connections.
  Transient exchanges are forgotten once no node that held them runs (`NodeStarted`,
  proposed by the broker before it listens, with the boots of the members it found
  running): a whole-cluster restart drops them, a rolling one keeps them, as RabbitMQ's
  RAM tables do.
Every applied entry, whoever proposed it, is reported to `MetadataMachine.listener`
(commands with their outcomes): the broker reconciles its running side with it. A snapshot
installed into a running member (one that fell behind the leader's compacted log) applies
no entry: it is reported to `MetadataMachine.restored`, and the broker reconciles with the
whole state at once.

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warrenmq.cluster.group import GroupConfig, GroupStopped, ProposalLost, RaftGroup
from warrenmq.cluster.raft.core import NotLeader, ProposalRefused, RaftError
from warrenmq.exchanges.errors import RoutingError
from warrenmq.server.metadata import commands as c
from warrenmq.server.metadata.encoding import decode_commands, encode_commands
from warrenmq.server.metadata.records import SINGLE_NODE_ID, User
from warrenmq.server.metadata.state import Limits, MetadataState, Outcome
from warrenmq.server.metadata.store import METADATA_FILE, MetadataStore, StoreFailed

logger = logging.getLogger(__name__)

# The metadata group's Raft log, hard state and snapshot, beside the SQLite view.
RAFT_DIRECTORY = "metadata-raft"
SNAPSHOT_ENTRIES = 20_000
# The rows are a view nobody waits for: the commands of this long share one transaction.
ROWS_WRITE_DELAY_S = 0.1
# How long a proposal waits for a leader to be known (an election) before it fails.
LEADER_WAIT_S = 10.0
# How long a membership change is requested again while its outcome is unknown: a node added
# before it listens costs the group an election that waits for it to start.
MEMBERSHIP_WAIT_S = 30.0
# How often a starting member logs that it still waits for the cluster.
_WAIT_LOG_INTERVAL_S = 5.0
# The Raft files hold password hashes too.
_DIRECTORY_MODE = 0o700


class MetadataUnavailable(Exception):
    """No quorum of the metadata group confirmed a read in time (`read_barrier`): this node
    is cut off from the others, or they have no leader. Nothing is broken here; the read
    may be asked again."""


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
        self.listener: Callable[[list[c.Command], list[Outcome]], None] | None = None
        """Told of every applied entry's commands and their outcomes (the refused one and
        those after it left out), after the state changed: whoever proposed it."""
        self.restored: Callable[[], None] | None = None
        """Told when a snapshot replaced the state of a running node (it fell behind the
        leader's compacted log): the entries it covers are never applied one by one here."""
        # Entries up to here already have their rows in the view (a restart replays them).
        self._rows_log_index = rows_log_index
        self.frozen = False
        """The state is the rows view, not the log's (a removed node): entries are skipped."""

    @property
    def state(self) -> MetadataState:
        return self.rows.state

    def reachable_nodes(self) -> set[int]:
        """This node and the members it has a live metadata connection to: the nodes a new
        queue can be placed on and served by now."""
        transport = self.group.transport
        return {self.node_id} | {
            node for node in self.group.raft.voters if transport and transport.connected(node)
        }

    def apply(self, index: int, data: bytes) -> EntryResult:
        result = EntryResult()
        if self.frozen:
            return result
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
        listener = self.listener
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
        if listener is not None and result.outcomes:
            try:
                listener(commands, result.outcomes)
            except Exception:
                # The state is applied, the same on every replica; what the broker failed to
                # reconcile is its own to log.
                logger.exception("reacting to metadata entry %d failed", index)
        return result

    def skip(self, index: int) -> None:
        pass

    def snapshot(self) -> bytes:
        return self.rows.state.snapshot()

    def restore(self, index: int, data: bytes) -> None:
        if self.frozen:
            return
        self.rows.state = MetadataState.from_snapshot(data, self.rows.state.limits)
        if index > self._rows_log_index:
            logger.warning("the metadata rows are behind snapshot %d; rewriting them", index)
            self.rows.rewrite_rows(self.rows.state, index)
            self._rows_log_index = index
        restored = self.restored
        if restored is not None:
            try:
                restored()
            except Exception:
                # As for an entry (`apply`): the state is the snapshot's on every replica.
                logger.exception("reacting to metadata snapshot %d failed", index)


class ReplicatedMetadata:
    """The broker's metadata store: see the module docstring."""

    def __init__(self, rows: MetadataStore, group: RaftGroup, machine: MetadataMachine) -> None:
        self.rows = rows
        self.group = group
        self.machine = machine
        self.node_id = group.config.node_id
        self.clustered = group.transport is not None
        self.path = rows.path
        self._syncing = asyncio.Lock()

    @property
    def state(self) -> MetadataState:
        return self.rows.state

    def reachable_nodes(self) -> set[int]:
        """This node and the members it has a live metadata connection to: the nodes a new
        queue can be placed on and served by now."""
        transport = self.group.transport
        return {self.node_id} | {
            node for node in self.group.raft.voters if transport and transport.connected(node)
        }

    @classmethod
    async def open(
        cls,
        data_dir: str | os.PathLike[str],
        *,
        limits: Limits | None = None,
        node_id: int = SINGLE_NODE_ID,
        peers: Mapping[int, tuple[str, int]] | None = None,
        joining: bool = False,
        snapshot_entries: int | None = None,
        secret: str = "",
    ) -> ReplicatedMetadata:
        """Open the data dir's metadata: recover the log, upgrade or seed it from the rows
        if it is new, take in offline CLI edits and drop what did not survive a restart.

        `peers` (the Raft address of every bootstrap voter, this node included) makes this
        node a member of a cluster; `joining` starts it as a non-voter that waits to be added
        (module docstring); `secret` is the cluster secret its Raft connections prove."""
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
            # A `cluster` of this node alone is still one other nodes can join: it listens.
            clustered = bool(peers)
            voters = None
            if joining:
                voters = tuple(sorted(node for node in peers or {} if node != node_id))
            group = RaftGroup(
                GroupConfig(
                    node_id=node_id,
                    data_dir=raft_dir,
                    peers=dict(peers) if clustered and peers is not None else None,
                    voters=voters,
                    snapshot_entries=snapshot_entries or SNAPSHOT_ENTRIES,
                    secret=secret,
                ),
                machine,
            )
            new_log = group.storage.snapshot is None and group.storage.last_index == 0
            await group.start()
            metadata = cls(rows, group, machine)
            if group.removed:
                # It must not serve (the broker refuses clients) nor change anything.
                logger.warning("node %d was removed from the cluster", node_id)
                await metadata._freeze_to_rows_view()
                return metadata
            if clustered:
                await metadata._wait_caught_up(joining=joining and new_log)
            else:
                await group.wait_leading()
            if new_log and not joining:
                await metadata._seed_from_rows()
            elif not new_log:
                await metadata._take_offline_edits()
            forget_node = node_id if clustered else None
            if metadata.state.has_transient(forget_node):
                await metadata.apply_idempotent(c.ForgetTransient(forget_node))
        except BaseException:
            if group is not None:
                await group.stop()
            await rows.close()
            raise
        return metadata

    async def _wait_caught_up(self, joining: bool) -> None:
        """Until a leader is known and this member applied what it knows committed (every
        entry committed before it started, once it heard from that leader). A node `joining`
        with an empty log also waits for its first entry or snapshot: the leader tells a
        follower its commit index only up to what they share, so before that, "applied all
        it knows committed" is true of nothing at all, and the broker would start empty."""
        group = self.group
        loop = asyncio.get_running_loop()
        logged_s = loop.time()
        while True:
            raft = group.raft
            if (
                raft.leader_id is not None
                and group.applied_index >= raft.commit_index
                and not (joining and group.applied_index == 0)
            ):
                return
            if group.stopped:
                raise StoreFailed("the metadata group stopped") from group.fatal_error
            if loop.time() - logged_s > _WAIT_LOG_INTERVAL_S:
                logged_s = loop.time()
                logger.info(
                    "node %d waits for the metadata group: voters %s, no leader yet%s",
                    self.node_id,
                    list(raft.voters),
                    "" if self.node_id in raft.voters else " (not a voter: join it)",
                )
            await asyncio.sleep(group.config.tick_s)

    async def _freeze_to_rows_view(self) -> None:
        """A removed node serves nothing, but its users still log in, to hear why it refuses
        them rather than that their password is wrong. No leader tells it a commit index
        again, so its log replays only as far as its hard state says (often nothing): its
        state is the rows view instead (what it applied before its removal), and it applies
        nothing more."""
        self.machine.frozen = True
        await self.rows.reload()

    async def _seed_from_rows(self) -> None:
        """A new log starts with what the rows hold: the upgrade of a data dir that predates
        the log, or a fresh one's defaults. One entry, so a crash leaves all or nothing. In a
        cluster every bootstrap member proposes its seed, headed by `ExpectNew`: only the
        first applies."""
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
        if not seed:
            return
        if self.clustered:
            try:
                await self.apply_all_idempotent([c.ExpectNew(), *seed])
            except RoutingError:
                logger.info("metadata log seeded by another node")
                return
        else:
            await self.apply_all(seed)
        logger.info("metadata log started from %d stored rows", len(seed))

    async def _take_offline_edits(self) -> None:
        await self._propose_changes(await self.rows.external_changes(since_open=True))

    async def close(self) -> None:
        # The rows' database closes even when the group's last write fails (its directory
        # deleted, a full disk): its thread would otherwise keep the process from exiting.
        try:
            await self.rows.flushed()
            await self.group.stop()
        finally:
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

    async def apply_idempotent(self, command: c.Command) -> Outcome:
        """`apply` for a command that changes nothing when applied twice (ForgetTransient,
        RegisterNode): see `apply_all_idempotent`."""
        return (await self.apply_all_idempotent([command]))[0]

    async def apply_all_idempotent(self, commands: list[c.Command]) -> list[Outcome]:
        """`apply_all` for commands that change nothing when applied twice, proposed again
        while their outcome is unknown: a leader change can lose track of a proposal, and a
        node starting meanwhile must not give up on what it can safely repeat (one that
        reached no leader is proposed again for any command: `_applied`)."""
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + LEADER_WAIT_S
        while True:
            try:
                return await self.apply_all(commands)
            except StoreFailed as error:
                if not isinstance(error.__cause__, ProposalLost) or loop.time() > deadline_s:
                    raise
                logger.info("metadata change %r: %s; proposing it again", commands, error)

    # --- membership ------------------------------------------------------------------------

    async def add_member(self, node_id: int, host: str, port: int) -> None:
        """Make `node_id` (its Raft transport at host:port) a voter of the metadata group."""
        await self._change_membership(lambda: self.group.add_member(node_id, host, port))

    async def remove_member(self, node_id: int) -> None:
        """Remove `node_id` from the metadata group's voters; this node too (it leaves)."""
        await self._change_membership(
            lambda: self.group.remove_member(node_id), leaving=node_id == self.node_id
        )

    async def _change_membership(
        self, request: Callable[[], asyncio.Future[Any]], leaving: bool = False
    ) -> None:
        """A membership change, requested again while its outcome is unknown, no leader is
        known or the leader refuses it for now: both changes are no-ops once done, so
        repeating one is safe. The common case: a voter added to a one-node group before it
        listens makes the leader step down (it hears from no quorum), which loses the
        change's outcome although it committed; the group has no leader until the new voter
        answers.

        A node `leaving` never applies its own removal (the leader stops replicating to it
        at once): it learns it from a member that did (`group.removed`), and is done then."""
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + MEMBERSHIP_WAIT_S
        group = self.group
        while True:
            try:
                change = request()
                while leaving and not change.done():
                    if group.removed:
                        change.add_done_callback(_retrieved)
                        return
                    await asyncio.wait([change], timeout=group.config.tick_s * 5)
                await change
                return
            except (ProposalLost, ProposalRefused, NotLeader) as error:
                if leaving and group.removed:
                    return
                alone = group.transport is None  # no peers: refused for good
                if alone or group.removed or loop.time() > deadline_s:
                    raise
                logger.info("membership change: %s; requesting it again", error)
            await asyncio.sleep(self.group.config.tick_s * 5)

    async def _propose(self, commands: list[c.Command]) -> list[Outcome]:
        if self.group.fatal_error is not None:
            raise StoreFailed("metadata log failed earlier") from self.group.fatal_error
        try:
            applied = await self._applied(encode_commands(commands))
        except (GroupStopped, ProposalLost) as error:
            raise StoreFailed(f"metadata change not applied: {error}") from error
        except RaftError as error:
            raise StoreFailed(f"metadata change refused by the log: {error}") from error
        result: EntryResult = applied.result
        if result.error is not None:
            raise result.error
        return result.outcomes

    async def _applied(self, data: bytes) -> Any:
        """The group's proposal of `data`, once applied here; proposed again while no leader
        is known or reachable (an election, a node starting before its links are up): a
        proposal that fails NotLeader never reached a leader."""
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + LEADER_WAIT_S
        while True:
            try:
                # Shielded: a caller cancelled while waiting does not take the entry back.
                return await asyncio.shield(self.group.propose(data))
            except NotLeader:
                if loop.time() > deadline_s:
                    raise
            await asyncio.sleep(self.group.config.tick_s * 5)

    # --- reads -----------------------------------------------------------------------------

    async def read_barrier(self) -> None:
        """Until `state` holds every change acknowledged by any member before this call
        (a linearizable read; `RaftGroup.read_point`): a read through this node then never
        answers an older value than a write already answered through another. Only a
        cluster has to wait; callers skip it when not `clustered`. Retried while no leader
        is known, for LEADER_WAIT_S, then MetadataUnavailable (StoreFailed if the group
        stopped)."""
        group = self.group
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + LEADER_WAIT_S
        while True:
            try:
                index = await group.read_point()
                break
            except NotLeader as error:
                if loop.time() > deadline_s:
                    waited = f"no quorum of the cluster answered within {LEADER_WAIT_S:.0f} s"
                    raise MetadataUnavailable(f"metadata read not confirmed: {waited}") from error
            except GroupStopped as error:
                raise StoreFailed(f"metadata read not confirmed: {error}") from error
        if group.applied_index < index:
            await group.applied(index)

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

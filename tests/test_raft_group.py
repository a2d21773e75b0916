"""`cluster.group.RaftGroup` as a group of one: proposals resolve once applied, in log order;
the fsync runs off the event loop and the proposals made meanwhile share the next one;
restart recovers from snapshot + log; a full disk stalls proposals until space returns; any
other storage error halts the group and fails what waits."""

from __future__ import annotations

import asyncio
import errno

import pytest

from warrenmq.cluster.group import GroupConfig, GroupStopped, RaftGroup


class Journal:
    """A state machine that records what it applied."""

    def __init__(self) -> None:
        self.entries: list[tuple[int, bytes]] = []
        self.skipped: list[int] = []
        self.restored_at = 0

    def apply(self, index: int, data: bytes) -> int:
        self.entries.append((index, data))
        return len(self.entries)

    def skip(self, index: int) -> None:
        self.skipped.append(index)

    def snapshot(self) -> bytes:
        return b"\n".join(data for _, data in self.entries)

    def restore(self, index: int, data: bytes) -> None:
        self.restored_at = index
        self.entries = [(0, line) for line in data.split(b"\n")] if data else []

    def values(self) -> list[bytes]:
        return [data for _, data in self.entries]


async def started(tmp_path, **settings) -> tuple[RaftGroup, Journal]:
    journal = Journal()
    group = RaftGroup(GroupConfig(node_id=1, data_dir=tmp_path / "raft", **settings), journal)
    await group.start()
    await group.wait_leading()
    return group, journal


def test_a_proposal_resolves_once_applied_with_the_machine_result(tmp_path):
    async def scenario():
        group, journal = await started(tmp_path)
        assert group.transport is None, "a group of one needs no transport"
        futures = [group.propose(b"v%d" % i) for i in range(5)]
        applied = await asyncio.gather(*futures)
        assert [a.result for a in applied] == [1, 2, 3, 4, 5]
        assert [a.index for a in applied] == sorted(a.index for a in applied)
        # Read-your-writes: when the future resolves, the machine already holds the entry.
        assert journal.values() == [b"v%d" % i for i in range(5)]
        assert journal.skipped, "the leader's no-op entry is skipped, not applied"
        await group.stop()

    asyncio.run(scenario())


def test_restart_recovers_from_snapshot_and_log(tmp_path):
    async def scenario():
        group, _ = await started(tmp_path, snapshot_entries=10)
        for i in range(25):
            await group.propose(b"v%d" % i)
        assert group.storage.snapshot is not None, "the log was compacted"
        assert group.raft.first_index > 1
        await group.stop()
        group, journal = await started(tmp_path, snapshot_entries=10)
        assert journal.restored_at > 0
        assert journal.values() == [b"v%d" % i for i in range(25)]
        await group.propose(b"after")
        assert journal.values()[-1] == b"after"
        await group.stop()

    asyncio.run(scenario())


def test_a_full_disk_stalls_proposals_until_space_returns(tmp_path):
    async def scenario():
        group, journal = await started(tmp_path, disk_full_retry_s=0.01)
        real_write = group.storage.write
        refusals = 3

        def full_then_space(*args):
            nonlocal refusals
            if refusals:
                refusals -= 1
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_write(*args)

        group.storage.write = full_then_space
        proposal = group.propose(b"waits")
        assert not proposal.done()
        applied = await asyncio.wait_for(proposal, 10)
        assert journal.values() == [b"waits"] and applied.result == 1
        assert group.disk_full_retries == 3 and group.fatal_error is None
        await group.stop()
        group, journal = await started(tmp_path)
        assert journal.values() == [b"waits"]
        await group.stop()

    asyncio.run(scenario())


async def _broken_flush():
    raise OSError(errno.EIO, "Input/output error")


def _broken_write(*args):
    raise OSError(errno.EIO, "Input/output error")


@pytest.mark.parametrize(("step", "broken"), [("write", _broken_write), ("flush", _broken_flush)])
def test_another_storage_error_halts_the_group_and_fails_proposals(tmp_path, capsys, step, broken):
    """On the loop (`write`) or in the worker thread (`flush`, the fsync)."""

    async def scenario():
        group, _ = await started(tmp_path)
        setattr(group.storage, step, broken)
        with pytest.raises(GroupStopped):
            await group.propose(b"lost")
        assert isinstance(group.fatal_error, OSError)
        with pytest.raises(GroupStopped):
            group.propose(b"refused")

    asyncio.run(scenario())
    assert "Input/output error" in capsys.readouterr().err


def test_the_loop_runs_while_the_log_is_fsynced_and_proposals_made_meanwhile_share_one(tmp_path):
    async def scenario():
        group, journal = await started(tmp_path)
        real_flush = group.storage.flush
        disk_done = asyncio.Event()
        flushes = 0

        async def slow_flush():
            nonlocal flushes
            flushes += 1
            await disk_done.wait()
            await real_flush()

        group.storage.flush = slow_flush
        first = group.propose(b"first")
        while not flushes:
            await asyncio.sleep(0)
        # The first entry's fsync is under way; the loop still runs, and what is proposed
        # now waits for it, not applied before it is durable.
        later = [group.propose(b"later%d" % i) for i in range(20)]
        for _ in range(10):
            await asyncio.sleep(0)
        assert not first.done() and journal.values() == []
        disk_done.set()
        await asyncio.gather(first, *later)
        assert journal.values() == [b"first"] + [b"later%d" % i for i in range(20)]
        assert flushes == 2, "the twenty proposals made during the first fsync shared one"
        await group.stop()
        group, journal = await started(tmp_path)
        assert len(journal.values()) == 21
        await group.stop()

    asyncio.run(scenario())


def test_proposals_of_one_loop_iteration_share_one_fsync(tmp_path):
    async def scenario():
        group, _ = await started(tmp_path)
        readys_before = group.ready_count
        await asyncio.gather(*(group.propose(b"v%d" % i) for i in range(50)))
        assert group.ready_count - readys_before == 1
        await group.stop()

    asyncio.run(scenario())


def test_stop_waits_for_the_fsync_under_way(tmp_path):
    async def scenario():
        group, journal = await started(tmp_path)
        proposal = group.propose(b"durable")
        while group._persisting is None:
            await asyncio.sleep(0)
        await group.stop()
        assert (await proposal).result == 1
        group, journal = await started(tmp_path)
        assert journal.values() == [b"durable"]
        await group.stop()

    asyncio.run(scenario())


def test_a_snapshot_written_before_the_group_kept_state_of_its_own_restores(tmp_path):
    """Data dirs of older versions hold the machine's bytes alone as their snapshot."""

    async def scenario():
        group, journal = await started(tmp_path)
        for i in range(5):
            await group.propose(b"v%d" % i)
        snapshot = group.raft.compact(group.applied_index, journal.snapshot())
        group.storage.compact(snapshot)
        await group.stop()
        group, journal = await started(tmp_path)
        assert journal.restored_at == snapshot.index
        assert journal.values() == [b"v%d" % i for i in range(5)]
        await group.stop()

    asyncio.run(scenario())

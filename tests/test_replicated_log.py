"""The leader's side of a replicated queue log (`server/replication.py`): a commit returns
only once the quorum's high watermark covers what was appended before it, a log the host
never adopted commits as a plain log, and a leader that stops leading fails what waits."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from warrenmq.log import DescriptorPool, LogConfig
from warrenmq.server.metadata.commands import AlterIsr
from warrenmq.server.metadata.partitions import STALE_PARTITION_EPOCH
from warrenmq.server.metadata.records import QueueRecord
from warrenmq.server.metadata.state import Outcome
from warrenmq.server.metadata.store import StoreFailed
from warrenmq.server.replication import (
    NotEnoughReplicas,
    Replicas,
    ReplicatedLog,
    ReplicationStopped,
)

RECORDS = [(b"", b"rk", b"", b"body")]


class RecordingHost:
    """What `Replicas` hears from a log it leads."""

    def __init__(self):
        self.appended_keys: list[str] = []
        self.durable_keys: list[str] = []

    def appended(self, key):
        self.appended_keys.append(key)

    def durable(self, key):
        self.durable_keys.append(key)

    def closed(self, log):
        pass


def adopted(tmp_path, epoch=3):
    log = ReplicatedLog.open(tmp_path / "messages", LogConfig())
    log.host = RecordingHost()
    log.key = "k"
    log.leader_epoch = epoch
    log.replicated = True
    return log


def test_a_commit_waits_for_the_quorum_and_batches_carry_the_leader_epoch(tmp_path):
    async def scenario():
        log = adopted(tmp_path)
        log.append(RECORDS * 3)
        commit = asyncio.ensure_future(log.commit())
        await asyncio.sleep(0.05)
        # fsynced here, but no quorum yet: not committed, not delivered.
        assert log.durable_offset == 3 and not commit.done()
        assert log.committed_offset == 0
        assert log.host.appended_keys == ["k"] and log.host.durable_keys == ["k"]
        log.moved(2)
        await asyncio.sleep(0.01)
        assert not commit.done() and log.committed_offset == 2
        log.moved(3)
        assert await asyncio.wait_for(commit, 1) == 3
        assert log.last_term == 3
        log.close()

    asyncio.run(scenario())


def test_a_log_never_adopted_commits_on_its_own_fsync(tmp_path):
    async def scenario():
        log = ReplicatedLog.open(tmp_path / "messages", LogConfig())
        log.append(RECORDS)
        assert await asyncio.wait_for(log.commit(), 1) == 1
        assert log.committed_offset == 1
        log.close()

    asyncio.run(scenario())


def test_a_leader_that_stops_leading_fails_the_commits_waiting_for_the_quorum(tmp_path):
    async def scenario():
        log = adopted(tmp_path)
        log.append(RECORDS)
        commit = asyncio.ensure_future(log.commit())
        await asyncio.sleep(0.05)
        log.stop()
        with pytest.raises(ReplicationStopped):
            await asyncio.wait_for(commit, 1)
        log.close()

    asyncio.run(scenario())


def test_a_commit_fails_at_once_while_fewer_than_a_majority_are_in_sync(tmp_path):
    async def scenario():
        log = adopted(tmp_path)
        log.enough_replicas = False
        log.append(RECORDS)
        with pytest.raises(NotEnoughReplicas):
            await asyncio.wait_for(log.commit(), 1)
        # The ISR shrank while a commit waited: it fails then.
        log.enough_replicas = True
        log.append(RECORDS)
        commit = asyncio.ensure_future(log.commit())
        await asyncio.sleep(0.05)
        log.enough_replicas = False
        log.moved(0)
        with pytest.raises(NotEnoughReplicas):
            await asyncio.wait_for(commit, 1)
        log.close()

    asyncio.run(scenario())


def test_a_queue_opened_where_it_is_led_writes_in_the_epoch_it_leads(tmp_path):
    """A promoted follower (or a restarted leader in its new epoch) opens the queue, which
    may write at once (a CLIP of what a crash took back): that batch carries the epoch the
    record gives, not 0, or followers holding a later epoch's batches refuse it for good."""

    async def scenario():
        record = QueueRecord(
            "/",
            "q",
            durable=True,
            auto_delete=False,
            arguments={},
            node=2,
            replicas=(1, 2, 3),
            isr=(2, 3),
            leader_epoch=5,
        )
        state = SimpleNamespace(queue=lambda vhost, name: record)
        broker = SimpleNamespace(
            config=SimpleNamespace(node_id=2),
            store=SimpleNamespace(state=state),
            descriptors=DescriptorPool(64),
        )
        replicas = Replicas(broker)
        directory = tmp_path / "q" / "messages"
        replicas._directories[directory] = ("/", "q")
        log = replicas.open_log(directory, LogConfig())
        assert log.leader_epoch == 5
        log.append(RECORDS)
        assert log.last_term == 5
        log.close()

    asyncio.run(scenario())


class Proposing:
    """A partition leader's side of an ISR proposal."""

    def __init__(self, isr):
        self.proposed_isr = isr

    def alter_isr_rejected(self):
        self.proposed_isr = None


def test_an_alter_isr_whose_outcome_is_unknown_stands_and_a_refused_one_is_dropped(tmp_path):
    """A proposal that adds a replica keeps the HW waiting for it (the maximal ISR) until the
    metadata answers. An error is no answer (the entry may commit later): dropping the
    proposal then let the HW pass a replica the ISR went on to hold, and elect."""

    async def scenario():
        command = AlterIsr("/", "q", 1, 0, 3, (1, 2, 3))
        outcomes: list = []

        async def apply_idempotent(_):
            outcome = outcomes.pop(0)
            if isinstance(outcome, Exception):
                raise outcome
            return outcome

        broker = SimpleNamespace(
            config=SimpleNamespace(node_id=1),
            store=SimpleNamespace(apply_idempotent=apply_idempotent),
        )
        replicas = Replicas(broker)
        leaders = [Proposing((1, 2, 3)), Proposing((1, 2, 3))]
        outcomes.append(StoreFailed("no metadata leader for 10 s"))
        await replicas._alter_isr(command, leaders)
        assert [leader.proposed_isr for leader in leaders] == [(1, 2, 3), (1, 2, 3)]
        outcomes.append(Outcome(False, refused=STALE_PARTITION_EPOCH))
        await replicas._alter_isr(command, leaders)
        assert [leader.proposed_isr for leader in leaders] == [None, None]

    asyncio.run(scenario())

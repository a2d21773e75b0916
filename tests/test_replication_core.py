"""Partition replication between real partition logs, driven as the broker will drive it:
the leader reads stored batches with `read_batches`, followers fsync with `commit`."""

import asyncio
from dataclasses import replace

from warrenmq.cluster.replication.config import ReplicationConfig
from warrenmq.cluster.replication.messages import (
    FetchedPartition,
    FetchError,
    FetchPartition,
    FetchRequest,
    FetchResponse,
    PartitionState,
)
from warrenmq.cluster.replication.node import ReplicationNode
from warrenmq.log import LogConfig, PartitionLog

KEYS = (b"q.messages", "q.acks")
CONFIG = ReplicationConfig(fetch_max_wait_s=0.0, fetch_max_bytes=4096)
LOG = LogConfig(segment_bytes_max=4096)


def records(n, tag):
    return [(b"", b"rk", b"", b"%s-%d" % (tag, i)) for i in range(n)]


class Cluster:
    """Three nodes, every key led by node 0 in epoch 1, and a loop that carries requests."""

    def __init__(self, tmp_path, isr=(0, 1, 2)):
        self.nodes = {i: ReplicationNode(i, CONFIG) for i in range(3)}
        self.logs = {
            (i, key): PartitionLog.open(tmp_path / f"n{i}" / str(hash(key) & 0xFFFF), LOG)
            for i in range(3)
            for key in KEYS
        }
        self.requests: list[tuple[int, int, FetchRequest]] = []
        self.now = 0.0
        self.set_state(PartitionState((0, 1, 2), 0, 1, isr, 1))

    def set_state(self, state):
        for i, node in self.nodes.items():
            for key in KEYS:
                node.apply(key, state, self.logs[(i, key)], self.now)

    async def answer(self, leader, pending):
        for read in pending.reads:
            if pending.budget_bytes > 0:
                log = self.logs[(leader, read.key)]
                data = await log.read_batches(read.offset, read.end_offset, pending.budget_bytes)
                pending.fill(read.key, data)
        return pending.response()

    async def round(self):
        """Every node sends its fetches, the leaders answer, followers append and fsync."""
        self.now += 0.01
        sent = [
            (follower, leader, request)
            for follower, node in self.nodes.items()
            for leader, request in node.poll_fetches(self.now)
        ]
        self.requests += sent
        for follower, leader, request in sent:
            pending = self.nodes[leader].handle_fetch(request, self.now)
            response = await self.answer(leader, pending)
            for key in self.nodes[follower].handle_response(leader, response, self.now):
                await self.logs[(follower, key)].commit()
                self.nodes[follower].durable(key, self.now)
        return sent

    async def settle(self, rounds=20):
        for _ in range(rounds):
            await self.round()

    async def publish(self, key, count, tag):
        log = self.logs[(0, key)]
        log.append(records(count, tag), term=self.nodes[0].leaders[key].leader_epoch)
        self.nodes[0].appended(key, self.now)
        await log.commit()
        self.nodes[0].durable(key, self.now)

    def close(self):
        for log in self.logs.values():
            log.close()


def test_followers_store_the_leaders_batches_and_the_hw_waits_for_their_fsync(tmp_path):
    async def scenario():
        cluster = Cluster(tmp_path)
        for i in range(30):
            await cluster.publish(KEYS[i % 2], 3, b"m%d" % i)
        leader = cluster.nodes[0]
        assert leader.take_high_watermarks() == {}, "nothing is confirmed before the ISR fsyncs"
        await cluster.settle()
        assert leader.take_high_watermarks() == {KEYS[0]: 45, KEYS[1]: 45}
        for key in KEYS:
            expected = await cluster.logs[(0, key)].read_batches(0, 45, 1 << 20)
            for follower in (1, 2):
                log = cluster.logs[(follower, key)]
                assert await log.read_batches(0, 45, 1 << 20) == expected
                assert cluster.nodes[follower].high_watermark(key) == 45
        # One request per leader node per round, covering both partitions.
        first = [r for f, _, r in cluster.requests if f == 1][0]
        assert {p.key for p in first.partitions} == set(KEYS)
        cluster.close()

    asyncio.run(scenario())


def test_no_hw_below_min_isr_and_a_stale_epoch_is_fenced(tmp_path):
    async def scenario():
        cluster = Cluster(tmp_path, isr=(0,))
        await cluster.publish(KEYS[0], 2, b"a")
        await cluster.settle(3)
        assert cluster.nodes[0].high_watermark(KEYS[0]) == 0, "one of three is below min_isr"
        cluster.nodes[0].tick(cluster.now)
        proposals = cluster.nodes[0].take_alter_isr()
        assert [(p.partition_epoch, p.isr) for p in proposals] == [(1, (0, 1, 2))] * 2
        stale = FetchRequest(99, 1, 1000, 0, (), (FetchPartition(KEYS[0], 0, 0, 0),))
        pending = cluster.nodes[0].handle_fetch(stale, cluster.now)
        response = await cluster.answer(0, pending)
        assert response.partitions == (FetchedPartition(KEYS[0], FetchError.FENCED, 0, 0, b""),)
        cluster.close()

    asyncio.run(scenario())


def test_a_divergent_follower_truncates_to_the_new_leaders_epoch_end(tmp_path):
    async def scenario():
        cluster = Cluster(tmp_path)
        await cluster.publish(KEYS[0], 4, b"committed")
        await cluster.settle()
        # Node 0 writes more in epoch 1 that only it has, then node 1 leads epoch 2.
        cluster.logs[(0, KEYS[0])].append(records(5, b"lost"), term=1)
        await cluster.logs[(0, KEYS[0])].commit()
        cluster.set_state(PartitionState((0, 1, 2), 1, 2, (1, 2), 2))
        new_log = cluster.logs[(1, KEYS[0])]
        new_log.append(records(2, b"epoch2"), term=2)
        cluster.nodes[1].appended(KEYS[0], cluster.now)
        await new_log.commit()
        cluster.nodes[1].durable(KEYS[0], cluster.now)
        await cluster.settle()
        expected = await new_log.read_batches(0, new_log.end_offset, 1 << 20)
        old_log = cluster.logs[(0, KEYS[0])]
        assert old_log.end_offset == 6
        assert await old_log.read_batches(0, 6, 1 << 20) == expected
        assert old_log.epoch_end_offset(1) == (1, 4)
        cluster.close()

    asyncio.run(scenario())


def test_a_follower_below_the_leaders_log_start_resets_there(tmp_path):
    async def scenario():
        cluster = Cluster(tmp_path, isr=(0, 1))
        leader_log = cluster.logs[(0, KEYS[0])]
        for i in range(200):
            leader_log.append(records(2, b"x%d" % i), term=1)
        await leader_log.commit()
        start = leader_log.delete_before(300)
        assert start > 0
        cluster.logs[(2, KEYS[0])].append(records(1, b"old"), term=0)
        await cluster.logs[(2, KEYS[0])].commit()
        await cluster.settle(60)
        follower_log = cluster.logs[(2, KEYS[0])]
        assert (follower_log.start_offset, follower_log.end_offset) == (start, 400)
        assert await follower_log.read_batches(
            start, 400, 1 << 20
        ) == await leader_log.read_batches(start, 400, 1 << 20)
        cluster.close()

    asyncio.run(scenario())


def test_a_lost_link_sends_its_partitions_fetches_again_at_once(tmp_path):
    async def scenario():
        cluster = Cluster(tmp_path)
        follower = cluster.nodes[1]
        cluster.now += 0.01
        (sent,) = follower.poll_fetches(cluster.now)
        assert sent[0] == 0
        # The request is in flight: nothing more goes out until its answer (or its timeout).
        assert follower.poll_fetches(cluster.now) == []
        follower.link_lost(0)
        (again,) = follower.poll_fetches(cluster.now)
        assert again[0] == 0
        assert {p.key for p in again[1].partitions} == set(KEYS)
        # The lost request's answer, should it come after all, is ignored.
        assert follower.handle_response(0, FetchResponse(sent[1].request_id, (), ()), 0) == []
        cluster.close()

    asyncio.run(scenario())


def test_a_fetch_held_while_its_replica_left_the_replica_set_is_answered(tmp_path):
    async def scenario():
        cluster = Cluster(tmp_path)
        await cluster.settle()
        leader = cluster.nodes[0]
        cluster.now += 0.01
        (sent,) = cluster.nodes[2].poll_fetches(cluster.now)
        # Nothing new: the leader holds the fetch (a long poll).
        assert leader.handle_fetch(replace(sent[1], max_wait_ms=500), cluster.now) is None
        shrunk = PartitionState((0, 1), 0, 1, (0, 1), 2)
        for key in KEYS:
            leader.apply(key, shrunk, cluster.logs[(0, key)], cluster.now)
        (pending,) = leader.ready_fetches(cluster.now + 1)
        response = pending.response()
        assert [p.error for p in response.partitions] == [FetchError.NONE] * len(KEYS)
        cluster.close()

    asyncio.run(scenario())


def test_ready_partitions_wait_for_one_fsyncing_what_it_fetched_and_share_its_request(tmp_path):
    """Sent at once, the ready partitions would be held by the leader as a long poll, and
    with another request in flight fill the follower's room: the fsynced one could not
    report its durable offset (the leader's acknowledgement, which every confirm of its
    queue waits for) until one of them came back. A priority queue's confirms took 250 ms
    so in a cluster."""

    async def scenario():
        cluster = Cluster(tmp_path)
        leader, follower = cluster.nodes[0], cluster.nodes[1]
        await cluster.publish(KEYS[0], 2, b"a")
        ((_, request),) = follower.poll_fetches(cluster.now)
        assert {p.key for p in request.partitions} == set(KEYS)
        response = await cluster.answer(0, leader.handle_fetch(request, cluster.now))
        assert follower.handle_response(0, response, cluster.now) == [KEYS[0]]
        # KEYS[1] had nothing new and is ready again; KEYS[0] is fsyncing what it got.
        assert follower.poll_fetches(cluster.now) == []
        await cluster.logs[(1, KEYS[0])].commit()
        follower.durable(KEYS[0], cluster.now)
        ((_, together),) = follower.poll_fetches(cluster.now)
        assert {p.key: p.durable_offset for p in together.partitions} == {KEYS[0]: 2, KEYS[1]: 0}
        cluster.close()

    asyncio.run(scenario())


def test_ready_partitions_wait_for_an_fsync_only_so_long(tmp_path):
    async def scenario():
        cluster = Cluster(tmp_path)
        leader, follower = cluster.nodes[0], cluster.nodes[1]
        await cluster.publish(KEYS[0], 2, b"a")
        ((_, request),) = follower.poll_fetches(cluster.now)
        response = await cluster.answer(0, leader.handle_fetch(request, cluster.now))
        follower.handle_response(0, response, cluster.now)
        assert follower.poll_fetches(cluster.now) == []
        later = cluster.now + CONFIG.fetch_store_wait_s
        ((_, alone),) = follower.poll_fetches(later)
        assert [p.key for p in alone.partitions] == [KEYS[1]]
        cluster.close()

    asyncio.run(scenario())

"""Unit tests of the sans-I/O Raft core, driven with hand-built messages and a tiny in-test
network (synchronous storage, explicit delivery, explicit cuts)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warrenmq.cluster.raft.core import (
    CANDIDATE,
    FOLLOWER,
    LEADER,
    PRE_CANDIDATE,
    Entry,
    EntryKind,
    HardState,
    Message,
    MessageKind,
    NotLeader,
    ProposalRefused,
    RaftConfig,
    RaftNode,
    Snapshot,
)
from warrenmq.cluster.raft.messages import (
    DecodeError,
    decode_message,
    decode_voters,
    encode_message,
    encode_voters,
)

M = MessageKind


class Net:
    """Nodes with synchronous in-memory storage and a FIFO network with cuttable links."""

    def __init__(self, ids=(1, 2, 3), **config) -> None:
        self.config = config
        self.voters = tuple(ids)
        self.nodes: dict[int, RaftNode] = {}
        self.stored: dict[int, dict] = {}
        self.applied: dict[int, list[Entry]] = {}
        self.snapshots_installed: dict[int, list[Snapshot]] = {}
        self.read_states: dict[int, list] = {}
        self.queue: list[Message] = []
        self.cut: set[int] = set()
        self.sent: list[Message] = []
        for i in ids:
            self.add(i, self.voters)

    def add(self, i: int, voters) -> RaftNode:
        node = RaftNode(RaftConfig(node_id=i, **self.config), tuple(voters), random.Random(i))
        self.nodes[i] = node
        self.stored[i] = {"hs": None, "snap": None, "entries": []}
        self.applied[i] = []
        self.snapshots_installed[i] = []
        self.read_states[i] = []
        return node

    def process(self, i: int) -> None:
        node = self.nodes[i]
        while node.has_ready():
            rd = node.ready()
            st_ = self.stored[i]
            if rd.snapshot is not None:
                st_["snap"] = rd.snapshot
                st_["entries"] = []
                self.snapshots_installed[i].append(rd.snapshot)
            if rd.entries:
                first = rd.entries[0].index
                st_["entries"] = [e for e in st_["entries"] if e.index < first] + rd.entries
            if rd.hard_state is not None:
                st_["hs"] = rd.hard_state
            for m in rd.messages:
                self.sent.append(m)
                if m.src not in self.cut and m.dst not in self.cut:
                    self.queue.append(m)
            self.applied[i].extend(rd.committed)
            self.read_states[i].extend(rd.read_states)
            node.advance(rd)

    def deliver(self, rounds: int = 200, drop=lambda m: False) -> None:
        for i in self.nodes:
            self.process(i)
        for _ in range(rounds):
            if not self.queue:
                return
            batch, self.queue = self.queue, []
            for m in batch:
                if m.dst in self.nodes and not drop(m):
                    self.nodes[m.dst].step(m)
                    self.process(m.dst)

    def tick(self, i: int, n: int = 1) -> None:
        for _ in range(n):
            self.nodes[i].tick()
            self.process(i)

    def tick_all(self, n: int = 1) -> None:
        for _ in range(n):
            for i in self.nodes:
                self.tick(i)
            self.deliver()

    def elect(self, i: int) -> RaftNode:
        node = self.nodes[i]
        for _ in range(100):
            if node.role == LEADER:
                break
            self.tick(i)
            self.deliver()
        assert node.role == LEADER
        return node

    def leaders(self):
        return [n for n in self.nodes.values() if n.role == LEADER]


def test_single_node_elects_itself_and_commits():
    net = Net(ids=(1,))
    node = net.elect(1)
    assert node.term == 1 and node.leader_id == 1
    index = node.propose(b"x")
    net.process(1)
    assert node.commit_index == index == 2
    assert [e.data for e in net.applied[1]] == [b"", b"x"]
    assert net.stored[1]["hs"] == HardState(1, 1, 2)


def test_three_nodes_elect_one_leader_and_replicate():
    net = Net()
    leader = net.elect(1)
    assert [n.role for n in net.nodes.values()] == [LEADER, FOLLOWER, FOLLOWER]
    assert all(n.leader_id == 1 and n.term == leader.term for n in net.nodes.values())
    for k in range(10):
        leader.propose(b"cmd%d" % k)
    net.deliver()
    net.tick_all(2)
    for i in (1, 2, 3):
        datas = [e.data for e in net.applied[i] if e.kind == EntryKind.NORMAL]
        assert datas == [b"cmd%d" % k for k in range(10)]
    with pytest.raises(NotLeader) as info:
        net.nodes[2].propose(b"nope")
    assert info.value.leader_id == 1


def test_pipelining_sends_many_appends_before_any_ack():
    net = Net(max_entries_per_append=2, max_inflight_appends=3)
    leader = net.elect(1)
    net.sent.clear()
    for k in range(20):
        leader.propose(b"%d" % k)
    net.process(1)
    appends_to_2 = [m for m in net.sent if m.kind == M.APPEND and m.dst == 2 and m.entries]
    # Bounded by the pipeline: three messages of at most two entries each, no ack yet.
    assert len(appends_to_2) == 3
    assert all(len(m.entries) <= 2 for m in appends_to_2)
    net.deliver()
    assert all(n.commit_index == leader.last_index for n in net.nodes.values())


def test_election_timeout_is_randomized_within_bounds():
    timeouts = set()
    for seed in range(20):
        node = RaftNode(RaftConfig(node_id=1, pre_vote=False), (1, 2, 3), random.Random(seed))
        ticks = 0
        while node.role == FOLLOWER:
            node.tick()
            ticks += 1
        assert node.role == CANDIDATE
        timeouts.add(ticks)
    assert min(timeouts) >= 10 and max(timeouts) < 20 and len(timeouts) > 3


def test_pre_vote_does_not_raise_term_and_rejoiner_cannot_disrupt():
    net = Net()
    leader = net.elect(1)
    term = leader.term
    net.cut.add(3)
    net.tick_all(60)
    isolated = net.nodes[3]
    # Pre-vote never wins without a quorum, so the isolated node keeps its term.
    assert isolated.term == term
    assert isolated.role in (PRE_CANDIDATE, FOLLOWER)
    net.cut.clear()
    net.tick_all(30)
    assert leader.role == LEADER and leader.term == term
    assert net.nodes[3].leader_id == 1


def test_without_pre_vote_an_isolated_node_inflates_its_term():
    net = Net(pre_vote=False, check_quorum=False)
    leader = net.elect(1)
    net.cut.add(3)
    net.tick_all(60)
    assert net.nodes[3].term > leader.term


def test_vote_in_lease_is_ignored():
    net = Net()
    net.elect(1)
    follower = net.nodes[2]
    term = follower.term
    follower.step(Message(M.PRE_VOTE, 3, 2, term + 5, log_term=99, index=99))
    follower.step(Message(M.VOTE, 3, 2, term + 5, log_term=99, index=99))
    assert follower.term == term and not follower.has_ready()


def test_vote_requires_up_to_date_log():
    node = RaftNode(
        RaftConfig(node_id=2),
        (1, 2, 3),
        random.Random(0),
        hard_state=HardState(2, None, 0),
        entries=[Entry(1, 1, EntryKind.NOOP, b""), Entry(2, 2, EntryKind.NORMAL, b"a")],
    )
    node.step(Message(M.VOTE, 3, 2, 3, log_term=1, index=5))  # older last term: refuse
    rd = node.ready()
    assert rd.messages == [Message(M.VOTE_RESP, 2, 3, 3, reject=True)]
    assert rd.hard_state == HardState(3, None, 0)
    node.advance(rd)
    node.step(Message(M.VOTE, 1, 2, 3, log_term=2, index=2))
    rd = node.ready()
    assert rd.messages == [Message(M.VOTE_RESP, 2, 1, 3)]
    assert rd.hard_state == HardState(3, 1, 0)
    node.advance(rd)
    node.step(Message(M.VOTE, 3, 2, 3, log_term=2, index=2))  # already voted this term
    assert node.ready().messages[0].reject


def test_check_quorum_leader_steps_down_when_cut_off():
    net = Net()
    leader = net.elect(1)
    net.cut.add(1)
    for _ in range(25):
        net.tick(1)
    assert leader.role == FOLLOWER and leader.leader_id is None
    net.cut.clear()
    net.tick_all(60)
    assert len(net.leaders()) == 1


def test_stale_leader_learns_higher_term_and_steps_down():
    net = Net(check_quorum=False)
    net.elect(1)
    net.cut.add(1)
    net.tick_all(60)
    new = [n for n in net.leaders() if n.node_id != 1]
    assert len(new) == 1
    net.cut.clear()
    net.tick_all(3)
    assert net.nodes[1].role == FOLLOWER and net.nodes[1].term == new[0].term


def log_of(terms):
    return [Entry(t, i + 1, EntryKind.NORMAL, b"%d" % (i + 1)) for i, t in enumerate(terms)]


def test_follower_rejection_carries_fast_backtracking_hint():
    follower = RaftNode(
        RaftConfig(node_id=2),
        (1, 2, 3),
        random.Random(0),
        hard_state=HardState(2, None, 1),
        entries=log_of([1, 1, 2, 2, 2, 2, 2]),
    )
    follower.step(Message(M.APPEND, 1, 2, 4, log_term=3, index=5))
    (resp,) = follower.ready().messages
    assert resp.kind == M.APPEND_RESP and resp.reject
    assert (resp.index, resp.reject_hint, resp.log_term) == (5, 5, 2)


def test_conflicting_suffix_is_replaced_in_few_round_trips():
    # The leader-to-be holds terms [1,1,3,3,3]; node 2 diverged with a long term-2 tail.
    stored = {
        1: log_of([1, 1, 3, 3, 3]),
        2: log_of([1, 1] + [2] * 30),
        3: log_of([1, 1, 3, 3, 3]),
    }
    net = Net()
    for i, entries in stored.items():
        net.nodes[i] = RaftNode(
            RaftConfig(node_id=i),
            (1, 2, 3),
            random.Random(i),
            hard_state=HardState(3, None, 2),
            entries=entries,
        )
    leader = net.elect(1)
    net.tick_all(3)
    rejects = [m for m in net.sent if m.kind == M.APPEND_RESP and m.reject and m.src == 2]
    assert 1 <= len(rejects) <= 2  # one per divergent term, not one per entry
    follower = net.nodes[2]
    assert follower.last_index == leader.last_index == 6
    assert [follower.term_at(i) for i in range(1, 7)] == [1, 1, 3, 3, 3, leader.term]
    assert follower.commit_index == 6


def leader_of_term4_with_uncommitted_term2_entry():
    """Figure 8: node 1 holds (1,t1),(2,t2); nodes 2 and 3 only (1,t1); node 1 wins term 4."""

    def make(i, entries):
        return RaftNode(
            RaftConfig(node_id=i),
            (1, 2, 3),
            random.Random(i),
            hard_state=HardState(3, None, 1),
            entries=entries,
        )

    node = make(1, [Entry(1, 1, EntryKind.NORMAL, b"a"), Entry(2, 2, EntryKind.NORMAL, b"b")])
    while node.role != PRE_CANDIDATE:
        node.tick()
    node.step(Message(M.PRE_VOTE_RESP, 2, 1, 4))
    assert node.role == CANDIDATE and node.term == 4
    node.step(Message(M.VOTE_RESP, 2, 1, 4))
    assert node.role == LEADER
    assert node.term_at(3) == 4  # the NOOP
    return node


def test_leader_commits_only_entries_of_its_term_figure_8():
    node = leader_of_term4_with_uncommitted_term2_entry()
    # A quorum (1 and 2) holds index 2, but it is from term 2: it must not be committed by
    # counting replicas, or a term-3 leader could still overwrite it.
    node.step(Message(M.APPEND_RESP, 2, 1, 4, index=2))
    assert node.commit_index == 1
    node.step(Message(M.APPEND_RESP, 2, 1, 4, index=3))
    assert node.commit_index == 3  # committing the NOOP commits index 2 indirectly


def test_snapshot_is_sent_to_a_lagging_follower_and_installed():
    net = Net()
    leader = net.elect(1)
    net.cut.add(3)
    for k in range(20):
        leader.propose(b"v%d" % k)
    net.deliver()
    assert leader.applied_index == leader.commit_index == 21
    snap = leader.compact(15, b"state@15")
    assert snap == Snapshot(15, leader.term, (1, 2, 3), b"state@15")
    assert leader.first_index == 16 and leader.term_at(14) is None
    net.cut.clear()
    net.tick_all(5)
    follower = net.nodes[3]
    assert net.snapshots_installed[3] == [snap]
    assert net.stored[3]["snap"] == snap
    assert follower.commit_index == 21 and follower.last_index == 21
    # Applied entries after the snapshot, never the compacted ones.
    assert [e.index for e in net.applied[3]] == [1, *range(16, 22)]


def test_follower_that_holds_the_snapshot_entry_keeps_its_log():
    follower = RaftNode(
        RaftConfig(node_id=2),
        (1, 2),
        random.Random(0),
        hard_state=HardState(1, None, 0),
        entries=log_of([1, 1, 1, 1]),
    )
    follower.step(Message(M.SNAPSHOT, 1, 2, 1, snapshot=Snapshot(2, 1, (1, 2), b"s")))
    rd = follower.ready()
    assert rd.snapshot is None and follower.last_index == 4 and follower.commit_index == 2
    assert rd.messages == [Message(M.APPEND_RESP, 2, 1, 1, index=2)]


def test_restart_from_storage_restores_state():
    net = Net()
    leader = net.elect(1)
    for k in range(5):
        leader.propose(b"%d" % k)
    net.deliver()
    net.tick_all(2)
    s = net.stored[2]
    restarted = RaftNode(
        RaftConfig(node_id=2),
        (1, 2, 3),
        random.Random(9),
        hard_state=s["hs"],
        snapshot=s["snap"],
        entries=s["entries"],
    )
    assert restarted.term == leader.term and restarted.last_index == leader.last_index
    assert restarted.commit_index == leader.commit_index and restarted.applied_index == 0
    rd = restarted.ready()
    assert [e.index for e in rd.committed] == list(range(1, leader.commit_index + 1))


def test_add_voter_then_remove_leader():
    net = Net()
    leader = net.elect(1)
    net.add(4, (1, 2, 3))
    index = leader.propose_membership(add=4)
    assert leader.voters == (1, 2, 3, 4)  # effective on append, before commit
    with pytest.raises(ProposalRefused):
        leader.propose_membership(add=5)
    net.deliver()
    net.tick_all(3)
    assert leader.commit_index >= index
    for n in net.nodes.values():
        assert n.voters == (1, 2, 3, 4)
    assert net.nodes[4].commit_index == leader.commit_index
    leader.propose_membership(remove=1)
    assert leader.role == LEADER
    net.deliver()
    net.tick_all(2)
    assert leader.role == FOLLOWER  # stepped down once its removal committed
    net.tick_all(60)
    (new,) = net.leaders()
    assert new.node_id in (2, 3, 4) and new.voters == (2, 3, 4)
    new.propose(b"after")
    net.tick_all(3)
    assert net.nodes[4].commit_index == new.last_index
    assert leader.role == FOLLOWER  # a removed node never campaigns


def test_truncated_config_entry_is_undone():
    follower = RaftNode(
        RaftConfig(node_id=2),
        (1, 2, 3),
        random.Random(0),
        hard_state=HardState(1, None, 1),
        entries=[Entry(1, 1, EntryKind.NOOP, b"")],
    )
    cfg = Entry(1, 2, EntryKind.CONFIG, encode_voters((1, 2, 3, 4)))
    follower.step(Message(M.APPEND, 1, 2, 1, log_term=1, index=1, commit=1, entries=(cfg,)))
    assert follower.voters == (1, 2, 3, 4)
    follower.step(
        Message(
            M.APPEND,
            3,
            2,
            2,
            log_term=1,
            index=1,
            commit=1,
            entries=(Entry(2, 2, EntryKind.NOOP, b""),),
        )
    )
    assert follower.voters == (1, 2, 3) and follower.term_at(2) == 2


def test_leadership_transfer():
    net = Net()
    leader = net.elect(1)
    term = leader.term
    leader.transfer_leadership(2)
    with pytest.raises(ProposalRefused):
        leader.propose(b"during transfer")
    net.deliver()
    assert net.nodes[2].role == LEADER and net.nodes[2].term == term + 1
    assert leader.role == FOLLOWER and leader.leader_id == 2


def test_leadership_transfer_to_lagging_follower_catches_it_up_first():
    net = Net()
    leader = net.elect(1)
    net.cut.add(3)
    leader.propose(b"x")
    net.deliver()
    net.cut.clear()
    leader.transfer_leadership(3)
    net.deliver()
    assert net.nodes[3].role == LEADER
    assert net.nodes[3].term_at(2) == leader.term_at(2)


def test_read_index_waits_for_a_quorum_heartbeat_round():
    net = Net()
    leader = net.elect(1)
    net.tick_all(1)
    leader.read_index(b"r1")
    rd = leader.ready()
    assert rd.read_states == []
    heartbeats = [m for m in rd.messages if m.kind == M.HEARTBEAT]
    assert len(heartbeats) == 2 and all(m.context for m in heartbeats)
    leader.advance(rd)
    hb = heartbeats[0]
    leader.step(Message(M.HEARTBEAT_RESP, hb.dst, 1, leader.term, context=hb.context))
    rd = leader.ready()
    assert [(r.index, r.context) for r in rd.read_states] == [(leader.commit_index, b"r1")]
    leader.advance(rd)


def test_read_index_from_follower_is_forwarded():
    net = Net()
    leader = net.elect(1)
    leader.propose(b"x")
    net.deliver()
    net.nodes[3].read_index(b"r2")
    net.deliver()
    resps = [m for m in net.sent if m.kind == M.READ_INDEX_RESP]
    assert len(resps) == 1 and resps[0].dst == 3
    assert [(r.index, r.context) for r in net.read_states[3]] == [(leader.commit_index, b"r2")]


def test_new_leader_defers_reads_until_its_noop_commits():
    node = leader_of_term4_with_uncommitted_term2_entry()
    node.read_index(b"early")
    assert not any(m.context for m in node.ready().messages if m.kind == M.HEARTBEAT)


def test_compact_refuses_unapplied_index():
    net = Net(ids=(1,))
    leader = net.elect(1)
    leader.propose(b"x")
    with pytest.raises(ValueError):
        leader.compact(2, b"")  # committed but not yet handed out in a Ready
    net.process(1)
    leader.compact(2, b"s")
    assert leader.snapshot.index == 2


entries_st = st.builds(
    Entry,
    term=st.integers(0, 2**64 - 1),
    index=st.integers(0, 2**64 - 1),
    kind=st.sampled_from(EntryKind),
    data=st.binary(max_size=40),
)
snapshot_st = st.builds(
    Snapshot,
    index=st.integers(0, 2**64 - 1),
    term=st.integers(0, 2**64 - 1),
    voters=st.lists(st.integers(1, 2**64 - 1), max_size=7).map(tuple),
    data=st.binary(max_size=60),
)
message_st = st.builds(
    Message,
    kind=st.sampled_from(MessageKind),
    src=st.integers(0, 2**64 - 1),
    dst=st.integers(0, 2**64 - 1),
    term=st.integers(0, 2**64 - 1),
    log_term=st.integers(0, 2**64 - 1),
    index=st.integers(0, 2**64 - 1),
    commit=st.integers(0, 2**64 - 1),
    entries=st.lists(entries_st, max_size=5).map(tuple),
    reject=st.booleans(),
    reject_hint=st.integers(0, 2**64 - 1),
    snapshot=st.none() | snapshot_st,
    context=st.binary(max_size=20),
)


@given(message_st)
def test_message_codec_round_trips(m):
    assert decode_message(encode_message(m)) == m


@given(message_st, st.data())
def test_truncated_or_extended_messages_are_rejected(m, data):
    raw = encode_message(m)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(DecodeError):
        decode_message(raw[:cut])
    with pytest.raises(DecodeError):
        decode_message(raw + b"\x00")


@given(st.binary(max_size=200))
def test_decoding_garbage_raises_only_decode_error(raw):
    try:
        decode_message(raw)
    except DecodeError:
        pass


def test_voters_codec():
    assert decode_voters(encode_voters((3, 1, 2))) == (1, 2, 3)
    with pytest.raises(DecodeError):
        decode_voters(b"\x01\x00\x00\x00")


def test_read_index_completes_on_a_later_heartbeat_when_its_round_was_lost():
    net = Net()
    leader = net.elect(1)
    net.tick_all(1)
    leader.read_index(b"r3")
    net.process(1)
    net.queue.clear()  # the read round's heartbeats are lost
    assert net.read_states[1] == []
    net.tick_all(1)
    assert [r.context for r in net.read_states[1]] == [b"r3"]


def test_committed_entries_are_handed_out_in_bounded_batches():
    entries = log_of([1] * 10)
    node = RaftNode(
        RaftConfig(node_id=1, max_committed_per_ready=4),
        (1, 2, 3),
        random.Random(0),
        hard_state=HardState(1, None, 10),
        entries=entries,
    )
    batches = []
    while node.has_ready():
        rd = node.ready()
        batches.append([e.index for e in rd.committed])
        node.advance(rd)
    assert batches == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10]]


def test_heartbeat_response_does_not_disturb_a_full_pipeline():
    net = Net()
    leader = net.elect(1)
    net.tick_all(1)
    for k in range(3):
        leader.propose(b"%d" % k)
    net.process(1)
    net.queue.clear()  # appends in flight, not yet acked
    net.sent.clear()
    leader.step(Message(M.HEARTBEAT_RESP, 2, 1, leader.term))
    net.process(1)
    # No empty append naming an entry that is still in flight:
    assert [m for m in net.sent if m.dst == 2] == []
    for _ in range(2):  # ...but a follower that stays stalled gets the entries again
        leader.step(Message(M.HEARTBEAT_RESP, 2, 1, leader.term))
        net.process(1)
    resent = [m for m in net.sent if m.dst == 2 and m.kind == M.APPEND]
    assert resent and resent[0].entries[0].index == leader.last_index - 2


def test_stale_candidate_learns_the_current_term_from_a_refusal():
    node = RaftNode(
        RaftConfig(node_id=2, pre_vote=False),
        (1, 2, 3),
        random.Random(0),
        hard_state=HardState(9, None, 0),
    )
    node.step(Message(M.VOTE, 1, 2, 5, log_term=0, index=0))
    assert node.ready().messages == [Message(M.VOTE_RESP, 2, 1, 9, reject=True)]


def test_refusing_a_higher_term_vote_does_not_restart_the_election_timer():
    node = RaftNode(
        RaftConfig(node_id=2, pre_vote=False, check_quorum=False),
        (1, 2, 3),
        random.Random(0),
        hard_state=HardState(1, None, 0),
        entries=log_of([1, 1]),
    )
    term = 1
    for _ in range(200):
        # A candidate with a shorter log campaigns every tick at a higher term.
        term += 1
        node.step(Message(M.VOTE, 3, 2, term, log_term=1, index=1))
        node.tick()
        if node.role == CANDIDATE:
            break
    assert node.role == CANDIDATE  # we timed out and campaign ourselves


def test_membership_change_waits_for_an_entry_of_the_leaders_term():
    node = leader_of_term4_with_uncommitted_term2_entry()
    with pytest.raises(ProposalRefused):
        node.propose_membership(add=4)  # its NOOP is not committed yet
    node.step(Message(M.APPEND_RESP, 2, 1, 4, index=3))
    assert node.commit_index == 3
    assert node.propose_membership(add=4) == 4
    with pytest.raises(ProposalRefused):
        node.propose_membership(remove=2)  # the first change is not committed yet


def test_proposals_beyond_the_uncommitted_bound_are_refused():
    net = Net(max_uncommitted_entries=3)
    leader = net.elect(1)
    net.cut.update((2, 3))
    for k in range(3):
        leader.propose(b"%d" % k)
    with pytest.raises(ProposalRefused):
        leader.propose(b"one too many")
    with pytest.raises(ProposalRefused):
        leader.transfer_leadership(9)  # not a voter


def test_a_thawed_leader_releases_no_read_on_answers_from_before_its_freeze():
    """The thawed-leader interleaving, stepped by hand: the old leader takes a read before it
    hears of its successor, then steps every frame queued while it was frozen (a late answer
    to its last read round, the successor's election and appends) in order. No read may be
    released below the successor's write: old answers name old rounds, the new round's
    heartbeats are answered in the new term."""
    net = Net()
    old = net.elect(1)
    old.propose(b"old")
    net.deliver()
    old.read_index(b"before")
    net.process(1)
    late = [m for m in net.queue if m.dst == 3]  # node 3's copy of the round is slow
    net.queue = [m for m in net.queue if m.dst != 3]
    net.deliver()
    assert [r.context for r in net.read_states[1]] == [b"before"]
    frozen_inbox: list[Message] = []

    def hold(m: Message) -> bool:
        if m.dst == 1:
            frozen_inbox.append(m)
            return True
        return False

    for m in late:  # answered while node 1 is frozen: the answer waits in its socket
        net.nodes[3].step(m)
    net.process(3)
    for _ in range(200):  # node 1 frozen: neither ticked nor stepped
        if any(net.nodes[i].role == LEADER for i in (2, 3)):
            break
        net.tick(2)
        net.tick(3)
        net.deliver(drop=hold)
    successor = next(net.nodes[i] for i in (2, 3) if net.nodes[i].role == LEADER)
    assert successor.term > old.term
    new_index = successor.propose(b"new")
    net.deliver(drop=hold)
    assert successor.commit_index >= new_index
    old.read_index(b"after")  # thawed: the client's read is handled first
    net.process(1)
    for m in frozen_inbox:
        old.step(m)
        net.process(1)
    net.deliver()
    net.tick_all(5)
    assert old.role == FOLLOWER and old.term == successor.term
    assert all(r.index >= new_index for r in net.read_states[1] if r.context == b"after")

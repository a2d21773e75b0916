"""One node's replication: every partition it leads or follows, behind one object that the
host drives with events and polls for effects (no sockets, no clock: `now` is passed in).

The host (the broker's event loop, or the simulator) does five things:

* metadata: `recover(key, state, log, now)` at start for every partition the node holds (the
  state it last knew; a node never resumes leading an epoch after a restart, so the
  controller must give its partitions a new leader epoch when it sees the node restart), then
  `apply(key, state, log, now)` whenever a partition's `PartitionState` changes, and
  `remove(key)` when it goes;
* its own log: `appended(key, now)` after a leader appends, `durable(key, now)` whenever a
  log's `durable_offset` advanced (group commit), for leaders and followers alike;
* fetches it serves: `handle_fetch(request, now)` returns a `PendingFetch`, or None when the
  leader holds it (nothing new yet: a long poll); `ready_fetches(now)` returns held ones that
  became answerable. For each, read every `reads` range from the log (`read_batches`) within
  `budget_bytes`, hand it to `fill`, and send `response()` back to `request.replica`;
* fetches it sends: `poll_fetches(now)` returns (leader node, FetchRequest) pairs, at most one
  request per leader node per call and `fetch_in_flight_max` in flight per leader node, each
  covering every partition followed there that is ready; `handle_response(leader, response,
  now)` takes the answer and returns the keys whose logs grew, to be fsynced (then `durable`);
* `tick(now)` now and then (ISR checks, held fetches' deadlines, request timeouts); then
  `take_alter_isr()` for the proposals to send to the metadata controller and
  `take_high_watermarks()` for the partitions whose HW moved (confirms up to it may go out,
  consumers may read below it).

Every call costs in proportion to the partitions it names, except `tick`, which walks the
partitions this node leads and the fetches it holds or has sent.
"""

from __future__ import annotations

from typing import NamedTuple

from .config import ReplicationConfig
from .follower import PartitionFollower, Phase
from .leader import PartitionLeader
from .messages import (
    NO_LEADER,
    AlterIsr,
    EpochAnswer,
    FetchedPartition,
    FetchError,
    FetchRequest,
    FetchResponse,
    PartitionKey,
    PartitionState,
)
from .replica_log import ReplicaLog


class ReadRange(NamedTuple):
    key: PartitionKey
    offset: int
    end_offset: int


class PendingFetch:
    """A fetch this node answers as leader: the host reads `reads` and calls `fill` for each
    (while `budget_bytes` is positive), then sends `response()`."""

    __slots__ = ("request", "answers", "errors", "leaders", "records", "budget_bytes", "reads")

    def __init__(
        self,
        request: FetchRequest,
        answers: tuple[EpochAnswer, ...],
        errors: dict[PartitionKey, FetchError],
        leaders: dict[PartitionKey, PartitionLeader],
    ) -> None:
        self.request = request
        self.answers = answers
        self.errors = errors
        self.leaders = leaders
        self.records: dict[PartitionKey, bytes] = {}
        self.budget_bytes = request.max_bytes
        self.reads: list[ReadRange] = []

    def _plan(self, current: dict[PartitionKey, PartitionLeader]) -> PendingFetch:
        for partition in self.request.partitions:
            key = partition.key
            leader = self.leaders.get(key)
            if key in self.errors:
                continue
            if leader is None or current.get(key) is not leader or leader.stepped_aside:
                self.errors[key] = FetchError.NOT_LEADER
            elif partition.fetch_offset < leader.log.end_offset:
                self.reads.append(ReadRange(key, partition.fetch_offset, leader.log.end_offset))
        return self

    @property
    def replica(self) -> int:
        return self.request.replica

    def fill(self, key: PartitionKey, data: bytes) -> None:
        self.records[key] = data
        self.budget_bytes -= len(data)

    def response(self) -> FetchResponse:
        partitions = []
        for partition in self.request.partitions:
            key = partition.key
            error = self.errors.get(key, FetchError.NONE)
            leader = self.leaders.get(key)
            if leader is None:
                partitions.append(FetchedPartition(key, error, -1, -1, b""))
                continue
            high_watermark = leader.high_watermark
            progress = leader.followers.get(self.replica)
            # The replica may have left the replica set while its fetch was held.
            if error is FetchError.NONE and progress is not None:
                progress.hw_sent = high_watermark
            partitions.append(
                FetchedPartition(
                    key,
                    error,
                    high_watermark,
                    leader.log.start_offset,
                    self.records.get(key, b"") if error is FetchError.NONE else b"",
                )
            )
        return FetchResponse(self.request.request_id, self.answers, tuple(partitions))


class _Held(NamedTuple):
    pending: PendingFetch
    deadline: float


class _Sent(NamedTuple):
    sent_at: float
    keys: tuple[PartitionKey, ...]


class ReplicationNode:
    """Every partition one node replicates, as leader or follower."""

    leader_class = PartitionLeader

    def __init__(self, node_id: int, config: ReplicationConfig | None = None) -> None:
        self.node_id = node_id
        self.config = config or ReplicationConfig()
        self.leaders: dict[PartitionKey, PartitionLeader] = {}
        self.followers: dict[PartitionKey, PartitionFollower] = {}
        self._alter_isr: list[AlterIsr] = []
        self._led_before: dict[PartitionKey, int] = {}
        self._high_watermarks: dict[PartitionKey, int] = {}
        # Held fetches (long polls), by a token, and the tokens of each partition's.
        self._held: dict[int, _Held] = {}
        self._held_by_key: dict[PartitionKey, set[int]] = {}
        self._ready: list[PendingFetch] = []
        self._next_token = 0
        # Followed partitions that may be ready to fetch (the rest wait for a response or
        # an fsync); requests in flight by leader node and request id.
        self._wanting: dict[PartitionKey, None] = {}
        self._sent: dict[int, dict[int, _Sent]] = {}
        # Per leader node, the partitions whose fetched records are being fsynced, and since
        # when: the others wait for them (`poll_fetches`).
        self._storing: dict[int, dict[PartitionKey, float]] = {}
        self._next_request_id = 0

    # -- metadata --------------------------------------------------------------------------

    def apply(
        self,
        key: PartitionKey,
        state: PartitionState,
        log: ReplicaLog,
        now: float,
        known_high_watermark: int = 0,
    ) -> None:
        """Take a partition's new metadata: lead it, follow it, or stop replicating it."""
        leader = self.leaders.get(key)
        follower = self.followers.get(key)
        if state.leader == self.node_id and state.leader_epoch <= self._led_before.get(key, -1):
            # This node led that epoch before it restarted and may have lost an unfsynced
            # tail that followers hold: it leads again only in an epoch the controller
            # bumps on seeing the restart.
            self._stop(key)
            return
        if state.leader == self.node_id:
            if leader is not None and leader.leader_epoch == state.leader_epoch:
                leader.update_state(state, now)
                self._leader_progressed(leader)
                return
            known = max(known_high_watermark, self.high_watermark(key))
            self._stop(key)
            self.leaders[key] = new = self.leader_class(
                key, self.node_id, log, state, self.config, now, known
            )
            self._leader_progressed(new)
            return
        if state.leader == NO_LEADER or self.node_id not in state.replicas:
            self._stop(key)
            return
        if (
            follower is not None
            and follower.leader == state.leader
            and follower.leader_epoch == state.leader_epoch
        ):
            follower.state = state
            return
        known = max(known_high_watermark, self.high_watermark(key))
        self._stop(key)
        self.followers[key] = PartitionFollower(key, log, state, known)
        self._wanting[key] = None

    def recover(
        self, key: PartitionKey, state: PartitionState, log: ReplicaLog, now: float
    ) -> None:
        """At start: the metadata this node held before it (re)started. It follows as told,
        but does not lead in that epoch (see `apply`)."""
        if state.leader == self.node_id:
            self._led_before[key] = state.leader_epoch
        self.apply(key, state, log, now)

    def remove(self, key: PartitionKey) -> None:
        self._stop(key)

    def _stop(self, key: PartitionKey) -> None:
        if self.leaders.pop(key, None) is not None:
            self._wake(key)
        self.followers.pop(key, None)
        self._wanting.pop(key, None)
        self._high_watermarks.pop(key, None)

    def high_watermark(self, key: PartitionKey) -> int:
        """The HW this node knows for the partition: consumers read only below it."""
        leader = self.leaders.get(key)
        if leader is not None:
            return leader.high_watermark
        follower = self.followers.get(key)
        return follower.high_watermark if follower is not None else 0

    # -- the node's own logs ---------------------------------------------------------------

    def appended(self, key: PartitionKey, now: float) -> None:
        """A leader appended to the partition's log: held fetches of it have news."""
        if key in self.leaders:
            self._wake(key)

    def durable(self, key: PartitionKey, now: float) -> None:
        """The partition's log fsynced further."""
        leader = self.leaders.get(key)
        if leader is not None:
            self._leader_progressed(leader)
        elif key in self.followers:
            self._wanting[key] = None

    def _leader_progressed(self, leader: PartitionLeader) -> None:
        if leader.update_high_watermark():
            self._high_watermarks[leader.key] = leader.high_watermark
            self._wake(leader.key)

    # -- fetches served (leader side) ------------------------------------------------------

    def handle_fetch(self, request: FetchRequest, now: float) -> PendingFetch | None:
        """Take a follower node's fetch; None when it is held until there is news."""
        replica = request.replica
        answers = []
        for query in request.queries:
            leader = self.leaders.get(query.key)
            if leader is None:
                answers.append(EpochAnswer(query.key, FetchError.NOT_LEADER, -1, -1))
            else:
                answers.append(leader.answer_epoch(replica, query))
        errors: dict[PartitionKey, FetchError] = {}
        leaders: dict[PartitionKey, PartitionLeader] = {}
        news = bool(answers)
        for partition in request.partitions:
            leader = self.leaders.get(partition.key)
            if leader is None:
                errors[partition.key] = FetchError.NOT_LEADER
                news = True
                continue
            leaders[partition.key] = leader
            error = leader.fetch(replica, partition, now)
            if error is not FetchError.NONE:
                errors[partition.key] = error
                news = True
            self._leader_progressed(leader)
        pending = PendingFetch(request, tuple(answers), errors, leaders)
        if not news:
            news = any(
                leader.has_news_for(replica, partition.fetch_offset)
                for partition in request.partitions
                if (leader := leaders.get(partition.key)) is not None
            )
        if news or request.max_wait_ms == 0 or len(self._held) >= self.config.parked_fetches_max:
            return pending._plan(self.leaders)
        token = self._next_token
        self._next_token += 1
        self._held[token] = _Held(pending, now + request.max_wait_ms / 1000)
        for key in leaders:
            self._held_by_key.setdefault(key, set()).add(token)
        return None

    def _wake(self, key: PartitionKey) -> None:
        for token in self._held_by_key.pop(key, ()):
            self._release(token)

    def _release(self, token: int) -> None:
        held = self._held.pop(token, None)
        if held is None:
            return
        for key in held.pending.leaders:
            tokens = self._held_by_key.get(key)
            if tokens is not None:
                tokens.discard(token)
                if not tokens:
                    del self._held_by_key[key]
        self._ready.append(held.pending._plan(self.leaders))

    def ready_fetches(self, now: float) -> list[PendingFetch]:
        """Held fetches that have news now or waited their `max_wait_ms` out."""
        for token, held in list(self._held.items()):
            if held.deadline <= now:
                self._release(token)
        ready, self._ready = self._ready, []
        return ready

    # -- fetches sent (follower side) ------------------------------------------------------

    def poll_fetches(self, now: float) -> list[tuple[int, FetchRequest]]:
        """Requests to send now: one per leader node that has partitions ready and room in
        flight."""
        config = self.config
        for sent in self._sent.values():
            for request_id, request in list(sent.items()):
                if now - request.sent_at >= config.fetch_timeout_s:
                    del sent[request_id]
                    self._forget_request(request_id, request.keys)
        by_leader: dict[int, list[PartitionFollower]] = {}
        for key in list(self._wanting):
            follower = self.followers.get(key)
            if follower is None:
                self._wanting.pop(key, None)
            elif follower.ready(now):
                by_leader.setdefault(follower.leader, []).append(follower)
            elif follower.in_flight is not None or now >= follower.retry_at:
                # A response or an fsync (`durable`) brings it back; a backoff keeps it here.
                self._wanting.pop(key, None)
        requests = []
        max_wait_ms = int(config.fetch_max_wait_s * 1000)
        for leader_node, followers in by_leader.items():
            sent = self._sent.setdefault(leader_node, {})
            if len(sent) >= config.fetch_in_flight_max or self._store_under_way(leader_node, now):
                continue
            request_id = self._next_request_id
            self._next_request_id += 1
            queries = []
            partitions = []
            for follower in followers:
                follower.in_flight = request_id
                self._wanting.pop(follower.key, None)
                if follower.phase is Phase.TRUNCATING:
                    queries.append(follower.query())
                else:
                    partitions.append(follower.fetch())
            sent[request_id] = _Sent(now, tuple(f.key for f in followers))
            requests.append(
                (
                    leader_node,
                    FetchRequest(
                        request_id,
                        self.node_id,
                        config.fetch_max_bytes,
                        max_wait_ms,
                        tuple(queries),
                        tuple(partitions),
                    ),
                )
            )
        return requests

    def _store_under_way(self, leader_node: int, now: float) -> bool:
        """Whether a partition of `leader_node` is fsyncing what it fetched (for at most
        `fetch_store_wait_s`): the ready ones wait to go in its request. Sent now, they would
        be held by the leader as a long poll, and with the other request in flight take the
        last room, so the fsynced one could not report its durable offset (the leader's
        acknowledgement) until one of them came back: up to `fetch_max_wait_s` per confirm."""
        storing = self._storing.get(leader_node)
        if not storing:
            return False
        for key, since in list(storing.items()):
            follower = self.followers.get(key)
            if (
                follower is None
                or follower.leader != leader_node
                or follower.log.durable_offset >= follower.log.end_offset
                or now - since >= self.config.fetch_store_wait_s
            ):
                del storing[key]
        return bool(storing)

    def _forget_request(self, request_id: int, keys: tuple[PartitionKey, ...]) -> None:
        for key in keys:
            follower = self.followers.get(key)
            if follower is not None and follower.in_flight == request_id:
                follower.in_flight = None
                self._wanting[key] = None

    def link_lost(self, leader_node: int) -> None:
        """The connection to `leader_node` went down: its requests in flight will get no
        answer, so their partitions are fetched again (on a new connection) at once."""
        for request_id, request in self._sent.pop(leader_node, {}).items():
            self._forget_request(request_id, request.keys)

    def handle_response(
        self, leader_node: int, response: FetchResponse, now: float
    ) -> list[PartitionKey]:
        """Take a leader node's answer; returns the keys whose logs grew (fsync them, then
        call `durable`)."""
        sent = self._sent.get(leader_node, {}).pop(response.request_id, None)
        if sent is None:
            return []
        request_id = response.request_id
        backoff_s = self.config.fetch_backoff_s
        for answer in response.answers:
            follower = self.followers.get(answer.key)
            if follower is not None and follower.in_flight == request_id:
                follower.on_answer(answer, now, backoff_s)
        grown = []
        for fetched in response.partitions:
            follower = self.followers.get(fetched.key)
            if (
                follower is not None
                and follower.in_flight == request_id
                and follower.phase is Phase.FETCHING
                and follower.on_fetched(fetched, now, backoff_s)
            ):
                grown.append(fetched.key)
        if grown:
            storing = self._storing.setdefault(leader_node, {})
            for key in grown:
                storing[key] = now
        self._forget_request(request_id, sent.keys)
        return grown

    # -- time ------------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        for leader in self.leaders.values():
            proposal = leader.propose_isr(now)
            if proposal is not None:
                self._alter_isr.append(proposal)
            self._leader_progressed(leader)

    def take_alter_isr(self) -> list[AlterIsr]:
        proposals, self._alter_isr = self._alter_isr, []
        return proposals

    def take_high_watermarks(self) -> dict[PartitionKey, int]:
        moved, self._high_watermarks = self._high_watermarks, {}
        return moved

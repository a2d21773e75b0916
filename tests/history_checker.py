"""The fault tests' history checker (issue 12, Jepsen's method): what clients did and saw in
a run, judged for safety once the faults healed and the queues drained. Pure: a history in,
a `Verdict` out; no broker, no clock.

Queues. A publish ends confirmed, nacked or unknown (the connection or the wait for the
confirm gave out); a consumer records every delivery (with its redelivered flag), every ack and
every reject it sends, and after the drain each queue's depth. The checker asks that
* every confirmed message was consumed at least once (`lost` otherwise); a message its
  consumers reject goes to the queue's dead-letter queue, and must be consumed there;
* nothing was consumed that was never published, nor from a dead-letter queue that its
  consumers never rejected (`phantoms`);
* every queue is empty after the drain (`undrained`);
and counts the deliveries of a message beyond its first (`duplicated`): allowed, reported.
For streams `duplicated` counts the records the log holds more than once.

Streams. A publisher numbers its publishes (`seq`); a consumer subscribes to a partition from
an offset and records each delivery's offset. The checker asks that
* one offset of a partition always holds the same record, and one record one offset
  (`reordered` otherwise: the log is the same for every reader);
* a subscription's offsets start where it asked and go up by one (`gaps`, `backwards`);
* every confirmed record was read (`lost`), nothing read that was never published
  (`phantoms`);
* a publisher's confirmed records sit in the order it published them (`reordered`);
* no two members of a consumer group hold one partition at once (`shared`): a member holds a
  partition from a delivery until it acked every delivery it had from there, or its session
  ended (the time of the last thing it heard, for a session lost to a fault).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

CONFIRMED = "confirmed"
NACKED = "nacked"
UNKNOWN = "unknown"


@dataclass(frozen=True)
class Publish:
    queue: str
    id: str
    outcome: str


@dataclass(frozen=True)
class Consume:
    queue: str
    id: str
    redelivered: bool
    consumer: str


@dataclass(frozen=True)
class Reject:
    """A consumer rejected the delivery without requeue: it is to be dead-lettered."""

    queue: str
    id: str
    consumer: str


@dataclass(frozen=True)
class Depth:
    """A queue's message count after the faults healed and the consumers drained it."""

    queue: str
    messages: int


@dataclass
class QueueHistory:
    publishes: list[Publish] = field(default_factory=list)
    consumes: list[Consume] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)
    depths: list[Depth] = field(default_factory=list)
    dead_letter_queues: dict[str, str] = field(default_factory=dict)
    """Queue -> the queue its rejected messages reach."""


@dataclass(frozen=True)
class StreamPublish:
    stream: str
    id: str
    publisher: str
    seq: int
    outcome: str


@dataclass(frozen=True)
class StreamRead:
    partition: str
    offset: int
    id: str
    consumer: str
    subscription: int
    """Which subscription of `consumer` (each consume, after a cancel or reconnect, is new)."""
    from_offset: int
    """The offset the subscription asked to start at."""


@dataclass(frozen=True)
class GroupDelivery:
    group: str
    partition: str
    offset: int
    member: str
    session: int
    at_s: float


@dataclass(frozen=True)
class GroupAck:
    group: str
    partition: str
    offset: int
    member: str
    session: int
    at_s: float


@dataclass(frozen=True)
class SessionEnd:
    """A member's session ended at `at_s`: when it began to close, or, lost to a fault, when
    it last heard from its broker."""

    member: str
    session: int
    at_s: float


@dataclass
class StreamHistory:
    publishes: list[StreamPublish] = field(default_factory=list)
    reads: list[StreamRead] = field(default_factory=list)
    group_deliveries: list[GroupDelivery] = field(default_factory=list)
    group_acks: list[GroupAck] = field(default_factory=list)
    session_ends: list[SessionEnd] = field(default_factory=list)


@dataclass
class Verdict:
    published: int = 0
    confirmed: int = 0
    nacked: int = 0
    unknown: int = 0
    consumed: int = 0
    """Distinct messages consumed (records read, for streams)."""
    duplicated: int = 0
    lost: list[str] = field(default_factory=list)
    phantoms: list[str] = field(default_factory=list)
    undrained: dict[str, int] = field(default_factory=dict)
    reordered: list[str] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)
    backwards: list[str] = field(default_factory=list)
    shared: list[str] = field(default_factory=list)

    @property
    def violations(self) -> dict[str, object]:
        """Every safety property broken, by name (empty: the run is safe)."""
        names = ("lost", "phantoms", "undrained", "reordered", "gaps", "backwards", "shared")
        return {name: getattr(self, name) for name in names if getattr(self, name)}

    def row(self) -> dict[str, int]:
        return {
            "published": self.published,
            "confirmed": self.confirmed,
            "consumed": self.consumed,
            "lost": len(self.lost),
            "duplicated": self.duplicated,
        }


def check_queues(history: QueueHistory) -> Verdict:
    verdict = Verdict()
    outcomes: dict[tuple[str, str], str] = {}
    for publish in history.publishes:
        outcomes[(publish.queue, publish.id)] = publish.outcome
    _count_outcomes(verdict, outcomes.values())
    deliveries = Counter((c.queue, c.id) for c in history.consumes)
    rejected = {(r.queue, r.id) for r in history.rejects}
    dead_lettered = {
        (history.dead_letter_queues[queue], id_)
        for queue, id_ in rejected
        if queue in history.dead_letter_queues
    }
    verdict.consumed = len(deliveries)
    verdict.duplicated = sum(count - 1 for count in deliveries.values())
    for queue, id_ in sorted(deliveries):
        if (queue, id_) not in outcomes and (queue, id_) not in dead_lettered:
            verdict.phantoms.append(f"{queue}: {id_}")
    for (queue, id_), outcome in sorted(outcomes.items()):
        if outcome != CONFIRMED:
            continue
        if (queue, id_) not in deliveries:
            verdict.lost.append(f"{queue}: {id_}")
        elif (queue, id_) in rejected and queue in history.dead_letter_queues:
            dead_letter_queue = history.dead_letter_queues[queue]
            if (dead_letter_queue, id_) not in deliveries:
                verdict.lost.append(f"{queue}: {id_} dead-lettered, never in {dead_letter_queue}")
    verdict.undrained = {d.queue: d.messages for d in history.depths if d.messages}
    return verdict


def check_streams(history: StreamHistory) -> Verdict:
    verdict = Verdict()
    outcomes = {p.id: p.outcome for p in history.publishes}
    _count_outcomes(verdict, outcomes.values())
    record_at: dict[tuple[str, int], str] = {}
    offset_of: dict[str, tuple[str, int]] = {}
    for read in history.reads:
        place = (read.partition, read.offset)
        held = record_at.setdefault(place, read.id)
        if held != read.id:
            verdict.reordered.append(f"{read.partition}@{read.offset}: {held} and {read.id}")
        where = offset_of.setdefault(read.id, place)
        if where != place:
            verdict.reordered.append(f"{read.id} at {where} and at {place}")
        if read.id not in outcomes:
            verdict.phantoms.append(f"{read.partition}@{read.offset}: {read.id}")
    verdict.consumed = len(offset_of)
    # Readers read records again by design (from offset 0 after the faults): a record is
    # duplicated when the log holds it twice.
    verdict.duplicated = len(record_at) - len(offset_of)
    _check_subscriptions(verdict, history.reads)
    for id_, outcome in outcomes.items():
        if outcome == CONFIRMED and id_ not in offset_of:
            verdict.lost.append(id_)
    _check_publish_order(verdict, history.publishes, offset_of)
    _check_group_exclusive(verdict, history)
    return verdict


def _count_outcomes(verdict: Verdict, outcomes) -> None:
    counts = Counter(outcomes)
    verdict.published = sum(counts.values())
    verdict.confirmed = counts[CONFIRMED]
    verdict.nacked = counts[NACKED]
    verdict.unknown = counts[UNKNOWN]


def _check_subscriptions(verdict: Verdict, reads: list[StreamRead]) -> None:
    """Within one subscription, in the order delivered: the first offset is the one asked
    for (or later, if retention took it: not here, nothing is retained away), then +1 each."""
    last: dict[tuple[str, str, int], int] = {}
    for read in reads:
        key = (read.partition, read.consumer, read.subscription)
        expected = last[key] + 1 if key in last else read.from_offset
        where = f"{read.consumer}#{read.subscription} on {read.partition}"
        if read.offset < expected:
            verdict.backwards.append(f"{where}: {read.offset} after {expected - 1}")
        elif read.offset > expected:
            verdict.gaps.append(f"{where}: {read.offset}, expected {expected}")
        last[key] = read.offset


def _check_publish_order(
    verdict: Verdict, publishes: list[StreamPublish], offset_of: dict[str, tuple[str, int]]
) -> None:
    placed: dict[tuple[str, str], list[tuple[int, int, str]]] = defaultdict(list)
    for publish in publishes:
        if publish.outcome == CONFIRMED and publish.id in offset_of:
            partition, offset = offset_of[publish.id]
            placed[(publish.publisher, partition)].append((publish.seq, offset, publish.id))
    for (publisher, partition), records in placed.items():
        records.sort()
        for (_, before, earlier), (_, after, later) in zip(records, records[1:], strict=False):
            if after < before:
                verdict.reordered.append(
                    f"{publisher} on {partition}: {later}@{after} before {earlier}@{before}"
                )


def _check_group_exclusive(verdict: Verdict, history: StreamHistory) -> None:
    ends = {(e.member, e.session): e.at_s for e in history.session_ends}
    acked = {
        (a.group, a.partition, a.offset, a.member, a.session): a.at_s for a in history.group_acks
    }
    holds: dict[tuple[str, str], list[tuple[float, float, str]]] = defaultdict(list)
    for d in history.group_deliveries:
        end = min(
            acked.get((d.group, d.partition, d.offset, d.member, d.session), float("inf")),
            ends.get((d.member, d.session), float("inf")),
        )
        holds[(d.group, d.partition)].append((d.at_s, end, f"{d.member}#{d.session}"))
    for (group, partition), intervals in holds.items():
        intervals.sort()
        latest_end, holder = float("-inf"), ""
        for start, end, member in intervals:
            if start < latest_end and member != holder:
                verdict.shared.append(f"{group} on {partition}: {holder} and {member}")
            if end > latest_end:
                latest_end, holder = end, member

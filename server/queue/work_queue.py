"""A queue as the broker hosts it: the log-backed engine, its consumers, and dispatch.

The engine (``log_queue.LogQueue``, or one per level in ``priority.PriorityQueue``) knows
offsets, acks and redelivery; this layer adds what only a running broker has: which channels
consume, with what credit, and when to hand out messages.

Publishes are buffered per tick (``stage``) and written with one engine append per queue
(``flush``); dispatch then hands ready messages to consumers with credit. Consumers are kept
by priority (``x-priority``, highest first, as RabbitMQ): a lower level is served only when
every consumer above it is out of credit; within a level, round-robin.

Dispatch looks only at consumers not known to lack credit, so a queue with 50,000 consumers
at their prefetch limit costs nothing per publish. A consumer found without credit is
*blocked*: it leaves the rotation of its level until its credit returns, as in RabbitMQ's
rabbit_queue_consumers. Its own acks unblock a consumer blocked on its own prefetch; one
blocked on its channel (global prefetch, the unacked limit, flow, a full socket) waits in the
channel, which unblocks all of its blocked consumers when it may deliver again, without
looking at any queue's other consumers. An unblocked consumer rejoins its level last.

Queue arguments enforced here, at the head as a RabbitMQ classic queue does: x-message-ttl
and per-message expiration, x-max-length and x-max-length-bytes (drop-head, or refusal with
x-overflow reject-publish), x-single-active-consumer, x-expires, x-delivery-limit.

Dead-lettering (x-dead-letter-exchange): a message that dies here (rejected without requeue,
expired, dropped beyond a length limit, past its delivery limit) stays in flight and goes to
`dead_letters` with its reason. The core publishes it to the dead-letter exchange and
settles it here (`dead_lettered`) once every target holds it, so a crash in between brings
it back rather than losing it. Without a dead-letter exchange such a message is dropped.

Time is passed in (epoch milliseconds), never read here. The queue says when it next wants
to run (`run_timers` returns it) and what is due then (expired messages dropped, or the
whole queue unused past x-expires: `unused_expired`); the broker process owns the event
loop's timer that calls it back.
"""

from __future__ import annotations

import bisect
import heapq
import logging
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, NamedTuple

from warrenmq.amqp import fastpath
from warrenmq.amqp import properties as props
from warrenmq.dlq.dead_letter import DELIVERY_LIMIT, EXPIRED, MAXLEN, REJECTED
from warrenmq.log import RawRecord
from warrenmq.log.batch import staged_batch_bounds

from .arguments import EXPIRY_MS_MAX
from .consumer import (
    BLOCKED_BY_CHANNEL,
    BLOCKED_BY_PREFETCH,
    CANCELLED,
    ROTATING,
    Consumer,
)
from .dead_letter_counts import DeadLetterCounts
from .engine import Kept, Message, QueueEngine
from .message_counts import MessageCounts

log = logging.getLogger("warrenmq.server")

# A dispatch pass stops after this many deliveries and is rescheduled, so one busy queue
# cannot hold the event loop for long.
DISPATCH_DELIVERIES_MAX = 1024
DISPATCH_TAKE_BYTES = 256 << 10


def _int_argument(arguments: Mapping[str, Any], key: str) -> int | None:
    value = arguments.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def timeouts(effective: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """A queue's (consumer timeout, visibility timeout) in ms, from its effective arguments:
    the channel holding its deliveries enforces them, wherever the queue is led.

    x-consumer-timeout: 0 disables it, None leaves the channel's default. x-visibility-timeout
    (a Warren extension like SQS's): a delivery unacked this long goes back alone, and the
    channel reports stale settles."""
    return (
        _int_argument(effective, "x-consumer-timeout"),
        _int_argument(effective, "x-visibility-timeout") or None,
    )


class DelayedRetry(NamedTuple):
    """RabbitMQ 4.3's delayed retry (x-delayed-retry-type, -min, -max): a return of the
    kinds `type` names waits min * its failed deliveries (at least once min), at most max."""

    type: str
    """"all", "failed" (basic.reject, a lost channel, a visibility timeout) or "returned"
    (basic.nack, basic.recover, a consumer timeout)."""
    min_ms: int
    max_ms: int

    def applies(self, failed: bool) -> bool:
        return self.type == "all" or (self.type == "failed") is failed

    def delay_ms(self, failures: int) -> int:
        return min(self.min_ms * max(1, failures), self.max_ms)


def _delayed_retry(arguments: Mapping[str, Any]) -> DelayedRetry | None:
    """rabbit_quorum_queue's get_delayed_retry_config/1: no type, "disabled", an unknown type
    or no positive minimum disables it; the maximum defaults to the minimum."""
    retry_type = arguments.get("x-delayed-retry-type")
    if isinstance(retry_type, bytes):
        retry_type = retry_type.decode("utf-8", "replace")
    least = _int_argument(arguments, "x-delayed-retry-min")
    if retry_type not in ("all", "failed", "returned") or least is None or least <= 0:
        return None
    most = _int_argument(arguments, "x-delayed-retry-max")
    return DelayedRetry(retry_type, least, most if most is not None and most > 0 else least)


def _highest_first(priority: int) -> int:
    return -priority


# RabbitMQ 4's delivery limit for quorum queues declared without one.
QUORUM_DELIVERY_LIMIT_DEFAULT = 20
DELIVERY_COUNT_HEADER = "x-delivery-count"
ACQUIRED_COUNT_HEADER = "x-acquired-count"
# Dead letters a target could not store (a full disk) are published again after this long,
# not at once: an expired message would otherwise die, fail and die again every tick.
DEAD_LETTER_RETRY_MS = 1000


def _with_delivery_count(message: Message) -> Message:
    """A redelivery as a RabbitMQ 4.3 quorum queue sends it (rabbit_fifo_client): with
    x-acquired-count, the times it came back before, and x-delivery-count, how many of those
    failed, each a long and only once above 0 (RabbitMQ sets them in a headers table it
    leaves sorted by key). A dead letter's first delivery from its new queue has only the
    failures it carried (`Kept`): it was acquired from this queue by no one before."""
    headers = dict(props.headers(message.properties))
    if message.delivery_count > 1:
        headers[ACQUIRED_COUNT_HEADER] = props.long(message.delivery_count - 1)
    if message.failed_count:
        headers[DELIVERY_COUNT_HEADER] = props.long(message.failed_count)
    entries = sorted(headers.items(), key=lambda entry: entry[0].encode("utf-8"))
    return message._replace(properties=props.with_headers(message.properties, entries))


class QueueDeposed(Exception):
    """The queue's leader moved to another node while its commit waited."""


class WorkQueue:
    """One queue of a vhost: engine, metadata flags, consumers, per-tick publish buffer."""

    def __init__(
        self,
        vhost: str,
        name: str,
        engine: QueueEngine,
        *,
        durable: bool,
        auto_delete: bool,
        exclusive_owner: str | None,
        arguments: Mapping[str, Any],
        queue_type: str,
        batch_records_max: int,
        dead_letter_counts: DeadLetterCounts,
        effective_arguments: Mapping[str, Any] | None = None,
    ) -> None:
        """`arguments` are the declared ones; `effective_arguments` (by default the same) are
        what the queue enforces: the declared ones merged with its policy (`policy.py`).
        `dead_letter_counts` counts the messages that die here (the process's totals)."""
        assert batch_records_max > 0
        self.vhost = vhost
        self.name = name
        self.engine = engine
        self.durable = durable
        self.auto_delete = auto_delete
        self.exclusive_owner = exclusive_owner
        self.arguments = dict(arguments)
        self.queue_type = queue_type
        self.deleted = False
        # Stopped here because another node now leads it (`VirtualHost.step_down`): what
        # waits for a commit was never confirmed by the quorum, and must not be.
        self.deposed = False
        self.had_consumer = False
        self._batch_records_max = batch_records_max
        self.committing = False
        self.bytes_max: int | None = None
        self.ready_bytes = 0
        self._in_flight_bytes: dict[int, int] = {}
        self.apply_arguments(self.arguments if effective_arguments is None else effective_arguments)
        self.last_used_ms = 0
        # Set once a message with its own expiration arrives; from then on take() reads
        # each message's properties (after a restart, until one such message comes again,
        # per-message expirations are not checked).
        self.has_expiring = False
        self.stale_settles = 0
        """Acks and rejects of deliveries their visibility timeout had already given back."""
        self._dead_letter_counts = dead_letter_counts
        self._requeued: list[tuple[int, bool]] = []
        """(offset, whether its delivery failed) of requeues not yet stamped by `_back_off`."""
        self._backing_off: list[tuple[int, int]] = [
            (due_ms, offset) for offset, due_ms in engine.held()
        ]
        """(when ready again, offset) of the messages the engine holds: a heap."""
        heapq.heapify(self._backing_off)
        self._take_step = 1
        """How many messages a lone consumer's next take asks for (see `dispatch`)."""
        self.dead_letters: list[tuple[Message, str]] = []
        """Messages that died here, in flight until `dead_lettered` settles them (a refused
        publish, never stored here, has a negative offset of its own)."""
        self._refused_offset = 0
        # The BCC keys of refused publishes among the dead letters, by their offset.
        self._refused_bcc: dict[int, tuple[str, ...]] = {}
        self._dead_letter_retries: list[tuple[Message, str]] = []
        self._dead_letter_retry_ms: int | None = None
        """When the retries go out again; stamped by the first `run_timers` after they came."""
        self._staged: list[RawRecord] = []
        self._staged_publishers: list[Any] = []
        self._staged_bytes = 0
        # What the engine keeps beside some of the staged records (index in `_staged`).
        self._staged_kept: list[Kept] = []
        self.written_publishers: list[Any] = []
        self.failed_publishers: list[Any] = []
        self.staged_persistent = False
        self.commit_wanted = False
        # The consumers in rotation (not blocked) by priority, each level in round-robin
        # order, next first; `_priorities` holds the levels' priorities, highest first. A
        # level exists while it has a consumer in rotation.
        self._rotations: dict[int, OrderedDict[Consumer, None]] = {}
        self._priorities: list[int] = []
        # Every consumer, in the order they registered (single-active-consumer's order).
        self.consumers: dict[tuple[int, str], Consumer] = {}
        self.counts = MessageCounts()

    def apply_arguments(self, effective: Mapping[str, Any]) -> None:
        """(Re)read the queue's settings from its effective arguments: at creation, and when a
        policy change alters them (the caller then enforces the new limits).

        A change applies to the messages already in the queue too: their TTL is counted from
        when each was stored (RabbitMQ fixes a message's expiry when it is enqueued). A byte
        limit that appears on a live queue counts only the messages that arrive from then on,
        as after a restart (the engine keeps no per-message sizes). `effective` is kept as
        given, not copied: a queue without a policy shares its declared mapping.
        """
        self.effective_arguments = effective
        # Limits enforced at the head, as a RabbitMQ classic queue does: x-message-ttl drops
        # a message when it reaches the head expired; x-max-length (overflow drop-head)
        # drops from the head once more than that many are ready.
        self.message_ttl_ms = _int_argument(effective, "x-message-ttl")
        self.length_max = _int_argument(effective, "x-max-length")
        # x-max-length-bytes counts the bodies of ready messages, as RabbitMQ does. The sum is
        # kept here only for queues that have the limit (and starts from zero after a
        # restart: the engine keeps no per-message sizes, by design).
        bytes_max = _int_argument(effective, "x-max-length-bytes")
        if bytes_max is None:
            self.ready_bytes = 0
            self._in_flight_bytes.clear()
        self.bytes_max = bytes_max
        overflow = effective.get("x-overflow")
        if isinstance(overflow, bytes):
            overflow = overflow.decode()
        # reject-publish-dlx also refuses; dead-lettering the refused message is the DLX
        # issue's part.
        self.reject_when_full = overflow in ("reject-publish", "reject-publish-dlx")
        # x-expires: the queue is deleted once unused (no consumers, no basic.get, no
        # redeclare) for this long; `last_used_ms` is when it was last used.
        self.expires_ms = _int_argument(effective, "x-expires")
        # x-single-active-consumer: only the longest-registered consumer gets messages; the
        # next one takes over when it goes (RabbitMQ 3.10, without priorities).
        self.single_active = effective.get("x-single-active-consumer") is True
        dead_letter_exchange = effective.get("x-dead-letter-exchange")
        self.dead_letter_exchange: str | None = (
            dead_letter_exchange.decode()
            if isinstance(dead_letter_exchange, bytes)
            else dead_letter_exchange
        )
        dead_letter_routing_key = effective.get("x-dead-letter-routing-key")
        self.dead_letter_routing_key: str | None = (
            dead_letter_routing_key.decode()
            if isinstance(dead_letter_routing_key, bytes)
            else dead_letter_routing_key
        )
        # x-overflow reject-publish-dlx: a refused publish is dead-lettered (reason maxlen).
        self.dead_letter_refused = overflow == "reject-publish-dlx"
        # x-delivery-limit: a message whose deliveries failed more than this many times is
        # dead-lettered instead of requeued (RabbitMQ 4.3 counts failed deliveries, not
        # returns: see `requeue`); quorum queues have RabbitMQ 4's default, -1 disables it.
        delivery_limit = _int_argument(effective, "x-delivery-limit")
        if delivery_limit is None and self.queue_type == "quorum":
            delivery_limit = QUORUM_DELIVERY_LIMIT_DEFAULT
        if delivery_limit is not None and delivery_limit < 0:
            delivery_limit = None
        self.delivery_limit = delivery_limit
        # Redeliveries carry x-delivery-count where RabbitMQ counts them (quorum queues), and
        # wherever a delivery limit makes the count matter.
        self.counts_deliveries = self.queue_type == "quorum" or self.delivery_limit is not None
        self.consumer_timeout_ms, self.visibility_timeout_ms = timeouts(effective)
        # x-requeue-delay / x-requeue-delay-max (ms, a Warren extension): a requeued message
        # waits base * 2^(deliveries - 1), at most the max, before it is ready again; others
        # flow past it meanwhile. The engine holds it until then, durably: the wait survives
        # a restart and a crash. Requeues are stamped by the next `run_timers`.
        # Deliveries, not failed deliveries: every return backs off, a basic.nack of a
        # consumer that cannot take work now as much as a basic.reject (counting failures, a
        # nack loop would spin at the base delay; RabbitMQ 4.3's own delayed retry is linear
        # in failed deliveries instead).
        self.requeue_delay_ms = _int_argument(effective, "x-requeue-delay") or None
        self.requeue_delay_max_ms = _int_argument(effective, "x-requeue-delay-max") or EXPIRY_MS_MAX
        self.delayed_retry = _delayed_retry(effective)
        self._delays_returns = self.requeue_delay_ms is not None or self.delayed_retry is not None

    # -- publishing -----------------------------------------------------------------------

    def stage(
        self,
        record: RawRecord,
        persistent: bool,
        expiring: bool = False,
        publisher: Any = None,
    ) -> bool:
        """Buffer a record for this tick's append; False if x-overflow reject-publish
        refuses it because the queue is full.

        `publisher` is whoever waits for the record to be stored (a (channel, confirm tag)
        pair, or None): a failed write hands it back, so exactly its publish is nacked.
        `take_written()` reports publishers as given, None included.
        """
        if self.reject_when_full and self._full(len(record[3])):
            if self.dead_letter_refused and self.dead_letter_exchange is not None:
                self._refused_offset -= 1
                refused = Message(self._refused_offset, 0, *record, False, 0, 0)
                self.dead_letters.append((refused, MAXLEN))
                self._count_deaths(MAXLEN, 1)
            return False
        self._staged.append(record)
        self._staged_publishers.append(publisher)
        self._staged_bytes += len(record[2]) + len(record[3])
        if self.bytes_max is not None:
            self.ready_bytes += len(record[3])
        if expiring:
            self.has_expiring = True
        if persistent and self.durable:
            self.staged_persistent = True
        return True

    def stage_kept(
        self,
        record: RawRecord,
        persistent: bool,
        expiring: bool = False,
        publisher: Any = None,
        *,
        bcc: tuple[str, ...] = (),
        failures: int = 0,
    ) -> bool:
        """`stage` for a record the engine keeps something beside (`Kept`): the BCC keys it
        was published with, so that its dead letter is routed by them too, and the failed
        deliveries a dead letter carries."""
        if not self.stage(record, persistent, expiring, publisher):
            if (
                bcc
                and self.dead_letters
                and self.dead_letters[-1][0].offset == self._refused_offset
            ):
                # Refused and dead-lettered (reject-publish-dlx): routed by its BCC keys too.
                self._refused_bcc[self._refused_offset] = bcc
            return False
        if bcc or failures:
            self._staged_kept.append(Kept(len(self._staged) - 1, bcc, failures))
        return True

    def _full(self, body_bytes: int) -> bool:
        if (
            self.length_max is not None
            and self.engine.ready_count + len(self._staged) >= self.length_max
        ):
            return True
        return self.bytes_max is not None and self.ready_bytes + body_bytes > self.bytes_max

    def drop_staged(self) -> list[Any]:
        """Forget what is staged and not yet written; returns its publishers (None
        included), which must be refused: the queue stops being served here."""
        publishers = self._staged_publishers
        self._staged, self._staged_publishers, self._staged_kept = [], [], []
        self._staged_bytes = 0
        return publishers

    def flush(self, now_ms: int) -> None:
        """Write the records staged so far, stamped `now_ms` (the tick does; so does a method
        that must see them, such as basic.get after publishes on the same channel).

        Records go in batches within the log's bounds, in order. When a write fails (a full
        disk), that batch and every later one are not stored: their publishers are kept for
        `take_written()` to report as failed, and the queue stays usable for later writes.
        """
        staged = self._staged
        if not staged:
            return
        publishers = self._staged_publishers
        self._staged = []
        self._staged_publishers = []
        staged_bytes, self._staged_bytes = self._staged_bytes, 0
        kept = self._staged_kept
        if kept:
            self._staged_kept = []
        count = written = len(staged)
        bounds = staged_batch_bounds(
            staged, staged_bytes, self._batch_records_max, self.engine.batch_bytes_max
        )
        for start, end in bounds:
            try:
                batch = staged if end - start == count else staged[start:end]
                if kept:
                    self.engine.append(
                        batch,
                        now_ms,
                        [k._replace(index=k.index - start) for k in kept if start <= k.index < end],
                    )
                else:
                    self.engine.append(batch, now_ms)
            except Exception as error:
                written = start
                self.failed_publishers += publishers[start:]
                if self.bytes_max is not None:
                    self.ready_bytes -= sum(len(record[3]) for record in staged[start:])
                log.error(
                    "queue '%s' in vhost '%s': storing %d message(s) failed, their "
                    "publishes are refused: %r",
                    self.name,
                    self.vhost,
                    len(staged) - start,
                    error,
                )
                break
        self.counts.published += written
        if written and self.staged_persistent:
            # Only a commit can still fail these: remembered for the tick that runs it.
            self.written_publishers += publishers if written == count else publishers[:written]
            self.commit_wanted = True
        self.staged_persistent = False
        if not self.consumers:
            self.enforce_length()

    def take_written(self) -> tuple[list[Any], list[Any], bool]:
        """(publishers whose records were written, publishers whose writes failed, whether
        a commit must make the written ones durable before they are confirmed), since the
        last call."""
        written, self.written_publishers = self.written_publishers, []
        failed, self.failed_publishers = self.failed_publishers, []
        wanted, self.commit_wanted = self.commit_wanted, False
        return written, failed, wanted

    async def commit(self) -> None:
        """Make appends, acks and the delivered mark durable (group commit in the engine).

        A queue deleted meanwhile has nothing left to make durable: its messages are gone
        with it, and their publishes count as handled (RabbitMQ confirms them too).
        """
        if self.deposed:
            raise QueueDeposed(f"queue '{self.name}' in vhost '{self.vhost}' is led elsewhere")
        if self.deleted:
            return
        self.committing = True
        try:
            await self.engine.commit()
        except Exception:
            if not self.deleted or self.deposed:
                raise
        finally:
            self.committing = False

    @property
    def needs_commit(self) -> bool:
        return not self.deleted and self.engine.needs_commit

    # -- consumers ------------------------------------------------------------------------

    def add_consumer(self, consumer: Consumer) -> None:
        key = (id(consumer.channel), consumer.tag)
        assert key not in self.consumers
        # basic.consume's rule, which exclusive_consumer() relies on.
        assert self.exclusive_consumer() is None and not (consumer.exclusive and self.consumers)
        self.consumers[key] = consumer
        self.had_consumer = True
        self._rotate_in(consumer)

    def remove_consumer(self, consumer: Consumer) -> bool:
        """Forget a consumer; True if this queue is now auto-delete-able (RabbitMQ's rule)."""
        if self.consumers.pop((id(consumer.channel), consumer.tag), None) is None:
            return False
        if consumer.state is ROTATING:
            self._rotate_out(consumer)
        elif consumer.state is BLOCKED_BY_CHANNEL:
            consumer.channel.forget_blocked(consumer)
        consumer.state = CANCELLED
        return self.auto_delete and self.had_consumer and not self.consumers

    def _rotate_in(self, consumer: Consumer) -> None:
        """Put a consumer last in its level's rotation."""
        consumer.state = ROTATING
        priority = consumer.priority
        rotation = self._rotations.get(priority)
        if rotation is None:
            rotation = self._rotations[priority] = OrderedDict()
            bisect.insort(self._priorities, priority, key=_highest_first)
        rotation[consumer] = None

    def _rotate_out(self, consumer: Consumer) -> None:
        priority = consumer.priority
        rotation = self._rotations[priority]
        del rotation[consumer]
        if not rotation:
            del self._rotations[priority]
            self._priorities.remove(priority)

    def _block(self, consumer: Consumer) -> None:
        """Take a consumer found without credit out of rotation until its credit returns."""
        self._rotate_out(consumer)
        channel = consumer.channel
        if channel.can_deliver() and (consumer.no_ack or channel.credit() > 0):
            assert consumer.prefetch_count and consumer.unacked_count >= consumer.prefetch_count
            consumer.state = BLOCKED_BY_PREFETCH
        else:
            consumer.state = BLOCKED_BY_CHANNEL
            channel.block(consumer)

    def unblock(self, consumer: Consumer) -> None:
        """The channel of a consumer it blocked has credit again: back into rotation."""
        assert consumer.state is BLOCKED_BY_CHANNEL
        self._rotate_in(consumer)

    def prefetch_freed(self, consumer: Consumer) -> None:
        """Acks made room under a consumer's own prefetch: if that blocked it, it rejoins the
        rotation."""
        if (
            consumer.state is BLOCKED_BY_PREFETCH
            and consumer.unacked_count < consumer.prefetch_count
        ):
            self._rotate_in(consumer)

    @property
    def consumer_count(self) -> int:
        return len(self.consumers)

    def exclusive_consumer(self) -> Consumer | None:
        # An exclusive consumer is always alone (basic.consume adds none beside it, nor it
        # beside others): looking at every consumer made each basic.consume O(consumers).
        if len(self.consumers) != 1:
            return None
        consumer = next(iter(self.consumers.values()))
        return consumer if consumer.exclusive else None

    def _next_consumer(self) -> Consumer | None:
        """The consumer to deliver to next: round-robin in the highest level with credit.
        Consumers found without credit on the way are blocked, so each is looked at once
        per time its credit returns, not once per message."""
        if self.single_active:
            active = next(iter(self.consumers.values()))
            if active.state is not ROTATING:
                return None
            if active.credit(1):
                return active
            self._block(active)
            return None
        priorities = self._priorities
        while priorities:
            rotation = self._rotations[priorities[0]]
            consumer = next(iter(rotation))
            if consumer.credit(1):
                rotation.move_to_end(consumer)
                return consumer
            self._block(consumer)
        return None

    # -- delivery -------------------------------------------------------------------------

    @property
    def ready_count(self) -> int:
        return self.engine.ready_count

    def dispatch(self, now_ms: int) -> bool:
        """Deliver ready messages to consumers with credit; True if stopped by the bound.

        Round-robin hands one message per turn; a consumer alone on the queue takes every
        message it has credit for at once (the same messages, in the same order).
        """
        if self.deleted:
            return False
        if self._backing_off:
            # Requeued messages whose delay is over are ready again (the queue's timer woke
            # the tick for them).
            self._back_off(now_ms)
        if not self.consumers:
            return False
        engine = self.engine
        alone = len(self.consumers) == 1
        budget = DISPATCH_DELIVERIES_MAX
        # A lone consumer's takes hold about DISPATCH_TAKE_BYTES each, sized by the last
        # message taken (one message the first time): its credit (a connection's write
        # buffer bound too) is checked between takes, so large messages do not pile up past
        # it. The size is kept between passes, so small messages cost one take a pass.
        step = self._take_step
        while engine.ready_count:
            consumer = self._next_consumer()
            if consumer is None:
                break
            messages = self._take_many(
                min(step, consumer.credit(budget)) if alone else 1, now_ms, arriving=True
            )
            if not messages:
                break
            step = self._take_step = DISPATCH_TAKE_BYTES // max(1, len(messages[-1].body)) or 1
            consumer.channel.deliver(consumer, messages)
            self.counts.handed_out(messages, consumer.no_ack)
            budget -= len(messages)
            if budget <= 0:
                return True
        # As RabbitMQ offers an arriving message to the consumers before it enqueues it, the
        # length limits apply to what the consumers left.
        self.enforce_length()
        return False

    @property
    def held_until_commit(self) -> bool:
        """Messages are ready but the engine hands out none until its next commit (the
        delivered mark, or a quorum queue's fsync)."""
        return not self.deleted and self.engine.held_until_commit

    async def take_after_commit(self, now_ms: int) -> Message | None:
        """`take()` for basic.get once it found the engine holding messages until a commit:
        commit, then take. Consumers may meanwhile take what the commit let through, up to
        the new mark; each further round follows their progress, so this ends."""
        while self.held_until_commit:
            try:
                await self.commit()
            except Exception:
                if self.deleted:
                    return None
                raise
            if not self.deleted:
                message = self.take(now_ms)
                if message is not None:
                    return message
        return None

    def take(self, now_ms: int) -> Message | None:
        """The next live ready message, marked in flight, or None; expired ones are dropped."""
        if self._backing_off:
            self._back_off(now_ms)
        taken = self.take_many(1, now_ms)
        return taken[0] if taken else None

    def take_many(self, count_max: int, now_ms: int) -> list[Message]:
        """Up to `count_max` live ready messages, marked in flight; expired ones are dropped."""
        return self._take_many(count_max, now_ms, arriving=False)

    def _take_many(self, count_max: int, now_ms: int, arriving: bool) -> list[Message]:
        """`take_many`; for a consumer (`arriving`), a message with a TTL of 0 that arrived in
        this millisecond is still alive: RabbitMQ offers an arriving message to the consumers
        before it expires anything, so a TTL of 0 reaches a consumer waiting for it."""
        engine = self.engine
        if not self.expires_messages and self.bytes_max is None:
            taken = engine.take_many(count_max)
            return self._counted(taken) if self.counts_deliveries else taken
        taken = []
        while len(taken) < count_max:
            if self.expires_messages:
                self.expire_head(now_ms, arriving)
            batch = engine.take_many(1)
            if not batch:
                break
            message = batch[0]
            if self.bytes_max is not None:
                size = len(message.body)
                self.ready_bytes -= size
                self._in_flight_bytes[message.offset] = size
            taken.append(message)
        if self.expires_messages:
            # What the take brought to the head may have expired: gone before anyone counts
            # the queue (basic.get-ok's message count), as RabbitMQ's fetch drops it.
            self.expire_head(now_ms, arriving)
        return self._counted(taken) if self.counts_deliveries else taken

    @staticmethod
    def _counted(taken: list[Message]) -> list[Message]:
        return [
            _with_delivery_count(m) if m.delivery_count > 1 or m.failed_count else m for m in taken
        ]

    def _remove_head(self, reason: str) -> bool:
        """Drop the head message (expired, or beyond a length limit), or dead-letter it;
        False when there is none to take now."""
        if self.dead_letter_exchange is None:
            dropped = self._drop_one()
            self._count_deaths(reason, int(dropped))
            return dropped
        taken = self.engine.take_many(1)
        if not taken:
            return False
        message = taken[0]
        if self.bytes_max is not None:
            self.ready_bytes -= len(message.body)
        self.dead_letters.append((message, reason))
        self._count_deaths(reason, 1)
        return True

    def _drop_one(self) -> bool:
        """Drop the head message (expired, or beyond a length limit)."""
        if self.bytes_max is not None:
            head = self.engine.peek()
            if head is None:
                return False
            self.ready_bytes -= len(head.body)
        return self.engine.drop_head(1) == 1

    @property
    def expires_messages(self) -> bool:
        return self.message_ttl_ms is not None or self.has_expiring

    def _expiry_ms(self, message: Message) -> int | None:
        """When `message` expires (epoch ms), or None if it never does."""
        ttl_ms = self.message_ttl_ms
        if self.has_expiring:
            expiration = fastpath.scan_properties(message.properties)[2]
            if expiration is not None:
                # Validated at publish: a non-negative integer of milliseconds.
                own_ms = int(expiration)
                ttl_ms = own_ms if ttl_ms is None else min(ttl_ms, own_ms)
        return None if ttl_ms is None else message.timestamp_ms + ttl_ms

    def expire_head(self, now_ms: int, arriving: bool = False) -> int | None:
        """Drop expired messages at the head (RabbitMQ expires only there); returns when the
        new head expires (epoch ms), or None when nothing ready will. `arriving` spares a
        TTL-0 message of this millisecond (see `_take_many`)."""
        if self.deleted:
            return None
        engine = self.engine
        while True:
            head = engine.peek()
            if head is None:
                return None
            expiry_ms = self._expiry_ms(head)
            if expiry_ms is None or expiry_ms > now_ms:
                return expiry_ms
            if arriving and expiry_ms == head.timestamp_ms == now_ms:
                return expiry_ms
            if not self._remove_head(EXPIRED):
                return expiry_ms

    def enforce_length(self) -> int:
        """Drop from the head beyond x-max-length; returns how many went."""
        if self.deleted or self.reject_when_full:
            return 0
        dropped = 0
        length_max = self.length_max
        if length_max is not None:
            excess = self.engine.ready_count - length_max
            if excess > 0:
                if self.bytes_max is None and self.dead_letter_exchange is None:
                    dropped = self.engine.drop_head(excess)
                    self._count_deaths(MAXLEN, dropped)
                else:
                    while dropped < excess and self._remove_head(MAXLEN):
                        dropped += 1
        if self.bytes_max is not None:
            while self.ready_bytes > self.bytes_max and self._remove_head(MAXLEN):
                dropped += 1
        return dropped

    def ack(self, offsets: list[int]) -> None:
        if self.deleted:
            return
        self.counts.settled += len(offsets)
        if self.bytes_max is not None:
            for offset in offsets:
                self._in_flight_bytes.pop(offset, None)
        self.engine.ack_many(offsets)

    def settle_recovered(self, offsets: list[int]) -> None:
        """Dead letters a crash kept here after their targets stored them: they leave
        without being delivered (see `DeadLetterJournal`). Right after a restart, so
        `ready_bytes` (counted from zero then) never held them."""
        self.engine.settle_redeliveries(offsets)

    def reject(self, offsets: list[int]) -> None:
        """Deliveries rejected without requeue: dead-lettered, or dropped without a DLX."""
        if self.deleted:
            return
        self._die(offsets, REJECTED)

    def _die(self, offsets: list[int], reason: str) -> None:
        if self.dead_letter_exchange is None:
            self._count_deaths(reason, len(offsets))
            self.ack(offsets)
            return
        if self.bytes_max is not None:
            for offset in offsets:
                self._in_flight_bytes.pop(offset, None)
        dying = [(message, reason) for message in self.engine.in_flight(offsets)]
        self._count_deaths(reason, len(dying))
        self.dead_letters += dying

    def _count_deaths(self, reason: str, messages: int) -> None:
        self._dead_letter_counts.add(
            self.queue_type, self.dead_letter_exchange is not None, reason, messages
        )

    def stale_settled(self) -> None:
        self.stale_settles += 1

    def take_dead_letters(self) -> list[tuple[Message, str]]:
        dead_letters, self.dead_letters = self.dead_letters, []
        return dead_letters

    def dead_lettered(self, offsets: list[int]) -> None:
        """Dead letters every target now holds: they leave this queue (a refused publish
        was never in it)."""
        if self._refused_bcc:
            for offset in offsets:
                if offset < 0:
                    self._refused_bcc.pop(offset, None)
        self.ack([offset for offset in offsets if offset >= 0])

    def bcc_keys(self, offset: int) -> tuple[str, ...]:
        """The BCC keys of the dead letter at `offset`: a stored message's from the engine,
        a refused publish's as it came."""
        if offset < 0:
            return self._refused_bcc.get(offset, ())
        return self.engine.bcc_keys(offset)

    def retry_dead_letters(self, failed: list[tuple[Message, str]]) -> None:
        """Dead letters a target could not store: still in flight here, published again after
        DEAD_LETTER_RETRY_MS (see `run_timers`)."""
        if not self.deleted:
            self._dead_letter_retries += failed

    def _retry_due(self, now_ms: int) -> int | None:
        if not self._dead_letter_retries:
            return None
        if self._dead_letter_retry_ms is None:
            self._dead_letter_retry_ms = now_ms + DEAD_LETTER_RETRY_MS
        if now_ms < self._dead_letter_retry_ms:
            return self._dead_letter_retry_ms
        self.dead_letters += self._dead_letter_retries
        self._dead_letter_retries = []
        self._dead_letter_retry_ms = None
        return None

    def requeue(self, offsets: list[int], failed: bool) -> None:
        """Deliveries given back to be delivered again. `failed` (basic.reject, a lost
        channel, a visibility timeout) counts a failed delivery, which x-delivery-limit
        bounds; a return that is no failure (basic.nack, basic.recover, a consumer timeout)
        never dead-letters: RabbitMQ 4.3 (rabbit_fifo's return_one, PR 15387) allows
        unlimited returns."""
        if self.deleted:
            return
        limit = self.delivery_limit
        if failed and limit is not None:
            failures = self.engine.failures
            spent = [offset for offset in offsets if failures(offset) >= limit]
            if spent:
                self._die(spent, DELIVERY_LIMIT)
                spent_set = set(spent)
                offsets = [offset for offset in offsets if offset not in spent_set]
        if self.requeue_delay_ms is not None or (
            self.delayed_retry is not None and self.delayed_retry.applies(failed)
        ):
            self._requeued += [(offset, failed) for offset in offsets]
            return
        self._return(offsets, failed)

    def _return(self, offsets: list[int], failed: bool) -> None:
        self._count_ready_again(offsets)
        self.engine.requeue(offsets, failed)
        # RabbitMQ's requeue_and_run drops from the head beyond the limits.
        self.enforce_length()

    def _release(self, offsets: list[int]) -> None:
        self._count_ready_again(offsets)
        self.engine.release(offsets)
        self.enforce_length()

    def _count_ready_again(self, offsets: list[int]) -> None:
        if self.bytes_max is not None:
            sizes = self._in_flight_bytes
            self.ready_bytes += sum(sizes.pop(offset, 0) for offset in offsets)

    def _return_delay_ms(self, offset: int, failed: bool) -> int:
        """How long a return waits: RabbitMQ's delayed retry where it applies, linear in
        failed deliveries (this one included), else Warren's requeue delay, exponential in
        deliveries."""
        retry = self.delayed_retry
        if retry is not None and retry.applies(failed):
            return retry.delay_ms(self.engine.failures(offset) + failed)
        if self.requeue_delay_ms is not None:
            deliveries = self.engine.deliveries(offset)
            return min(self.requeue_delay_ms << min(deliveries - 1, 32), self.requeue_delay_max_ms)
        return 0

    def _back_off(self, now_ms: int) -> int | None:
        """Hand the requeues since the last call to the engine to hold until they are due,
        release those due by `now_ms`; returns when the next one is due."""
        backing_off = self._backing_off
        requeued, self._requeued = self._requeued, []
        if not self._delays_returns:
            # A policy took the delay away meanwhile: whatever waited is ready now.
            self._release([offset for _, offset in backing_off])
            self._backing_off = []
            for failed in (True, False):
                offsets = [offset for offset, failed_ in requeued if failed_ is failed]
                if offsets:
                    self._return(offsets, failed)
            return None
        engine = self.engine
        for offset, failed in requeued:
            due_ms = now_ms + self._return_delay_ms(offset, failed)
            if engine.hold([offset], due_ms, failed):
                heapq.heappush(backing_off, (due_ms, offset))
        due = []
        while backing_off and backing_off[0][0] <= now_ms:
            due.append(heapq.heappop(backing_off)[1])
        if due:
            self._release(due)
        return backing_off[0][0] if backing_off else None

    def purge(self) -> int:
        self.ready_bytes = 0
        return self.engine.purge()

    # -- timers ---------------------------------------------------------------------------

    @property
    def has_timers(self) -> bool:
        return (
            self.expires_messages
            or self.expires_ms is not None
            or self._delays_returns
            or bool(self._backing_off or self._requeued or self._dead_letter_retries)
        )

    def touch(self, now_ms: int) -> None:
        """A use (declare, basic.get, the last consumer gone) renews x-expires."""
        self.last_used_ms = now_ms

    def unused_expired(self, now_ms: int) -> bool:
        """x-expires: unused for that long with no consumer; the queue is to be deleted."""
        due_ms = self._unused_due_ms()
        return due_ms is not None and now_ms >= due_ms

    def _unused_due_ms(self) -> int | None:
        if self.expires_ms is None or self.consumers or self.deleted:
            return None
        return self.last_used_ms + self.expires_ms

    def run_timers(self, now_ms: int) -> int | None:
        """Drop the messages expired at the head by `now_ms`, so counts and depth follow TTL
        as in RabbitMQ's classic queues; returns when the queue next wants this called
        (epoch ms), or None for never."""
        due_ms = self.expire_head(now_ms) if self.expires_messages else None
        if self._delays_returns or self._backing_off or self._requeued:
            ready_ms = self._back_off(now_ms)
            if ready_ms is not None and (due_ms is None or ready_ms < due_ms):
                due_ms = ready_ms
        retry_ms = self._retry_due(now_ms)
        if retry_ms is not None and (due_ms is None or retry_ms < due_ms):
            due_ms = retry_ms
        unused_ms = self._unused_due_ms()
        if unused_ms is not None and (due_ms is None or unused_ms < due_ms):
            return unused_ms
        return due_ms

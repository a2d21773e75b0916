"""One virtual host: the queues it hosts, and the metadata commands that shape it.

The metadata state machine (``server/metadata``) is the one authority for topology: it holds
the vhost's Router (exchanges and bindings) and queue records, checks every declare, delete,
bind and unbind as RabbitMQ does, and persists what is durable. This class turns channel
methods into its commands and keeps the running side in step: a ``WorkQueue`` (engine plus
consumers) for every queue record.

Every topology change is awaited before the client gets its -ok, so a declare-ok for a
durable entity means it survives a restart.

In a cluster, every queue record names the node that leads it (`QueueRecord.node`, chosen
here when a declare proposes it: `queue_leader_node`); a vhost hosts the queues its node
leads, and the broker opens and retires them as entries proposed anywhere apply
(`host_declared`, `retire_queue`). A queue another node leads is a `RemoteQueue` here
(`self.remote`, placed by `server/forward`), which forwards its work to that node.

A new queue's storage is opened before its record is written: a declare that cannot be
honoured (no descriptors, a full disk) leaves no record behind, and a crash between the two
leaves only a directory that no record names, which recovery deletes. A queue whose storage
fails to open at recovery keeps its record and its files; it is answered as RabbitMQ answers
a crashed queue (404) until a declare opens it again, and the other queues carry on.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import enum
import errno
import hashlib
import logging
import os
import urllib.parse
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, cast

from warrenmq.amqp import fastpath, frames
from warrenmq.amqp.properties import HEADERS_FLAG_BYTE0
from warrenmq.dlq.dead_letter import DELIVERY_LIMIT, REJECTED, cycling, dead_letter
from warrenmq.exchanges.binding import EXCHANGE, QUEUE, Destination
from warrenmq.exchanges.delayed import DelayedTarget
from warrenmq.exchanges.errors import AccessRefused, NotFound, PreconditionFailed
from warrenmq.exchanges.field_values import amqp_type_name
from warrenmq.exchanges.router import Router
from warrenmq.exchanges.super_stream import PARTITION_ORDER, SUPER_STREAM, SuperStreamExchange
from warrenmq.log import RawRecord
from warrenmq.server.metadata import commands as mc
from warrenmq.server.metadata import partitions
from warrenmq.server.metadata.records import SINGLE_NODE_ID, QueueRecord
from warrenmq.server.metadata.state import strip_cr_lf

from .dead_letter_journal import DeadLetterJournal, Item, digest
from .delayed import DelayedExchanges, DelayedMessageLog
from .delayed.store import DelayedHandoff
from .errors import internal_error, not_implemented, precondition_failed
from .forward.coordination import MemberElsewhere, described_elsewhere
from .forward.entry import RemoteCursor, RemoteQueue
from .queue import arguments as queue_arguments
from .queue import policy
from .queue.consumer import Consumer, ConsumerChannel
from .queue.dead_letter_counts import DeadLetterCounts
from .queue.engine import Message, QueueEngine
from .queue.log_queue import remove_directory
from .queue.work_queue import WorkQueue
from .replication import replicated, replicates
from .stream import arguments as stream_arguments
from .stream import offset_spec, super_stream
from .stream.cursor import Cursor
from .stream.filter import consume_filter
from .stream.groups import GROUP_ARGUMENT, Group, Member, MemberStandIn, attach_partition
from .stream.stream import Stream

log = logging.getLogger("warrenmq.server")

REPLY_TO_QUEUE = "amq.rabbitmq.reply-to"
REPLY_TO_PREFIX = REPLY_TO_QUEUE + "."
# Queues shutting down at once; each waits on its fsyncs meanwhile.
SHUTDOWN_CONCURRENT_MAX = 64
_DIRECTORY_NAME_CHARS_MAX = 200
# Exchange names and routing keys keep their encoded form in a small cache; a flood of
# distinct keys just clears it.
_ENCODED_NAMES_MAX = 1024
DEAD_LETTER_EXCHANGE = "x-dead-letter-exchange"
LEADER_LOCATOR_ARGUMENT = "x-queue-leader-locator"
LEADER_LOCATOR_POLICY_KEY = "queue-leader-locator"
CLIENT_LOCAL = "client-local"
BALANCED = "balanced"
OTHER_NODE = "other-node"


class Published(enum.Enum):
    """What became of one publish."""

    ROUTED = "routed"
    """Staged on every queue it was routed to."""
    REFUSED = "refused"
    """Routed, and refused by at least one queue (x-overflow reject-publish): nack it."""
    UNROUTABLE = "unroutable"
    """No queue took it: return it to a mandatory publisher."""
    REPLIED = "replied"
    """A direct reply-to message, handed to the waiting reply consumer (never stored)."""


Route = tuple[Any, bytes, tuple[str, ...]]
"""Where a message goes: (queue names, its properties as they are to be stored, BCC removed,
the BCC header's keys, kept beside the message for its dead letter). A plain tuple: one is
made per publish."""


def _header_strings(headers: dict, name: str) -> list[str]:
    """The strings of a CC or BCC header (RabbitMQ's sender-selected distribution: an array
    of long strings; anything else in it is ignored)."""
    values = headers.get(name)
    if not isinstance(values, list):
        return []
    strings = []
    for value in values:
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        if isinstance(value, str):
            strings.append(value)
    return strings


def _sender_selected_keys(routing_key: str, headers: dict) -> list[str]:
    """The routing key plus the CC and BCC headers' strings, each once."""
    keys = [routing_key]
    for header in ("CC", "BCC"):
        for value in _header_strings(headers, header):
            if value not in keys:
                keys.append(value)
    return keys


def _without_bcc(properties: bytes, decoded: Any) -> bytes:
    """The properties as stored: RabbitMQ removes BCC before storing; CC stays visible."""
    headers = decoded.headers
    if not headers or "BCC" not in headers:
        return properties
    decoded.headers = {k: v for k, v in headers.items() if k != "BCC"}
    return frames.encode_properties(decoded)


def stored_properties(properties: bytes) -> bytes:
    """A message's property bytes as the core stores (and returns) it: without BCC."""
    if not (properties and properties[0] & HEADERS_FLAG_BYTE0):
        return properties
    return _without_bcc(properties, frames.decode_properties(properties))


DeadLetterPlan = tuple[
    RawRecord, bool, list[WorkQueue], list[DelayedTarget], tuple[str, ...], int, bool
]
"""A dead letter's record, persistence, target queues and delayed exchanges, BCC keys,
failed deliveries, and whether a target has no leader now (it is published again later)."""
"""A dead letter's record, whether persistent, its target queues and delayed exchanges, the
BCC keys it keeps and the failed deliveries it carries (`Kept`)."""
# The reasons a dead letter dies of a failed delivery, counted as one more before it goes on,
# as RabbitMQ 4's quorum queues count it (rabbit_fifo's incr_msg_headers).
FAILED_DELIVERY_REASONS = frozenset((REJECTED, DELIVERY_LIMIT))
"""For one dead letter: its record, whether persistent, its target queues and delayed
exchanges (none: dropped), and the BCC keys it keeps in its targets."""


@dataclasses.dataclass(frozen=True, slots=True)
class UnhostedQueue:
    """What a declare of a queue this node does not host answers with: one another node
    leads (a new queue's counts, 0 and 0, until forwarding asks the leader for the real
    ones), or one an entry applied right after the declare deleted."""

    name: str
    node: int
    ready_count: int = 0
    consumer_count: int = 0


class DeadLetterHandoff:
    """The dead letters one queue published in one tick, waiting until their targets hold
    them. The tick confirms it as it confirms a publishing channel (`publish_failed` for a
    dead letter a target could not store, then `confirm`), and only then do the dead letters
    leave their queue: a crash before that brings them back, never loses them. One whose
    write failed stays in flight there and is published again later
    (`WorkQueue.retry_dead_letters`)."""

    def __init__(
        self,
        queue: WorkQueue,
        dead_letters: list[tuple[Message, str]],
        wake: Callable[[WorkQueue], None],
    ):
        self.queue = queue
        self.dead_letters = dead_letters
        """(message, reason) by tag - 1 (offset -1: a refused publish, never stored here)."""
        self._failed: set[int] = set()
        self._wake = wake
        self.settled: Callable[[], None] | None = None
        """Called once the dead letters left the queue (the journal forgets the hand-off)."""

    def publish_failed(self, tag: int) -> None:
        self._failed.add(tag)

    def confirm(self, _through_tag: int, _refused: object) -> None:
        failed = self._failed
        settled = [m.offset for tag, (m, _) in enumerate(self.dead_letters, 1) if tag not in failed]
        self.queue.dead_lettered(settled)
        if self.settled is not None:
            self.settled()
        if failed:
            self.queue.retry_dead_letters([self.dead_letters[tag - 1] for tag in sorted(failed)])
        self._wake(self.queue)


def _refuse_staged(queue: WorkQueue | RemoteQueue) -> None:
    """Refuse (nack) the publishes staged on a queue that stops being served here, not yet
    written or sent: the tick skips a deleted queue and would confirm them, as it confirms
    those to a queue deleted meanwhile (RabbitMQ does), but nothing holds them."""
    for publisher in queue.drop_staged():
        if publisher is not None:
            channel, tag = publisher
            channel.publish_failed(tag)


def check_expiration(expiration: str) -> None:
    """rabbit_basic:parse_expiration: a message's expiration property must be a whole
    non-negative number of milliseconds (406 otherwise), checked before it is published."""
    digits = expiration.lstrip("-")
    count = len(digits) - len(digits.lstrip("0123456789"))
    if count == 0:
        reason = "no_integer"
    elif count < len(digits):
        reason = f'{{leftover_string,"{digits[count:]}"}}'
    elif expiration.startswith("-"):
        reason = f"{{value_negative,{int(expiration)}}}"
    elif int(expiration) > queue_arguments.EXPIRY_MS_MAX:
        reason = f"{{value_too_large,{int(expiration)},{queue_arguments.EXPIRY_MS_MAX}}}"
    else:
        return
    raise precondition_failed(f"invalid expiration '{expiration}': {reason}")


def generated_name(prefix: str) -> str:
    """RabbitMQ's rabbit_guid style: a prefix + 22 url-safe base64 characters."""
    return prefix + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")


def directory_name(name: str) -> str:
    """A file-system-safe directory name for a vhost or queue name (any shortstr)."""
    quoted = urllib.parse.quote(name, safe="") or "%"
    if quoted in (".", "..") or len(quoted) > _DIRECTORY_NAME_CHARS_MAX:
        return "h-" + hashlib.sha256(name.encode()).hexdigest()
    return quoted


def describe(error: BaseException) -> str:
    """An error for a client: the errno's name and text, without the server's paths."""
    if isinstance(error, OSError) and error.errno is not None:
        return f"{errno.errorcode.get(error.errno, error.errno)} ({error.strerror})"
    return f"{type(error).__name__}: {error}"


class VirtualHost:
    """The broker core for one vhost: every caller (the AMQP session, dead-lettering, the
    HTTP API) publishes, declares and consumes through it.

    The process around it answers through narrow callbacks: `staged(queue)` tells the tick
    that a queue has records to write, `wake(queue)` that it may deliver, commit, or want
    its timers run; `deliver_reply(routing_key, exchange, properties, body)` hands a direct
    reply-to message to its waiting consumer, False if there is none; `background(work)`
    runs a metadata write nobody waits for; `clock()` is the time (epoch ms) the core passes
    to its queues; `confirm(handoff, tag)` has the tick confirm dead letters staged so far
    once they are stored (see `DeadLetterHandoff`). `open_delayed(directory)` opens the store
    of a delayed exchange (`delayed`, the vhost's `DelayedExchanges`). `dead_letter_counts`
    counts the messages that die in its queues (the process's totals, shared by vhosts).
    """

    def __init__(
        self,
        name: str,
        data_dir: Path,
        store: Any,
        *,
        open_engine: Callable[[Path, str, Mapping[str, Any]], QueueEngine],
        batch_records_max: int,
        staged: Callable[[WorkQueue], None],
        wake: Callable[[WorkQueue], None],
        deliver_reply: Callable[[str, str, bytes, bytes], bool],
        background: Callable[[Awaitable[Any]], asyncio.Future[Any]],
        clock: Callable[[], int],
        confirm: Callable[[DeadLetterHandoff | DelayedHandoff, int], None],
        open_delayed: Callable[[Path], DelayedMessageLog],
        dead_letter_counts: DeadLetterCounts,
        node_id: int = SINGLE_NODE_ID,
        leader_locator: str = CLIENT_LOCAL,
        replicate: bool = False,
    ) -> None:
        self.name = name
        self.node_id = node_id
        self.replicate = replicate
        """Whether this node replicates queues (`server/replication.py`)."""
        self.leader_locator = leader_locator
        """Where new queues go when neither their argument nor a policy says."""
        self._dead_letter_counts = dead_letter_counts
        self.store = store
        self.queues: dict[str, WorkQueue] = {}
        self.remote: dict[str, RemoteQueue] = {}
        """Queues another node leads, which this node forwards to (`server/forward`)."""
        self._staged = staged
        self._wake = wake
        self._deliver_reply = deliver_reply
        self._background = background
        self._clock = clock
        self._confirm = confirm
        self._encoded_names: dict[str, bytes] = {}
        self.directory = data_dir / "queues" / directory_name(name)
        self._open_engine = open_engine
        self._batch_records_max = batch_records_max
        # Engines of declares whose record is being written. A concurrent use of the queue
        # hosts this engine; the files are never opened twice.
        self._opening: dict[str, Any] = {}
        self.groups: dict[tuple[str, str], Group] = {}
        """Consumer groups with members this node coordinates, by (super stream, group)."""
        self.members_elsewhere: dict[tuple[str, str], set[MemberElsewhere]] = {}
        """This node's members of groups another node coordinates, by (super stream, group)."""
        self.failed: dict[str, str] = {}
        """Queues whose storage failed to open, with the error: the record stays, uses get 404."""
        # The vhost's policies as its queues last took them (`apply_policies`).
        self._policies_applied: Mapping[str, Any] | None = None
        self.journal = DeadLetterJournal(
            data_dir / "dead-letters" / f"{directory_name(name)}.journal"
        )
        # Each source queue's newest hand-off still on its way (`dead_letter`), until it ends.
        self._handoffs_pending: dict[WorkQueue, asyncio.Future[Any]] = {}
        delayed_directory = data_dir / "delayed" / directory_name(name)
        self.delayed = DelayedExchanges(
            self,
            delayed_directory,
            lambda exchange: delayed_directory / directory_name(exchange),
            open_log=open_delayed,
            batch_records_max=batch_records_max,
            staged=staged,
            wake=wake,
            confirm=confirm,
            background=background,
            clock=clock,
        )

    @property
    def router(self) -> Router:
        return self.store.state.router(self.name)

    async def _apply(self, command: Any) -> Any:
        # What the entry deleted (queues, delayed exchanges' stores) the broker retires as it
        # applies, for entries proposed here and elsewhere alike (`Broker.metadata_applied`).
        return await self.store.apply(command)

    # -- publishing -----------------------------------------------------------------------

    def publish(
        self,
        exchange: str,
        routing_key: str,
        properties: bytes,
        body: bytes,
        persistent: bool,
        expiring: bool = False,
        publisher: Any = None,
    ) -> Published:
        """Route a message and stage it on its queues (written by the next tick).

        `publisher` is whoever waits for it to be stored (see `WorkQueue.stage`).
        """
        if exchange == "":
            if routing_key.startswith(REPLY_TO_PREFIX):
                replied = self._deliver_reply(routing_key, exchange, properties, body)
                return Published.REPLIED if replied else Published.UNROUTABLE
            if not (properties and properties[0] & HEADERS_FLAG_BYTE0):
                # The commonest publish: to the queue the key names, no CC/BCC possible. The
                # same as `stage(route(...))`, without the intermediate tuples.
                queue = self.queues.get(routing_key)
                if queue is None:
                    queue = self.remote.get(routing_key)  # type: ignore[assignment]
                    if queue is None:
                        if self.unled(routing_key):
                            return Published.REFUSED
                        return Published.UNROUTABLE
                routing_key_bytes = self._encoded_names.get(routing_key)
                if routing_key_bytes is None:
                    routing_key_bytes = self._encoded(routing_key)
                record = (b"", routing_key_bytes, properties, body)
                if not queue.stage(record, persistent, expiring, publisher):
                    self._refused(queue)
                    return Published.REFUSED
                self._staged(queue)
                return Published.ROUTED
        route = self.route(exchange, routing_key, properties)
        return self.stage(route, exchange, routing_key, body, persistent, expiring, publisher)

    def route(
        self, exchange: str, routing_key: str, properties: bytes, internal_allowed: bool = False
    ) -> Route:
        """The queues a message goes to (sender-selected CC/BCC included), without staging
        it: a transaction routes at publish and stages at commit, as RabbitMQ does.
        `internal_allowed`: the broker publishes (a delayed message when due)."""
        headers = None
        routing_keys = None
        bcc: tuple[str, ...] = ()
        if properties and properties[0] & HEADERS_FLAG_BYTE0:
            decoded = frames.decode_properties(properties)
            headers = decoded.headers
            if headers and ("CC" in headers or "BCC" in headers):
                routing_keys = _sender_selected_keys(routing_key, headers)
                if "BCC" in headers:
                    # RabbitMQ keeps them with the message (its routing keys) and routes its
                    # dead letter by them, though the header itself is never delivered.
                    bcc = tuple(_header_strings(headers, "BCC"))
                    properties = _without_bcc(properties, decoded)
        if exchange == "" and routing_keys is None:
            # The default exchange routes to the queue named by the key: no Router call (and
            # no set built) on the commonest path.
            routed = (
                routing_key in self.queues or routing_key in self.remote or self.unled(routing_key)
            )
            return ((routing_key,) if routed else ()), properties, bcc
        router = self.router
        if routing_keys is None and not internal_allowed:
            return router.route(exchange, routing_key, headers), properties, bcc
        routed = router.route_keys(
            exchange, routing_keys or (routing_key,), headers, internal_allowed=internal_allowed
        )
        return routed, properties, bcc

    def stage(
        self,
        route: Route,
        exchange: str,
        routing_key: str,
        body: bytes,
        persistent: bool,
        expiring: bool,
        publisher: Any,
    ) -> Published:
        """Stage a routed message on each of its queues that still exists (with its BCC keys),
        and in each delayed exchange that holds it."""
        queue_names, properties, bcc = route
        if not queue_names:
            return Published.UNROUTABLE
        names = self._encoded_names
        exchange_bytes = names.get(exchange)
        if exchange_bytes is None:
            exchange_bytes = self._encoded(exchange)
        routing_key_bytes = names.get(routing_key)
        if routing_key_bytes is None:
            routing_key_bytes = self._encoded(routing_key)
        record = (exchange_bytes, routing_key_bytes, properties, body)
        refused = False
        held = 0
        queues = self.queues
        staged = self._staged
        for name in queue_names:
            queue = queues.get(name)
            if queue is None:
                queue = self.remote.get(name)  # type: ignore[assignment]
            if queue is not None:
                if (
                    queue.stage_kept(record, persistent, expiring, publisher, bcc=bcc)
                    if bcc
                    else queue.stage(record, persistent, expiring, publisher)
                ):
                    staged(queue)
                else:
                    self._refused(queue)
                    refused = True
            elif type(name) is DelayedTarget:
                held += 1
                refused |= not self.delayed.stage(name, record, persistent, publisher)
            elif self.unled(name):
                refused = True
        if refused:
            return Published.REFUSED
        # As the plugin: a held message reached no queue yet, so a mandatory one is returned.
        return Published.UNROUTABLE if held == len(queue_names) else Published.ROUTED

    def unled(self, name: str) -> bool:
        """A replicated queue served neither here nor elsewhere: it has no leader, or this
        node stepped down and waits to learn the next. A publish to it is refused (nacked),
        not confirmed as unroutable: it was routed, and nothing stored it."""
        if not self.replicate or name in self.queues or name in self.remote:
            return False
        record = self.store.state.queue(self.name, name)
        return record is not None and replicated(record)

    def restage(
        self,
        queue: WorkQueue,
        record: RawRecord,
        persistent: bool,
        expiring: bool,
        publisher: Any,
        bcc: tuple[str, ...] = (),
        failures: int = 0,
    ) -> bool:
        """Stage a stored record, unchanged, on one queue (a redrive moving a dead letter
        back, or keeping it, with `bcc` its BCC keys; a dead letter forwarded here, with
        the failed deliveries it carries); False when the queue refuses it (x-overflow
        reject-publish)."""
        if queue.deleted or not queue.stage_kept(
            record, persistent, expiring, publisher, bcc=bcc, failures=failures
        ):
            self._refused(queue)
            return False
        self._staged(queue)
        return True

    def wake(self, queue: WorkQueue) -> None:
        """Have the tick deliver the queue's ready messages and commit what changed."""
        self._wake(queue)

    def _refused(self, queue: WorkQueue) -> None:
        """x-overflow reject-publish-dlx dead-letters what it refuses: the tick publishes it."""
        if queue.dead_letters:
            self._wake(queue)

    def dead_letter(self, queue: WorkQueue) -> None:
        """Publish a queue's dead letters to its dead-letter exchange, as RabbitMQ routes
        them (`dlq.dead_letter`); each leaves the queue once every target holds it. With no
        such exchange, no route, or only targets that would cycle, a dead letter is dropped.

        When a dead letter goes to a queue, the hand-off is written to the journal first
        (`DeadLetterJournal`), and staged once that is durable: a crash after the targets
        stored it and before its queue acknowledged it does not deliver it twice.

        A queue's hand-offs are staged in the order they were made, whichever journal write
        ends first: its targets get its dead letters in the order they died (but for one
        whose journal write failed: it stays in flight and is published again later)."""
        dead_letters = queue.take_dead_letters()
        if not dead_letters:
            return
        handoff = DeadLetterHandoff(queue, dead_letters, self._wake)
        plan = self._dead_letter_plan(queue, dead_letters)
        items = []
        positions: dict[str, set[int]] = {}
        for (message, _), (record, _, targets, _, _, _, unled) in zip(
            dead_letters, plan, strict=True
        ):
            if message.offset < 0 or not targets or unled:
                continue
            if any(isinstance(target, RemoteQueue) for target in targets):
                # A queue led elsewhere has no log here for recovery to find it in: a crash
                # before the source settled brings the dead letter back (at least once).
                continue
            item = Item(message.offset, message[2:6])
            for target in targets:
                item.targets.append((target.name, digest(record)))
                positions.setdefault(target.name, set()).add(
                    target.engine.append_position(record[2])
                )
            items.append(item)
        pending = self._handoffs_pending
        previous = pending.get(queue)
        if not items and previous is None:
            self._stage_dead_letters(handoff, plan)
            return
        task = self._background(self._journal_then_stage(handoff, plan, items, positions, previous))
        pending[queue] = task
        task.add_done_callback(lambda ended: self._handoff_ended(queue, ended))

    def _handoff_ended(self, queue: WorkQueue, ended: asyncio.Future[Any]) -> None:
        if self._handoffs_pending.get(queue) is ended:
            del self._handoffs_pending[queue]

    def _dead_letter_plan(
        self, queue: WorkQueue, dead_letters: list[tuple[Message, str]]
    ) -> list[DeadLetterPlan]:
        """For each dead letter its `DeadLetterPlan` (no targets: dropped)."""
        exchange = queue.dead_letter_exchange
        router = self.router
        if exchange is None or (exchange != "" and router.get(exchange) is None):
            return [((b"", b"", b"", b""), False, [], [], (), 0, False) for _ in dead_letters]
        now_s = self._clock() // 1000
        exchange_bytes = self._encoded(exchange)
        plan = []
        dead_letter_routing_key = queue.dead_letter_routing_key
        for message, reason in dead_letters:
            bcc = queue.bcc_keys(message.offset)
            properties, keys = dead_letter(
                message.properties,
                queue=queue.name,
                reason=reason,
                exchange=message.exchange.decode("utf-8", "replace"),
                routing_key=message.routing_key.decode("utf-8", "replace"),
                dead_letter_routing_key=dead_letter_routing_key,
                now_s=now_s,
                bcc=bcc,
            )
            headers = (
                frames.decode_properties(properties).headers
                if properties[0] & HEADERS_FLAG_BYTE0
                else None
            )
            record = (exchange_bytes, self._encoded(keys[0]), properties, message.body)
            persistent = fastpath.scan_properties(properties)[0] == 2
            queues, delayed = [], []
            unled = False
            for name in router.route_keys(exchange, keys, headers, internal_allowed=True):
                target = self.queues.get(name)
                if target is None:
                    target = self.remote.get(name)  # type: ignore[assignment]
                if target is not None and not cycling(reason, properties, name):
                    queues.append(target)
                elif type(name) is DelayedTarget:
                    delayed.append(name)
                elif target is None and self.unled(name):
                    unled = True
            # RabbitMQ's dead letter keeps the keys it was routed by: BCC ones too, unless a
            # dead-letter routing key replaced them all.
            kept_bcc = bcc if dead_letter_routing_key is None else ()
            failures = message.failed_count + (reason in FAILED_DELIVERY_REASONS)
            plan.append((record, persistent, queues, delayed, kept_bcc, failures, unled))
        return plan

    async def _journal_then_stage(
        self,
        handoff: DeadLetterHandoff,
        plan: list[DeadLetterPlan],
        items: list[Item],
        positions: dict[str, set[int]],
        previous: asyncio.Future[Any] | None,
    ) -> None:
        """Journal the hand-off (no `items`: nothing to journal), then stage it once
        `previous`, the same queue's hand-off before it, has ended: journal writes may end
        in any order, and a later hand-off staged first would overtake its dead letters."""
        queue = handoff.queue
        handoff_id = None
        failed = None
        if items:
            try:
                handoff_id = await self.journal.record(queue.name, items, positions)
            except OSError as error:
                failed = error
        if previous is not None:
            # Waited for even after a failed write: a hand-off ends only after the one before
            # it, so the newest pending one is all the next has to wait for. `wait`, not
            # `await`: its failure is its own, and does not stop this one.
            await asyncio.wait([previous])
        if failed is not None:
            log.error(
                "queue '%s' in vhost '%s': the dead-letter journal failed, its dead letters "
                "wait: %s",
                queue.name,
                self.name,
                describe(failed),
            )
            queue.retry_dead_letters(handoff.dead_letters)
            self._wake(queue)
            return
        if handoff_id is not None:
            journaled = handoff_id
            handoff.settled = lambda: self._background(self._settle(queue, journaled))
        self._stage_dead_letters(handoff, plan)

    async def _settle(self, queue: WorkQueue, handoff_id: int) -> None:
        """The hand-off's dead letters left their queue: once that is durable, the journal
        forgets it."""
        await queue.commit()
        self.journal.settle(handoff_id)

    def _stage_dead_letters(
        self,
        handoff: DeadLetterHandoff,
        plan: list[DeadLetterPlan],
    ) -> None:
        if handoff.queue.deleted:
            return
        for tag, (record, persistent, queues, delayed, bcc, failures, unled) in enumerate(plan, 1):
            if unled or any(target.deposed for target in queues):
                # A target with no leader, or whose leader moved since the plan: staged on
                # none of them, and published again later.
                handoff.publish_failed(tag)
                continue
            for target in queues:
                if not target.deleted and target.stage_kept(
                    record, persistent, False, (handoff, tag), bcc=bcc, failures=failures
                ):
                    self._staged(target)
            for name in delayed:
                if not self.delayed.stage(name, record, persistent, (handoff, tag)):
                    handoff.publish_failed(tag)
        self._confirm(handoff, len(plan))

    def _recover_dead_letters(self) -> None:
        """Hand-offs a crash interrupted: a dead letter every target holds leaves its queue."""
        touched: list[WorkQueue] = []
        for entry in self.journal.load():
            source = self.queues.get(entry["queue"])
            if source is None:
                continue
            stored: Counter[tuple[str, str]] = Counter()
            for name, found_from in entry["positions"].items():
                target = self.queues.get(name)
                if target is not None and found_from:
                    for _, record in target.engine.stored_from(found_from):
                        stored[(name, digest(record))] += 1
            settled = []
            for offset, source_digest, targets in entry["items"]:
                keys = [(name, target_digest) for name, target_digest in targets]
                if not keys or any(stored[key] <= 0 for key in keys):
                    continue
                browsed = source.engine.browse(offset, 1)
                if not browsed or browsed[0][0].offset != offset:
                    continue
                if digest(browsed[0][0][2:6]) != source_digest:
                    continue
                stored.subtract(keys)
                settled.append(offset)
            if settled:
                source.settle_recovered(settled)
                touched.append(source)
                self._wake(source)
                log.info(
                    "queue '%s' in vhost '%s': %d dead letter(s) its targets stored before a "
                    "crash leave it now",
                    source.name,
                    self.name,
                    len(settled),
                )
        self._background(self._compact_journal(touched))

    async def _compact_journal(self, touched: list[WorkQueue]) -> None:
        for queue in touched:
            await queue.commit()
        await self.journal.compact()

    def dead_letter_queues(self) -> dict[str, list[str]]:
        """Each queue dead letters can reach, with the queues whose dead-letter exchange
        (argument or policy) leads there: through its dead-letter routing key when it has
        one, else through any binding of the exchange (and of exchanges bound to it). Queues
        another node leads count too, as sources and as targets: all of this is metadata."""
        router = self.router
        reached: dict[str, set[str]] = {}
        # Those another node leads too: their arguments and policies are metadata.
        for queue in [*self.queues.values(), *self.remote.values()]:
            exchange = queue.dead_letter_exchange
            if exchange is None:
                continue
            key = queue.dead_letter_routing_key
            if key is not None:
                names = router.route_keys(exchange, (key,), None, internal_allowed=True)
            elif exchange == "":
                continue
            else:
                names = self._bound_queues(router, exchange)
            for name in names:
                if name in self.queues or name in self.remote:
                    reached.setdefault(name, set()).add(queue.name)
        return {name: sorted(sources) for name, sources in sorted(reached.items())}

    @staticmethod
    def _bound_queues(router: Router, exchange: str) -> set[str]:
        queues: set[str] = set()
        seen = {exchange}
        waiting = [exchange]
        while waiting:
            for binding in router.bindings(waiting.pop()):
                kind, name = binding.destination
                if kind == QUEUE:
                    queues.add(name)
                elif name not in seen:
                    seen.add(name)
                    waiting.append(name)
        return queues

    def _encoded(self, name: str) -> bytes:
        names = self._encoded_names
        encoded = names.get(name)
        if encoded is None:
            if len(names) >= _ENCODED_NAMES_MAX:
                names.clear()
            encoded = names[name] = name.encode()
        return encoded

    # -- queues ---------------------------------------------------------------------------

    def queue_directory(self, name: str) -> Path:
        return self.directory / directory_name(name)

    def queue_leader_node(self, name: str, arguments: Mapping[str, Any], exclusive: bool) -> int:
        """Where a new queue goes: the node of the declaring client ("client-local", the
        default, and always for an exclusive queue, whose connection is here), else the
        member leading the fewest queues. The policy's queue-leader-locator wins over the
        argument, as in RabbitMQ 3.10."""
        if exclusive:
            return self.node_id
        locator = arguments.get(LEADER_LOCATOR_ARGUMENT, self.leader_locator)
        chosen = policy.queue_policy(
            name,
            queue_arguments.queue_type(arguments),
            self.store.state.policies(self.name).values(),
        )
        if chosen is not None:
            locator = chosen.definition.get(LEADER_LOCATOR_POLICY_KEY, locator)
        if isinstance(locator, bytes):
            locator = locator.decode(errors="replace")
        if locator == CLIENT_LOCAL:
            return self.node_id
        running = self.store.reachable_nodes()
        if locator == OTHER_NODE:
            return self.store.state.balanced_node(self.node_id, self.node_id, running)
        return self.store.state.balanced_node(self.node_id, among=running)

    def queue_replicas(
        self,
        name: str,
        arguments: Mapping[str, Any],
        *,
        durable: bool,
        exclusive: bool,
        leader: int,
    ) -> tuple[int, ...]:
        """A new queue's replica set: `leader` first, then followers on the members holding
        the fewest replicas, running ones first; as many as its type, arguments and policy
        ask for, else the default (`metadata.partitions`)."""
        state = self.store.state
        queue_type = queue_arguments.queue_type(arguments)
        chosen = policy.queue_policy(name, queue_type, state.policies(self.name).values())
        count = partitions.replica_count(
            queue_type,
            arguments,
            chosen.definition if chosen is not None else None,
            len(state.nodes),
            durable=durable,
            exclusive=exclusive,
        )
        if count == 1:
            return (leader,)
        return state.place_replicas(leader, count, self.store.reachable_nodes())

    def get_queue(self, name: str, owner: str) -> WorkQueue:
        """The queue for passive declare, consume, get, bind, purge: 404, or 405 if locked."""
        record = self.store.state.lookup_queue(self.name, name, owner)
        queue = self.queues.get(record.name)
        if queue is None:
            remote = self.remote.get(record.name)
            if remote is not None:
                return remote  # type: ignore[return-value]
            if record.name not in self._opening:
                raise self._crashed(record.name)
            queue = self._host(record, self._opening.pop(record.name))
        # Publishes staged earlier in this tick come first, as they would in RabbitMQ.
        queue.flush(self._clock())
        return queue

    def metadata_read_barrier(self) -> Awaitable[None] | None:
        """What a client's metadata read (a passive declare) awaits first, in a cluster:
        until this node's state holds every change acknowledged through any node
        (`ReplicatedMetadata.read_barrier`). None on a single node, which has nothing to wait
        for."""
        store = self.store
        return store.read_barrier() if store.clustered else None

    def check_queue(self, name: str, owner: str) -> WorkQueue:
        """queue.declare passive: the queue (404, or 405 if locked). A use, as RabbitMQ
        counts it: it renews x-expires."""
        return self._used(self.get_queue(name, owner))

    async def declare_queue(
        self,
        name: str,
        *,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        arguments: Mapping[str, Any],
        owner: str,
        server_named: bool,
        user: str | None,
    ) -> WorkQueue:
        """Declare a queue, or redeclare an equivalent one. `user` is whom a client's declare
        acts for (None: the broker's own, as a definitions import), checked as rabbit_channel
        checks a new queue's dead-letter exchange."""
        node = self.queue_leader_node(strip_cr_lf(name), arguments, exclusive)
        replicas = self.queue_replicas(
            strip_cr_lf(name), arguments, durable=durable, exclusive=exclusive, leader=node
        )
        command = mc.DeclareQueue(
            self.name,
            name,
            durable=durable,
            exclusive=exclusive,
            auto_delete=auto_delete,
            arguments=dict(arguments),
            owner=owner,
            server_named=server_named,
            node=node,
            replicas=replicas,
            # Every replica of a new queue holds all of it (nothing): all are in sync, as
            # Kafka's new partitions are, so its first publishes need not wait for the
            # followers to join. A queue not replicated is in sync on its leader alone.
            isr=replicas
            if self.replicate and replicates(replicas, durable, exclusive, arguments)
            else (),
        )
        name = strip_cr_lf(name)
        # A declare of the same new queue still waiting for its command to apply has the
        # storage open already: this one is a redeclaration, checked when it applies after it.
        existing = self.store.state.queue(self.name, name)
        if existing is not None or name in self._opening or node != self.node_id:
            if node != self.node_id and existing is None:
                self._check_new_queue(
                    name, durable, exclusive, auto_delete, arguments, server_named, user
                )
            outcome = await self._apply(command)
            record = outcome.queue
            remote = self.remote.get(record.name)
            if remote is not None:
                await remote.refresh_counts()
                return self._used(remote)  # type: ignore[arg-type]
            if (
                record.node != self.node_id
                or self.store.state.queue(self.name, record.name) is None
            ):
                return cast(WorkQueue, UnhostedQueue(record.name, record.node))
            return self._used(self._hosted(record))
        self._check_new_queue(name, durable, exclusive, auto_delete, arguments, server_named, user)
        deleted = self.queues.get(name)
        if deleted is not None:
            # A delete of it applied, and its caller resumes later to retire it: retire it now,
            # or that would take away the directory of the queue declared here.
            self.retire_queue(deleted)
        engine = self._open_new(name, arguments)
        self._opening[name] = engine
        try:
            outcome = await self._apply(command)
        except BaseException:
            if self._opening.pop(name, None) is engine:
                engine.delete()
            raise
        record = outcome.queue
        hosted = self.queues.get(record.name)
        state = self.store.state
        if record.node != self.node_id:
            # Declared first through another node, which leads it: this declare was a
            # redeclaration there. Hosting it here too would leave a second, local queue
            # shadowing the forwarded one (and the forwarder then never retired).
            if self._opening.get(record.name) is engine:
                del self._opening[record.name]
                engine.delete()
            remote = self.remote.get(record.name)
            if remote is not None and not remote.deleted:
                await remote.refresh_counts()
                return self._used(remote)  # type: ignore[arg-type]
            return cast(WorkQueue, UnhostedQueue(record.name, record.node))
        if (
            hosted is None
            and self.name in state.vhosts
            and state.queue(self.name, record.name) is None
        ):
            # Deleted (through another node) by an entry applied right after this one.
            if self._opening.get(record.name) is engine:
                del self._opening[record.name]
                engine.delete()
            return cast(WorkQueue, UnhostedQueue(record.name, record.node))
        if hosted is None:
            engine = self._opening.pop(record.name)
            try:
                hosted = self._host(record, engine)
            except BaseException:
                # A command applied right after this one took the vhost away (404).
                engine.delete()
                raise
        return self._used(hosted)

    def _check_new_queue(
        self,
        name: str,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        arguments: Mapping[str, Any],
        server_named: bool,
        user: str | None,
    ) -> None:
        if queue_arguments.queue_type(arguments) == Stream.queue_type:
            stream_arguments.check_declare(
                name,
                self.name,
                durable=durable,
                exclusive=exclusive,
                auto_delete=auto_delete,
                server_named=server_named,
                arguments=arguments,
            )
        else:
            if user is not None:
                self._check_dead_letter_exchange(name, arguments, user)
            queue_arguments.check_declare(
                name, self.name, durable, exclusive, auto_delete, arguments
            )

    def host_declared(self, record: QueueRecord) -> None:
        """A queue this node leads was declared through another node: open its storage."""
        if record.name in self.queues or record.name in self._opening:
            return
        directory = self.queue_directory(record.name)
        if directory.exists():
            # No record named it before this one: a leftover (see `_open_new`).
            remove_directory(directory)
        queue = self._host_existing(record)
        if queue is not None:
            self._used(queue)

    def host_elected(self, record: QueueRecord) -> None:
        """This node was elected leader of a queue it holds a replica of (`ElectLeaders`):
        serve it from the files it has, in place of any forwarder to the old leader."""
        remote = self.remote.get(record.name)
        if remote is not None:
            self.stop_forwarding(remote)
        if record.name in self.queues or record.name in self._opening:
            return
        queue = self._host_existing(record)
        if queue is not None:
            self._used(queue)

    def _host_existing(self, record: QueueRecord) -> WorkQueue | None:
        """Host a queue from the files it has; None (logged, `failed`) if they do not open."""
        try:
            return self._host(record, self._open_existing(record))
        except Exception as error:
            self._failed(record.name, error)
            return None

    def retire_deleted(self) -> None:
        """Stop serving the queues whose records are gone (a `ForgetTransient`)."""
        records = self.store.state.queues(self.name)
        for queue in [q for name, q in self.all_queues() if name not in records]:
            self.retire_queue(queue)

    def all_queues(self) -> list[tuple[str, WorkQueue]]:
        """The queues this node hosts and those it forwards to another node."""
        return [*self.queues.items(), *self.remote.items()]  # type: ignore[list-item]

    def served_queue(self, name: str) -> WorkQueue | None:
        """The queue hosted here or forwarded to another node, by name."""
        return self.queues.get(name) or self.remote.get(name)  # type: ignore[return-value]

    def _check_dead_letter_exchange(
        self, queue: str, arguments: Mapping[str, Any], user: str
    ) -> None:
        """A new queue's dead-letter exchange must be named by a string (406), and its
        declarer needs read access to the queue and write access to the exchange (403): the
        queue will publish there on the user's behalf."""
        exchange = arguments.get(DEAD_LETTER_EXCHANGE)
        if exchange is None:
            return
        if not isinstance(exchange, (str, bytes)):
            raise precondition_failed(
                f"invalid type '{amqp_type_name(exchange)}' for arg '{DEAD_LETTER_EXCHANGE}' "
                f"in queue '{queue}' in vhost '{self.name}'"
            )
        if isinstance(exchange, bytes):
            exchange = exchange.decode()
        state = self.store.state
        state.check_resource_access(user, self.name, "read", QUEUE, queue)
        state.check_resource_access(user, self.name, "write", EXCHANGE, exchange)

    def _used(self, queue: WorkQueue) -> WorkQueue:
        """A declare, basic.get or the last consumer gone renews the queue's x-expires."""
        queue.touch(self._clock())
        self._wake(queue)
        return queue

    def _open_new(self, name: str, arguments: Mapping[str, Any]) -> Any:
        """Open the storage of a queue that has no record yet; 541 if it cannot be opened."""
        directory = self.queue_directory(name)
        if directory.exists():
            # No record names it: left by a transient queue of an earlier run, or by a
            # declare that crashed before its record was written.
            remove_directory(directory)
        try:
            return self._open_engine(directory, name, arguments)
        except Exception as error:
            remove_directory(directory)
            rs = queue_arguments.resource("queue", name, self.name)
            log.error("cannot declare %s: opening its storage failed: %r", rs, error)
            # As RabbitMQ answers a queue that fails to start (rabbit_amqqueue:declare).
            raise internal_error(f"cannot declare {rs}: {describe(error)}") from None

    def _hosted(self, record: Any) -> WorkQueue:
        """The queue of an existing record, opening its storage again if it failed before."""
        queue = self.queues.get(record.name)
        if queue is None:
            queue = self.remote.get(record.name)  # type: ignore[assignment]
        if queue is not None:
            return queue
        engine = self._opening.pop(record.name, None)
        if engine is not None:
            return self._host(record, engine)
        if self.unled(record.name):
            # This node's copy is a follower's: served only once this node leads it.
            raise self._crashed(record.name)
        try:
            queue = self._host(record, self._open_existing(record))
        except Exception as error:
            self._failed(record.name, error)
            raise self._crashed(record.name) from None
        log.info("queue '%s' in vhost '%s' is available again", record.name, self.name)
        return queue

    def _open_existing(self, record: Any) -> Any:
        return self._open_engine(self.queue_directory(record.name), record.name, record.arguments)

    def _failed(self, name: str, error: Exception) -> None:
        self.failed[name] = describe(error)
        log.error(
            "queue '%s' in vhost '%s' is unavailable until a declare opens it (its "
            "record and files are kept): opening its storage failed: %r",
            name,
            self.name,
            error,
        )
        log.debug(
            "queue '%s' in vhost '%s': opening its storage failed", name, self.name, exc_info=error
        )

    def _crashed(self, name: str) -> Exception:
        # rabbit_amqqueue:priv_absent/4 for a queue process that crashed.
        rs = queue_arguments.resource("queue", name, self.name)
        return NotFound(f"{rs} has crashed and failed to restart")

    def _host(self, record: Any, engine: Any) -> WorkQueue:
        arguments = record.arguments
        queue_type = queue_arguments.queue_type(arguments)
        if queue_type == Stream.queue_type:
            stream = Stream(
                self.name,
                record.name,
                engine,
                arguments=arguments,
                effective_arguments=self._effective_arguments(record.name, queue_type, arguments),
                batch_records_max=self._batch_records_max,
            )
            self.queues[record.name] = stream  # type: ignore[assignment]
            self.failed.pop(record.name, None)
            return stream  # type: ignore[return-value]
        queue = WorkQueue(
            self.name,
            record.name,
            engine,
            durable=record.durable,
            auto_delete=record.auto_delete,
            exclusive_owner=record.exclusive_owner,
            arguments=arguments,
            queue_type=queue_type,
            batch_records_max=self._batch_records_max,
            dead_letter_counts=self._dead_letter_counts,
            effective_arguments=self._effective_arguments(record.name, queue_type, arguments),
        )
        self.queues[record.name] = queue
        self.failed.pop(record.name, None)
        return queue

    def _effective_arguments(
        self, name: str, queue_type: str, arguments: Mapping[str, Any]
    ) -> Mapping[str, Any]:
        policies = self.store.state.policies(self.name).values()
        return policy.effective_arguments(name, queue_type, arguments, policies)

    def apply_policies(self) -> None:
        """After policies were set or cleared: every queue whose effective arguments changed
        takes them at once, without a restart, as RabbitMQ's do. The new limits are enforced
        and, as RabbitMQ restarts a queue's expiry timer on a policy change, x-expires counts
        from now. Cheap when the vhost's policies are the ones last applied."""
        policies = self.store.state.policies(self.name)
        if policies is self._policies_applied:
            return
        self._policies_applied = policies
        for queue in self.queues.values():
            effective = policy.effective_arguments(
                queue.name, queue.queue_type, queue.arguments, policies.values()
            )
            if effective != queue.effective_arguments:
                queue.apply_arguments(effective)
                queue.enforce_length()
                # The tick commits what the limits dropped and re-arms the queue's timers.
                self._used(queue)
        for remote in self.remote.values():
            remote.apply_arguments(
                policy.effective_arguments(
                    remote.name, remote.queue_type, remote.arguments, policies.values()
                )
            )

    def recover(self) -> list[str]:
        """Host every queue of the metadata this node leads; returns the directory names of
        those it holds a replica of (the files of a queue with no leader now, which this
        node may lead again, are kept: `host_elected`).

        A queue whose storage fails to open is logged and left out (`failed`); the others
        are hosted. Its directory name is returned all the same: its files are kept.
        """
        kept = []
        now_ms = self._clock()
        for record in self.store.state.queues(self.name).values():
            if self.node_id in record.replicas:
                kept.append(directory_name(record.name))
            if record.node != self.node_id:
                continue
            if self.replicate and replicated(record):
                # This node may have lost an unfsynced tail its followers hold: it leads the
                # queue again only in the epoch its `NodeStarted` gives it, and opens it then
                # (`host_elected`), so that what the queue writes as it opens carries it.
                continue
            queue = self._host_existing(record)
            if queue is None:
                continue
            queue.touch(now_ms)
            # A policy set while the broker was down may lower a limit, as RabbitMQ's queue
            # enforces its limits when it starts; the tick commits what was dropped.
            if queue.enforce_length() or queue.has_timers:
                self._wake(queue)
        # After the queues: an interrupted hand-off looks for its messages in them.
        self._recover_dead_letters()
        self.delayed.recover()
        return kept

    def check_delete(self, queue: WorkQueue, *, if_unused: bool, if_empty: bool) -> None:
        if queue.queue_type == Stream.queue_type:
            # rabbit_stream_queue:delete/4 ignores if-unused and if-empty.
            return
        rs = queue_arguments.resource("queue", queue.name, self.name)
        if if_unused and queue.consumer_count:
            raise PreconditionFailed(f"{rs} in use")
        if if_empty and queue.ready_count:
            raise PreconditionFailed(f"{rs} not empty")

    async def delete_queue(
        self, queue: WorkQueue, *, if_unused: bool = False, if_empty: bool = False
    ) -> int:
        """The one way a queue goes (queue.delete, auto-delete, exclusive owner gone,
        x-expires): checks, the metadata record (routing to it stops at once), then consumers
        cancelled and data deleted. Returns how many ready messages it held; 0 when it was
        already gone."""
        if isinstance(queue, RemoteQueue):
            return await self._delete_remote(queue, if_unused=if_unused, if_empty=if_empty)
        if (
            self.queues.get(queue.name) is not queue
            or self.store.state.queue(self.name, queue.name) is None
        ):
            return 0
        self.check_delete(queue, if_unused=if_unused, if_empty=if_empty)
        # RabbitMQ's delete-ok of a stream counts nothing.
        count = 0 if queue.queue_type == Stream.queue_type else queue.ready_count
        outcome = await self._apply(mc.DeleteQueue(self.name, queue.name))
        self.retire_queue(queue)
        # A delete racing ours applied first: the queue was gone when ours applied.
        return count if outcome.changed else 0

    async def _delete_remote(self, queue: RemoteQueue, *, if_unused: bool, if_empty: bool) -> int:
        """The owner checks and deletes (its consumers are its own); the record's delete is
        then applied here too, a no-op where metadata is replicated, so the client finds the
        queue gone on this node as soon as it has its delete-ok."""
        count = await queue.delete(if_unused=if_unused, if_empty=if_empty)
        await self._apply(mc.DeleteQueue(self.name, queue.name))
        self.retire_queue(queue)  # type: ignore[arg-type]
        return count

    def lead_elsewhere(self, queue: RemoteQueue) -> None:
        """Another node leads the queue: this node forwards its work there (a queue hosted
        here until now stops being served here)."""
        hosted = self.queues.get(queue.name)
        if hosted is not None:
            self.retire_queue(hosted)
        queue.apply_arguments(
            self._effective_arguments(queue.name, queue.queue_type, queue.arguments)
        )
        self.remote[queue.name] = queue

    def refresh_counts(self, queue: WorkQueue) -> Awaitable[None] | None:
        """queue.declare passive on a queue another node leads: its counts from there."""
        return queue.refresh_counts() if isinstance(queue, RemoteQueue) else None

    def drop_queue(self, queue: WorkQueue) -> asyncio.Future[Any]:
        """Delete a queue nobody has to wait on (auto-delete, exclusive owner gone,
        x-expires); returns the deletion under way."""
        return self._background(self.delete_queue(queue))

    def stop_forwarding(self, queue: RemoteQueue) -> None:
        """The queue's leader moved from the node `queue` forwards to. What was sent there
        waits for its answer; what is staged and not yet sent is refused."""
        if self.remote.get(queue.name) is queue:
            _refuse_staged(queue)
            queue.deposed = True
            if queue.queue_type == Stream.queue_type:
                self._dissolve_groups_of(queue, "queue leader moved")  # type: ignore[arg-type]
        self.retire_queue(queue)

    def retire_queue(self, queue: WorkQueue) -> None:
        """Stop hosting a queue whose record is gone: its consumers are cancelled, its timers
        stopped and its engine data deleted."""
        if isinstance(queue, RemoteQueue):
            if self.remote.get(queue.name) is queue:
                del self.remote[queue.name]
                queue.retire()
            return
        if not self._unhost(queue, "queue deleted"):
            return
        if isinstance(queue, Stream):
            self._dissolve_groups_of(queue, "queue deleted")
        queue.deleted = True
        queue.engine.delete()
        # The tick stops the timers of a deleted queue.
        self._wake(queue)

    def _unhost(self, queue: WorkQueue, reason: str) -> bool:
        """Stop serving a hosted queue here and cancel its consumers with `reason`; False if
        this node does not host that queue."""
        if self.queues.get(queue.name) is not queue:
            return False
        del self.queues[queue.name]
        for consumer in list(queue.consumers.values()):
            queue.remove_consumer(consumer)
            consumer.channel.cancel(consumer, reason)
        return True

    def step_down(self, queue: WorkQueue) -> None:
        """Stop hosting a replicated queue another node now leads (or none does): its
        consumers are cancelled (they consume again from the new leader), its commits
        waiting for the quorum fail (their publishes are nacked), and its files stay, for
        this node's replica to follow the new leader from."""
        if not self._unhost(queue, "queue leader moved"):
            return
        if isinstance(queue, Stream):
            self._dissolve_groups_of(queue, "queue leader moved")
        _refuse_staged(queue)
        queue.deposed = queue.deleted = True
        queue.engine.close()
        self._wake(queue)

    def _dissolve_groups_of(self, partition: Stream, reason: str) -> None:
        """A deleted partition ends the consumer groups reading it: their members are
        cancelled as a deleted queue's consumers are (a group on a super stream declared
        again starts afresh). So does one whose leader moved: its members consume again
        where it is led now."""
        for key, group in list(self.groups.items()):
            if partition in group.partitions:
                del self.groups[key]
                for member in group.dissolve():
                    if isinstance(member, MemberStandIn):
                        member.cancel(reason)
                    else:
                        member.consumer.channel.cancel(member.consumer, reason)

    # -- consuming ------------------------------------------------------------------------

    def consume(
        self,
        queue_name: str,
        owner: str,
        channel: ConsumerChannel,
        tag: str,
        *,
        no_ack: bool,
        exclusive: bool,
        arguments: Mapping[str, Any],
        prefetch_count: int,
    ) -> Consumer | Awaitable[Consumer]:
        """Add a consumer to a queue (basic.consume): 404, 405, 406 or 403 as RabbitMQ. On a
        super stream's name with x-consumer-group, a member of that group. For a queue
        another node leads, an awaitable of the consumer, registered there."""
        if GROUP_ARGUMENT in arguments and self.router.get(queue_name) is not None:
            return self._join_group(
                queue_name, channel, tag, arguments, no_ack=no_ack, prefetch_count=prefetch_count
            )
        queue = self.get_queue(queue_name, owner)
        if queue.queue_type == Stream.queue_type:
            spec = stream_arguments.check_consume(
                queue.name,
                self.name,
                arguments,
                prefetch_count=prefetch_count,
                no_ack=no_ack,
                now_ms=self._clock(),
            )
            if isinstance(queue, RemoteQueue):
                return self._consume_remote_stream(
                    queue, channel, tag, exclusive, arguments, prefetch_count
                )
            consumer = queue.add_consumer(  # type: ignore[attr-defined]
                tag, channel, spec, arguments, exclusive=exclusive, prefetch_count=prefetch_count
            )
            self._wake(consumer.queue)
            return consumer
        queue_arguments.check_consume(queue.name, self.name, arguments)
        consumer = Consumer(
            tag,
            channel,
            queue,
            no_ack,
            exclusive,
            int(arguments.get("x-priority", 0)),
            prefetch_count,
        )
        if isinstance(queue, RemoteQueue):
            # Exclusivity is the owner's to check; the caller wakes the queue (its first
            # credit) once the client has its consume-ok.
            return queue.consume(consumer, arguments)
        if queue.exclusive_consumer() is not None or (exclusive and queue.consumer_count):
            rs = queue_arguments.resource("queue", queue.name, self.name)
            raise AccessRefused(f"{rs} in exclusive use")
        queue.add_consumer(consumer)
        self._wake(queue)
        return consumer

    def _consume_remote_stream(
        self,
        queue: RemoteQueue,
        channel: ConsumerChannel,
        tag: str,
        exclusive: bool,
        arguments: Mapping[str, Any],
        prefetch_count: int,
    ) -> Awaitable[Consumer]:
        """A stream another node leads, its basic.consume checked here as a local stream's
        (the client's prefetch and no-ack are this node's): consumed there
        (`consume_forwarded_stream`) from the same arguments."""
        consume_filter(queue_arguments.resource("queue", queue.name, self.name), arguments)
        cursor = RemoteCursor(queue)
        consumer = Consumer(tag, channel, cursor, False, exclusive, 0, prefetch_count)
        return cursor.consume(consumer, arguments)

    def consume_forwarded_stream(
        self,
        stream: Stream,
        channel: ConsumerChannel,
        tag: str,
        *,
        exclusive: bool,
        arguments: Mapping[str, Any],
    ) -> Consumer:
        """The owner's side of `_consume_remote_stream`: the entry node checked the consume,
        and the link's credit stands for the client's prefetch."""
        spec = offset_spec.parse(arguments.get(stream_arguments.OFFSET_ARGUMENT), self._clock())
        consumer = stream.add_consumer(
            tag, channel, spec, arguments, exclusive=exclusive, prefetch_count=0
        )
        self._wake(consumer.queue)  # type: ignore[arg-type]
        return consumer

    def _join_group(
        self,
        super_stream: str,
        channel: ConsumerChannel,
        tag: str,
        arguments: Mapping[str, Any],
        *,
        no_ack: bool,
        prefetch_count: int,
    ) -> Consumer | Awaitable[Consumer]:
        """A member of a group: of this node's `Group` when this node coordinates it (leads
        the super stream's partition 0), else a `MemberElsewhere` of the coordinator's."""
        group_name = arguments[GROUP_ARGUMENT]
        rs = queue_arguments.resource("exchange", super_stream, self.name)
        if isinstance(group_name, bytes):
            group_name = group_name.decode("utf-8", "replace")
        table = self._super_stream_table(super_stream)
        if not isinstance(group_name, str) or not group_name:
            raise PreconditionFailed(f"invalid arg '{GROUP_ARGUMENT}' for {rs}: expected a name")
        streams = self._group_partitions(super_stream, table)
        spec = stream_arguments.check_consume(
            super_stream,
            self.name,
            arguments,
            prefetch_count=prefetch_count,
            no_ack=no_ack,
            now_ms=self._clock(),
        )
        stream_filter = consume_filter(rs, arguments)
        key = (super_stream, group_name)
        coordinator = streams[0]
        if isinstance(coordinator, RemoteQueue):
            member = MemberElsewhere(
                coordinator,
                super_stream,
                group_name,
                streams,
                channel,
                tag,
                spec,
                stream_filter,
                prefetch_count,
                arguments,
                self._wake,
                self._attach_partition_elsewhere,
                self._member_elsewhere_gone,
            )
            self.members_elsewhere.setdefault(key, set()).add(member)
            return member.join()
        group = self.coordinated_group(super_stream, group_name, streams)
        return group.join(tag, channel, spec, stream_filter, prefetch_count, arguments)

    def _super_stream_table(self, super_stream: str) -> SuperStreamExchange:
        """The super stream exchange's table; 404 if there is no such super stream."""
        exchange = self.router.get(super_stream)
        if exchange is None or not isinstance(exchange.table, SuperStreamExchange):
            rs = queue_arguments.resource("exchange", super_stream, self.name)
            raise NotFound(f"no super stream: {rs}")
        return exchange.table

    def _group_partitions(
        self, super_stream: str, table: SuperStreamExchange | None = None
    ) -> list[Any]:
        """A super stream's partitions, each a `Stream` or a `RemoteQueue` of one; 404
        unless there is such a super stream and its partitions are all streams."""
        if table is None:
            table = self._super_stream_table(super_stream)
        rs = queue_arguments.resource("exchange", super_stream, self.name)
        partitions = [
            self.queues.get(d.name) or self.remote.get(d.name) for d in table.partitions()
        ]
        streams = [
            p
            for p in partitions
            if isinstance(p, Stream)
            or (isinstance(p, RemoteQueue) and p.queue_type == Stream.queue_type)
        ]
        if not streams or len(streams) != len(partitions):
            raise NotFound(f"{rs} has partitions that are not streams, or none")
        return streams

    def coordinated_group(
        self, super_stream: str, group_name: str, streams: list[Any] | None = None
    ) -> Group:
        """The group this node coordinates (it leads the super stream's partition 0),
        created if it has no members yet; 404 if another node coordinates it (a member's
        node whose metadata is ahead of or behind this one's)."""
        if streams is None:
            streams = self._group_partitions(super_stream)
            if not isinstance(streams[0], Stream):
                rs = queue_arguments.resource("exchange", super_stream, self.name)
                raise NotFound(f"consumer groups of {rs} are coordinated by another node")
        key = (super_stream, group_name)
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = Group(
                super_stream, group_name, streams, self._wake, self._attach_partition_elsewhere
            )
        return group

    async def describe_group(self, super_stream: str, group_name: str) -> dict[str, Any] | None:
        """The whole group (`Group.describe`), asked of its coordinator when that is another
        node; None when it has no members."""
        streams = self._group_partitions(super_stream)
        if isinstance(streams[0], RemoteQueue):
            return await described_elsewhere(streams[0], super_stream, group_name)
        group = self.groups.get((super_stream, group_name))
        return group.describe() if group is not None and group.members else None

    def leave_group(self, member: Member | MemberStandIn) -> None:
        """A member cancelled, its channel closed or (a stand-in) its node's link went."""
        group = member.group
        group.leave(member)
        if not group.members and self.groups.get((group.super_stream, group.name)) is group:
            del self.groups[(group.super_stream, group.name)]

    def _member_elsewhere_gone(self, member: MemberElsewhere) -> None:
        key = (member.super_stream, member.group_name)
        members = self.members_elsewhere.get(key)
        if members is not None:
            members.discard(member)
            if not members:
                del self.members_elsewhere[key]

    @staticmethod
    def _attach_partition_elsewhere(partition: RemoteQueue, member: Any) -> Consumer:
        """A member's consumer of a partition another node leads: registered there
        (`consume_group_partition`), from the group's committed offset there."""
        cursor = RemoteCursor(partition)
        template = member.consumer
        consumer = Consumer(
            template.tag, template.channel, cursor, False, False, 0, template.prefetch_count
        )
        cursor.consume_partition(consumer, member.group_name, member.arguments)
        return consumer

    def consume_group_partition(
        self,
        stream: Stream,
        channel: ConsumerChannel,
        tag: str,
        group: str,
        arguments: Mapping[str, Any],
    ) -> Consumer:
        """The owner's side of `_attach_partition_elsewhere`: the entry node checked the
        member's arguments, and the link's credit stands for its prefetch."""
        rs = queue_arguments.resource("queue", stream.name, self.name)
        spec = offset_spec.parse(arguments.get(stream_arguments.OFFSET_ARGUMENT), self._clock())
        consumer = attach_partition(
            stream, group, tag, channel, spec, consume_filter(rs, arguments), 0
        )
        self._wake(consumer.queue)  # type: ignore[arg-type]
        return consumer

    def cancel(self, consumer: Consumer) -> asyncio.Future[Any] | None:
        """Remove a consumer (basic.cancel, its channel gone); the last one of an auto-delete
        queue deletes it, as RabbitMQ does: returns that deletion, under way (for a queue
        another node leads, the cancel under way there, which may delete it)."""
        if isinstance(consumer.queue, Member):
            self.leave_group(consumer.queue)
            return None
        if isinstance(consumer.queue, MemberElsewhere):
            return consumer.queue.leave()
        if isinstance(consumer.queue, Cursor):
            consumer.queue.stream.remove_consumer(consumer)
            return
        if isinstance(consumer.queue, (RemoteQueue, RemoteCursor)):
            return consumer.queue.remove_consumer(consumer)
        # The core's consumers are always of its own queues.
        queue = cast(WorkQueue, consumer.queue)
        if queue.remove_consumer(consumer):
            return self.drop_queue(queue)
        if not queue.consumers:
            self._used(queue)
        else:
            self._wake(queue)
        return None

    def get(self, queue_name: str, owner: str, *, no_ack: bool) -> tuple[WorkQueue, Message | None]:
        """basic.get: the queue and its next message (None when there is none, or when the
        engine holds its ready messages until a commit: see `get_after_commit`)."""
        queue = self._used(self.get_queue(queue_name, owner))
        self._refuse_on_stream(queue, "basic.get")
        message = queue.take(self._clock())
        if message is not None and no_ack:
            queue.ack([message.offset])
        if message is not None or not queue.held_until_commit:
            queue.counts.got_one(message, no_ack)
        if queue.dead_letters:
            # The take met expired messages: the tick dead-letters them.
            self._wake(queue)
        return queue, message

    async def get_after_commit(self, queue: WorkQueue, *, no_ack: bool) -> Message | None:
        """basic.get never answers get-empty while messages are ready: when the engine holds
        them until a commit (the delivered mark, a quorum queue's fsync), wait for it."""
        message = await queue.take_after_commit(self._clock())
        if message is not None:
            if no_ack:
                queue.ack([message.offset])
            # The take moved the engine on (a no-ack get's ack, the delivered mark): the tick
            # commits when the engine asks, and serves consumers the commit let through.
            self._wake(queue)
        queue.counts.got_one(message, no_ack)
        return message

    def _refuse_on_stream(self, queue: WorkQueue, method: str) -> None:
        if queue.queue_type == Stream.queue_type:
            rs = queue_arguments.resource("queue", queue.name, self.name)
            raise not_implemented(f"{method} not supported by stream queues {rs}")

    def peek(
        self, queue_name: str, owner: str, count_max: int, start: int = 0
    ) -> list[tuple[Message, bool]] | Awaitable[list[tuple[Message, bool]]]:
        """Browse a queue (the DLQ tools): up to `count_max` messages not yet acknowledged,
        ready or in flight, from offset `start` on, each with whether it is in flight (an
        awaitable of them when another node leads the queue). Nothing is delivered, counted
        or renewed."""
        queue = self.get_queue(queue_name, owner)
        if isinstance(queue, RemoteQueue):
            return queue.browse(start, count_max)
        return queue.engine.browse(start, count_max)

    def purge(self, queue_name: str, owner: str) -> int | Awaitable[int]:
        """queue.purge: drop every ready message; returns how many went (an awaitable of
        it when another node leads the queue)."""
        queue = self.get_queue(queue_name, owner)
        self._refuse_on_stream(queue, "queue.purge")
        if isinstance(queue, RemoteQueue):
            return queue.purge()
        count = queue.purge()
        # The purge acks every ready message: the tick commits that.
        self._wake(queue)
        return count

    # -- exchanges ------------------------------------------------------------------------

    def check_exchange(self, name: str) -> None:
        """exchange.declare passive: 404 unless the exchange exists (403 for the default)."""
        self.router.declare(name, passive=True)

    async def declare_exchange(
        self,
        name: str,
        type_name: str,
        *,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: Mapping[str, Any],
        user: str | None,
    ) -> None:
        """exchange.declare; a super stream exchange declared with a partition count also
        gets its partition streams (`super_stream.partitions`), which `user` (None: the
        broker or an administrator's import) must be allowed to configure too."""
        partitions = None
        if type_name == SUPER_STREAM:
            partitions = super_stream.partition_count(name, self.name, arguments)
            if partitions is not None and user is not None:
                for partition in super_stream.partition_names(name, partitions):
                    self.store.state.check_resource_access(
                        user, self.name, "configure", QUEUE, partition
                    )
        await self._apply(
            mc.DeclareExchange(
                self.name,
                name,
                type_name,
                durable=durable,
                auto_delete=auto_delete,
                internal=internal,
                arguments=dict(arguments),
            )
        )
        if partitions is not None:
            for order, partition in enumerate(super_stream.partition_names(name, partitions)):
                await self.declare_queue(
                    partition,
                    durable=True,
                    exclusive=False,
                    auto_delete=False,
                    # Spread over the nodes, as rabbitmq-streams add_super_stream places them.
                    arguments={
                        "x-queue-type": Stream.queue_type,
                        LEADER_LOCATOR_ARGUMENT: BALANCED,
                    },
                    owner="",
                    server_named=False,
                    # The broker's own declare: a stream has no dead-letter exchange to check.
                    user=None,
                )
                await self.bind(
                    name, Destination(QUEUE, partition), str(order), {PARTITION_ORDER: order}
                )

    async def delete_exchange(self, name: str, *, if_unused: bool) -> None:
        await self._apply(mc.DeleteExchange(self.name, name, if_unused=if_unused))

    async def delete_super_stream(self, name: str) -> list[str]:
        """The super stream's exchange, then its partition streams, as `rabbitmq-streams
        delete_super_stream` does (exchange.delete alone leaves the partitions, as in
        RabbitMQ). Returns the partitions deleted; 404 unless `name` is a super stream."""
        exchange = self.router.get(name)
        if exchange is None or not isinstance(exchange.table, SuperStreamExchange):
            rs = queue_arguments.resource("exchange", name, self.name)
            raise NotFound(f"no super stream: {rs}")
        partitions = [self.queues.get(d.name) for d in exchange.table.partitions()]
        await self.delete_exchange(name, if_unused=False)
        deleted = []
        for partition in partitions:
            if isinstance(partition, Stream):
                await self.delete_queue(partition)
                deleted.append(partition.name)
        return deleted

    # -- bindings -------------------------------------------------------------------------

    async def bind(
        self, source: str, destination: Destination, routing_key: str, arguments: Mapping[str, Any]
    ) -> None:
        await self._apply(
            mc.Bind(
                self.name, source, destination.name, destination.kind, routing_key, dict(arguments)
            )
        )

    async def unbind(
        self, source: str, destination: Destination, routing_key: str, arguments: Mapping[str, Any]
    ) -> None:
        await self._apply(
            mc.Unbind(
                self.name, source, destination.name, destination.kind, routing_key, dict(arguments)
            )
        )

    # -- lifecycle ------------------------------------------------------------------------

    async def shutdown(self) -> None:
        """Flush, fsync and close every queue, recording exactly what was delivered.

        Queues shut down side by side, `SHUTDOWN_CONCURRENT_MAX` at a time: their fsyncs
        run in the logs' worker threads, and one queue after another, a broker holding
        100,000 queues with unsynced messages took minutes to stop.
        """
        queues = iter([*self.queues.values(), *self.delayed.stores.values()])

        async def shut_down_in_turn() -> None:
            for queue in queues:
                queue.flush(self._clock())
                try:
                    await queue.engine.shutdown()
                except Exception as error:
                    log.error(
                        "queue '%s' in vhost '%s': clean shutdown failed: %r",
                        queue.name,
                        self.name,
                        error,
                    )
                    queue.engine.close()

        await asyncio.gather(*(shut_down_in_turn() for _ in range(SHUTDOWN_CONCURRENT_MAX)))

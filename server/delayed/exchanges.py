"""The delayed exchanges of one vhost: a store each, and due messages routed through the core.

Holding. The router reports a delayed exchange that holds a message as a `DelayedTarget`
(`exchanges/delayed.py`); the core's `stage` hands it here, and it is staged on that
exchange's `DelayedStore`, opened on first use, in `directory_of(exchange)`. The store is
written, committed and confirmed by the tick like a queue: a publisher confirm means the
held message is stored (fsynced if persistent and the exchange durable).

Routing when due, exactly once. The store's timer takes what is due (at most
`DUE_BATCH_MAX` per run, `HAND_OFFS_MAX` hand-offs at a time) and routes it from the
exchange through the core's `route` with `x-delay` negated, which picks its queues. Then:

1. an INTENT naming each message's queues, and each queue's `append_position` before the
   staging, is written to the store and committed (fsynced) -- before any queue holds it;
2. the messages are staged on their queues with a `DelayedHandoff` as their publisher; the
   tick writes and commits the queues and confirms the hand-off, as it confirms dead letters;
3. only then are the messages done in the store (a DELTA, committed later).

A crash before 1 leaves the message held: it is routed after the restart. A crash between 1
and 3 leaves an intent: recovery looks in each of its queues, from its position on, for the
message as it was staged (exchange, routing key, properties, body) and stages it only on the
queues that lack it (`_resume`). So a due message reaches each of its queues once, across a
SIGKILL or a power loss. The limits of that search, both in the few milliseconds between a
queue's commit and the store's: a byte-identical message staged on the same queue by someone
else may be taken for it (then it is not delivered), and a copy already consumed from a
queue that deleted its whole segment since is not found (then it is delivered again).

A queue another node leads (a `RemoteQueue`) is staged on as a local one, its confirm being
the owner's; its log cannot be searched from here, so a crash between 1 and 3 stages the
message there again: at least once, not exactly once, on such a queue.

A queue that could not store a message (a write or fsync failure) is retried alone after
`RETRY_DELAY_MS`, with a new intent; the queues that stored it are done.

Deleting the exchange deletes its store and the messages it holds.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

from warrenmq.amqp import fastpath
from warrenmq.amqp import properties as props
from warrenmq.exchanges.delayed import DELAY_HEADER, DELAYED_MESSAGE, DelayedTarget
from warrenmq.exchanges.router import Exchange, Router
from warrenmq.log import RawRecord

from ..forward.entry import RemoteQueue, append_position
from ..queue.log_queue import remove_directory
from ..queue.work_queue import WorkQueue
from .message_log import DELAY, DelayedMessageLog, Held
from .routed_log import Target
from .store import DelayedHandoff, DelayedStore, Staging

log = logging.getLogger("warrenmq.server")

DUE_BATCH_MAX = 1024
HAND_OFFS_MAX = 4
RETRY_DELAY_MS = 1000
_INT32_MIN = -(2**31)


class Core(Protocol):
    """What the delayed exchanges use of their vhost (`server/vhost.py`)."""

    name: str
    queues: dict[str, WorkQueue]

    @property
    def router(self) -> Router: ...

    def served_queue(self, name: str) -> WorkQueue | None: ...

    def unled(self, name: str) -> bool: ...

    def route(
        self, exchange: str, routing_key: str, properties: bytes, internal_allowed: bool = False
    ) -> tuple[Any, bytes]: ...


def with_delay_negated(properties: bytes, delay_ms: int) -> bytes:
    """The properties as a due message is routed: `x-delay` replaced, in place, by -delay (a
    signed int, as the plugin writes it), so no delayed exchange holds it again."""
    negated = -delay_ms
    typed = b"I" + negated.to_bytes(4, "big", signed=True) if negated >= _INT32_MIN else None
    entries = [
        (key, (typed or props.long(negated)) if key == DELAY_HEADER else value)
        for key, value in props.headers(properties)
    ]
    return props.with_headers(properties, entries)


class DelayedExchanges:
    def __init__(
        self,
        core: Core,
        directory: Path,
        directory_of: Callable[[str], Path],
        *,
        open_log: Callable[[Path], DelayedMessageLog],
        batch_records_max: int,
        staged: Callable[[WorkQueue], None],
        wake: Callable[[WorkQueue], None],
        confirm: Callable[[DelayedHandoff, int], None],
        background: Callable[[Any], None],
        clock: Callable[[], int],
    ) -> None:
        self._core = core
        self._directory = directory
        self._directory_of = directory_of
        self._open_log = open_log
        self._batch_records_max = batch_records_max
        self._staged = staged
        self._wake = wake
        self._confirm = confirm
        self._background = background
        self._clock = clock
        self.stores: dict[str, DelayedStore] = {}

    # -- holding --------------------------------------------------------------------------

    def stage(
        self, target: DelayedTarget, record: RawRecord, persistent: bool, publisher: Any
    ) -> bool:
        """Hold a routed message in its delayed exchange's store (written by the next tick);
        False when the store cannot be opened."""
        store = self._store(target.exchange)
        if store is None:
            return False
        exchange, routing_key, properties, body = record
        held = (exchange, routing_key, DELAY.pack(target.delay_ms) + properties, body)
        store.stage(held, persistent, False, publisher)
        self._staged(store)
        return True

    def held_count(self, exchange: str) -> int:
        """Messages a delayed exchange holds (the plugin's `messages_delayed`)."""
        store = self.stores.get(exchange)
        return 0 if store is None else store.held_count

    def _store(self, name: str) -> DelayedStore | None:
        store = self.stores.get(name)
        if store is not None and self._exchange_kept(store):
            return store
        exchange = self._core.router.get(name)
        if exchange is None or exchange.type != DELAYED_MESSAGE:
            return None
        return self._open(exchange)

    def _exchange_kept(self, store: DelayedStore) -> bool:
        """Whether a store's exchange is still there; one deleted by a path that did not say
        so (`exchanges_deleted`) takes its store with it."""
        exchange = self._core.router.get(store.name)
        if exchange is not None and exchange.type == DELAYED_MESSAGE:
            return True
        self._drop(store)
        return False

    def _open(self, exchange: Exchange) -> DelayedStore | None:
        try:
            engine = self._open_log(self._directory_of(exchange.name))
        except Exception as error:
            log.error(
                "delayed exchange '%s' in vhost '%s': opening its store failed: %r",
                exchange.name,
                self._core.name,
                error,
            )
            return None
        store = DelayedStore(
            self._core.name,
            exchange,
            engine,
            batch_records_max=self._batch_records_max,
            route_due=self._route_due,
        )
        self.stores[exchange.name] = store
        return store

    # -- lifecycle ------------------------------------------------------------------------

    def recover(self) -> None:
        """Open the store of every delayed exchange the metadata kept, finish the hand-offs a
        crash interrupted, and arm their timers; delete every other store's files."""
        kept = set()
        for exchange in self._core.router.exchanges():
            if exchange.type != DELAYED_MESSAGE:
                continue
            directory = self._directory_of(exchange.name)
            kept.add(directory.name)
            if not directory.exists():
                continue
            store = self._open(exchange)
            if store is None:
                continue
            intents = store.engine.recovered_intents()
            if intents:
                self._resume(store, intents)
            self._wake(store)
        if self._directory.exists():
            for leftover in self._directory.iterdir():
                if leftover.name not in kept:
                    shutil.rmtree(leftover, ignore_errors=True)

    def exchanges_deleted(self, names: Iterable[str]) -> None:
        """Exchanges are gone: so are their stores and the messages those held."""
        router = self._core.router
        for name in names:
            if router.get(name) is not None:
                continue
            store = self.stores.get(name)
            if store is not None:
                self._drop(store)
            else:
                remove_directory(self._directory_of(name))

    def _drop(self, store: DelayedStore) -> None:
        if self.stores.get(store.name) is store:
            del self.stores[store.name]
        store.deleted = True
        store.engine.delete()
        # The tick stops the timer of a deleted store.
        self._wake(store)

    def close(self) -> None:
        """Release every store's files without writing (a start that failed)."""
        for store in self.stores.values():
            store.engine.close()

    def retire(self) -> None:
        """The vhost is deleted: every store goes, with its files."""
        for store in list(self.stores.values()):
            self._drop(store)

    # -- routing what is due --------------------------------------------------------------

    def _route_due(self, store: DelayedStore, now_ms: int) -> int | None:
        """The store's timer: begin hand-offs of what is due; returns when to run again."""
        if store.deleted or store.engine.closed or not self._exchange_kept(store):
            return None
        if store.retries and now_ms >= store.retry_at_ms and store.hand_offs < HAND_OFFS_MAX:
            retries, store.retries = store.retries, []
            self._begin(store, retries)
        if store.hand_offs < HAND_OFFS_MAX:
            due = store.engine.take_due(now_ms, DUE_BATCH_MAX)
            if due:
                self._begin(store, [self._routed(store, held) for held in due])
        if store.hand_offs >= HAND_OFFS_MAX:
            # A confirmed hand-off wakes the store.
            return None
        next_ms = store.engine.next_due_ms()
        if store.retries and (next_ms is None or store.retry_at_ms < next_ms):
            return store.retry_at_ms
        return next_ms

    def _routed(self, store: DelayedStore, held: Held) -> Staging:
        """Where a due message goes: routed from its exchange, x-delay negated, now."""
        # The held properties carry no BCC header (the core strips it before a delayed
        # exchange holds the message), so there are no BCC keys to route or keep.
        routed, properties, _ = self._core.route(
            store.name,
            held.routing_key.decode("utf-8"),
            with_delay_negated(held.properties, held.delay_ms),
            internal_allowed=True,
        )
        return self._targeted(Staging(held, properties, []), routed)

    def _targeted(self, staging: Staging, names: Iterable[str]) -> Staging:
        """`staging` going to the queues `names` as they are served now: the queue served
        here or forwarded to its leader, or waited for while it has no leader; none, for a
        queue deleted since it was routed."""
        served = self._core.served_queue
        queues: list[WorkQueue] = []
        unled: list[str] = []
        for name in names:
            queue = served(name)
            if queue is not None:
                queues.append(queue)
            elif self._core.unled(name):
                unled.append(name)
        return staging._replace(queues=queues, unled=tuple(unled))

    def _begin(self, store: DelayedStore, stagings: list[Staging]) -> None:
        """Write the intent of a hand-off; it is staged once the intent is durable."""
        # A retry's queues may have been deleted since, or be led elsewhere now.
        stagings = [
            self._targeted(staging, [*(q.name for q in staging.queues), *staging.unled])
            for staging in stagings
        ]
        waiting = [staging for staging in stagings if staging.unled]
        if waiting:
            self._retry_later(store, waiting, None)
            stagings = [staging for staging in stagings if not staging.unled]
            if not stagings:
                return
        intents = [
            (
                staging.held.offset,
                tuple(
                    (queue.name, append_position(queue, staging.properties))
                    for queue in staging.queues
                ),
            )
            for staging in stagings
        ]
        try:
            store.engine.begin_hand_off(intents)
        except Exception as error:
            self._retry_later(store, stagings, error)
            return
        store.hand_offs += 1
        self._background(self._commit_then_stage(store, stagings))

    async def _commit_then_stage(self, store: DelayedStore, stagings: list[Staging]) -> None:
        if store.durable:
            try:
                await store.commit()
            except Exception as error:
                store.hand_offs -= 1
                self._retry_later(store, stagings, error)
                return
        if not store.deleted:
            self._stage(store, stagings)

    def _stage(self, store: DelayedStore, stagings: list[Staging]) -> None:
        """Stage due messages on their queues; the tick confirms the hand-off once every
        queue's write is done (and durable, for a persistent message on a durable queue)."""
        pairs: list[tuple[Staging, WorkQueue]] = []
        handoff = DelayedHandoff(store, stagings, pairs, self._handed_off)
        served = self._core.served_queue
        for staging in stagings:
            held = staging.held
            delivery_mode, _, expiration, _ = fastpath.scan_properties(staging.properties)
            record = (held.exchange, held.routing_key, staging.properties, held.body)
            for queue in staging.queues:
                if served(queue.name) is not queue and not queue.deposed:
                    continue  # deleted since: nothing left to hold the message there
                pairs.append((staging, queue))
                publisher = (handoff, len(pairs))
                if queue.deposed:
                    # Its leader moved since the intent: tried again where it is led now.
                    handoff.publish_failed(len(pairs))
                elif queue.stage(record, delivery_mode == 2, expiration is not None, publisher):
                    self._staged(queue)
                elif queue.dead_letters:
                    # x-overflow reject-publish-dlx: the tick dead-letters what it refused.
                    self._wake(queue)
        if pairs:
            self._confirm(handoff, len(pairs))
        else:
            self._handed_off(handoff)

    def _handed_off(self, handoff: DelayedHandoff) -> None:
        """The tick confirmed a hand-off: what every queue holds is done; what some queue
        failed to store is retried on that queue alone."""
        store = handoff.store
        store.hand_offs -= 1
        if store.deleted:
            return
        failed: dict[int, Staging] = {}
        for tag in handoff.failed:
            staging, queue = handoff.pairs[tag - 1]
            retry = failed.get(staging.held.offset)
            if retry is None:
                retry = failed[staging.held.offset] = staging._replace(queues=[])
            retry.queues.append(queue)
        store.engine.routed(
            staging.held.offset for staging in handoff.stagings if staging.held.offset not in failed
        )
        if failed:
            self._retry_later(store, list(failed.values()), None)
        # The done marks want a commit; a store at its hand-off bound may take more now.
        self._wake(store)

    def _retry_later(
        self, store: DelayedStore, stagings: list[Staging], error: Exception | None
    ) -> None:
        if error is not None:
            log.error(
                "delayed exchange '%s' in vhost '%s': routing %d due message(s) failed, "
                "retrying in %d ms: %r",
                store.name,
                self._core.name,
                len(stagings),
                RETRY_DELAY_MS,
                error,
            )
        store.retries += stagings
        store.retry_at_ms = self._clock() + RETRY_DELAY_MS
        self._wake(store)

    # -- recovery -------------------------------------------------------------------------

    def _resume(self, store: DelayedStore, intents: dict[int, tuple[Target, ...]]) -> None:
        """Finish the hand-offs a crash interrupted: each message goes to the queues of its
        intent that do not hold it yet, and is done once they all do."""
        by_queue: dict[str, list[tuple[int, int]]] = {}
        stagings: dict[int, Staging] = {}
        for held in store.engine.read_many(list(intents)):
            properties = with_delay_negated(held.properties, held.delay_ms)
            stagings[held.offset] = Staging(held, properties, [])
            for name, position in intents[held.offset]:
                by_queue.setdefault(name, []).append((position, held.offset))
        for name, wanted in by_queue.items():
            queue = self._core.served_queue(name)
            if queue is not None:
                for offset in _not_stored(queue, wanted, stagings):
                    stagings[offset].queues.append(queue)
            elif self._core.unled(name):
                for _, offset in wanted:
                    staging = stagings[offset]
                    stagings[offset] = staging._replace(unled=(*staging.unled, name))
        store.engine.routed(
            offset
            for offset, staging in stagings.items()
            if not staging.queues and not staging.unled
        )
        waiting = [staging for staging in stagings.values() if staging.unled]
        if waiting:
            self._retry_later(store, waiting, None)
        unfinished = [
            staging for staging in stagings.values() if staging.queues and not staging.unled
        ]
        log.info(
            "delayed exchange '%s' in vhost '%s': %d message(s) were being routed at a crash; "
            "%d of them staged again on the queues that lack them",
            store.name,
            self._core.name,
            len(stagings),
            len(unfinished),
        )
        if unfinished:
            store.hand_offs += 1
            self._stage(store, unfinished)


def _not_stored(
    queue: WorkQueue, wanted: list[tuple[int, int]], stagings: dict[int, Staging]
) -> list[int]:
    """Which of the (position, offset) messages `queue` does not hold at or after their
    position. Copies of identical messages are matched one to one: the latest position takes
    the latest copy that is at or after it. A queue another node leads is not searched: every
    message is staged there again, which may deliver one twice (at least once)."""
    if isinstance(queue, RemoteQueue):
        return [offset for _, offset in wanted]
    keys: dict[int, RawRecord] = {}
    for _, offset in wanted:
        staging = stagings[offset]
        held = staging.held
        keys[offset] = (held.exchange, held.routing_key, staging.properties, held.body)
    looked_for = set(keys.values())
    copies: dict[RawRecord, list[int]] = {}
    for position, record in queue.engine.stored_from([position for position, _ in wanted]):
        if record in looked_for:
            copies.setdefault(record, []).append(position)
    missing = []
    taken: dict[RawRecord, int] = {}
    for position, offset in sorted(wanted, reverse=True):
        key = keys[offset]
        found = copies.get(key, [])
        index = taken.get(key, 0)
        # Copies are in ascending position within a sequence: the latest is last.
        if index < len(found) and found[len(found) - 1 - index] >= position:
            taken[key] = index + 1
        else:
            missing.append(offset)
    return missing

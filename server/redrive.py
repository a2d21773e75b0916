"""Redrives: server-side tasks that move dead letters out of a queue (back to the queue each
died in, or to an exchange), at a rate, up to a limit, cancellable and resumable, and
surviving a crash without losing or doubling a message.

A task works a batch at a time, as a consumer of the dead-letter queue (DLQ) with no channel:
it takes up to a batch of messages from the head (in flight there, so a crash gives them
back), and for each either moves it (stages it on its target) or, when the task does not
select it or its source queue is gone, keeps it (stages it again at the DLQ's tail, so the
task goes past it). Once the targets hold the batch (fsynced), the DLQ acknowledges it. A
task considers as many messages as the DLQ held ready when it (re)started, so what it keeps
is not considered twice.

Exactly once across a crash: before staging a batch the task writes, durably, which DLQ
offsets it holds and where each target queue's log stood (`append_position`). A crash
between the targets' fsync and the DLQ's ack brings the batch back to the DLQ; on resume the
task reads each target's log from its recorded position (`stored_from`) and a message found
there, byte for byte, is acknowledged rather than staged again. The same hand-off the
delayed exchanges use.

In a cluster a task runs on the node leading its DLQ (the HTTP API of any node starts, shows,
cancels and resumes it there, `server/forward`). A target another node leads is staged on
through the link, as a publish; its log is not searched after a crash, so a message moved
there is moved at least once, not exactly once.

A task's state lives in `<data dir>/redrives/<id>.json`, replaced atomically; a task the
broker was running when it stopped (or crashed) runs again when it starts.

BCC keys (kept beside a dead letter in its queue, `QueueEngine.bcc_keys`): a message the task
keeps stays what it was, so it keeps them at the DLQ's tail. A message it moves does not: a
redrive publishes it anew, as an operator would by hand (RabbitMQ's shovels, which move
messages between queues, republish them and never see BCC keys either). The BCC copies went
out when the message was first published and again when it died; a moved message that dies
again goes to its routing key and CC keys only, not to the BCC recipients a third time.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from warrenmq.amqp import fastpath
from warrenmq.dlq.redrive import RedriveSpec, last_death
from warrenmq.log import RawRecord

from . import durable_files
from .forward.entry import append_position
from .queue.engine import Message
from .queue.work_queue import WorkQueue
from .vhost import Published, VirtualHost, describe

log = logging.getLogger(__name__)

BATCH_MESSAGES = 1000
BROWSE_MESSAGES = 1000
RATE_SLICES_PER_S = 5
"""A rate-limited task moves rate/5 messages at a time, so its pace is smooth."""

RUNNING = "running"
CANCELLED = "cancelled"
FAILED = "failed"
DONE = "done"


class RedriveError(Exception):
    """A task cannot go on (its queue is gone, a target refused or failed a write)."""


class _Batch:
    """The publisher the core reports failed writes to, by tag."""

    def __init__(self) -> None:
        self.failed: set[int] = set()

    def publish_failed(self, tag: int) -> None:
        self.failed.add(tag)


class _Step:
    """One message of a batch: where it goes (`target` None: routed through `route`)."""

    __slots__ = (
        "message",
        "moves",
        "target",
        "record",
        "route",
        "exchange",
        "routing_key",
        "bcc",
    )

    def __init__(self, message: Message, moves: bool, target: WorkQueue | None) -> None:
        self.message = message
        self.moves = moves
        self.target = target
        self.record: RawRecord = (
            message.exchange,
            message.routing_key,
            message.properties,
            message.body,
        )
        self.route: Any = None
        self.exchange = ""
        self.routing_key = ""
        self.bcc: tuple[str, ...] = ()
        """The BCC keys it keeps: a kept message's own (see the module's docstring)."""


@dataclass
class RedriveTask:
    id: str
    vhost: str
    queue: str
    spec: RedriveSpec
    state: str = RUNNING
    considered: int = 0
    moved: int = 0
    kept: int = 0
    skipped: int = 0
    """Selected, but with nowhere to go (its source queue is gone, no route): kept."""
    total: int = 0
    error: str | None = None
    created_ms: int = 0
    finished_ms: int | None = None
    pending: dict[str, Any] | None = None
    """The batch between its journal and its ack: DLQ offsets, target log positions."""
    stop: bool = field(default=False, compare=False)

    def to_json(self) -> dict[str, Any]:
        """What the API shows (and, with `pending`, what the task file holds)."""
        return {
            "id": self.id,
            "vhost": self.vhost,
            "queue": self.queue,
            "state": self.state,
            "dry_run": self.spec.dry_run,
            "considered": self.considered,
            "moved": self.moved,
            "kept": self.kept,
            "skipped": self.skipped,
            "total": self.total,
            "error": self.error,
            "created": self.created_ms,
            "finished": self.finished_ms,
            "spec": self.spec.to_json(),
        }

    @classmethod
    def from_file(cls, saved: dict[str, Any]) -> RedriveTask:
        task = cls(saved["id"], saved["vhost"], saved["queue"], RedriveSpec(**saved["spec"]))
        for name in ("state", "considered", "moved", "kept", "skipped", "total", "error"):
            setattr(task, name, saved[name])
        task.created_ms = saved["created"]
        task.finished_ms = saved["finished"]
        task.pending = saved.get("pending")
        return task


class Redrives:
    """The broker's redrive tasks. `after_commit()` resolves once everything staged so far
    is stored (the tick's); `wake(queue)` has the tick deliver and commit a queue."""

    def __init__(
        self,
        directory: Path,
        vhosts: Mapping[str, VirtualHost],
        after_commit: Callable[[], Awaitable[None]],
        clock: Callable[[], int],
    ) -> None:
        self.directory = directory
        self._vhosts = vhosts
        self._after_commit = after_commit
        self._clock = clock
        self.tasks: dict[str, RedriveTask] = {}
        self._running: dict[str, asyncio.Task[None]] = {}

    def recover(self) -> None:
        """Load every task; run again those that were running."""
        if not self.directory.is_dir():
            return
        for path in sorted(self.directory.glob("*.json")):
            try:
                task = RedriveTask.from_file(json.loads(path.read_text()))
            except (ValueError, KeyError, TypeError) as error:
                log.error("redrive task file %s is unreadable, ignored: %r", path.name, error)
                continue
            self.tasks[task.id] = task
            if task.state == RUNNING:
                self._run(task)

    def start(self, vhost: str, queue: str, spec: RedriveSpec) -> RedriveTask:
        """A new task on an existing queue (LookupError if it is not, ValueError if a task
        already runs on it)."""
        self._queue(vhost, queue)
        self._check_idle(vhost, queue)
        task = RedriveTask(secrets.token_hex(6), vhost, queue, spec, created_ms=self._clock())
        self.tasks[task.id] = task
        self._run(task)
        return task

    async def cancel(self, task_id: str) -> RedriveTask:
        """Stop a running task after its current batch (a stopped one stays as it is)."""
        task = self.tasks[task_id]
        running = self._running.get(task_id)
        if running is not None:
            task.stop = True
            await asyncio.shield(running)
            task.stop = False
            if task.state == RUNNING:
                task.state = CANCELLED
                await self._save(task)
        return task

    def resume(self, task_id: str) -> RedriveTask:
        """Run a cancelled or failed task again from where it stopped."""
        task = self.tasks[task_id]
        if task.state in (RUNNING, DONE):
            raise ValueError(f"the task is {task.state}")
        self._queue(task.vhost, task.queue)
        self._check_idle(task.vhost, task.queue)
        task.state, task.error, task.finished_ms = RUNNING, None, None
        self._run(task)
        return task

    async def operate(self, operation: str, vhost: str, queue: str, argument: str) -> Any:
        """An operation another node's HTTP API asks of this node's tasks (`server/forward`):
        list, start (`argument`: the spec as JSON), get, cancel or resume (`argument`: the
        task id). The answer as the API shows it, or {"refused": "not_found"} or
        {"refused": "bad_request", "reason": ...}."""
        try:
            if operation == "list":
                return [task.to_json() for task in self.tasks.values()]
            if operation == "start":
                spec = RedriveSpec.from_json(json.loads(argument))
                return self.start(vhost, queue, spec).to_json()
            if operation == "get":
                return self.tasks[argument].to_json()
            if operation == "cancel":
                return (await self.cancel(argument)).to_json()
            if operation == "resume":
                return self.resume(argument).to_json()
            raise ValueError(f"no redrive operation {operation!r}")
        except LookupError:
            return {"refused": "not_found"}
        except ValueError as error:
            return {"refused": "bad_request", "reason": str(error)}

    async def shutdown(self) -> None:
        """Stop every task after its batch, leaving it running on disk: the next start
        resumes it."""
        running = list(self._running.values())
        for task_id in self._running:
            self.tasks[task_id].stop = True
        await asyncio.gather(*running, return_exceptions=True)

    def _check_idle(self, vhost: str, queue: str) -> None:
        for task_id in self._running:
            task = self.tasks[task_id]
            if (task.vhost, task.queue) == (vhost, queue):
                raise ValueError(f"redrive {task.id} is already running on this queue")

    def _queue(self, vhost_name: str, name: str) -> tuple[VirtualHost, WorkQueue]:
        vhost = self._vhosts.get(vhost_name)
        queue = None if vhost is None else vhost.queues.get(name)
        if vhost is None or queue is None or queue.deleted:
            raise LookupError(f"no queue '{name}' in vhost '{vhost_name}'")
        return vhost, queue

    def _run(self, task: RedriveTask) -> None:
        running = asyncio.ensure_future(self._work(task))
        self._running[task.id] = running
        running.add_done_callback(lambda _: self._running.pop(task.id, None))

    async def _work(self, task: RedriveTask) -> None:
        try:
            if task.spec.dry_run:
                await self._count(task)
            else:
                await self._move(task)
        except (LookupError, RedriveError, OSError) as error:
            task.state = FAILED
            task.error = describe(error) if isinstance(error, OSError) else str(error)
            log.error("redrive %s of queue '%s' failed: %s", task.id, task.queue, task.error)
        if task.stop and task.state == RUNNING:
            # Stopped by cancel (which records it) or by shutdown (which leaves it running).
            if task.pending is not None:
                await self._save(task)
            return
        if task.state == RUNNING:
            task.state = DONE
        task.finished_ms = self._clock()
        try:
            await self._save(task)
        except OSError as error:
            log.error("redrive %s: its state could not be saved: %s", task.id, describe(error))

    # -- dry run ---------------------------------------------------------------------------

    async def _count(self, task: RedriveTask) -> None:
        """What a redrive would move, browsing the ready messages without taking any."""
        vhost, queue = self._queue(task.vhost, task.queue)
        task.total = queue.ready_count
        task.considered = task.moved = task.kept = task.skipped = 0
        start = 0
        limit = task.spec.limit
        while not task.stop and (limit is None or task.moved < limit):
            vhost, queue = self._queue(task.vhost, task.queue)
            browsed = queue.engine.browse(start, BROWSE_MESSAGES)
            if not browsed:
                break
            for message, in_flight in browsed:
                if in_flight:
                    continue
                task.considered += 1
                step = self._plan(vhost, queue, task.spec, message)
                if not step.moves:
                    task.kept += 1
                elif step.target is queue:
                    task.skipped += 1
                elif limit is None or task.moved < limit:
                    task.moved += 1
            start = browsed[-1][0].offset + 1
            await asyncio.sleep(0)

    # -- moving ----------------------------------------------------------------------------

    async def _move(self, task: RedriveTask) -> None:
        vhost, queue = self._queue(task.vhost, task.queue)
        stored_before = self._reconcile(vhost, task)
        held = set(task.pending["offsets"]) if task.pending else set()
        task.total = task.considered + queue.ready_count
        limit = task.spec.limit
        rate = task.spec.rate
        started, moved_at_start = time.monotonic(), task.moved
        while not task.stop and task.considered < task.total:
            if limit is not None and task.moved >= limit:
                break
            wanted = min(BATCH_MESSAGES, task.total - task.considered)
            if limit is not None:
                wanted = min(wanted, limit - task.moved)
            if rate is not None:
                wanted = min(wanted, max(1, rate // RATE_SLICES_PER_S))
                ahead_s = (task.moved - moved_at_start) / rate - (time.monotonic() - started)
                if ahead_s > 0:
                    await asyncio.sleep(ahead_s)
                    continue
            vhost, queue = self._queue(task.vhost, task.queue)
            messages = queue.take_many(wanted, self._clock())
            if not messages:
                if queue.held_until_commit:
                    await queue.commit()
                    continue
                break
            await self._batch(task, vhost, queue, messages, stored_before, held)

    def _plan(
        self, vhost: VirtualHost, queue: WorkQueue, spec: RedriveSpec, message: Message
    ) -> _Step:
        """Where one message goes: a move to its target, or kept (target: the DLQ itself)."""
        death = last_death(message.properties)
        if not spec.selects(death):
            return self._kept(queue, message, False)
        if spec.exchange is None:
            assert death is not None
            source = vhost.served_queue(death.queue)
            if source is None or source.deleted or source is queue:
                return self._kept(queue, message, True)
            step = _Step(message, True, source)
            step.record = (
                death.exchange.encode(),
                death.routing_key.encode(),
                message.properties,
                message.body,
            )
            return step
        if spec.routing_key is not None:
            routing_key = spec.routing_key
        elif death is not None:
            routing_key = death.routing_key
        else:
            routing_key = message.routing_key.decode("utf-8", "replace")
        route = vhost.route(spec.exchange, routing_key, message.properties)
        if not route[0]:
            return self._kept(queue, message, True)
        step = _Step(message, True, None)
        step.route, step.exchange, step.routing_key = route, spec.exchange, routing_key
        step.record = (spec.exchange.encode(), routing_key.encode(), route[1], message.body)
        return step

    @staticmethod
    def _kept(queue: WorkQueue, message: Message, moves: bool) -> _Step:
        """A message staying in the DLQ (staged again at its tail), with its BCC keys."""
        step = _Step(message, moves, queue)
        step.bcc = queue.engine.bcc_keys(message.offset)
        return step

    def _targets(self, vhost: VirtualHost, step: _Step) -> list[WorkQueue]:
        if step.target is not None:
            return [step.target]
        return [q for name in step.route[0] if (q := vhost.served_queue(name)) is not None]

    async def _batch(
        self,
        task: RedriveTask,
        vhost: VirtualHost,
        queue: WorkQueue,
        messages: list[Message],
        stored_before: Counter[tuple[str, RawRecord]],
        held: set[int],
    ) -> None:
        steps = [self._plan(vhost, queue, task.spec, message) for message in messages]
        positions: dict[str, set[int]] = {}
        for step in steps:
            for target in self._targets(vhost, step):
                positions.setdefault(target.name, set()).add(
                    append_position(target, step.record[2])
                )
        task.pending = {
            "offsets": [message.offset for message in messages],
            "positions": {name: sorted(found) for name, found in positions.items()},
        }
        try:
            await self._save(task)
        except OSError:
            # Nothing staged: the batch goes back to the queue as it was.
            queue.requeue(task.pending["offsets"], failed=False)
            vhost.wake(queue)
            raise
        batch = _Batch()
        refused: list[int] = []
        for tag, step in enumerate(steps, 1):
            if step.message.offset in held:
                targets = self._targets(vhost, step)
                keys = [(target.name, step.record) for target in targets]
                if targets and all(stored_before[key] > 0 for key in keys):
                    # Stored before a crash, its ack lost: acknowledged, not staged again.
                    stored_before.subtract(keys)
                    continue
            scan = fastpath.scan_properties(step.record[2])
            persistent, expiring = scan[0] == 2, scan[2] is not None
            publisher = (batch, tag)
            if step.target is not None:
                stored = vhost.restage(
                    step.target, step.record, persistent, expiring, publisher, step.bcc
                )
            else:
                stored = (
                    vhost.stage(
                        step.route,
                        step.exchange,
                        step.routing_key,
                        step.message.body,
                        persistent,
                        expiring,
                        publisher,
                    )
                    is Published.ROUTED
                )
            if not stored:
                refused.append(tag)
        await self._after_commit()
        failed = batch.failed.union(refused)
        settled = [step for tag, step in enumerate(steps, 1) if tag not in failed]
        queue.ack([step.message.offset for step in settled])
        if failed:
            # A target's refusal is no failed delivery of the message.
            queue.requeue([steps[tag - 1].message.offset for tag in sorted(failed)], failed=False)
        vhost.wake(queue)
        await queue.commit()
        for step in settled:
            if not step.moves:
                task.kept += 1
            elif step.target is queue:
                task.skipped += 1
            else:
                task.moved += 1
        task.considered += len(settled)
        task.pending = None
        held.difference_update(step.message.offset for step in steps)
        await self._save(task)
        if failed:
            raise RedriveError(
                f"{len(failed)} message(s) could not be stored on their target "
                "(a full queue refused them, or a write failed); they stay in the queue"
            )

    def _reconcile(self, vhost: VirtualHost, task: RedriveTask) -> Counter[tuple[str, RawRecord]]:
        """After a crash mid-batch: the records the batch's targets hold since its journal."""
        stored: Counter[tuple[str, RawRecord]] = Counter()
        if task.pending is None:
            return stored
        for name, positions in task.pending["positions"].items():
            target = vhost.queues.get(name)
            # A target another node leads is not searched: its messages are staged again.
            if target is None or target.deleted or not positions:
                continue
            for _, record in target.engine.stored_from(positions):
                stored[(name, tuple(record))] += 1
        log.info(
            "redrive %s resumes a batch of %d the crash interrupted (%d records since in its "
            "targets)",
            task.id,
            len(task.pending["offsets"]),
            sum(stored.values()),
        )
        return stored

    async def _save(self, task: RedriveTask) -> None:
        saved = json.dumps(dict(task.to_json(), pending=task.pending))
        await asyncio.to_thread(durable_files.replace, self.directory / f"{task.id}.json", saved)

"""A priority queue (x-max-priority) as one durable queue per priority level.

RabbitMQ semantics: a queue declared with ``x-max-priority`` N has levels 0..N; a message's
``priority`` property picks its level, values above N count as N and a missing priority as 0.
Consumers always get the highest non-empty level first, FIFO within a level.

Each level is a ``LogQueue`` in its own subdirectory, opened on its first message (a
queue declared with N = 255 but used with three priorities costs three logs, not 256). The
adapter has the engine's interface, so ``WorkQueue`` does not know the difference; offsets
it hands out carry the level in their low byte (``offset * 256 + level``) so acks and
requeues find their level again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from pathlib import Path

from warrenmq.amqp import fastpath
from warrenmq.log import RawRecord

from .engine import Kept, Message, QueueEngine
from .log_queue import remove_directory

LEVEL_BITS = 8
LEVELS_MAX = 1 << LEVEL_BITS
_LEVEL_MASK = LEVELS_MAX - 1
_LEVEL_PREFIX = "priority-"


def level_directory(level: int) -> str:
    """A level's directory under its queue's."""
    return f"{_LEVEL_PREFIX}{level}"


class PriorityQueue:
    def __init__(
        self,
        directory: Path,
        max_priority: int,
        batch_bytes_max: int,
        open_level: Callable[[Path], QueueEngine],
        every_level: bool = False,
    ) -> None:
        """`every_level`: open all levels now, not on their first message (a replicated
        queue's: its followers hold a copy of every level's logs)."""
        assert 0 <= max_priority < LEVELS_MAX, max_priority
        self.directory = directory
        self.max_priority = max_priority
        self.batch_bytes_max = batch_bytes_max
        self._open_level = open_level
        # Open levels, highest priority first.
        self._levels: dict[int, QueueEngine] = {}
        directory.mkdir(parents=True, exist_ok=True)
        try:
            if every_level:
                for level in range(max_priority + 1):
                    self._level(level)
            for path in directory.glob(_LEVEL_PREFIX + "*"):
                suffix = path.name[len(_LEVEL_PREFIX) :]
                if suffix.isdigit() and int(suffix) <= max_priority:
                    self._level(int(suffix))
        except BaseException:
            # A level that cannot be opened fails the queue; the levels opened so far close.
            self.close()
            raise

    def _level(self, level: int) -> QueueEngine:
        engine = self._levels.get(level)
        if engine is None:
            engine = self._open_level(self.directory / level_directory(level))
            self._levels[level] = engine
            self._levels = dict(sorted(self._levels.items(), reverse=True))
        return engine

    def level_of(self, properties: bytes) -> int:
        priority = fastpath.scan_properties(properties)[1]
        if priority is None:
            return 0
        return min(priority, self.max_priority)

    @staticmethod
    def _tagged(message: Message, level: int) -> Message:
        return message._replace(offset=(message.offset << LEVEL_BITS) | level)

    def _split(self, offsets: Iterable[int]) -> dict[int, list[int]]:
        by_level: dict[int, list[int]] = {}
        for offset in offsets:
            by_level.setdefault(offset & _LEVEL_MASK, []).append(offset >> LEVEL_BITS)
        return by_level

    # -- the engine interface ---------------------------------------------------------------

    @property
    def ready_count(self) -> int:
        return sum(engine.ready_count for engine in self._levels.values())

    @property
    def unacked_count(self) -> int:
        return sum(engine.unacked_count for engine in self._levels.values())

    @property
    def message_log_bytes(self) -> int:
        return sum(engine.message_log_bytes for engine in self._levels.values())

    @property
    def message_log_segments(self) -> int:
        return sum(engine.message_log_segments for engine in self._levels.values())

    @property
    def needs_commit(self) -> bool:
        return any(engine.needs_commit for engine in self._levels.values())

    @property
    def held_until_commit(self) -> bool:
        for engine in self._levels.values():
            if engine.ready_count:
                return engine.held_until_commit
        return False

    def append(
        self,
        records: Sequence[RawRecord],
        timestamp_ms: int | None = None,
        kept: Sequence[Kept] = (),
    ) -> None:
        by_level: dict[int, list[RawRecord]] = {}
        for record in records:
            by_level.setdefault(self.level_of(record[2]), []).append(record)
        if not kept:
            for level, batch in by_level.items():
                self._level(level).append(batch, timestamp_ms)
            return
        # Each kept entry with its record's index within its level's batch.
        kept_by_index = {entry.index: entry for entry in kept}
        by_level_kept: dict[int, list[Kept]] = {}
        counts: dict[int, int] = {}
        for index, record in enumerate(records):
            level = self.level_of(record[2])
            entry = kept_by_index.get(index)
            if entry is not None:
                by_level_kept.setdefault(level, []).append(
                    entry._replace(index=counts.get(level, 0))
                )
            counts[level] = counts.get(level, 0) + 1
        for level, batch in by_level.items():
            self._level(level).append(batch, timestamp_ms, by_level_kept.get(level, ()))

    def bcc_keys(self, offset: int) -> tuple[str, ...]:
        engine = self._levels.get(offset & _LEVEL_MASK)
        return () if engine is None else engine.bcc_keys(offset >> LEVEL_BITS)

    def append_position(self, properties: bytes) -> int:
        """The level's position, tagged with the level as offsets are."""
        level = self.level_of(properties)
        return (self._level(level).append_position(properties) << LEVEL_BITS) | level

    def stored_from(self, positions: Collection[int]) -> Iterator[tuple[int, RawRecord]]:
        for level, offsets in self._split(positions).items():
            engine = self._levels.get(level)
            if engine is not None:
                for offset, record in engine.stored_from(offsets):
                    yield (offset << LEVEL_BITS) | level, record

    def take_many(self, count_max: int) -> list[Message]:
        # Highest level first. A level that keeps ready messages until a commit (the
        # delivered mark) stops the take: a lower level serving would invert priorities.
        taken: list[Message] = []
        tagged = self._tagged
        for level, engine in self._levels.items():
            if len(taken) >= count_max:
                break
            if engine.ready_count:
                taken += [tagged(m, level) for m in engine.take_many(count_max - len(taken))]
                if engine.ready_count:
                    break
        return taken

    def peek(self) -> Message | None:
        for level, engine in self._levels.items():
            if engine.ready_count:
                head = engine.peek()
                return None if head is None else self._tagged(head, level)
        return None

    def drop_head(self, count_max: int) -> int:
        dropped = 0
        for engine in self._levels.values():
            if dropped >= count_max:
                break
            dropped += engine.drop_head(count_max - dropped)
        return dropped

    def ack_many(self, offsets: Iterable[int]) -> int:
        return sum(
            self._levels[level].ack_many(level_offsets)
            for level, level_offsets in self._split(offsets).items()
            if level in self._levels
        )

    def requeue(self, offsets: Iterable[int], failed: bool = False) -> int:
        return sum(
            self._levels[level].requeue(level_offsets, failed)
            for level, level_offsets in self._split(offsets).items()
            if level in self._levels
        )

    def hold(self, offsets: Iterable[int], due_ms: int, failed: bool = False) -> int:
        return sum(
            self._levels[level].hold(level_offsets, due_ms, failed)
            for level, level_offsets in self._split(offsets).items()
            if level in self._levels
        )

    def release(self, offsets: Iterable[int]) -> int:
        return sum(
            self._levels[level].release(level_offsets)
            for level, level_offsets in self._split(offsets).items()
            if level in self._levels
        )

    def held(self) -> list[tuple[int, int]]:
        return [
            ((offset << LEVEL_BITS) | level, due_ms)
            for level, engine in self._levels.items()
            for offset, due_ms in engine.held()
        ]

    def settle_redeliveries(self, offsets: Iterable[int]) -> int:
        return sum(
            self._levels[level].settle_redeliveries(level_offsets)
            for level, level_offsets in self._split(offsets).items()
            if level in self._levels
        )

    def browse(self, start: int, count_max: int) -> list[tuple[Message, bool]]:
        """`LogQueue.browse` over every level, in the order of the offsets handed out
        (offset, then level)."""
        browsed = [
            (self._tagged(message, level), in_flight)
            for level, engine in self._levels.items()
            for message, in_flight in engine.browse(start >> LEVEL_BITS, count_max)
        ]
        browsed = [entry for entry in browsed if entry[0].offset >= start]
        browsed.sort(key=lambda entry: entry[0].offset)
        return browsed[:count_max]

    def deliveries(self, offset: int) -> int:
        engine = self._levels.get(offset & _LEVEL_MASK)
        return 0 if engine is None else engine.deliveries(offset >> LEVEL_BITS)

    def failures(self, offset: int) -> int:
        engine = self._levels.get(offset & _LEVEL_MASK)
        return 0 if engine is None else engine.failures(offset >> LEVEL_BITS)

    def in_flight(self, offsets: Iterable[int]) -> list[Message]:
        tagged = self._tagged
        return [
            tagged(message, level)
            for level, level_offsets in self._split(offsets).items()
            if level in self._levels
            for message in self._levels[level].in_flight(level_offsets)
        ]

    def purge(self) -> int:
        return sum(engine.purge() for engine in self._levels.values())

    async def commit(self) -> None:
        await asyncio.gather(*(engine.commit() for engine in self._levels.values()))

    async def shutdown(self) -> None:
        # Side by side (255 levels, 255 fsyncs); every level finishes before a failure is raised.
        outcomes = await asyncio.gather(
            *(engine.shutdown() for engine in self._levels.values()), return_exceptions=True
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    def close(self) -> None:
        for engine in self._levels.values():
            engine.close()

    def delete(self) -> None:
        self.close()
        remove_directory(self.directory)

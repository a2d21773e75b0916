"""The dead-letter journal: why a crash never doubles a dead letter.

A dead letter leaves its queue only once every target stored it (fsynced), and the source's
acknowledgement is written after that: a crash between the two would bring the message back
to its queue while its dead letter sits in the targets, and it would die (and be delivered)
again. So before a hand-off stages anything, the vhost writes one journal line, durably: for
each dead letter its offset in the source and a digest of its stored record there, and for
each target the digest of the record staged on it and where the target's log stood
(`append_position`). On recovery, a dead letter whose record every target holds after those
positions (digests compared) is acknowledged in its source; any other comes back as before
(at least once). The digest of the source record guards against an offset a crash freed and
a new message reused.

The journal is one file of JSON lines per vhost, appended with group-committed fsyncs in a
thread; once it passes `COMPACT_BYTES`, it is rewritten with only the hand-offs still open.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from warrenmq.log import RawRecord

from . import durable_files

log = logging.getLogger(__name__)

COMPACT_BYTES = 4 << 20


def digest(record: Iterable[bytes]) -> str:
    """A digest of (exchange, routing key, properties, body), each part length-prefixed."""
    hashed = hashlib.blake2b(digest_size=16)
    for part in record:
        hashed.update(len(part).to_bytes(8, "little"))
        hashed.update(part)
    return hashed.hexdigest()


class Item:
    """One dead letter of a hand-off: its source offset and record, and its targets."""

    __slots__ = ("offset", "source", "targets")

    def __init__(self, offset: int, source: RawRecord) -> None:
        self.offset = offset
        self.source = digest(source)
        self.targets: list[tuple[str, str]] = []

    def to_json(self) -> list[Any]:
        return [self.offset, self.source, [list(target) for target in self.targets]]


class DeadLetterJournal:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._next_id = 1
        self._open: dict[int, str] = {}
        """Hand-offs written and not yet settled: id -> their line."""
        self._buffer: list[str] = []
        self._waiting: list[asyncio.Future[None]] = []
        self._writing = False
        self._size = path.stat().st_size if path.exists() else 0

    def load(self) -> list[dict[str, Any]]:
        """The hand-offs the file holds (a line torn by a crash is left out)."""
        if not self.path.exists():
            return []
        entries = []
        for line in self.path.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
                entries.append(entry)
                self._next_id = max(self._next_id, int(entry["id"]) + 1)
            except (ValueError, KeyError, TypeError):
                continue
        return entries

    async def record(self, queue: str, items: list[Item], positions: dict[str, set[int]]) -> int:
        """Write one hand-off durably; its id, to `settle` once its source acked it."""
        handoff_id = self._next_id
        self._next_id += 1
        line = json.dumps(
            {
                "id": handoff_id,
                "queue": queue,
                "items": [item.to_json() for item in items],
                "positions": {name: sorted(found) for name, found in positions.items()},
            },
            separators=(",", ":"),
        )
        self._open[handoff_id] = line
        self._buffer.append(line)
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        if not self._writing:
            # Marked here, not once the writer runs: another record in this pass of the loop
            # would start a second writer, whose write could end first and answer later
            # hand-offs before earlier ones (or append beside the other's compacting rewrite).
            self._writing = True
            asyncio.ensure_future(self._write())
        try:
            await waiter
        except BaseException:
            self._open.pop(handoff_id, None)
            raise
        return handoff_id

    def settle(self, handoff_id: int) -> None:
        self._open.pop(handoff_id, None)

    async def compact(self) -> None:
        """Rewrite the file with only the open hand-offs (after recovery, and when large)."""
        lines = list(self._open.values())
        await asyncio.to_thread(durable_files.replace, self.path, _text(lines))
        self._size = sum(len(line) + 1 for line in lines)

    async def _write(self) -> None:
        # One writer at a time (`record` sets `_writing`); what arrives meanwhile goes in the
        # next write (group commit).
        try:
            while self._buffer:
                lines, self._buffer = self._buffer, []
                waiting, self._waiting = self._waiting, []
                if self._size >= COMPACT_BYTES:
                    written = list(self._open.values())
                    write = asyncio.to_thread(durable_files.replace, self.path, _text(written))
                else:
                    written = lines
                    write = asyncio.to_thread(durable_files.append, self.path, _text(lines))
                try:
                    await write
                except OSError as error:
                    for waiter in waiting:
                        if not waiter.done():
                            waiter.set_exception(error)
                    continue
                if written is not lines:
                    self._size = 0
                self._size += sum(len(line) + 1 for line in written)
                for waiter in waiting:
                    if not waiter.done():
                        waiter.set_result(None)
        finally:
            self._writing = False


def _text(lines: list[str]) -> str:
    return "".join(line + "\n" for line in lines)

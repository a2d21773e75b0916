"""Idempotent producers (Warren's): a publisher that names itself and numbers its messages
gets each appended to a stream exactly once, however often it retries.

Headers: `x-producer-id` (a string) and `x-producer-sequence` (an integer that grows with
each new message of that producer). A stream keeps, per producer, the highest sequence it
appended; a message whose sequence is not above it is a duplicate (a retry after a lost
confirm or a reconnect): it is not appended, and it is confirmed as the original was. A
message without both headers is appended as any other.

The state is bounded (`PRODUCERS_MAX` producers per stream; the one heard from least recently
goes first) and durable without a write per message: the records themselves carry the
headers, so a snapshot (`SNAPSHOT_FILE`: the sequences as of an offset, replaced atomically
now and then) plus a scan of the records after it rebuilds the state after a restart or a
crash, exactly as the log holds it.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path

from warrenmq.amqp import properties as props
from warrenmq.log import PartitionLog
from warrenmq.server import durable_files

PRODUCER_ID = "x-producer-id"
PRODUCER_SEQUENCE = "x-producer-sequence"
_MARKER = PRODUCER_ID.encode()
SNAPSHOT_FILE = "producer-sequences.json"
PRODUCERS_MAX = 10_000
# A snapshot is written once this many records were appended since the last one, so a
# restart scans at most about this many.
SNAPSHOT_EVERY_RECORDS = 100_000


def producer_of(properties: bytes) -> tuple[str, int] | None:
    """(producer id, sequence) a message carries, or None."""
    if _MARKER not in properties:
        return None
    headers = dict(props.headers(properties))
    producer = props.text(headers.get(PRODUCER_ID))
    sequence = props.integer(headers.get(PRODUCER_SEQUENCE))
    if producer is None or sequence is None:
        return None
    return producer, sequence


class ProducerSequences:
    """One stream's highest appended sequence per producer."""

    def __init__(self, directory: Path, log: PartitionLog) -> None:
        self.path = directory / SNAPSHOT_FILE
        self._last: OrderedDict[str, int] = OrderedDict()
        self._undo: list[tuple[int, str, int | None]] = []
        """(index of the staged record, producer, its previous sequence) of this tick."""
        self.duplicates = 0
        self._snapshot_offset = 0
        self._writing: asyncio.Future[None] | None = None
        try:
            snapshot = json.loads(self.path.read_text())
        except FileNotFoundError:
            snapshot = {"offset": 0, "sequences": []}
        for producer, sequence in snapshot["sequences"]:
            self._remember(producer, sequence)
        self._snapshot_offset = snapshot["offset"]
        self._scan(log, max(snapshot["offset"], log.start_offset))

    def _scan(self, log: PartitionLog, offset: int) -> None:
        """Take the sequences of the records from `offset` to the end of the log."""
        for record in log.records_from(offset):
            found = producer_of(record.properties)
            if found is not None and found[1] > self._last.get(found[0], -1):
                self._remember(*found)

    def _remember(self, producer: str, sequence: int) -> None:
        last = self._last
        last.pop(producer, None)
        last[producer] = sequence
        if len(last) > PRODUCERS_MAX:
            last.popitem(last=False)

    def get(self, producer: str) -> int | None:
        return self._last.get(producer)

    def items(self) -> Iterable[tuple[str, int]]:
        return self._last.items()

    def accept(self, index: int, producer: str, sequence: int) -> bool:
        """Whether the message staged as record `index` of this tick is new (then its
        sequence is the producer's from now on, unless `failed` takes it back)."""
        previous = self._last.get(producer)
        if previous is not None and sequence <= previous:
            self.duplicates += 1
            return False
        self._undo.append((index, producer, previous))
        self._remember(producer, sequence)
        return True

    def written(self, failed_from: int | None) -> None:
        """The tick's records were written, those from index `failed_from` on excepted:
        their producers' sequences go back to what they were."""
        undo, self._undo = self._undo, []
        if failed_from is None:
            return
        for index, producer, previous in reversed(undo):
            if index < failed_from:
                break
            if previous is None:
                self._last.pop(producer, None)
            else:
                self._last[producer] = previous

    def snapshot_due(self, durable_offset: int) -> bool:
        return self._writing is None and durable_offset - self._snapshot_offset >= (
            SNAPSHOT_EVERY_RECORDS
        )

    async def snapshot(self, durable_offset: int) -> None:
        """Record the sequences as of `durable_offset` (everything below it is fsynced, so a
        restart scans from there)."""
        snapshot = {"offset": durable_offset, "sequences": list(self._last.items())}
        self._writing = asyncio.get_running_loop().run_in_executor(
            None, durable_files.replace, self.path, json.dumps(snapshot)
        )
        try:
            await self._writing
            self._snapshot_offset = durable_offset
        finally:
            self._writing = None

"""Tracked offsets: where a named stream consumer resumes, kept by the broker per (stream, tag).

A consumer is tracked when its tag is its own (not a broker-generated `amq.ctag-…`) or it asks
with `x-stream-automatic-offset-tracking: true`. Its tracked offset is the end of the
contiguous acked prefix of what it was handed: every offset below it was delivered and acked,
so it is never advanced by a delivery, and acks out of order (prefetch > 1) move it only once
the gap below them is acked too. When the same tag consumes again without `x-stream-offset`,
it resumes there.

The offsets of a stream are a log of their own (`OFFSETS_DIR`, in the stream's directory):
each commit appends a record of the tags that changed since the last, and now and then one of
all of them, after which the older records are deleted. Opening replays it. So the offsets
are replicated with the stream, as a queue's ack log is with its messages
(`server/replication.py`): a consumer resuming on a new leader starts where its acks were
committed. After a crash a tag resumes from an offset it had acked up to, never beyond. A
stream from before this log (its offsets in `tracked-offsets.json`) takes them from that
file into the log on its first commit.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from warrenmq.log import LogConfig, PartitionLog

OFFSETS_DIR = "offsets"
LEGACY_FILE = "tracked-offsets.json"
LOG_CONFIG = LogConfig(segment_bytes_max=256 << 10, tail_cache_bytes_max=0)
"""Small segments: a record of every tag lets the ones before it go soon."""
FULL_RECORD_BYTES_MIN = 512 << 10
"""A record of every tag is written once the changes since the last one reach this, or four
times that record's size."""
_CHANGES = b"changes"
_ALL = b"all"
# Tags kept per stream; beyond, the one acked least recently is forgotten (client libraries
# name consumers at random, and each such tag would otherwise stay for ever).
TAGS_MAX = 10_000
GENERATED_TAG_PREFIX = "amq.ctag-"
TRACKING_ARGUMENT = "x-stream-automatic-offset-tracking"


def is_tracked(tag: str, arguments: dict) -> bool:
    return arguments.get(TRACKING_ARGUMENT) is True or not tag.startswith(GENERATED_TAG_PREFIX)


class TrackedOffsets:
    """One stream's tracked offsets, as last made durable and as changed since."""

    def __init__(self, log: PartitionLog, directory: Path) -> None:
        self.log = log
        self._offsets: dict[str, int] = {}
        self._changed: set[str] = set()
        self._writing = asyncio.Lock()
        self._all_bytes = 0
        self._bytes_since_all = 0
        for record in log.records_from(log.start_offset):
            pairs = json.loads(record.body)
            if record.routing_key == _ALL:
                self._offsets.clear()
                self._all_bytes, self._bytes_since_all = len(record.body), 0
            else:
                self._bytes_since_all += len(record.body)
            for tag, offset in pairs:
                self._put(tag, offset)
        self._legacy = directory / LEGACY_FILE
        if log.end_offset == 0 and self._legacy.exists():
            for tag, offset in json.loads(self._legacy.read_text()).items():
                self._put(tag, offset)
            self._changed.update(self._offsets)
        else:
            self._legacy = None

    @classmethod
    def open(cls, directory: Path) -> TrackedOffsets:
        """A stream's offsets, from its directory (its log not replicated)."""
        return cls(PartitionLog.open(directory / OFFSETS_DIR, LOG_CONFIG), directory)

    def get(self, tag: str) -> int | None:
        return self._offsets.get(tag)

    def items(self) -> list[tuple[str, int]]:
        return sorted(self._offsets.items())

    def set(self, tag: str, offset: int) -> None:
        if self._offsets.get(tag) == offset:
            return
        self._put(tag, offset)
        self._changed.add(tag)

    def _put(self, tag: str, offset: int) -> None:
        offsets = self._offsets
        # Kept in the order they were last set: the first is the least recently acked.
        offsets.pop(tag, None)
        offsets[tag] = offset
        if len(offsets) > TAGS_MAX:
            del offsets[next(iter(offsets))]

    @property
    def changed(self) -> bool:
        return bool(self._changed)

    async def commit(self) -> None:
        """Make the offsets as they are now durable (one write at a time: every cursor of the
        stream commits through here)."""
        async with self._writing:
            if not self._changed:
                return
            changed, self._changed = self._changed, set()
            offsets = self._offsets
            every = self._bytes_since_all >= max(FULL_RECORD_BYTES_MIN, 4 * self._all_bytes)
            if every:
                kind, pairs = _ALL, list(offsets.items())
            else:
                # In the order they were set, which replaying keeps (a tag forgotten since
                # is left out: replaying forgets it too).
                kind, pairs = _CHANGES, [(t, o) for t, o in offsets.items() if t in changed]
            body = json.dumps(pairs).encode()
            try:
                at = self.log.append([(b"", kind, b"", body)])
                await self.log.commit()
            except BaseException:
                self._changed |= changed
                raise
            if every:
                self._all_bytes, self._bytes_since_all = len(body), 0
                self.log.delete_before(at)
            else:
                self._bytes_since_all += len(body)
            if self._legacy is not None:
                os.unlink(self._legacy)
                self._legacy = None

    def close(self) -> None:
        self.log.close()

"""Tracked offsets: where a named stream consumer resumes, kept by the broker per (stream, tag).

A consumer is tracked when its tag is its own (not a broker-generated `amq.ctag-…`) or it asks
with `x-stream-automatic-offset-tracking: true`. Its tracked offset is the end of the
contiguous acked prefix of what it was handed: every offset below it was delivered and acked,
so it is never advanced by a delivery, and acks out of order (prefetch > 1) move it only once
the gap below them is acked too. When the same tag consumes again without `x-stream-offset`,
it resumes there.

The offsets of a stream are one small JSON file beside its log, replaced atomically (written
to a temporary file, fsynced, renamed, the directory fsynced): after a crash a tag resumes
from an offset it had acked up to, never beyond.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from warrenmq.server import durable_files

OFFSETS_FILE = "tracked-offsets.json"
# Tags kept per stream; beyond, the one acked least recently is forgotten (client libraries
# name consumers at random, and each such tag would otherwise stay for ever).
TAGS_MAX = 10_000
GENERATED_TAG_PREFIX = "amq.ctag-"
TRACKING_ARGUMENT = "x-stream-automatic-offset-tracking"


def is_tracked(tag: str, arguments: dict) -> bool:
    return arguments.get(TRACKING_ARGUMENT) is True or not tag.startswith(GENERATED_TAG_PREFIX)


class TrackedOffsets:
    """One stream's tracked offsets, as last made durable and as changed since."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / OFFSETS_FILE
        try:
            self._offsets: dict[str, int] = json.loads(self.path.read_text())
        except FileNotFoundError:
            self._offsets = {}
        self._changed = False
        self._writing = asyncio.Lock()

    def get(self, tag: str) -> int | None:
        return self._offsets.get(tag)

    def items(self) -> list[tuple[str, int]]:
        return sorted(self._offsets.items())

    def set(self, tag: str, offset: int) -> None:
        offsets = self._offsets
        if offsets.get(tag) == offset:
            return
        # Kept in the order they were last set: the first is the least recently acked.
        offsets.pop(tag, None)
        offsets[tag] = offset
        if len(offsets) > TAGS_MAX:
            del offsets[next(iter(offsets))]
        self._changed = True

    @property
    def changed(self) -> bool:
        return self._changed

    async def commit(self) -> None:
        """Make the offsets as they are now durable (one write at a time: every cursor of the
        stream commits through here)."""
        async with self._writing:
            if not self._changed:
                return
            self._changed = False
            snapshot = dict(self._offsets)
            try:
                await asyncio.get_running_loop().run_in_executor(
                    None, durable_files.replace, self.path, json.dumps(snapshot)
                )
            except BaseException:
                self._changed = True
                raise

"""The dead-letter journal (`server/dead_letter_journal.py`): one write at a time, so the
hand-offs it records become durable, and are answered, in the order they were recorded."""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor

from warrenmq.server import durable_files
from warrenmq.server.dead_letter_journal import DeadLetterJournal


class CountingExecutor(ThreadPoolExecutor):
    """The loop's executor (where the journal's writes run), counting the jobs in progress
    as they are submitted, so the test sees a second write start without waiting for it."""

    def __init__(self) -> None:
        super().__init__(max_workers=4)
        self._lock = threading.Lock()
        self.running = 0
        self.running_max = 0

    def submit(self, fn, /, *args, **kwargs):
        with self._lock:
            self.running += 1
            self.running_max = max(self.running_max, self.running)
        future = super().submit(fn, *args, **kwargs)
        future.add_done_callback(self._done)
        return future

    def _done(self, _future) -> None:
        with self._lock:
            self.running -= 1


def test_a_record_made_while_a_write_runs_waits_for_it(tmp_path, monkeypatch):
    """Two records in one pass of the loop, then a third while their write runs: the third
    goes in the next write, not in a second writer beside the first (which would finish
    first and answer the third before the other two)."""
    release_first_write = threading.Event()
    append = durable_files.append

    def held_append(path, text):
        if '"id":1,' in text:
            assert release_first_write.wait(10)
        append(path, text)

    monkeypatch.setattr(durable_files, "append", held_append)

    async def scenario() -> tuple[list[int], int]:
        executor = CountingExecutor()
        asyncio.get_running_loop().set_default_executor(executor)
        journal = DeadLetterJournal(tmp_path / "journal")
        answered: list[int] = []

        async def record(number: int) -> None:
            await journal.record("q", [], {})
            answered.append(number)

        first_two = [asyncio.ensure_future(record(number)) for number in (1, 2)]
        while executor.running == 0:
            await asyncio.sleep(0)
        third = asyncio.ensure_future(record(3))
        # Passes enough for the third record, and a writer of its own if it had one, to run.
        for _ in range(10):
            await asyncio.sleep(0)
        running_max = executor.running_max
        release_first_write.set()
        await asyncio.gather(*first_two, third)
        return answered, running_max

    answered, running_max = asyncio.run(scenario())
    assert running_max == 1
    assert answered == [1, 2, 3]
    lines = (tmp_path / "journal").read_text().splitlines()
    assert [json.loads(line)["id"] for line in lines] == [1, 2, 3]

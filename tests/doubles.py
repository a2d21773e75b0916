"""Test doubles shared by the unit tests (importable because tests/conftest.py puts this folder
on sys.path; the suite runs in importlib mode, so the folder is not a package)."""

from __future__ import annotations

from concurrent.futures import Executor, Future


def work_queue(engine, name: str = "q", queue_type: str = "classic", **arguments):
    """A durable WorkQueue (classic unless told) named `name` in vhost "/" over `engine`."""
    # Imported here: the log and amqp tests use this module without loading server/.
    from warrenmq.server.queue.dead_letter_counts import DeadLetterCounts
    from warrenmq.server.queue.work_queue import WorkQueue

    return WorkQueue(
        "/",
        name,
        engine,
        durable=True,
        auto_delete=False,
        exclusive_owner=None,
        arguments=arguments,
        queue_type=queue_type,
        batch_records_max=64,
        dead_letter_counts=DeadLetterCounts(),
    )


class HeldExecutor(Executor):
    """A worker thread that has not got to its jobs yet: they run only when told to, and a
    crash (`drop_all`) means they never run."""

    def __init__(self) -> None:
        self.jobs: list[tuple[Future, object, tuple, dict]] = []

    def submit(self, fn, /, *args, **kwargs):
        future: Future = Future()
        self.jobs.append((future, fn, args, kwargs))
        return future

    def run_all(self) -> None:
        jobs, self.jobs = self.jobs, []
        for future, fn, args, kwargs in jobs:
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:
                future.set_exception(exc)

    def drop_all(self) -> None:
        self.jobs = []

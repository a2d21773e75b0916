"""Test doubles shared by the unit tests (importable because tests/conftest.py puts this folder
on sys.path; the suite runs in importlib mode, so the folder is not a package)."""

from __future__ import annotations

from concurrent.futures import Executor, Future


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

"""Password checks that unauthenticated clients can neither starve nor learn users from.

Each check is a KDF run (``passwords.verify_password``: ~40 ms and 16 MiB of scrypt), so:

* At most ``concurrent_max`` run at once, on threads of their own: the bound is the pool's
  size, so a check whose client went away (its waiter cancelled) never adds a run beyond it.
* Fair between source addresses: each address has at most one check queued or running and
  the pool takes them first come, first served, so a flood from one address delays another
  address's login by at most one check per address ahead of it, not by the whole flood.
* Repeated failures slow their address down: after ``FAILURES_FREE`` failures each further
  check from it waits first, doubling from ``PENALTY_S_MIN`` to ``PENALTY_S_MAX``, until
  ``FAILURES_FORGOTTEN_S`` pass without a failure or a check succeeds.
* An unknown user costs the same KDF as a known one (a decoy hash of the default cost that no
  password matches), so the time of a refusal does not tell which users exist.
"""

from __future__ import annotations

import asyncio
import base64
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from . import passwords

FAILURES_FREE = 5
PENALTY_S_MIN = 0.1
PENALTY_S_MAX = 5.0
FAILURES_FORGOTTEN_S = 300.0
# Addresses whose failures are remembered at most; beyond it the longest quiet ones go.
SOURCES_MAX = 10_000


def decoy_hash() -> str:
    """A stored hash of the default cost, with random salt and key: no password matches it."""
    return "$".join(
        (
            passwords.SCHEME,
            str(passwords.LOG2_N_DEFAULT),
            str(passwords.BLOCK_SIZE_DEFAULT),
            str(passwords.PARALLELISM_DEFAULT),
            base64.b64encode(os.urandom(passwords.SALT_BYTES)).decode("ascii"),
            base64.b64encode(os.urandom(passwords.KEY_BYTES)).decode("ascii"),
        )
    )


class _Source:
    """One address's turn (a lock: one check at a time) and its recent failures."""

    __slots__ = ("turn", "failures", "failed_s", "checks")

    def __init__(self) -> None:
        self.turn = asyncio.Lock()
        self.failures = 0
        self.failed_s = 0.0
        self.checks = 0


class PasswordChecks:
    def __init__(
        self,
        concurrent_max: int,
        *,
        verify: Callable[[str, str], bool] = passwords.verify_password,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        assert concurrent_max >= 1
        self._pool = ThreadPoolExecutor(concurrent_max, thread_name_prefix="warren-password")
        self._verify = verify
        self._clock = clock
        self._decoy = decoy_hash()
        self._sources: dict[str, _Source] = {}

    async def check(self, password: str, stored: str | None, source: str) -> bool:
        """Whether `password` matches `stored` (None: the user does not exist, always False,
        after the same work). `source` is the client's address."""
        entry = self._sources.get(source)
        if entry is None:
            entry = self._sources[source] = _Source()
            self._forget_quiet_sources()
        entry.checks += 1
        try:
            async with entry.turn:
                penalty_s = self.penalty_s(source)
                if penalty_s > 0:
                    await asyncio.sleep(penalty_s)
                loop = asyncio.get_running_loop()
                ok = await loop.run_in_executor(
                    self._pool, self._verify, password, self._decoy if stored is None else stored
                )
                ok = ok and stored is not None
                if ok:
                    entry.failures = 0
                else:
                    entry.failures += 1
                    entry.failed_s = self._clock()
                return ok
        finally:
            entry.checks -= 1
            if entry.checks == 0 and entry.failures == 0 and self._sources.get(source) is entry:
                del self._sources[source]

    def penalty_s(self, source: str) -> float:
        """How long the next check from `source` waits before its KDF runs."""
        entry = self._sources.get(source)
        if entry is None or entry.failures < FAILURES_FREE:
            return 0.0
        if self._clock() - entry.failed_s >= FAILURES_FORGOTTEN_S:
            entry.failures = 0
            return 0.0
        return min(PENALTY_S_MAX, PENALTY_S_MIN * 2 ** (entry.failures - FAILURES_FREE))

    def _forget_quiet_sources(self) -> None:
        if len(self._sources) <= SOURCES_MAX:
            return
        now = self._clock()
        for source, entry in list(self._sources.items()):
            if entry.checks == 0 and now - entry.failed_s >= FAILURES_FORGOTTEN_S:
                del self._sources[source]
        if len(self._sources) > SOURCES_MAX:
            idle = sorted(
                (entry.failed_s, source)
                for source, entry in self._sources.items()
                if entry.checks == 0
            )
            for _, source in idle[: len(self._sources) - SOURCES_MAX]:
                del self._sources[source]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

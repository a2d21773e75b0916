"""Resource alarms: the memory high watermark and the free disk limit, as RabbitMQ's.

A `ResourceMonitor` samples the process's resident memory and the free space of the data
dir's disk; it raises an alarm when memory goes above the watermark or free space below the
limit, and clears it once the sample is back on the right side (``rabbit_alarm``,
``vm_memory_monitor``, ``rabbit_disk_monitor``). While any alarm is in effect the broker
blocks publishing connections: a connection that publishes is sent ``connection.blocked``
(if it announced the capability) and read no more until every alarm clears, when it gets
``connection.unblocked``. Consumers, acks, deletes and purges go on, on the connections that
do not publish, so memory and space can be freed.

The samplers are passed in and `check` is called by the broker's timer, so a test drives
the monitor without a full disk or a memory hog.
"""

from __future__ import annotations

import ctypes
import logging
import os
import resource
import shutil
from collections.abc import Callable
from pathlib import Path

from .config import BrokerConfig

log = logging.getLogger("warrenmq.server")

MEMORY = "memory"
DISK = "disk"
# rabbit_alarm's names of the resources in /api/health/checks/alarms.
RESOURCE_NAMES = {MEMORY: "memory", DISK: "disk space"}
# Clients' input also samples memory and disk after this many bytes since the last sample:
# a flood over loopback reads hundreds of MB in one timer interval (or in a timer delayed by
# a busy machine), which only the watermark plus this much should hold.
RESOURCE_CHECK_READ_BYTES = 8 << 20


def resident_memory_bytes() -> int:
    """The process's resident memory (peak, where /proc is missing)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None


_MALLOC_TRIM = _malloc_trim()


def release_free_memory() -> None:
    """Hand the allocator's free pages back to the OS (glibc's malloc_trim; elsewhere
    nothing): what a dropped connection held is otherwise freed inside the process only, the
    resident memory stays up, and the memory alarm with it."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def total_memory_bytes() -> int:
    """The machine's memory, what the relative settings are fractions of."""
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def disk_free_bytes(path: Path) -> int:
    """Free space on the disk holding `path` (0 while it does not exist)."""
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return 0


def memory_limit_bytes(config: BrokerConfig, total_bytes: int) -> int:
    """The memory high watermark: absolute when set, else relative to the machine's memory."""
    if config.memory_high_watermark_bytes:
        return config.memory_high_watermark_bytes
    return int(config.memory_high_watermark_relative * total_bytes)


def disk_free_limit_bytes(config: BrokerConfig, total_bytes: int) -> int:
    """The free disk limit: relative to the machine's memory when set, else absolute."""
    if config.disk_free_limit_relative:
        return int(config.disk_free_limit_relative * total_bytes)
    return config.disk_free_limit_bytes


def blocked_reason(resources: frozenset[str]) -> str:
    """connection.blocked's reason, as rabbit_reader words it: "low on memory", "low on
    disk", or "low on memory & disk"."""
    return "low on " + " & ".join(name for name in (MEMORY, DISK) if name in resources)


class ResourceMonitor:
    """The two alarms, each raised and cleared by the samples `check` takes."""

    def __init__(
        self,
        memory_limit_bytes: int,
        disk_free_limit_bytes: int,
        sample_memory: Callable[[], int],
        sample_disk_free: Callable[[], int],
        changed: Callable[[frozenset[str]], None],
    ) -> None:
        assert memory_limit_bytes >= 0 and disk_free_limit_bytes >= 0
        self.memory_limit_bytes = memory_limit_bytes
        self.disk_free_limit_bytes = disk_free_limit_bytes
        self._sample_memory = sample_memory
        self._sample_disk_free = sample_disk_free
        self._changed = changed
        self.memory_used_bytes = 0
        self.disk_free_bytes = 0
        self.alarms: frozenset[str] = frozenset()
        """The resources in alarm now."""

    def check(self) -> None:
        """Sample both resources; raise or clear their alarms, and report a change."""
        self.memory_used_bytes = self._sample_memory()
        self.disk_free_bytes = self._sample_disk_free()
        alarms = set()
        if self.memory_used_bytes > self.memory_limit_bytes:
            alarms.add(MEMORY)
        if self.disk_free_bytes < self.disk_free_limit_bytes:
            alarms.add(DISK)
        alarms_now = frozenset(alarms)
        if alarms_now == self.alarms:
            return
        for name in alarms_now - self.alarms:
            log.warning(
                "%s resource limit alarm set (%s). Publishers will be blocked until this "
                "alarm clears",
                name,
                self._describe(name),
            )
        for name in self.alarms - alarms_now:
            log.warning("%s resource limit alarm cleared (%s)", name, self._describe(name))
        self.alarms = alarms_now
        self._changed(alarms_now)

    def _describe(self, name: str) -> str:
        if name == MEMORY:
            used, limit = self.memory_used_bytes, self.memory_limit_bytes
            return f"memory used {used} bytes, watermark {limit}"
        return f"disk free {self.disk_free_bytes} bytes, limit {self.disk_free_limit_bytes}"

"""A bounded pool of open file descriptors, shared by the logs of one thread.

A segment has three files (`.log`, `.index`, `.timeindex`) and a queue two logs, so a broker
with 100,000 queues names 600,000 files: far more than RLIMIT_NOFILE lets a process hold
open. Segments therefore hold their files as `PooledFile`s: `fileno()` returns an open
descriptor, reopening the file if the pool closed it, and the pool closes the least recently
used descriptor whenever opening another would pass its capacity. At most `capacity` log
descriptors are open however many logs exist; an idle log holds none once others needed room.

Closing a descriptor loses nothing written through it: the data sits in the page cache of the
file (the inode), and an fsync through any descriptor of that file writes it to disk. The
log's fsyncs rely on that: the worker thread opens the files it fsyncs itself (partition.py),
so no descriptor of the pool is ever used outside its thread, and eviction never races an
fsync.

Not thread-safe: a pool and every log using it belong to one thread (the event loop). A use
of an open descriptor costs one `OrderedDict.move_to_end`; a reopen one open(2), plus one
close(2) when the pool is full.
"""

from __future__ import annotations

import errno
import os
import resource
from collections import OrderedDict

from .errors import LogError

# The logs take this share of the process's open-file limit by default; the rest is for
# sockets, the metadata store (SQLite keeps three files), and short-lived descriptors.
DEFAULT_LIMIT_SHARE = 0.5
CAPACITY_MIN = 16
# What a pool assumes when the process's limit is unlimited.
_UNLIMITED_NOFILE = 1 << 20


def default_capacity() -> int:
    """`DEFAULT_LIMIT_SHARE` of the process's soft RLIMIT_NOFILE, at least `CAPACITY_MIN`."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        soft = _UNLIMITED_NOFILE
    return max(CAPACITY_MIN, int(soft * DEFAULT_LIMIT_SHARE))


class PooledFile:
    """A file of the pool: open now, or reopened by the next `fileno()`.

    Take the descriptor for one system call at a time: a later `fileno()` of another file may
    evict this one, and the number may then name another file.
    """

    __slots__ = ("path", "flags", "fd", "closed", "_pool")

    def __init__(self, path: str, flags: int, pool: DescriptorPool) -> None:
        self.path = path
        self.flags = flags
        """The flags of every reopen (never O_CREAT or O_TRUNC: only the first open may)."""
        self.fd = -1
        self.closed = False
        self._pool = pool

    def fileno(self) -> int:
        fd = self.fd
        if fd >= 0:
            self._pool._recent.move_to_end(self)
            return fd
        return self._pool._reopen(self)

    def close(self) -> None:
        """Close the descriptor for good; `fileno()` refuses afterwards."""
        self.closed = True
        self._pool._release(self)


class DescriptorPool:
    """At most `capacity` open descriptors; the least recently used is closed first."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise LogError(f"a descriptor pool needs a capacity of at least 1, got {capacity}")
        self.capacity = capacity
        # Open files, least recently used first.
        self._recent: OrderedDict[PooledFile, None] = OrderedDict()
        self.opened_total = 0
        """Descriptors opened, first opens and reopens."""
        self.evicted_total = 0
        """Descriptors closed to make room (or because the process ran out)."""

    @property
    def open_count(self) -> int:
        return len(self._recent)

    def open(
        self, path: str | os.PathLike[str], flags: int, *, first_flags: int = 0, mode: int = 0o644
    ) -> PooledFile:
        """Open `path` now with `flags | first_flags`; reopens after an eviction use `flags`."""
        file = PooledFile(os.fspath(path), flags, self)
        self._open(file, flags | first_flags, mode)
        return file

    def _reopen(self, file: PooledFile) -> int:
        if file.closed:
            raise LogError(f"{file.path} is closed")
        return self._open(file, file.flags, 0)

    def _open(self, file: PooledFile, flags: int, mode: int) -> int:
        recent = self._recent
        while len(recent) >= self.capacity:
            self._evict_oldest()
        while True:
            try:
                fd = os.open(file.path, flags, mode)
                break
            except OSError as error:
                # The process's limit is reached (sockets hold the rest): the logs give up
                # descriptors they can reopen later rather than fail.
                if error.errno not in (errno.EMFILE, errno.ENFILE) or not recent:
                    raise
                self._evict_oldest()
        file.fd = fd
        recent[file] = None
        self.opened_total += 1
        return fd

    def _evict_oldest(self) -> None:
        file, _ = self._recent.popitem(last=False)
        fd, file.fd = file.fd, -1
        self.evicted_total += 1
        os.close(fd)

    def _release(self, file: PooledFile) -> None:
        if file.fd >= 0:
            del self._recent[file]
            fd, file.fd = file.fd, -1
            os.close(fd)


_default: DescriptorPool | None = None


def default_pool() -> DescriptorPool:
    """The pool of logs opened without one, created with `default_capacity()` on first use."""
    global _default
    if _default is None:
        _default = DescriptorPool(default_capacity())
    return _default

"""Errors the commit log raises. Every one is a LogError, so callers can catch the family."""


class LogError(Exception):
    """A request the log cannot honour (a bound exceeded, a closed log, a bad argument)."""


class CorruptBatchError(LogError):
    """A stored batch failed its CRC or framing check; its records are never returned."""


class OffsetOutOfRangeError(LogError):
    """A read below the log's first retained offset."""

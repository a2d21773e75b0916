"""Errors the queue engine raises; storage failures arrive as `warrenmq.log.LogError`."""


class QueueError(Exception):
    """A request the queue cannot honour (a closed queue, a damaged ack log record)."""

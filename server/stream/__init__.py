"""Retained streams: a partition log that any number of consumers replay from an offset or a
time (``stream.Stream``), each consumer reading through its own cursor (``cursor.Cursor``)."""

"""Queues on the log: ready/unacked/acked state, the ack log, redelivery, limits."""

"""Clustering: Raft, the metadata state machine, replication and forwarding."""

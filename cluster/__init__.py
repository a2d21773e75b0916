"""Generic replication: the sans-I/O Raft core and its simulator (`raft/`), and beside it the
Raft host process (`node.py`) with its TCP transport, durable storage on `warrenmq.log`, the
demo replicated KV service (`kv.py`), `LocalCluster` for tests, and the benchmark."""

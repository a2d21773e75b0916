"""Partition-log replication: leader/follower with leader epochs under the metadata Raft, and
a quorum commit rule (issue 12's design; its vocabulary throughout).

Sans-I/O: no sockets, no clock, no asyncio. The host passes `now` in, carries the messages,
reads and fsyncs the logs, and carries AlterIsr proposals to the metadata controller.

* `node.ReplicationNode` — everything one node replicates, the host's one object: `apply` /
  `recover` metadata, `appended` / `durable` log progress, `handle_fetch` + `ready_fetches`
  (leader side, `PendingFetch`: read `reads`, `fill`, send `response()`), `poll_fetches` +
  `handle_response` (follower side, one request per leader node), `tick`,
  `take_alter_isr`, `take_high_watermarks`, `high_watermark`. Its docstring is the host's
  contract.
* `leader.PartitionLeader` / `follower.PartitionFollower` — one partition's two roles.
* `messages` — `PartitionState` (the metadata), `FetchRequest` / `FetchResponse` (epoch
  queries and fetches together), `AlterIsr`; `codec.encode` / `codec.decode` put them on the
  wire.
* `replica_log.ReplicaLog` — what replication needs of a log; `log.PartitionLog` is one
  (`append_stored`, `epoch_end_offset`), `memory_log.MemoryLog` the simulator's.
* `sim` — the deterministic simulator: `python -m warrenmq.cluster.replication.sim --seeds N`.

Partitions are opaque keys (bytes or str): a queue's messages and acks logs are two.
"""

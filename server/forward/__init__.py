"""Forwarding: queue work from the node a client is connected to (the entry node) to the node
that leads the queue (the owner).

The path
    Routing stays on the entry node: exchanges and bindings are metadata every node has. In
    the vhost, a queue another node leads is a `RemoteQueue` (``vhost.remote``) where its own
    queues are `WorkQueue`s (``vhost.queues``), and it answers the same calls: the publish
    path stages on it, the tick flushes it and waits for its "commit", channels deliver its
    messages and settle them by offset. A queue led here is never looked up in
    ``vhost.remote``: the local hot path pays nothing (a miss in ``vhost.queues`` looks
    there too, on the unroutable path). The session knows of no node; the few core calls that
    must wait for the owner (consume, get, purge, delete, a declare's counts) return an
    awaitable where they returned a value, which the session awaits as it awaits a metadata
    write.

The link
    One stream per (entry node, owner node), dialled by the entry node to the owner's AMQP
    port (`broker.node_address`): its first bytes, ``MAGIC``, tell it from an AMQP client and
    the listener hands the socket over (`Forwarding.accept`). Messages (`wire.py`) are frames
    of ``cluster/transport.py``'s framing, fields packed by schema, argument tables in the
    metadata's lossless encoding; properties and body travel as the publisher sent them.
    Not AMQP: a forwarded publish is staged into named queues keeping its original exchange
    and routing key, which basic.publish cannot say, and settles go by the owner's offsets.

    PUBLISH(seq, vhost, queues, exchange, routing key, properties, body, persistent,
    expiring, BCC keys) is answered by CONFIRM(through seq) once the owner's tick stored it
    (fsynced, for a persistent message on a durable queue: the owner's link is a publisher
    to its core, as a confirming channel), and NACK(seq) first for one it refused or could
    not store. The entry node's tick holds the client's confirm until every target of the
    publish is stored: its local queues' fsync and each owner's CONFIRM (`RemoteQueue.commit`).

    A dead letter whose target queue another node leads is published to it the same way,
    over this node's link to that node, by PUBLISH_KEPT when it carries failed deliveries
    (``x-delivery-count`` goes on counting there). As with a local target, it leaves its
    source queue only once the target's owner confirmed it; the dead-letter journal, which
    finds a local target's copy after a crash, leaves such a hand-off out: a crash in
    between delivers it twice, never loses it.

    CONSUME(id, vhost, queue, tag, exclusive, arguments) registers a consumer on the owner
    whose channel is the link (`owner.LinkChannel`); the entry node grants it credit
    (CREDIT(id, n): what the client's prefetch and channel leave room for, at most
    ``CREDIT_WINDOW`` ahead), the owner sends DELIVER(id, message) within it, and the entry
    node hands them to the client's channel as a local queue would. Every delivery needs an
    ack on the owner (a no-ack client's channel acks at once): SETTLE(vhost, queue, ack |
    reject | requeue, offsets). CANCEL(id) is answered once removed (and an auto-delete
    queue deleted); CANCELLED(id, reason) tells of a consumer the owner dropped.

    The deliveries are held by the entry node's channels, so the entry node enforces the
    queue's consumer and visibility timeouts: its arguments and policies are metadata every
    node has (`RemoteQueue.apply_arguments`). A timeout's requeue is a SETTLE like any other.

    A stream's consumer is checked on the entry node as basic.consume checks a local
    stream's (x-stream-offset, x-stream-filter, the client's prefetch and no-ack); its
    CONSUME carries the client's arguments, and the owner runs a real stream consumer from
    them (its cursor: start offset, filter, tracked offset under the client's tag). Its
    acks go as STREAM_ACK(id, offsets), by consumer and not by queue (every consumer of a
    stream holds the same offsets): credit, and the tracked offset; nack and reject are
    refused on the entry node (`entry.RemoteCursor`), and nothing is requeued. The topic
    API's POST to a stream (or super stream partition) led elsewhere sends each record as
    APPEND, answered with its offset there once fsynced; its GET is READ, answered by
    RECORDS (`Stream.read_waiting` there, long poll included); its commit and offsets are
    COMMIT_OFFSET and TRACKED (a group's committed offset is the partition's tracked offset,
    kept where the partition is).

    A consumer group lives on its coordinator, the node leading its super stream's
    partition 0 (`stream/groups.py`): the members and who owns which partition. A member
    connected to another node joins it over that node's link to the coordinator
    (`coordination.py`): GROUP_JOIN(member id, vhost, super stream, group, tag) and
    GROUP_LEAVE(member id) go to the coordinator, which answers a join by REPLY and then
    sends ASSIGN(member id, partition index) and REVOKE(member id, index) back over the same
    link; the member's node answers a revoke by DRAINED(member id, index) once the member's
    deliveries from it are acked, and GROUP_CANCELLED(member id, reason) ends a member whose
    group ended. GROUP_DESCRIBE(request id, vhost, super stream, group), answered by
    GROUP_DESCRIBED(request id, JSON), is the whole group for the HTTP API on other nodes.
    A partition another node leads is read by its member through CONSUME_PARTITION(id,
    vhost, partition, tag, group, arguments): the owner attaches it as a local member's
    partition (`groups.attach_partition`: from the group's committed offset, acks move it,
    deliveries name the partition), then it is a forwarded stream consumer (CREDIT, DELIVER,
    STREAM_ACK, CANCEL). The entry node counts its unacked deliveries, for a partition moving
    to another member to wait for them.

    GET, PURGE, DELETE(if_unused, if_empty) and STATS (the queue's figures, for a passive
    declare and the HTTP API) are requests answered by REPLY/GOT/STATS_REPLY or by
    ERROR(reply code, text), which the entry node raises as the same channel or connection
    exception a single node raises. The entry node's own services ask too: PEEK (the DLQ
    tools' browse, answered by PEEKED a slice at a time), REDRIVE (a redrive task's
    operation on the node leading its DLQ, answered by REDRIVEN), BOOT (which start of
    the owner runs, for `NodeStarted`, answered by REPLY) and VIEW (the owner's part of a
    cluster-wide management API figure, `server/http/node_views.py`, answered by VIEWED
    as JSON).

Loss of a link
    Entry node: publishes not yet confirmed are nacked (never confirmed without the owner),
    consumers are cancelled (basic.cancel to clients that asked for consumer_cancel_notify,
    as RabbitMQ does when a queue's node goes down), and so are its members of groups the
    owner coordinates; requests fail with RabbitMQ's 404 for a queue whose home node is
    down. Owner: as a closed channel, the link's consumers are cancelled and everything it
    was handed and not settled returns to its queue (a group partition's committed offset
    is where its member's acks got to); the entry node's members of groups coordinated here
    leave them, and their partitions go to the others. A settle arriving later over a new
    link names nothing that link holds and is ignored. The next use of a remote queue dials
    again.

Trust
    Both ends prove the cluster secret (``cluster_secret``, ``--cluster-secret``,
    ``WARREN_CLUSTER_SECRET``) before anything else crosses: the owner sends CHALLENGE(nonce),
    the entry's HELLO carries HMAC-SHA256 of the secret over that nonce, its role and its node
    id, and its own nonce, which the owner's WELCOME proves the secret over in turn. The
    secret never travels; a recorded hello cannot be replayed (the nonce is fresh); the entry
    node sends no queue work to an end that has not proven it. Without TLS the link is
    neither private nor safe from a relaying man in the middle, and an empty secret (the
    default) proves nothing: set one on a cluster.

Shards
    Nothing here knows that the owner is another machine: a node split into shard
    processes (one event loop per core, each leading some queues) forwards between them by
    the same links, over the same port or a Unix socket, with `queue_leader` naming a shard.

Where queues are placed
    `broker.queue_leader(vhost, name)` and `broker.node_address(node)` (the metadata's
    placement, in a cluster); `Forwarding.place` makes a queue whose leader is another node
    a `RemoteQueue` on this one.
"""

"""This broker as a node of the cluster: what it does with metadata entries applied here,
wherever they were proposed, and what it tells others about itself.

Every node applies every metadata entry (`ReplicatedMetadata`); exchanges, bindings, users,
permissions and policies are read from the state, so they are usable on a node the moment it
applied them. The running side follows through `applied` (`MetadataMachine.listener`),
called for each applied entry after the state changed:
* a vhost declared or deleted: hosted or retired here (`Broker.sync_vhosts`);
* a queue declared that this node leads: its storage opened here, unless a declare through
  this node opened it already (`VirtualHost.host_declared`); one another node leads: a
  `RemoteQueue` here, forwarding to that node (`Forwarding.place`);
* a queue deleted, or forgotten by `ForgetTransient`: retired here, its consumers
  cancelled, if this node hosted it; delayed exchanges deleted: their stores dropped;
* policies set or cleared: the vhost's queues take them;
* a partition's leader changed (`ElectLeaders`, `ShrinkReplicas`, `Rebalance`): a queue this
  node now leads is served from its own replica's files (`VirtualHost.host_elected`), one
  another node now leads is forwarded there; a queue that no longer has a leader keeps its
  forwarder to the old one, which fails until an in-sync replica returns. Moving a hosted
  queue's engine off this node is the replication data path's (it keeps the replica);
* a snapshot installed here (this node fell behind the leader's compacted log, so no entry
  it covers is applied one by one): the whole state at once (`resync`, the same steps);
* this node forgotten (`ForgetNode`, `warren cluster remove`), or removed from the metadata
  group (`check_removed`, polled: a removed node no longer hears of the `ForgetNode`): it
  closes its connections and refuses new ones with the reason (`refusal`).

At start, before it listens, a node proposes `NodeStarted` (`started`): its boot, and those
of the members it found running, so that the transient exchanges go when none that held
them runs; once listening (`register`), its `NodeRecord` (where clients and nodes reach its
AMQP and HTTP ports) when the state lacks it or holds another.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from warrenmq.amqp import replies
from warrenmq.server.metadata import commands as c
from warrenmq.server.metadata.errors import NotFound
from warrenmq.server.metadata.records import NO_LEADER, NodeRecord, QueueRecord, node_name
from warrenmq.server.metadata.state import Outcome
from warrenmq.server.replication import replicated

log = logging.getLogger(__name__)
BOOT_ASK_S = 2.0
_POLICY_COMMANDS = (c.SetPolicy, c.ClearPolicy)
_DELETING_EXCHANGES = (c.DeleteExchange, c.DeleteQueue, c.Unbind)
_PARTITION_COMMANDS = (c.AlterIsr, c.ElectLeaders, c.GrowReplicas, c.ShrinkReplicas, c.Rebalance)


class ClusterNode:
    def __init__(self, broker: Any) -> None:
        # The Broker (not imported: it imports this module).
        self.broker = broker
        self.node_id = broker.config.node_id
        self.name = node_name(self.node_id)
        self.removed = False

    # -- what the broker asks ---------------------------------------------------------------

    def queue_leader(self, vhost: str, name: str) -> int:
        """The node that leads the queue; NotFound (404) if there is no such queue."""
        record = self._state().queue(vhost, name)
        if record is None:
            raise NotFound(f"no queue '{name}' in vhost '{vhost}'")
        return record.node

    def node_address(self, node_id: int) -> tuple[str, int]:
        """(host, AMQP port) where this node dials the node's links: its `forward_addresses`
        entry, else the address it registered; NotFound if unknown."""
        configured = self.broker.config.forward_peers.get(node_id)
        if configured is not None:
            return configured
        record = self._state().nodes.get(node_id)
        if record is None:
            raise NotFound(f"no node {node_name(node_id)} in the cluster")
        return record.host, record.amqp_port

    def refusal(self) -> str | None:
        """Why this node refuses to serve, or None."""
        if self.removed:
            return f"node {self.name} was removed from the cluster"
        return None

    def check_removed(self) -> None:
        """Leave if the metadata group learnt that this node was removed (the removed node
        does not apply the `ForgetNode` that follows its removal)."""
        store = self.broker.store
        if store is not None and store.group.removed:
            self._leave()

    def _state(self) -> Any:
        store = self.broker.store
        assert store is not None
        return store.state

    # -- start ------------------------------------------------------------------------------

    def record(self) -> NodeRecord:
        broker = self.broker
        http_ports = broker.http.ports()
        return NodeRecord(
            self.node_id,
            broker.config.node_host,
            broker.port,
            broker.tls_port,
            http_ports.get("management", 0),
        )

    async def started(self) -> None:
        """In a cluster, before listening: tell the others which members this node found
        running (`NodeStarted`), each asked for its boot over a link within BOOT_ASK_S; the
        transient exchanges survive if one of those held them."""
        store = self.broker.store
        assert store is not None
        if not store.clustered or store.group.removed:
            return
        others = [node for node in store.state.nodes if node != self.node_id]
        forwarding = self.broker.forwarding
        boots = await asyncio.gather(
            *(asyncio.wait_for(forwarding.boot_of(node), BOOT_ASK_S) for node in others),
            return_exceptions=True,
        )
        alive = [
            (node, boot) for node, boot in zip(others, boots, strict=True) if type(boot) is int
        ]
        await store.apply_idempotent(
            c.NodeStarted(
                self.node_id,
                self.broker.boot,
                tuple(node for node, _ in alive),
                tuple(boot for _, boot in alive),
            )
        )

    async def register(self) -> None:
        store = self.broker.store
        assert store is not None
        record = self.record()
        if store.state.nodes.get(self.node_id) != record:
            await store.apply_idempotent(
                c.RegisterNode(
                    record.node_id,
                    record.host,
                    record.amqp_port,
                    record.amqps_port,
                    record.http_port,
                )
            )

    # -- applied entries --------------------------------------------------------------------

    def applied(self, commands: list[c.Command], outcomes: list[Outcome]) -> None:
        for command, outcome in zip(commands, outcomes, strict=False):
            if outcome.changed:
                self._reconcile(command, outcome)

    def _reconcile(self, command: c.Command, outcome: Outcome) -> None:
        broker = self.broker
        if isinstance(command, (c.DeclareVhost, c.DeleteVhost)):
            broker.sync_vhosts()
            return
        if isinstance(command, c.ForgetNode):
            if command.node_id == self.node_id:
                self._leave()
            return
        if isinstance(command, c.ForgetTransient):
            for vhost in broker.vhosts.values():
                vhost.retire_deleted()
            return
        if isinstance(command, _PARTITION_COMMANDS):
            for result in outcome.partitions:
                if not result.error:
                    self._partition_changed(result.queue, isinstance(command, c.AlterIsr))
            return
        if isinstance(command, c.NodeStarted):
            # Transient exchanges forgotten: the delayed ones' stores go with them.
            for vhost in broker.vhosts.values():
                vhost.delayed.exchanges_deleted(outcome.deleted_exchanges)
            # The starting node's replicated queues, in a new leader epoch.
            for result in outcome.partitions:
                self._partition_changed(result.queue, False)
            return
        vhost_name = getattr(command, "vhost", None)
        vhost = broker.vhosts.get(vhost_name) if vhost_name is not None else None
        if vhost is None:
            return
        if isinstance(command, c.DeclareQueue):
            record = outcome.queue
            if outcome.created and record is not None:
                self._serve(vhost, record)
                if broker.replicas is not None:
                    broker.replicas.sync(record)
        elif isinstance(command, c.DeleteQueue):
            queue = vhost.served_queue(outcome.queue.name) if outcome.queue else None
            if queue is not None:
                vhost.retire_queue(queue)
            if outcome.queue and broker.replicas is not None:
                broker.replicas.forget(vhost.name, outcome.queue.name)
        elif isinstance(command, _POLICY_COMMANDS):
            vhost.apply_policies()
        if outcome.deleted_exchanges and isinstance(command, _DELETING_EXCHANGES):
            vhost.delayed.exchanges_deleted(outcome.deleted_exchanges)

    def _serve(self, vhost: Any, record: QueueRecord) -> None:
        """A queue this node leads: its storage opened here (unless it is already); one
        another node leads: a `RemoteQueue` here, forwarding to that node."""
        if record.node == self.node_id:
            vhost.host_declared(record)
        else:
            self.broker.forwarding.place(vhost, record.name)

    def _partition_changed(self, record: QueueRecord, isr_altered: bool) -> None:
        if isr_altered and record.under_min_isr:
            log.warning(
                "queue '%s' in vhost '%s' has %d in-sync replicas of %d: it confirms nothing "
                "until %d are",
                record.name,
                record.vhost,
                len(record.isr),
                len(record.replicas),
                record.min_isr,
            )
        vhost = self.broker.vhosts.get(record.vhost)
        if vhost is None:
            return
        replicas = self.broker.replicas
        if replicas is None:
            self._follow_leader(vhost, record)
            return
        if record.node == self.node_id:
            # This node's follower files close for the queue to open them.
            replicas.release(record)
        elif replicated(record):
            hosted = vhost.queues.get(record.name)
            if hosted is not None:
                # Deposed (or left without a leader): the new leader serves it from its
                # copy, and this one becomes a follower of it.
                vhost.step_down(hosted)
            if record.node != NO_LEADER and record.name not in vhost.remote:
                # Deposed, or never opened here (a restarted leader waits for its new epoch).
                self.broker.forwarding.place(vhost, record.name)
        self._follow_leader(vhost, record)
        replicas.sync(record)

    def _follow_leader(self, vhost: Any, record: QueueRecord) -> None:
        """Serve the queue where its record says it is led: here from the files this node
        has, or forwarded to its leader."""
        if record.node == NO_LEADER:
            return
        if record.node == self.node_id:
            vhost.host_elected(record)
            return
        remote = vhost.remote.get(record.name)
        if remote is not None and remote.node != record.node:
            vhost.stop_forwarding(remote)
            self.broker.forwarding.place(vhost, record.name)

    # -- an installed snapshot --------------------------------------------------------------

    def resync(self) -> None:
        """A snapshot replaced the state (`MetadataMachine.restored`): none of the entries it
        covers reached `applied`, so the running side takes the whole state at once, as it
        would have taken them: vhosts hosted or retired, the queues of the state served here
        or forwarded to their leader, those gone retired, the delayed exchanges gone dropped,
        the policies applied."""
        broker = self.broker
        broker.sync_vhosts()
        for vhost in broker.vhosts.values():
            vhost.retire_deleted()
            for record in self._state().queues(vhost.name).values():
                remote = vhost.remote.get(record.name)
                if remote is not None and remote.node == record.node:
                    continue
                if record.node == self.node_id and record.leader_epoch > 0:
                    # Elected, not declared, here: this node's replica has its files.
                    vhost.host_elected(record)
                    continue
                if remote is not None:
                    # Deleted and declared again on another leader meanwhile.
                    vhost.retire_queue(remote)
                self._serve(vhost, record)
            vhost.delayed.exchanges_deleted(list(vhost.delayed.stores))
            vhost.apply_policies()
        if broker.replicas is not None:
            broker.replicas.sync_all()

    def _leave(self) -> None:
        if self.removed:
            return
        self.removed = True
        reason = self.refusal()
        log.warning("%s; closing every connection and refusing new ones", reason)
        for connection in list(self.broker.connections):
            connection.close(replies.CONNECTION_FORCED, reason or "")

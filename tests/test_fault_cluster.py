"""The fault tests' cluster itself: its proxies never take a node's port, and a scenario whose
cluster fails to boot leaves no node process behind."""

from __future__ import annotations

import asyncio
import socket

import fault_scenarios
import pytest
from fault_cluster import FaultCluster
from fault_scenarios import Scenario, run_scenario


@pytest.mark.slow
def test_a_cluster_that_cannot_boot_leaves_no_node_running(tmp_path, monkeypatch):
    """Node 1's Raft port is taken (as a proxy once took it), so node 1 exits at start; the
    nodes that did start are stopped, not left running after the test."""
    clusters: list[FaultCluster] = []

    class BlockedCluster(FaultCluster):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            clusters.append(self)

    monkeypatch.setattr(fault_scenarios, "FaultCluster", BlockedCluster)
    with socket.socket() as taken:
        original_boot = FaultCluster.boot

        async def boot_with_a_port_taken(self):
            taken.bind(("127.0.0.1", self.nodes[1].raft_port))
            taken.listen()
            return await original_boot(self)

        monkeypatch.setattr(BlockedCluster, "boot", boot_with_a_port_taken)
        with pytest.raises(RuntimeError, match="node 1 exited"):
            asyncio.run(run_scenario(tmp_path / "cluster", Scenario("pause")))
    (cluster,) = clusters
    assert not [node for node in cluster.nodes if cluster.running(node)]
    assert all(proxy._server is None or not proxy._server.is_serving() for proxy in cluster.proxies)


def test_the_proxies_listen_on_none_of_the_nodes_ports(tmp_path, monkeypatch):
    cluster = FaultCluster(tmp_path / "cluster")
    monkeypatch.setattr(FaultCluster, "start", lambda self, node_id, join=False: None)
    monkeypatch.setattr(FaultCluster, "listening", lambda self, node_id: asyncio.sleep(0))

    async def boot_and_close() -> set[int]:
        await cluster.boot()
        ports = {proxy.port for proxy in cluster.proxies}
        await asyncio.gather(*(proxy.close() for proxy in cluster.proxies))
        return ports

    proxy_ports = asyncio.run(boot_and_close())
    assert len(proxy_ports) == 12
    assert proxy_ports.isdisjoint(cluster._ports())

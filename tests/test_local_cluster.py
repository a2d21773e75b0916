"""`LocalCluster`'s view of its nodes' processes, which `warren cluster down` waits on."""

import json
import subprocess
import sys
import time

from warrenmq.cluster.local_cluster import free_ports
from warrenmq.server.local_cluster import LocalCluster, _ports_of

# Starts a child that exits at once and is never reaped, prints its pid, then lingers.
_PARENT_OF_A_ZOMBIE = """
import subprocess, time
child = subprocess.Popen(["true"])
time.sleep(0.5)
print(child.pid, flush=True)
time.sleep(60)
"""


def test_a_node_that_exited_unreaped_by_the_process_that_started_it_is_not_running(tmp_path):
    """`warren cluster down` stopping nodes a still-running process started (a test's): they
    stay zombies until that process reaps them, and counting them as running made `down`
    wait out both its SIGTERM and SIGKILL timeouts."""
    parent = subprocess.Popen([sys.executable, "-c", _PARENT_OF_A_ZOMBIE], stdout=subprocess.PIPE)
    try:
        zombie = int(parent.stdout.readline())
        cluster = LocalCluster(tmp_path, size=1)
        cluster.nodes[1].pid = zombie
        assert not cluster.running(1)
        cluster.nodes[1].pid = parent.pid
        assert cluster.running(1)
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()


def test_stopping_a_node_another_process_started_and_never_reaps_returns_at_once(tmp_path):
    parent = subprocess.Popen([sys.executable, "-c", _PARENT_OF_A_ZOMBIE], stdout=subprocess.PIPE)
    try:
        zombie = int(parent.stdout.readline())
        cluster = LocalCluster(tmp_path, size=1)
        cluster.nodes[1].pid = zombie
        started_s = time.monotonic()
        cluster.stop(timeout_s=10)
        assert time.monotonic() - started_s < 5
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()


def test_the_ports_picked_for_a_cluster_are_distinct_and_avoid_those_taken():
    taken = set(free_ports(50))
    ports = free_ports(600, taken=taken)
    assert len(set(ports)) == 600 and taken.isdisjoint(ports)


def test_a_recorded_node_whose_ports_another_node_now_has_gets_new_ones(tmp_path):
    cluster = LocalCluster(tmp_path, size=2)
    cluster._record()
    document = json.loads((tmp_path / "cluster.json").read_text())
    first, second = document["nodes"][0], document["nodes"][1]
    second["raft_port"] = first["raft_port"]
    (tmp_path / "cluster.json").write_text(json.dumps(document))
    again = LocalCluster(tmp_path, size=2)
    all_ports = [port for node in again.nodes.values() for port in _ports_of(node)]
    assert len(set(all_ports)) == 6

"""Three `warren serve` processes whose every connection to a peer goes through a
`LinkProxy` the test controls, and the faults a Jepsen nemesis injects into them.

Each node's `cluster` setting names its own Raft port and, for each peer, the proxy of that
directed pair; its `forward_addresses` do the same for the links that forward queue work.
Clients connect to the nodes directly: a partition cuts nodes from each other, not from their
clients (as RabbitMQ's Jepsen tests do it with iptables between the nodes only).

Network faults: `cut(a, b)` (what a sends stops reaching b), `partition(*sides)`, the
shapes of Jepsen's partitions (`random_halves`, `isolated`, `majorities_ring`, `bridge`),
`slow`, `drop_links`, `heal`. Process faults: `crash` (SIGKILL), `restart`, `pause`
(SIGSTOP), `resume` (SIGCONT). Clock faults: with libfaketime installed, every node runs under
it, reading its wall clock's offset from a file of its own (`jump_clock`). Disk faults: with
`slow_disks`, every node runs under `native/slow_fsync.c` (built with the machine's C
compiler), which delays its fsyncs by what a file of its own says (`slow_disk`).
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import signal
import subprocess
from pathlib import Path

from fault_proxy import LinkProxy

from warrenmq.cluster.local_cluster import free_ports
from warrenmq.server.local_cluster import HOST, LocalCluster

LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
SLOW_FSYNC_SOURCE = Path(__file__).parent / "native" / "slow_fsync.c"
NODE_START_TIMEOUT_S = 60.0


class FaultCluster(LocalCluster):
    def __init__(
        self, directory: Path, size: int = 3, fake_clock: bool = False, slow_disks: bool = False
    ) -> None:
        super().__init__(directory, size)
        self.raft_proxies: dict[tuple[int, int], LinkProxy] = {}
        self.link_proxies: dict[tuple[int, int], LinkProxy] = {}
        self.fake_clock = fake_clock and LIBFAKETIME.exists()
        self.slow_fsync = build_slow_fsync(self.directory) if slow_disks else None
        self.paused: set[int] = set()

    # -- how each node reaches its peers ----------------------------------------------------

    def peers_of(self, node_id: int) -> str:
        return ",".join(
            f"{peer}={HOST}:{self._peer_port(self.raft_proxies, node_id, peer, node.raft_port)}"
            for peer, node in self.nodes.items()
        )

    def environment_of(self, node_id: int) -> dict[str, str]:
        settings = super().environment_of(node_id)
        settings["WARREN_FORWARD_ADDRESSES"] = ",".join(
            f"{peer}={HOST}:{self.link_proxies[(node_id, peer)].port}"
            for peer in self.nodes
            if peer != node_id
        )
        preloads = []
        if self.slow_fsync is not None:
            preloads.append(str(self.slow_fsync))
            settings["SLOW_FSYNC_FILE"] = str(self.fsync_delay_file(node_id))
        if self.fake_clock:
            preloads.append(str(LIBFAKETIME))
            settings.update(
                FAKETIME_TIMESTAMP_FILE=str(self.clock_file(node_id)),
                # Read again every second, so that a running node's clock jumps.
                FAKETIME_CACHE_DURATION="1",
                # The wall clock only, as an NTP step moves it: CLOCK_MONOTONIC never jumps.
                FAKETIME_DONT_FAKE_MONOTONIC="1",
            )
        if preloads:
            settings["LD_PRELOAD"] = ":".join(preloads)
        return settings

    @staticmethod
    def _peer_port(proxies, node_id: int, peer: int, own_port: int) -> int:
        return own_port if peer == node_id else proxies[(node_id, peer)].port

    def clock_file(self, node_id: int) -> Path:
        return self.directory / f"node-{node_id}.faketime"

    def fsync_delay_file(self, node_id: int) -> Path:
        return self.directory / f"node-{node_id}.fsync-delay-us"

    # -- start and stop ----------------------------------------------------------------------

    async def boot(self) -> FaultCluster:
        self.directory.mkdir(parents=True, exist_ok=True)
        # Not ports the OS picks at bind: one of the nodes' ports, picked but not yet bound
        # by their processes, may come back, and that node then fails to start.
        ports = iter(free_ports(2 * len(self.nodes) * (len(self.nodes) - 1), self._ports()))
        for source in self.nodes:
            for target, node in self.nodes.items():
                if source != target:
                    pair = (source, target)
                    self.raft_proxies[pair] = await LinkProxy(
                        source, target, (HOST, node.raft_port)
                    ).start(next(ports))
                    self.link_proxies[pair] = await LinkProxy(
                        source, target, (HOST, node.amqp_port)
                    ).start(next(ports))
        for node_id in self.nodes:
            if self.fake_clock:
                self.clock_file(node_id).write_text("+0\n")
            if self.slow_fsync is not None:
                self.slow_disk(node_id, 0)
            self.start(node_id)
        await asyncio.gather(*(self.listening(node_id) for node_id in self.nodes))
        return self

    async def listening(self, node_id: int) -> None:
        await asyncio.to_thread(self.wait_listening, node_id, NODE_START_TIMEOUT_S)

    async def shutdown(self) -> None:
        for node_id in list(self.paused):
            self.resume(node_id)
        self.heal()
        await asyncio.to_thread(self.stop)
        await asyncio.gather(*(p.close() for p in self.proxies))

    @property
    def proxies(self) -> list[LinkProxy]:
        return [*self.raft_proxies.values(), *self.link_proxies.values()]

    def amqp_url(self, node_id: int) -> str:
        # Short heartbeats: a client of a paused node finds out within seconds.
        return self.nodes[node_id].amqp_url + "?heartbeat=5"

    # -- network faults ----------------------------------------------------------------------

    def cut(self, source: int, target: int) -> None:
        """What `source` sends stops reaching `target`, on every connection between them."""
        for proxies in (self.raft_proxies, self.link_proxies):
            proxies[(source, target)].block(forward=True, backward=False)
            proxies[(target, source)].block(forward=False, backward=True)

    def partition(self, *sides: set[int]) -> None:
        """No node hears any node on another side."""
        for side in sides:
            for other in sides:
                if side is not other:
                    for source in side:
                        for target in other:
                            self.cut(source, target)

    def random_halves(self, rng: random.Random) -> list[set[int]]:
        nodes = list(self.nodes)
        rng.shuffle(nodes)
        half = len(nodes) // 2
        sides = [set(nodes[:half]), set(nodes[half:])]
        self.partition(*sides)
        return sides

    def isolated(self, node_id: int) -> list[set[int]]:
        sides = [{node_id}, set(self.nodes) - {node_id}]
        self.partition(*sides)
        return sides

    def majorities_ring(self) -> dict[int, set[int]]:
        """Each node hears a majority (itself and the next in a ring), no two the same one:
        Jepsen's majorities-ring. Returns what each node hears."""
        ring = sorted(self.nodes)
        majority = len(ring) // 2 + 1
        hears = {
            node: {ring[(i + k) % len(ring)] for k in range(majority)}
            for i, node in enumerate(ring)
        }
        for target, heard in hears.items():
            for source in set(ring) - heard:
                self.cut(source, target)
        return hears

    def bridge(self, node_id: int) -> None:
        """`node_id` hears everyone; the others are split in two halves around it."""
        others = sorted(set(self.nodes) - {node_id})
        half = len(others) // 2
        self.partition(set(others[:half]), set(others[half:]))

    def slow(self, seconds: float) -> None:
        for proxy in self.proxies:
            proxy.delay(seconds)

    def drop_links(self) -> None:
        for proxy in self.proxies:
            proxy.drop()

    def heal(self) -> None:
        for proxy in self.proxies:
            proxy.heal()

    # -- process and clock faults -------------------------------------------------------------

    async def crash(self, node_id: int) -> None:
        self.paused.discard(node_id)
        await asyncio.to_thread(self.kill, node_id)

    async def restart(self, node_id: int) -> None:
        self.start(node_id)
        await self.listening(node_id)

    def pause(self, node_id: int) -> None:
        self.signal(node_id, signal.SIGSTOP)
        self.paused.add(node_id)

    def resume(self, node_id: int) -> None:
        self.signal(node_id, signal.SIGCONT)
        self.paused.discard(node_id)

    def jump_clock(self, node_id: int, offset_s: float) -> None:
        """Move the node's wall clock `offset_s` from the real one (within about a second:
        libfaketime reads the file again that often)."""
        assert self.fake_clock, "libfaketime is not installed"
        _replace(self.clock_file(node_id), f"{offset_s:+.0f}\n")

    def slow_disk(self, node_id: int, seconds: float) -> None:
        """Make each fsync and fdatasync of the node take `seconds` more (0: heal)."""
        assert self.slow_fsync is not None, "the cluster was not started with slow_disks"
        pid = self.nodes[node_id].pid
        if pid and self.running(node_id):
            maps = Path(f"/proc/{pid}/maps").read_text()
            assert str(self.slow_fsync) in maps, f"node {node_id} did not load {self.slow_fsync}"
        _replace(self.fsync_delay_file(node_id), f"{round(seconds * 1_000_000)}\n")


def build_slow_fsync(directory: Path) -> Path:
    """`native/slow_fsync.c` built into `directory` with the machine's C compiler."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("slow disks need a C compiler: apt-get install gcc")
    directory.mkdir(parents=True, exist_ok=True)
    library = directory / "slow_fsync.so"
    command = [compiler, "-shared", "-fPIC", "-O2", "-o", str(library), str(SLOW_FSYNC_SOURCE)]
    subprocess.run([*command, "-ldl"], check=True, capture_output=True)
    return library


def _replace(path: Path, text: str) -> None:
    """Write `path` whole at once: a node reads it at any moment."""
    temporary = path.with_suffix(".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)

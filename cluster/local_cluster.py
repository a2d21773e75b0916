"""`LocalCluster`: Raft node processes (`python -m warrenmq.cluster.node`) on loopback, for
tests and the benchmark."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Collection, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from warrenmq.cluster.node import format_addresses


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int, taken: Collection[int] = ()) -> list[int]:
    """`count` distinct ports free a moment ago on 127.0.0.1, none of them in `taken`. The
    sockets stay bound until all are picked: ports picked one by one may repeat, and a
    cluster given one port twice does not start."""
    with ExitStack() as bound:
        ports: list[int] = []
        while len(ports) < count:
            sock = bound.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            if port not in taken:
                ports.append(port)
        return ports


@dataclass
class LocalCluster:
    """Node processes on loopback, for tests and the benchmark. Use as a context manager."""

    base_dir: Path
    size: int = 3
    extra_args: tuple[str, ...] = ()
    voters: tuple[int, ...] | None = None
    """Bootstrap voters (default: all); the other nodes start as joiners, see ServerConfig."""
    peers: dict[int, tuple[str, int]] = field(default_factory=dict)
    clients: dict[int, tuple[str, int]] = field(default_factory=dict)
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    # node -> size of its log file when its current process was started
    _log_offsets: dict[int, int] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self._pick_ports()

    def _pick_ports(self) -> None:
        ports = iter(free_ports(2 * self.size))
        for node in range(1, self.size + 1):
            self.peers[node] = ("127.0.0.1", next(ports))
            self.clients[node] = ("127.0.0.1", next(ports))

    def client_addresses(self, nodes: Sequence[int] | None = None) -> list[str]:
        return [
            f"{h}:{p}" for n, (h, p) in sorted(self.clients.items()) if nodes is None or n in nodes
        ]

    def start(self, node: int) -> None:
        assert node not in self.processes or self.processes[node].poll() is not None
        data_dir = self.base_dir / f"node-{node}"
        command = [
            sys.executable,
            "-m",
            "warrenmq.cluster.node",
            "--id",
            str(node),
            "--peers",
            format_addresses(self.peers),
            "--clients",
            format_addresses(self.clients),
            "--data-dir",
            str(data_dir),
            *(("--voters", ",".join(map(str, self.voters))) if self.voters else ()),
            *self.extra_args,
        ]
        with open(self.base_dir / f"node-{node}.log", "ab") as log:
            self._log_offsets[node] = log.tell()
            self.processes[node] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)

    def start_all(self, attempts: int = 3) -> None:
        """Start every node and wait until all listen.

        A port found free may be taken by someone else before the node binds it; then
        the whole cluster is started again on new ports (peers must agree on addresses).
        """
        self.base_dir.mkdir(parents=True, exist_ok=True)
        for attempt in range(attempts):
            for node in self.peers:
                self.start(node)
            try:
                self.wait_listening()
                return
            except RuntimeError:
                lost_port = any(
                    "address already in use" in self.log_tail(n).lower() for n in self.peers
                )
                if not lost_port or attempt == attempts - 1:
                    raise
                self.stop_all()
                self._pick_ports()

    def wait_listening(self, nodes: Sequence[int] | None = None, timeout_s: float = 20.0) -> None:
        """Wait until each node's current process has bound its ports.

        Proof is the node's own "serving" line (printed once both its servers are bound),
        not a successful connect: a port found free may since have been bound by another
        process (another test's cluster on this machine), which would accept the connect
        while our node dies of EADDRINUSE; its clients would then talk to a foreign node.
        """
        deadline = time.monotonic() + timeout_s
        for node in nodes or list(self.clients):
            serving = f"raft node {node} serving".encode()
            log_path = self.base_dir / f"node-{node}.log"
            while True:
                process = self.processes[node]
                if process.poll() is not None:
                    raise RuntimeError(
                        f"node {node} exited with {process.returncode}: {self.log_tail(node)}"
                    )
                with open(log_path, "rb") as log:
                    log.seek(self._log_offsets.get(node, 0))
                    if serving in log.read():
                        break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"node {node} not listening after {timeout_s} s")
                time.sleep(0.05)

    def kill(self, node: int, signum: int = signal.SIGKILL) -> None:
        process = self.processes[node]
        if process.poll() is None:
            process.send_signal(signum)
        process.wait(timeout=10)

    def pause(self, node: int) -> None:
        """Freeze a node (SIGSTOP): to its peers it looks like a partition, not a crash."""
        self.processes[node].send_signal(signal.SIGSTOP)

    def resume(self, node: int) -> None:
        self.processes[node].send_signal(signal.SIGCONT)

    def log_tail(self, node: int, lines: int = 20) -> str:
        path = self.base_dir / f"node-{node}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def stop_all(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)  # a paused node could not act on SIGTERM
                process.terminate()
        for process in self.processes.values():
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)

    def __enter__(self) -> LocalCluster:
        self.start_all()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop_all()

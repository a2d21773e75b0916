"""Broker nodes (`warren serve --cluster ...`) as processes on loopback: what `warren cluster
up|down` runs, and what tests start clusters with.

`LocalCluster(directory, size)` gives each node free ports (Raft, AMQP, management), a data
dir `directory/node-N` and a log `directory/node-N.log`, and records them with the pids in
`directory/cluster.json`; started again on the same directory, the nodes keep their ports
(their peers know them by those), unless one was taken meanwhile. The file also keeps the
cluster secret the nodes prove to each other: random, made once, handed to each node in its
environment (never its command line, which every local user can read); the file is the
owner's only. The processes run in
sessions of their own, so they outlive the command that started them; `stop` (or `warren
cluster down`, from the file) sends SIGTERM and waits.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from warrenmq.cluster.local_cluster import free_ports

STATE_FILE = "cluster.json"
LISTENING = re.compile(r"Warren listening on ")
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
HOST = "127.0.0.1"


def _exited(pid: int) -> bool:
    """Whether `pid` is a zombie: exited, not yet reaped by the process that started it
    (`warren cluster down` stopping nodes another process started, still running, say)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # The state follows the command name, which is in parentheses and may hold any byte.
    return stat[stat.rfind(")") + 2 :].startswith("Z")


@dataclass
class LocalNode:
    node_id: int
    raft_port: int
    amqp_port: int
    http_port: int
    pid: int = 0

    @property
    def amqp_url(self) -> str:
        return f"amqp://guest:guest@{HOST}:{self.amqp_port}/"

    @property
    def http_url(self) -> str:
        return f"http://{HOST}:{self.http_port}"


class LocalCluster:
    def __init__(self, directory: str | os.PathLike[str], size: int = 3) -> None:
        self.directory = Path(directory)
        self.nodes: dict[int, LocalNode] = {}
        recorded = self._recorded()
        self.secret = self._recorded_secret() or secrets.token_urlsafe(32)
        for node_id in range(1, size + 1):
            node = recorded.get(node_id)
            if node is None or not _all_free(node) or not self._ports().isdisjoint(_ports_of(node)):
                node = LocalNode(node_id, *free_ports(3, taken=self._ports()))
            node.pid = 0
            self.nodes[node_id] = node

    @classmethod
    def recorded(cls, directory: str | os.PathLike[str]) -> LocalCluster:
        """The cluster `directory/cluster.json` describes, its pids included."""
        cluster = cls.__new__(cls)
        cluster.directory = Path(directory)
        cluster.nodes = cluster._recorded()
        if not cluster.nodes:
            raise FileNotFoundError(f"no cluster recorded in {cluster.directory / STATE_FILE}")
        cluster.secret = cluster._recorded_secret()
        return cluster

    def _document(self) -> dict:
        try:
            return json.loads((self.directory / STATE_FILE).read_text())
        except FileNotFoundError:
            return {}

    def _recorded(self) -> dict[int, LocalNode]:
        return {item["node_id"]: LocalNode(**item) for item in self._document().get("nodes", [])}

    def _recorded_secret(self) -> str:
        return self._document().get("secret", "")

    def _record(self) -> None:
        document = {
            "nodes": [asdict(node) for node in self.nodes.values()],
            "secret": self.secret,
        }
        path = self.directory / STATE_FILE
        temporary = path.with_suffix(".tmp")
        temporary.unlink(missing_ok=True)
        # Created the owner's only: it holds the secret.
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with open(descriptor, "w") as file:
            file.write(json.dumps(document, indent=2))
        temporary.replace(path)

    @property
    def cluster_setting(self) -> str:
        return ",".join(f"{n.node_id}={HOST}:{n.raft_port}" for n in self.nodes.values())

    def peers_of(self, node_id: int) -> str:
        """Node `node_id`'s `cluster` setting: where it reaches each member's Raft port (the
        fault tests put proxies there)."""
        return self.cluster_setting

    def environment_of(self, node_id: int) -> dict[str, str]:
        """The `WARREN_*` settings node `node_id` gets in its environment, never on its
        command line: the cluster secret (the fault tests add `forward_addresses`)."""
        return {"WARREN_CLUSTER_SECRET": self.secret}

    def _ports(self) -> set[int]:
        return {port for node in self.nodes.values() for port in _ports_of(node)}

    def log_path(self, node_id: int) -> Path:
        return self.directory / f"node-{node_id}.log"

    def add(self) -> LocalNode:
        """A new node, next id, free ports: recorded, not started (`start(id, join=True)`
        starts it waiting to be added, `warren cluster join` adds it)."""
        node_id = max(self.nodes) + 1
        node = self.nodes[node_id] = LocalNode(node_id, *free_ports(3, taken=self._ports()))
        self._record()
        return node

    def start(self, node_id: int, join: bool = False) -> None:
        node = self.nodes[node_id]
        command = [
            sys.executable,
            "-m",
            "warrenmq.server.cli",
            "serve",
            "--node-id",
            str(node_id),
            "--cluster",
            self.peers_of(node_id),
            "--bind",
            HOST,
            "--port",
            str(node.amqp_port),
            "--management-port",
            str(node.http_port),
            "--no-metrics",
            "--data-dir",
            str(self.directory / f"node-{node_id}"),
            *(["--join"] if join else []),
        ]
        self.directory.mkdir(parents=True, exist_ok=True)
        log_path = self.log_path(node_id)
        with open(log_path, "ab") as log:
            log.write(f"--- starting node {node_id}\n".encode())
            log.flush()
            process = subprocess.Popen(
                command,
                env={**os.environ, **self.environment_of(node_id)},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        node.pid = process.pid
        self._record()

    def start_all(self) -> None:
        for node_id in self.nodes:
            self.start(node_id)
        for node_id in self.nodes:
            self.wait_listening(node_id)

    def wait_listening(self, node_id: int, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until the node's current process printed that it listens (it does once the
        metadata group has a leader and it caught up)."""
        deadline_s = time.monotonic() + timeout_s
        log_path = self.log_path(node_id)
        marker = f"--- starting node {node_id}\n"
        while True:
            text = log_path.read_text(errors="replace")
            if LISTENING.search(text[text.rfind(marker) :]):
                return
            if not self.running(node_id):
                raise RuntimeError(f"node {node_id} exited: {self.log_tail(node_id)}")
            if time.monotonic() > deadline_s:
                raise TimeoutError(f"node {node_id} not listening after {timeout_s} s")
            time.sleep(0.05)

    def running(self, node_id: int) -> bool:
        pid = self.nodes[node_id].pid
        if not pid:
            return False
        try:
            # A child of ours that exited is a zombie until reaped: reap it, if ours.
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return False
        except ChildProcessError:
            pass
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return not _exited(pid)

    def signal(self, node_id: int, signum: int) -> None:
        if self.running(node_id):
            os.kill(self.nodes[node_id].pid, signum)

    def kill(self, node_id: int) -> None:
        """SIGKILL the node and wait until it is gone."""
        self.signal(node_id, signal.SIGKILL)
        self._wait_gone([node_id], STOP_TIMEOUT_S)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM every node, then SIGKILL those still running after `timeout_s`."""
        for node_id in self.nodes:
            self.signal(node_id, signal.SIGTERM)
        if not self._wait_gone(list(self.nodes), timeout_s):
            for node_id in self.nodes:
                self.signal(node_id, signal.SIGKILL)
            self._wait_gone(list(self.nodes), timeout_s)
        for node in self.nodes.values():
            node.pid = 0
        self._record()

    def _wait_gone(self, node_ids: list[int], timeout_s: float) -> bool:
        deadline_s = time.monotonic() + timeout_s
        while any(self.running(node_id) for node_id in node_ids):
            if time.monotonic() > deadline_s:
                return False
            time.sleep(0.05)
        return True

    def log_tail(self, node_id: int, lines: int = 20) -> str:
        path = self.log_path(node_id)
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> LocalCluster:
        self.start_all()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _ports_of(node: LocalNode) -> tuple[int, int, int]:
    return (node.raft_port, node.amqp_port, node.http_port)


def _all_free(node: LocalNode) -> bool:
    for port in _ports_of(node):
        with socket.socket() as sock:
            try:
                sock.bind((HOST, port))
            except OSError:
                return False
    return True

"""The brokers the compat suite runs against: Warren as a subprocess, or a reference RabbitMQ.

Each is a ``Broker``: where it listens (AMQP, and the HTTP management API and Prometheus
metrics: ``management_url``, ``metrics_url``), how to restart it (clients see every connection
closed, transient entities gone, durable ones back) and how to seed the users and vhost that
permission tests need.
"""

from __future__ import annotations

import abc
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote, urlsplit

import pika
import pytest
from rabbitmq_reference import (
    ReferenceNode,
    ReferenceUnavailable,
    default_state_path,
    load_node,
    non_loopback_address,
    wait_for_port,
)

from warrenmq.cluster.local_cluster import free_ports
from warrenmq.server.tls_cli import (
    CA_CERTIFICATE,
    SERVER_CERTIFICATE,
    SERVER_KEY,
    generate,
)

WARREN_READY_LINE = "Warren listening on"
WARREN_BOOT_SECONDS_MAX = 30.0
WARREN_STOP_SECONDS_MAX = 15.0

# Entities that some tests need beyond guest on "/": created once per broker, on first use.
SEED_VHOST = "warren-compat-vhost"
LIMITED_USER = ("compat-limited", "compat-limited-pw")
# compat-limited may configure cfg.* and limited.*, write limited.*, read limited.* and cfg.*.
LIMITED_PERMISSIONS = ("^(cfg|limited)\\..*", "^limited\\..*", "^(cfg|limited)\\..*")
NOPERM_USER = ("compat-noperm", "compat-noperm-pw")


class Broker(abc.ABC):
    """What a test sees: where the broker listens, and how to restart and seed it."""

    name: str
    host: str
    port: int
    # A non-loopback address the broker also listens on (None: not reachable that way), to
    # check what a remote client sees, e.g. guest refused outside loopback.
    external_host: str | None = None
    can_seed: bool = True
    # The management plugin's base URL ("http://HOST:PORT") and the Prometheus plugin's; None
    # when this broker does not serve them (HTTP tests are then skipped).
    management_url: str | None = None
    metrics_url: str | None = None
    # AMQP over TLS with certificates from `tls_certificates()` (None: no TLS listener).
    tls_port: int | None = None

    def __init__(self) -> None:
        self._seeded = False

    @property
    def url(self) -> str:
        return self.url_for()

    @property
    def metrics_urls(self) -> list[str]:
        """Every node's Prometheus URL: as RabbitMQ's, a node's metrics show the queues it
        leads (a cluster's are summed over its nodes)."""
        return [self.metrics_url] if self.metrics_url is not None else []

    def url_for(
        self, user: str = "guest", password: str = "guest", vhost: str = "/", **query
    ) -> str:
        base = f"amqp://{quote(user, safe='')}:{quote(password, safe='')}@{self.host}:{self.port}/"
        url = base + quote(vhost, safe="")
        if query:
            url += "?" + "&".join(f"{key}={value}" for key, value in query.items())
        return url

    def params(self, **kwargs) -> pika.ConnectionParameters:
        """pika parameters for guest on "/", with any override (vhost, credentials, tuning)."""
        kwargs.setdefault("credentials", pika.PlainCredentials("guest", "guest"))
        kwargs.setdefault("connection_attempts", 1)
        return pika.ConnectionParameters(host=self.host, port=self.port, **kwargs)

    def seed(self) -> None:
        """Create the seed vhost and users once (see the module constants)."""
        if not self.can_seed:
            pytest.skip(f"{self.name}: cannot create users and vhosts on an external broker")
        if not self._seeded:
            self._seed()
            self._seeded = True

    @abc.abstractmethod
    def _seed(self) -> None:
        """Create SEED_VHOST (guest may do anything there), LIMITED_USER and NOPERM_USER."""

    @abc.abstractmethod
    def restart(self) -> None:
        """Restart the broker in place: same address, same data, every connection closed."""

    @abc.abstractmethod
    def set_loopback_users(self, users: tuple[str, ...]) -> None:
        """Set RabbitMQ's loopback_users: the users that may log in from loopback only."""

    @abc.abstractmethod
    def destroy(self) -> None:
        """Stop the broker for good and remove what it wrote."""

    @abc.abstractmethod
    def set_policy(
        self, name: str, pattern: str, definition: dict, apply_to: str = "queues", priority: int = 0
    ) -> None:
        """Set a policy on "/" as the broker's own command line does; returns once queues
        declared from now on get it (existing ones may take a moment, as in RabbitMQ)."""

    @abc.abstractmethod
    def clear_policy(self, name: str) -> None:
        """Clear a policy of "/"."""


_certificates: list[Path] = []


def tls_certificates() -> Path:
    """The directory of `warren tls generate` files both brokers' TLS listeners use (made
    once per session: EC keys, a few milliseconds)."""
    if not _certificates:
        directory = Path(tempfile.mkdtemp(prefix="warren-compat-tls-"))
        generate(directory, hosts=("localhost", "127.0.0.1"), client_name="guest")
        _certificates.append(directory)
    return _certificates[0]


class WarrenBroker(Broker):
    name = "warren"

    def __init__(self, extra_args: tuple[str, ...] = ()) -> None:
        super().__init__()
        # `warren serve` flags beyond those every run has (a cluster node's).
        self.extra_args = extra_args
        self.host = "127.0.0.1"
        self.port, self.management_port, self.metrics_port, self.tls_port = free_ports(4)
        # `warren serve` binds 0.0.0.0 by default, so every local address reaches it.
        self.external_host = non_loopback_address()
        self.management_url = f"http://{self.host}:{self.management_port}"
        self.metrics_url = f"http://{self.host}:{self.metrics_port}"
        self.data_dir = Path(tempfile.mkdtemp(prefix="warren-compat-"))
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.log"
        self.process: subprocess.Popen | None = None
        # WARREN_* settings for the next start, over those of our own environment.
        self.settings: dict[str, str] = {}

    @staticmethod
    def _warren() -> list[str]:
        script = Path(sys.executable).parent / "warren"
        if script.exists():
            return [str(script)]
        return [sys.executable, "-m", "warrenmq.server.cli"]

    def start(self) -> None:
        self.spawn()
        self.wait_ready()

    def spawn(self) -> None:
        """Start `warren serve` without waiting for it (a cluster's nodes wait for each other)."""
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [
                    *self._warren(),
                    "serve",
                    "--port",
                    str(self.port),
                    "--data-dir",
                    str(self.data_dir),
                    "--management-port",
                    str(self.management_port),
                    "--metrics-port",
                    str(self.metrics_port),
                    "--tls-port",
                    str(self.tls_port),
                    "--ssl-certfile",
                    str(tls_certificates() / SERVER_CERTIFICATE),
                    "--ssl-keyfile",
                    str(tls_certificates() / SERVER_KEY),
                    "--ssl-cacertfile",
                    str(tls_certificates() / CA_CERTIFICATE),
                    "--ssl-verify",
                    "verify_peer",
                    *self.extra_args,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **self.settings},
            )

    def wait_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + WARREN_BOOT_SECONDS_MAX
        while time.monotonic() < deadline:
            output = self.log_path.read_bytes()[self._log_offset :].decode(errors="replace")
            if WARREN_READY_LINE in output:
                wait_for_port(self.host, self.port, WARREN_BOOT_SECONDS_MAX)
                return
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"warren serve exited with {self.process.returncode}:\n{output[-4000:]}"
                )
            time.sleep(0.05)
        self.stop()
        raise TimeoutError(
            f"warren serve printed no {WARREN_READY_LINE!r} line; see {self.log_path}"
        )

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(WARREN_STOP_SECONDS_MAX)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def restart(self) -> None:
        self.stop()
        self.start()

    def set_loopback_users(self, users: tuple[str, ...]) -> None:
        self.settings["WARREN_LOOPBACK_USERS"] = ",".join(users)
        self.restart()

    def _admin(self, *args: str) -> None:
        # `warren users|vhosts …` are the admin module's commands; running the module itself
        # works whether or not the `warren` entry point lists it yet.
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "warrenmq.server.admin_cli",
                *args,
                "--data-dir",
                str(self.data_dir),
            ],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if done.returncode != 0:
            raise RuntimeError(f"warren {' '.join(args)} failed: {done.stdout}{done.stderr}")

    def set_policy(
        self, name: str, pattern: str, definition: dict, apply_to: str = "queues", priority: int = 0
    ) -> None:
        # `warren policies` writes the data dir of the running broker; the broker reads every
        # change before it logs a client in, so one connection makes sure it has the policy.
        self._admin(
            "policies",
            "set",
            name,
            pattern,
            json.dumps(definition),
            "--apply-to",
            apply_to,
            "--priority",
            str(priority),
        )
        pika.BlockingConnection(self.params()).close()

    def clear_policy(self, name: str) -> None:
        self._admin("policies", "clear", name)
        pika.BlockingConnection(self.params()).close()

    def _seed(self) -> None:
        # The admin commands write the data dir; the broker reads it when it starts.
        self.stop()
        try:
            self._admin("vhosts", "add", SEED_VHOST)
            self._admin("users", "set-permissions", "guest", *(".*",) * 3, "--vhost", SEED_VHOST)
            self._admin("users", "add", *LIMITED_USER)
            self._admin(
                "users", "set-permissions", LIMITED_USER[0], *LIMITED_PERMISSIONS, "--vhost", "/"
            )
            self._admin("users", "add", *NOPERM_USER)
        finally:
            self.start()

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.data_dir, ignore_errors=True)
        self.log_path.unlink(missing_ok=True)


class WarrenClusterBroker(WarrenBroker):
    """Three Warren nodes as one cluster. Clients connect to node 1, which places every queue
    they declare (but an exclusive one, which RabbitMQ keeps on its connection's node) on
    another node (``queue_leader_locator = "other-node"``), so the suite's clients work on
    their queues through forwarding, and a restart restarts the whole cluster."""

    name = "warren-cluster"

    def __init__(self) -> None:
        peers = ",".join(f"{node}=127.0.0.1:{port}" for node, port in enumerate(free_ports(3), 1))
        secret = os.urandom(16).hex()

        def flags(node: int) -> tuple[str, ...]:
            return ("--node-id", str(node), "--cluster", peers, "--cluster-secret", secret)

        super().__init__(flags(1))
        self.settings["WARREN_QUEUE_LEADER_LOCATOR"] = "other-node"
        self.others = [WarrenBroker(flags(node)) for node in (2, 3)]

    def start(self) -> None:
        # Each node waits for a metadata leader, which needs a second node up.
        for node in self.others:
            node.spawn()
        super().start()
        for node in self.others:
            node.wait_ready()

    def stop(self) -> None:
        super().stop()
        for node in self.others:
            node.stop()

    @property
    def metrics_urls(self) -> list[str]:
        return [*super().metrics_urls, *(url for node in self.others for url in node.metrics_urls)]

    def destroy(self) -> None:
        super().destroy()
        for node in self.others:
            node.destroy()


class ManagedRabbitMQ(Broker):
    """A private RabbitMQ node: booted for this session (``owned``), or one that
    scripts/rabbitmq_reference.sh started, which we may seed and restart but never stop."""

    name = "rabbitmq"

    def __init__(self, node: ReferenceNode, owned: bool) -> None:
        super().__init__()
        self.node = node
        self.owned = owned
        self.host = "127.0.0.1"
        self.port = self.node.amqp_port
        self.external_host = self.node.external_host
        if self.node.management_port:
            self.management_url = self.node.management_url
        if self.node.metrics_port:
            self.metrics_url = self.node.metrics_url
        if self.node.tls_port:
            self.tls_port = self.node.tls_port

    def start(self) -> None:
        self.node.start()

    def restart(self) -> None:
        self.node.restart_app()

    def set_loopback_users(self, users: tuple[str, ...]) -> None:
        # rabbit_access_control reads the setting at every login: no restart needed.
        names = ",".join(f'<<"{user}">>' for user in users)
        self.node.ctl("eval", f"application:set_env(rabbit, loopback_users, [{names}]).")

    def set_policy(
        self, name: str, pattern: str, definition: dict, apply_to: str = "queues", priority: int = 0
    ) -> None:
        self.node.ctl(
            "set_policy",
            "--apply-to",
            apply_to,
            "--priority",
            str(priority),
            name,
            pattern,
            json.dumps(definition),
        )

    def clear_policy(self, name: str) -> None:
        self.node.ctl("clear_policy", name)

    def _seed(self) -> None:
        # A node started by the script may have been seeded by an earlier session.
        existing = self.node.ctl("list_users", "--quiet")
        if LIMITED_USER[0] in existing.split():
            return
        ctl = self.node.ctl
        ctl("add_vhost", SEED_VHOST)
        ctl("set_permissions", "-p", SEED_VHOST, "guest", *(".*",) * 3)
        ctl("add_user", *LIMITED_USER)
        ctl("set_permissions", "-p", "/", LIMITED_USER[0], *LIMITED_PERMISSIONS)
        ctl("add_user", *NOPERM_USER)

    def destroy(self) -> None:
        if self.owned:
            self.node.stop()


class ExternalRabbitMQ(Broker):
    """The broker at WARREN_REFERENCE_URL: used as it is, never restarted or seeded."""

    name = "rabbitmq"
    can_seed = False

    def __init__(self, url: str) -> None:
        super().__init__()
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 5672

    def restart(self) -> None:
        pytest.skip("WARREN_REFERENCE_URL points at a broker this suite may not restart")

    def set_loopback_users(self, users: tuple[str, ...]) -> None:
        pytest.skip("WARREN_REFERENCE_URL points at a broker this suite may not configure")

    def _seed(self) -> None:
        pytest.skip("WARREN_REFERENCE_URL points at a broker this suite may not seed")

    def set_policy(
        self, name: str, pattern: str, definition: dict, apply_to: str = "queues", priority: int = 0
    ) -> None:
        pytest.skip("WARREN_REFERENCE_URL points at a broker this suite may not configure")

    def clear_policy(self, name: str) -> None:
        pytest.skip("WARREN_REFERENCE_URL points at a broker this suite may not configure")

    def destroy(self) -> None:
        pass


def start_reference() -> Broker:
    url = os.environ.get("WARREN_REFERENCE_URL")
    if url:
        state = default_state_path()
        if state.exists():
            node = load_node(state)
            if node.amqp_port == urlsplit(url).port:
                return ManagedRabbitMQ(node, owned=False)
        return ExternalRabbitMQ(url)
    try:
        broker = ManagedRabbitMQ(ReferenceNode.create(tls_certificates()), owned=True)
    except ReferenceUnavailable as why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true needs a reference RabbitMQ: {why}")
        pytest.skip(f"no reference RabbitMQ: {why}")
    broker.start()
    return broker

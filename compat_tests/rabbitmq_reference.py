"""A private reference RabbitMQ node for the compat suite: start, restart, seed, stop.

The Debian package's node runs as user ``rabbitmq``, so everything it writes (Mnesia, logs,
the Erlang cookie in its HOME) lives in one temporary directory owned by that user. Each node
gets a unique name (``rabbit-warren-<pid>-<n>@localhost``), a free AMQP port, a free
distribution port below 65536 (RabbitMQ's default, AMQP port + 20000, can overflow), and only
the management and Prometheus plugins, each on a free port of its own, so the HTTP API and
the metrics can be compared too. The node runs in the foreground as a
child process we own (not ``-detached``), so stopping it is certain: ``rabbitmqctl stop``
first, then SIGKILL of its process group if it lingers.

Used by ``compat_tests/conftest.py`` and, for scripts and CI, as a command line::

    python compat_tests/rabbitmq_reference.py start [--state FILE]   # prints the AMQP URL
    python compat_tests/rabbitmq_reference.py start --tls DIR   # and the amqps URL below it
    python compat_tests/rabbitmq_reference.py stop [--state FILE]

FILE defaults to $WARREN_REFERENCE_STATE, else warren-rabbitmq-reference.json in the temporary
directory. A pytest run whose WARREN_REFERENCE_URL names that node finds the file and may then
seed and restart the node as it does its own.

With ``--tls DIR`` (the files of ``warren tls generate DIR``) the node also listens for AMQP
over TLS on a free loopback port, with ``verify_peer`` against DIR's CA, and offers SASL EXTERNAL
(rabbitmq_auth_mechanism_ssl) to clients with a certificate; the second line printed is that
listener's amqps URL with the client certificate's query parameters.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

RABBITMQ_BIN_DIR = Path("/usr/lib/rabbitmq/bin")
RABBITMQ_USER = "rabbitmq"
BOOT_SECONDS_MAX = 60.0
STOP_SECONDS_MAX = 30.0
CTL_SECONDS_MAX = 60.0
PLUGINS = ("rabbitmq_management", "rabbitmq_prometheus")
# With TLS: SASL EXTERNAL, offered beside the password mechanisms.
TLS_PLUGINS = ("rabbitmq_auth_mechanism_ssl",)
STATISTICS_INTERVAL_MS = 500

_node_counter = itertools.count()


def default_state_path() -> Path:
    """Where `start` records the node for `stop` (and for pytest to find it)."""
    configured = os.environ.get("WARREN_REFERENCE_STATE")
    if configured:
        return Path(configured)
    return Path(tempfile.gettempdir()) / "warren-rabbitmq-reference.json"


class ReferenceUnavailable(RuntimeError):
    """RabbitMQ cannot be started here (not installed, or we may not become its user)."""


def _free_ports(count: int) -> list[int]:
    """`count` distinct ports free a moment ago on 127.0.0.1, all bound until all are picked.
    Not `warrenmq.cluster.local_cluster.free_ports`: `scripts/rabbitmq_reference.sh` runs
    this file with any python3, without the package installed."""
    with contextlib.ExitStack() as bound:
        ports = []
        for _ in range(count):
            sock = bound.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
        return ports


def wait_for_port(host: str, port: int, seconds_max: float, alive=lambda: True) -> None:
    """Return once ``host:port`` accepts TCP; raise if ``alive()`` turns false or time runs out."""
    deadline = time.monotonic() + seconds_max
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"the process serving {host}:{port} exited during start-up")
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{host}:{port} did not accept connections within {seconds_max} s")


def non_loopback_address() -> str | None:
    """An IPv4 address of this machine outside 127/8, to reach a broker as a remote client."""
    candidates = []
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            # A UDP connect sends nothing; it only makes the kernel pick the outgoing address.
            probe.connect(("198.51.100.1", 9))
            candidates.append(probe.getsockname()[0])
    except OSError:
        pass
    try:
        candidates.extend(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    for address in candidates:
        if not address.startswith("127.") and address != "0.0.0.0":
            return address
    return None


def unavailable_reason() -> str | None:
    """Why a private node cannot run on this machine, or None when it can."""
    if not (RABBITMQ_BIN_DIR / "rabbitmq-server").exists():
        return f"rabbitmq-server is not installed ({RABBITMQ_BIN_DIR} missing)"
    try:
        user = pwd.getpwnam(RABBITMQ_USER)
    except KeyError:
        return f"there is no user {RABBITMQ_USER!r}"
    if os.geteuid() not in (0, user.pw_uid):
        return f"only root or {RABBITMQ_USER!r} may start the Debian RabbitMQ node"
    return None


@dataclass
class ReferenceNode:
    """One private RabbitMQ node; ``state`` round-trips through JSON for the CLI."""

    nodename: str
    base_dir: str
    amqp_port: int
    dist_port: int
    pid: int = 0
    # Also listen here (not only on loopback), so a test can connect as a non-local client.
    external_host: str | None = None
    # The management (HTTP API) and Prometheus plugins' listeners, on loopback.
    management_port: int = 0
    metrics_port: int = 0
    # AMQP over TLS, when started with certificates: their copies in base_dir/tls.
    tls_port: int = 0

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.amqp_port}/%2F"

    @property
    def tls_url(self) -> str:
        files = Path(self.base_dir) / "tls"
        return (
            f"amqps://guest:guest@localhost:{self.tls_port}/%2F"
            f"?cacertfile={files / 'ca_certificate.pem'}"
            f"&certfile={files / 'client_certificate.pem'}"
            f"&keyfile={files / 'client_key.pem'}"
        )

    @property
    def management_url(self) -> str:
        return f"http://127.0.0.1:{self.management_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    def _env(self) -> dict[str, str]:
        base = Path(self.base_dir)
        return {
            "PATH": f"{RABBITMQ_BIN_DIR}:/usr/bin:/bin:/usr/sbin:/sbin",
            "HOME": str(base / "home"),
            "LANG": "C.UTF-8",
            "RABBITMQ_NODENAME": self.nodename,
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(base / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
            "RABBITMQ_CONF_ENV_FILE": str(base / "rabbitmq-env.conf"),
            "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(base / "advanced.config"),
        }

    def _as_rabbitmq(self) -> dict:
        """Popen arguments that run a RabbitMQ tool as its own user with this node's env."""
        if os.geteuid() == 0:
            return {"user": RABBITMQ_USER, "group": RABBITMQ_USER, "env": self._env()}
        return {"env": self._env()}

    @classmethod
    def create(
        cls, tls_dir: Path | None = None, http: bool = True, cookie: str | None = None
    ) -> ReferenceNode:
        """A node not yet started; ``http`` False leaves out the management and Prometheus
        plugins (and their ports), ``cookie`` is the Erlang cookie the node shares with the
        nodes of its cluster (default: one of its own, made at its first boot)."""
        reason = unavailable_reason()
        if reason is not None:
            raise ReferenceUnavailable(reason)
        base = Path(tempfile.mkdtemp(prefix="warren-rabbitmq-"))
        for sub in ("home", "mnesia", "log"):
            (base / sub).mkdir()
        if cookie is not None:
            # Erlang refuses a cookie file that others may read.
            cookie_file = base / "home" / ".erlang.cookie"
            cookie_file.write_text(cookie)
            cookie_file.chmod(0o400)
        plugins = (PLUGINS if http else ()) + (TLS_PLUGINS if tls_dir is not None else ())
        (base / "enabled_plugins").write_text(f"[{','.join(plugins)}].\n")
        (base / "rabbitmq-env.conf").write_text("")
        (base / "advanced.config").write_text("[].\n")
        if tls_dir is not None:
            shutil.copytree(tls_dir, base / "tls")
        user = pwd.getpwnam(RABBITMQ_USER)
        os.chmod(base, 0o755)
        for path in [base, *base.rglob("*")]:
            os.chown(path, user.pw_uid, user.pw_gid)
        amqp_port, dist_port, management_port, metrics_port, tls_port = _free_ports(5)
        nodename = f"rabbit-warren-{os.getpid()}-{next(_node_counter)}@localhost"
        node = cls(
            nodename=nodename,
            base_dir=str(base),
            amqp_port=amqp_port,
            dist_port=dist_port,
            external_host=non_loopback_address(),
            management_port=management_port if http else 0,
            metrics_port=metrics_port if http else 0,
            tls_port=tls_port if tls_dir is not None else 0,
        )
        node.write_config()
        return node

    def write_config(self) -> None:
        """rabbitmq.conf: the AMQP listeners (loopback, and the external address if any), and
        the HTTP listeners of the management and Prometheus plugins (loopback)."""
        lines = [f"listeners.tcp.loopback = 127.0.0.1:{self.amqp_port}"]
        if self.external_host:
            lines.append(f"listeners.tcp.external = {self.external_host}:{self.amqp_port}")
        if self.management_port:
            lines += [
                "management.tcp.ip = 127.0.0.1",
                f"management.tcp.port = {self.management_port}",
                # Queue depths and rates are sampled this often (5 s by default): the HTTP
                # tests wait for a sample, so a short interval keeps them short.
                f"collect_statistics_interval = {STATISTICS_INTERVAL_MS}",
            ]
        if self.metrics_port:
            lines += ["prometheus.tcp.ip = 127.0.0.1", f"prometheus.tcp.port = {self.metrics_port}"]
        if self.tls_port:
            files = Path(self.base_dir) / "tls"
            lines += [
                f"listeners.ssl.loopback = 127.0.0.1:{self.tls_port}",
                f"ssl_options.cacertfile = {files / 'ca_certificate.pem'}",
                f"ssl_options.certfile = {files / 'server_certificate.pem'}",
                f"ssl_options.keyfile = {files / 'server_key.pem'}",
                "ssl_options.verify = verify_peer",
                "ssl_options.fail_if_no_peer_cert = false",
                "auth_mechanisms.1 = PLAIN",
                "auth_mechanisms.2 = AMQPLAIN",
                "auth_mechanisms.3 = EXTERNAL",
            ]
        config = Path(self.base_dir) / "rabbitmq.conf"
        config.write_text("\n".join(lines) + "\n")
        user = pwd.getpwnam(RABBITMQ_USER)
        os.chown(config, user.pw_uid, user.pw_gid)

    @property
    def ports(self) -> list[int]:
        """The ports the node serves clients on: AMQP, and the plugins' HTTP when it has them."""
        ports = (self.amqp_port, self.management_port, self.metrics_port, self.tls_port)
        return [port for port in ports if port]

    def start(self) -> None:
        """Boot the node in the foreground as our child and wait until its ports accept."""
        output = open(Path(self.base_dir) / "console.log", "ab")
        process = subprocess.Popen(
            [str(RABBITMQ_BIN_DIR / "rabbitmq-server")],
            cwd=self.base_dir,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            **self._as_rabbitmq(),
        )
        output.close()
        self.pid = process.pid
        try:
            for port in self.ports:
                wait_for_port("127.0.0.1", port, BOOT_SECONDS_MAX, lambda: process.poll() is None)
        except Exception:
            self.stop()
            raise RuntimeError(f"RabbitMQ did not start; see {self.base_dir}/console.log") from None

    def ctl(self, *args: str) -> str:
        """Run ``rabbitmqctl -n NODE ARGS`` and return its output; raise on failure."""
        done = subprocess.run(
            [str(RABBITMQ_BIN_DIR / "rabbitmqctl"), "-n", self.nodename, *args],
            cwd=self.base_dir,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=CTL_SECONDS_MAX,
            **self._as_rabbitmq(),
        )
        if done.returncode != 0:
            raise RuntimeError(f"rabbitmqctl {' '.join(args)} failed: {done.stdout}{done.stderr}")
        return done.stdout

    def restart_app(self) -> None:
        """Stop and start the RabbitMQ application inside the running node.

        That is what a broker restart means to clients: every connection is closed, transient
        and exclusive queues are gone, durable entities and persistent messages come back.
        It costs about two seconds instead of a whole Erlang VM boot.
        """
        self.ctl("stop_app")
        self.ctl("start_app")
        for port in self.ports:
            wait_for_port("127.0.0.1", port, BOOT_SECONDS_MAX, self.alive)

    def alive(self) -> bool:
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def stop(self) -> None:
        """Stop the node (politely, then by SIGKILL of its process group) and remove its files."""
        if self.pid and self.alive():
            try:
                self.ctl("stop")
            except (RuntimeError, subprocess.TimeoutExpired):
                pass
            deadline = time.monotonic() + STOP_SECONDS_MAX
            while self.alive() and time.monotonic() < deadline:
                _reap(self.pid)
                time.sleep(0.1)
            if self.alive():
                try:
                    os.killpg(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                _reap(self.pid)
        shutil.rmtree(self.base_dir, ignore_errors=True)
        self.pid = 0


def _reap(pid: int) -> None:
    """Collect our own exited child so that it does not linger as a zombie (and look alive)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def load_node(state: Path) -> ReferenceNode:
    return ReferenceNode(**json.loads(state.read_text()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("action", choices=["start", "stop"])
    parser.add_argument("--state", help="JSON file that remembers the node (see above)")
    parser.add_argument("--tls", metavar="DIR", help="also listen for amqps, DIR's certificates")
    args = parser.parse_args(argv)
    state = Path(args.state) if args.state else default_state_path()
    if args.action == "start":
        if state.exists():
            parser.error(f"{state} exists: a node may still run (stop it first)")
        node = ReferenceNode.create(Path(args.tls) if args.tls else None)
        node.start()
        state.write_text(json.dumps(asdict(node)))
        print(node.url)
        if node.tls_port:
            print(node.tls_url)
        return 0
    node = load_node(state)
    node.stop()
    state.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())

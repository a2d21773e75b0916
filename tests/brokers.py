"""Warren for tests: in-process on an event-loop thread (`ThreadBroker`), or `warren serve` as
a subprocess (`WarrenProcess`); both on 127.0.0.1 and ports the OS picks (AMQP, and the HTTP
management and metrics listeners: never RabbitMQ's fixed ports)."""

from __future__ import annotations

import queue
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pika
from loop_thread import LoopThread

from warrenmq.server.broker import Broker
from warrenmq.server.config import BrokerConfig

WARREN_LISTENING = re.compile(r"Warren listening on [^:]+:(\d+)")
HTTP_LISTENING = re.compile(r"; (management|metrics) on [^;]+:(\d+)")


def connect(port: int, **kwargs) -> pika.BlockingConnection:
    """A pika connection as guest to 127.0.0.1:`port`, one attempt."""
    return pika.BlockingConnection(
        pika.ConnectionParameters("127.0.0.1", port, connection_attempts=1, **kwargs)
    )


def declare_stream(broker, name: str, **arguments) -> None:
    """Declare the stream `name` on `broker` (a ThreadBroker or WarrenProcess) over AMQP."""
    connection = broker.connect()
    connection.channel().queue_declare(
        name, durable=True, arguments={"x-queue-type": "stream", **arguments}
    )
    connection.close()


DURABLE_QUEUE = dict(
    durable=True,
    exclusive=False,
    auto_delete=False,
    arguments={},
    owner="o",
    server_named=False,
    user=None,
)
"""`VirtualHost.declare_queue`'s keyword arguments for a durable queue owned by "o"."""


class ThreadBroker(LoopThread):
    """Warren's Broker in this process, on its own uvloop thread, 127.0.0.1 and a free port.

    start() and stop() block until done; stop() may be called again (the `start_broker`
    fixture stops whatever a test left running)."""

    START_STOP_S_MAX = 20.0

    def __init__(self, data_dir, **settings) -> None:
        super().__init__()
        settings.setdefault("management_port", 0)
        settings.setdefault("metrics_port", 0)
        settings.setdefault("management_ssl_port", 0)
        settings.setdefault("metrics_ssl_port", 0)
        self.broker = Broker(BrokerConfig(port=0, bind="127.0.0.1", data_dir=data_dir, **settings))

    def start(self):
        super().start()
        self.call(self.broker.start(), self.START_STOP_S_MAX)
        return self

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.call(self.broker.stop(), self.START_STOP_S_MAX)
        super().stop()

    @property
    def port(self) -> int:
        return self.broker.port

    @property
    def management_url(self) -> str:
        return f"http://127.0.0.1:{self.broker.http.ports()['management']}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.broker.http.ports()['metrics']}"

    def connect(self, **kwargs) -> pika.BlockingConnection:
        return connect(self.port, **kwargs)


def warren_serve(data_dir, port: int = 0, *options: str) -> list[str]:
    """The command line of `warren serve` on 127.0.0.1 (port 0: the OS picks a free one; the
    HTTP listeners always get free ports)."""
    return [
        sys.executable,
        "-m",
        "warrenmq.server.cli",
        "serve",
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--data-dir",
        str(data_dir),
        "--management-port",
        "0",
        "--metrics-port",
        "0",
        *options,
    ]


class WarrenProcess:
    """`warren serve` as a subprocess on 127.0.0.1 and a port it picks, read from its ready line.

    start() may be called again after a stop or kill: the same data dir, a new process (and
    port). Its log (stderr) is appended to `log_path`, or dropped."""

    def __init__(
        self, data_dir, *, log_level: str = "warning", log_path: Path | None = None, preexec_fn=None
    ) -> None:
        self.data_dir = data_dir
        self.log_level = log_level
        self.log_path = log_path
        self.preexec_fn = preexec_fn
        self.process: subprocess.Popen | None = None
        self.port: int | None = None
        self.http_ports: dict[str, int] = {}
        self._log_offset = 0

    def start(self, timeout_s: float = 30.0):
        if self.log_path is None:
            self.process = self._spawn(subprocess.DEVNULL)
        else:
            self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
            with open(self.log_path, "ab") as log:
                self.process = self._spawn(log)
        # Read in a thread: a broker that hangs before listening prints nothing at all.
        lines: queue.Queue[str] = queue.Queue()
        stdout = self.process.stdout
        threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True).start()
        try:
            line = lines.get(timeout=timeout_s)
        except queue.Empty:
            self.kill()
            raise AssertionError(f"warren serve did not listen within {timeout_s} s") from None
        match = WARREN_LISTENING.search(line)
        if match is None:
            self.kill()
            log = self.log_since_start()[-2000:] if self.log_path else line
            raise AssertionError(f"warren serve exited ({self.process.returncode}): {log}")
        self.port = int(match.group(1))
        self.http_ports = {name: int(port) for name, port in HTTP_LISTENING.findall(line)}
        return self

    def _spawn(self, stderr) -> subprocess.Popen:
        return subprocess.Popen(
            warren_serve(self.data_dir, 0, "--log-level", self.log_level),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            preexec_fn=self.preexec_fn,
        )

    def log_since_start(self) -> str:
        """What the last start wrote to `log_path`."""
        with open(self.log_path, "rb") as log:
            log.seek(self._log_offset)
            return log.read().decode(errors="replace")

    def stop(self, signum: int = signal.SIGTERM, timeout_s: float = 15.0) -> int:
        """Send `signum` and wait for the exit; returns the exit status."""
        self.process.send_signal(signum)
        return self.process.wait(timeout_s)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}/%2F"

    @property
    def management_url(self) -> str:
        return f"http://127.0.0.1:{self.http_ports['management']}"

    def connect(self, **kwargs) -> pika.BlockingConnection:
        # A connection the broker blocks (a full disk) fails the test instead of hanging it.
        kwargs.setdefault("blocked_connection_timeout", 5)
        return connect(self.port, **kwargs)

"""docker/Dockerfile and docker/docker-compose.yml on a real Docker engine: the image built by
compose on a local base (scripts/docker_base_image.sh: Debian packages, no registry needed, kept
between runs), the three nodes up and healthy on free host ports, the compiled codecs in the
image, messages through the nodes, and the cluster still serving with one node stopped.

Marked `docker`: only `make test-docker` (pytest -m docker) runs it, as CI does; it takes
minutes (the first base build about one). Without a Docker engine and a compose CLI it skips,
except under CI=true where it fails. The tests of one module share the cluster and run in
order: the last one stops a node. Everything is removed afterwards (`compose down -v`), failed
or not; the base image and the built image's layers stay, for the next run.
"""

import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pika
import pytest
from brokers import connect
from http_api import HttpApi, eventually, path
from ports import free_ports

# The first run builds the base and the image inside the first test's setup: minutes.
pytestmark = [pytest.mark.docker, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "docker" / "docker-compose.yml"
BASE_IMAGE = "warren-base:bookworm"
IMAGE = "warren:test"
NODES = ("warren1", "warren2", "warren3")
HEALTHY_TIMEOUT_S = 300.0


def unavailable(reason: str):
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true needs {reason}")
    pytest.skip(f"needs {reason}")


def succeeds(*command: str) -> bool:
    try:
        return subprocess.run(command, capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def compose_command() -> list[str]:
    """The compose CLI at hand: the docker plugin (`docker compose`), else Debian's
    docker-compose (1.29, which reads the same file)."""
    if not succeeds("docker", "info"):
        unavailable("a Docker engine (docker.io, dockerd running: `make test-docker` as root)")
    if succeeds("docker", "compose", "version"):
        return ["docker", "compose"]
    if shutil.which("docker-compose") is not None:
        return ["docker-compose"]
    unavailable("a compose CLI (the docker compose plugin or Debian's docker-compose)")


def base_image() -> str:
    """$WARREN_BASE_IMAGE, else the local Debian base (built once, as root with debootstrap),
    else the Dockerfile's default, pulled from the registry."""
    if os.environ.get("WARREN_BASE_IMAGE"):
        return os.environ["WARREN_BASE_IMAGE"]
    if succeeds("docker", "image", "inspect", BASE_IMAGE):
        return BASE_IMAGE
    if os.geteuid() == 0 and shutil.which("debootstrap") is not None:
        subprocess.run(
            [str(ROOT / "scripts" / "docker_base_image.sh"), BASE_IMAGE], check=True, timeout=900
        )
        return BASE_IMAGE
    return "python:3.11-slim"


def image_id(image: str) -> str:
    """The id of `image`, or "" when there is none."""
    inspected = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Id}}", image], capture_output=True, text=True
    )
    return inspected.stdout.strip() if inspected.returncode == 0 else ""


class Cluster:
    """The compose project of one test run: its own name, host ports and volumes."""

    def __init__(self, compose: list[str]) -> None:
        self.project = f"warren-test-{uuid.uuid4().hex[:8]}"
        self.compose = [*compose, "-f", str(COMPOSE_FILE), "-p", self.project]
        ports = free_ports(2 * len(NODES))
        self.amqp_ports = dict(zip(NODES, ports[: len(NODES)], strict=True))
        self.http_ports = dict(zip(NODES, ports[len(NODES) :], strict=True))
        self.environment = {
            **os.environ,
            "WARREN_IMAGE": IMAGE,
            "WARREN_BASE_IMAGE": base_image(),
            "WARREN_PUBLISH_ADDRESS": "127.0.0.1",
            "WARREN_CLUSTER_SECRET": uuid.uuid4().hex,
        }
        for number, node in enumerate(NODES, 1):
            self.environment[f"WARREN{number}_AMQP_PORT"] = str(self.amqp_ports[node])
            self.environment[f"WARREN{number}_HTTP_PORT"] = str(self.http_ports[node])
        """Whether the image's broker has the cluster's settings (issue 11): before them, each
        node is a broker of its own and WARREN_CLUSTER is ignored. Known once it runs."""

    def run(self, *arguments: str, timeout_s: float = 600.0) -> str:
        done = subprocess.run(
            [*self.compose, *arguments],
            env=self.environment,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        assert done.returncode == 0, f"compose {' '.join(arguments)}: {done.stderr}"
        return done.stdout

    def container(self, node: str) -> str:
        return self.run("ps", "-q", node).strip()

    def health(self, node: str) -> str:
        return subprocess.run(
            ["docker", "inspect", "--format", "{{.State.Health.Status}}", self.container(node)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()

    def wait_healthy(self, nodes) -> None:
        deadline = time.monotonic() + HEALTHY_TIMEOUT_S
        while (states := {node: self.health(node) for node in nodes}) != dict.fromkeys(
            nodes, "healthy"
        ):
            assert time.monotonic() < deadline, f"not healthy: {states}\n{self.run('logs')}"
            time.sleep(2)

    def connect(self, node: str) -> pika.BlockingConnection:
        return connect(self.amqp_ports[node])

    def api(self, node: str) -> HttpApi:
        return HttpApi(f"http://127.0.0.1:{self.http_ports[node]}")

    def up(self) -> None:
        replaced = image_id(IMAGE)
        self.run("build", timeout_s=1800)
        if replaced not in ("", image_id(IMAGE)):
            # The last run's image, untagged now: its layers still shared stay as the cache.
            subprocess.run(["docker", "image", "rm", replaced], capture_output=True)
        self.run("up", "-d")
        self.wait_healthy(NODES)


@pytest.fixture(scope="module")
def cluster():
    cluster = Cluster(compose_command())
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.run("down", "-v", "--remove-orphans")


def publish(connection: pika.BlockingConnection, queue: str, bodies: list[bytes]) -> None:
    """Declare the durable `queue` and publish `bodies` to it, each confirmed."""
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(queue, durable=True)
    for body in bodies:
        channel.basic_publish("", queue, body, pika.BasicProperties(delivery_mode=2))


def consume(connection: pika.BlockingConnection, queue: str, count: int) -> list[bytes]:
    """`count` messages got from `queue` and acked, in order."""
    channel = connection.channel()
    bodies = []
    for _ in range(count):
        method, _properties, body = channel.basic_get(queue)
        assert method is not None, f"{queue} had {len(bodies)} messages, not {count}"
        channel.basic_ack(method.delivery_tag)
        bodies.append(body)
    return bodies


def test_every_node_serves_its_published_ports(cluster):
    for node in NODES:
        assert cluster.api(node).get("/api/health/checks/alarms").json == {"status": "ok"}
        cluster.connect(node).close()


def test_the_image_has_the_compiled_codecs(cluster):
    """The image's Warren runs amqp/ and log/_speedups.pyx compiled (docker/Dockerfile's
    builder stage has the C compiler), not the pure-Python reference an install without one
    falls back to."""
    printed = cluster.run(
        "exec",
        "-T",
        "warren1",
        "python",
        "-c",
        "from warrenmq.amqp import fastpath; from warrenmq.log import batch; "
        "print(fastpath._speedups); print(batch._speedups)",
    ).splitlines()
    assert printed[0].startswith("<module 'warrenmq.amqp._speedups'"), printed
    assert printed[1].startswith("<module 'warrenmq.log._speedups'"), printed


def test_publish_and_consume_through_one_node(cluster):
    bodies = [f"message {n}".encode() for n in range(10)]
    with cluster.connect("warren1") as connection:
        publish(connection, "through-one-node", bodies)
        assert consume(connection, "through-one-node", len(bodies)) == bodies


def test_consume_through_another_node(cluster):
    bodies = [f"message {n}".encode() for n in range(10)]
    with cluster.connect("warren1") as connection:
        publish(connection, "across-nodes", bodies)
    with cluster.connect("warren2") as connection:
        assert consume(connection, "across-nodes", len(bodies)) == bodies


def test_the_others_keep_serving_with_a_node_stopped(cluster):
    cluster.run("stop", "warren1")
    cluster.wait_healthy(("warren2", "warren3"))
    bodies = [b"after the stop"]
    for node in ("warren2", "warren3"):
        with cluster.connect(node) as connection:
            publish(connection, f"after-a-stop-on-{node}", bodies)
            assert consume(connection, f"after-a-stop-on-{node}", 1) == bodies


def test_metadata_goes_on_with_a_node_stopped(cluster):
    """With two voters of three (warren1 stopped by the test before), what warren2 declares,
    warren3 knows and serves."""
    with cluster.connect("warren2") as connection:
        connection.channel().queue_declare("declared-with-one-node-down", durable=True)
    declared = path("api", "queues", "/", "declared-with-one-node-down")
    assert eventually(lambda: cluster.api("warren3").get(declared).status, 200) == 200
    bodies = [b"across, after the stop"]
    with cluster.connect("warren2") as connection:
        publish(connection, "across-after-a-stop", bodies)
    with cluster.connect("warren3") as connection:
        assert consume(connection, "across-after-a-stop", 1) == bodies

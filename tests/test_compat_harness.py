"""The compat harness itself: ports, URLs, the raw frame client, and the reference launcher."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pika
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import commands, frame

ROOT = Path(__file__).resolve().parent.parent
# compat_tests is a folder of test modules, not a package; its helpers are found by path.
sys.path.insert(0, str(ROOT / "compat_tests"))

import compat_harness  # noqa: E402
import rabbitmq_reference  # noqa: E402
from ports import free_port  # noqa: E402
from raw_client import FRAME_END, RawClient, raw_frame  # noqa: E402


def test_free_port_is_bindable():
    port = free_port()
    assert 0 < port < 65536
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_wait_for_port_times_out_on_a_closed_port():
    port = free_port()
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        rabbitmq_reference.wait_for_port("127.0.0.1", port, 0.3)
    assert time.monotonic() - started < 2


def test_wait_for_port_stops_when_the_process_dies():
    port = free_port()
    with pytest.raises(RuntimeError, match="exited during start-up"):
        rabbitmq_reference.wait_for_port("127.0.0.1", port, 10, alive=lambda: False)


def test_wait_for_port_returns_once_listening():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        rabbitmq_reference.wait_for_port("127.0.0.1", server.getsockname()[1], 2)


def test_reference_node_environment(tmp_path):
    node = rabbitmq_reference.ReferenceNode(
        nodename="rabbit-warren-1-0@localhost",
        base_dir=str(tmp_path),
        amqp_port=40000,
        dist_port=50000,
        external_host="192.0.2.7",
    )
    env = node._env()
    assert env["RABBITMQ_DIST_PORT"] == "50000"
    assert env["RABBITMQ_NODENAME"] == "rabbit-warren-1-0@localhost"
    assert env["RABBITMQ_ENABLED_PLUGINS_FILE"] == f"{tmp_path}/enabled_plugins"
    assert env["RABBITMQ_CONFIG_FILE"] == f"{tmp_path}/rabbitmq.conf"
    assert env["HOME"] == f"{tmp_path}/home"
    assert node.url == "amqp://guest:guest@127.0.0.1:40000/%2F"
    if rabbitmq_reference.unavailable_reason() is None:
        node.write_config()
        assert (tmp_path / "rabbitmq.conf").read_text().splitlines() == [
            "listeners.tcp.loopback = 127.0.0.1:40000",
            "listeners.tcp.external = 192.0.2.7:40000",
        ]


def test_reference_node_serves_management_and_metrics_on_loopback(tmp_path):
    node = rabbitmq_reference.ReferenceNode(
        nodename="rabbit-warren-1-0@localhost",
        base_dir=str(tmp_path),
        amqp_port=40000,
        dist_port=50000,
        management_port=40001,
        metrics_port=40002,
    )
    assert node.ports == [40000, 40001, 40002]
    assert (node.management_url, node.metrics_url) == (
        "http://127.0.0.1:40001",
        "http://127.0.0.1:40002",
    )
    if rabbitmq_reference.unavailable_reason() is None:
        node.write_config()
        lines = (tmp_path / "rabbitmq.conf").read_text().splitlines()
        assert {
            "management.tcp.ip = 127.0.0.1",
            "management.tcp.port = 40001",
            "prometheus.tcp.ip = 127.0.0.1",
            "prometheus.tcp.port = 40002",
        } <= set(lines)


def test_non_loopback_address_is_not_loopback():
    address = rabbitmq_reference.non_loopback_address()
    assert address is None or not address.startswith("127.")


@given(
    user=st.text(min_size=1, max_size=20),
    password=st.text(max_size=20),
    vhost=st.text(min_size=1, max_size=20),
)
def test_url_for_round_trips_through_pika(user, password, vhost):
    broker = compat_harness.ExternalRabbitMQ("amqp://h:1234/")
    params = pika.URLParameters(broker.url_for(user, password, vhost))
    assert (params.host, params.port, params.virtual_host) == ("h", 1234, vhost)
    assert (params.credentials.username, params.credentials.password) == (user, password)


def test_default_url_is_guest_on_the_root_vhost():
    broker = compat_harness.ExternalRabbitMQ("amqp://127.0.0.1:5999/")
    assert broker.url == "amqp://guest:guest@127.0.0.1:5999/%2F"


@given(
    frame_type=st.integers(0, 255), channel=st.integers(0, 65535), payload=st.binary(max_size=64)
)
def test_raw_frame_layout(frame_type, channel, payload):
    data = raw_frame(frame_type, channel, payload)
    assert data[0] == frame_type
    assert int.from_bytes(data[1:3], "big") == channel
    assert int.from_bytes(data[3:7], "big") == len(payload)
    assert data[7:-1] == payload and data[-1:] == FRAME_END


def test_raw_client_handshake_against_a_scripted_server():
    """The raw client speaks the handshake in the right order (checked by a fake broker)."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        seen: list = []

        def serve():
            conn, _ = server.accept()
            with conn:
                assert conn.recv(8) == b"AMQP\x00\x00\x09\x01"
                conn.sendall(frame.marshal(commands.Connection.Start(), 0))
                buffer = b""
                for expected in (
                    commands.Connection.StartOk,
                    commands.Connection.TuneOk,
                    commands.Connection.Open,
                ):
                    while True:
                        try:
                            used, _, value = frame.unmarshal(buffer)
                            break
                        except Exception:
                            buffer += conn.recv(4096)
                    buffer = buffer[used:]
                    seen.append(value)
                    if expected is commands.Connection.StartOk:
                        conn.sendall(
                            frame.marshal(
                                commands.Connection.Tune(
                                    channel_max=9, frame_max=8192, heartbeat=0
                                ),
                                0,
                            )
                        )
                conn.sendall(frame.marshal(commands.Connection.OpenOk(), 0))

        thread = threading.Thread(target=serve)
        thread.start()
        with RawClient(*server.getsockname()) as raw:
            raw.handshake(channel_max=5, frame_max=4096, vhost="v")
        thread.join(5)
    start_ok, tune_ok, open_ = seen
    assert start_ok.response == "\0guest\0guest"
    assert (tune_ok.channel_max, tune_ok.frame_max) == (5, 4096)
    assert open_.virtual_host == "v"


@pytest.mark.slow
def test_reference_script_starts_and_stops_a_node(tmp_path):
    reason = rabbitmq_reference.unavailable_reason()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    env = {**os.environ, "WARREN_REFERENCE_STATE": str(tmp_path / "state.json")}
    script = ROOT / "scripts" / "rabbitmq_reference.sh"
    started = subprocess.run(
        [script, "start"], env=env, capture_output=True, text=True, timeout=120
    )
    assert started.returncode == 0, started.stderr
    url = started.stdout.strip()
    try:
        conn = pika.BlockingConnection(pika.URLParameters(url))
        assert conn.channel().queue_declare("", exclusive=True).method.queue.startswith("amq.gen-")
        conn.close()
        again = subprocess.run(
            [script, "start"], env=env, capture_output=True, text=True, timeout=60
        )
        assert again.returncode != 0 and "exists" in again.stderr
    finally:
        stopped = subprocess.run(
            [script, "stop"], env=env, capture_output=True, text=True, timeout=120
        )
    assert stopped.returncode == 0, stopped.stderr
    assert not (tmp_path / "state.json").exists()
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    with pytest.raises(TimeoutError):
        rabbitmq_reference.wait_for_port("127.0.0.1", port, 0.5)


def test_the_reference_script_runs_without_warren_installed():
    """`scripts/rabbitmq_reference.sh` runs it with any python3 when there is no .venv: `-S`
    leaves site-packages, and so the warrenmq package, out."""
    script = ROOT / "compat_tests" / "rabbitmq_reference.py"
    shown = subprocess.run(
        [sys.executable, "-S", str(script), "--help"], capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    assert "start" in shown.stdout

"""The HTTP listeners of `warren serve`: moved or turned off by flag, TOML and environment as
the AMQP port is, named on the ready line, and a taken port fails the start."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
from brokers import WARREN_LISTENING, ThreadBroker, warren_serve
from http_api import HttpApi
from ports import free_port

from warrenmq.server.config import ConfigError, load


def test_defaults_are_rabbitmqs_ports():
    config = load(environ={})
    assert (config.management_port, config.metrics_port) == (15672, 15692)
    assert config.management_enabled and config.metrics_enabled


def test_file_then_environment_then_flags(tmp_path):
    toml = tmp_path / "warren.toml"
    toml.write_text("management_port = 8000\nmetrics_port = 8001\nmetrics_enabled = false\n")
    config = load(
        toml,
        environ={"WARREN_MANAGEMENT_PORT": "9000", "WARREN_MANAGEMENT_ENABLED": "false"},
        overrides={"management_port": 9100, "metrics_enabled": None},
    )
    assert (config.management_port, config.metrics_port) == (9100, 8001)
    assert not config.management_enabled and not config.metrics_enabled


@pytest.mark.parametrize("setting", ["management_port", "metrics_port"])
def test_ports_out_of_range_are_refused(setting):
    with pytest.raises(ConfigError, match=f"{setting} must be 0..65535"):
        load(environ={}, overrides={setting: 70000})


def test_the_ready_line_names_the_http_listeners(warren_process):
    warren_process.start()
    assert set(warren_process.http_ports) == {"management", "metrics"}
    assert HttpApi(warren_process.management_url).get("/api/whoami").status == 200


def test_listeners_turned_off_by_flag(tmp_path):
    process = subprocess.Popen(
        warren_serve(tmp_path / "d", 0, "--no-management", "--no-metrics"),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        line = process.stdout.readline()
        assert WARREN_LISTENING.search(line) and "management" not in line and "metrics" not in line
    finally:
        process.terminate()
        process.wait(15)


def test_a_taken_management_port_fails_the_start(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            warren_serve(tmp_path / "d", 0, "--management-port", str(port)),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1
    assert "start-up failed" in done.stderr
    assert "Warren listening" not in done.stdout


def test_an_in_process_broker_without_http(tmp_path):
    broker = ThreadBroker(tmp_path / "d", management_enabled=False, metrics_enabled=False).start()
    try:
        assert broker.broker.http.ports() == {}
    finally:
        broker.stop()


def test_environment_moves_and_turns_off_the_listeners(tmp_path):
    port = free_port()
    environment = {**os.environ, "WARREN_MANAGEMENT_PORT": str(port)}
    environment["WARREN_METRICS_ENABLED"] = "false"
    command = [sys.executable, "-m", "warrenmq.server.cli", "serve", "--port", "0"]
    command += ["--bind", "127.0.0.1", "--data-dir", str(tmp_path / "d")]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=environment
    )
    try:
        line = process.stdout.readline()
        assert f"; management on 127.0.0.1:{port}" in line and "metrics" not in line
    finally:
        process.terminate()
        process.wait(15)

"""The file-descriptor alarm on a running broker with a small RLIMIT_NOFILE: connections up to
what the descriptors leave are served, one more is closed at once and the alarm logged (as
RabbitMQ's file descriptor limit alarm), and a freed place clears it."""

from __future__ import annotations

import re
import resource
import socket
import time

from hostile import serves_a_good_client
from raw_amqp import PROTOCOL_HEADER

from warrenmq.server.descriptor_alarm import DescriptorAlarm

FILES_MAX = 400


def small_descriptor_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FILES_MAX, FILES_MAX))


def answers_the_handshake(sock: socket.socket) -> bool:
    """True when the broker sends connection.start, False when it closes the socket."""
    sock.sendall(PROTOCOL_HEADER)
    try:
        return len(sock.recv(7)) == 7
    except ConnectionResetError:
        return False


def test_connections_beyond_the_descriptors_left_are_refused_until_one_closes(tmp_path):
    from brokers import WarrenProcess

    warren = WarrenProcess(
        tmp_path / "data",
        log_level="info",
        log_path=tmp_path / "warren.log",
        preexec_fn=small_descriptor_limit,
    ).start()
    socks = []
    try:
        line = re.search(
            r"file descriptors: (\d+) \(RLIMIT_NOFILE\); queue logs keep at most (\d+) open, "
            r"connections at most (\d+)",
            warren.log_since_start(),
        )
        assert line is not None
        limit, log_files, connections_max = map(int, line.groups())
        assert limit == FILES_MAX
        assert connections_max == DescriptorAlarm(log_files, limit).connections_max > 0
        for _ in range(connections_max):
            sock = socket.create_connection(("127.0.0.1", warren.port), timeout=10)
            socks.append(sock)
            assert answers_the_handshake(sock)
        refused = socket.create_connection(("127.0.0.1", warren.port), timeout=10)
        assert not answers_the_handshake(refused)
        refused.close()
        assert "file descriptor limit alarm set" in warren.log_since_start()
        assert warren.process.poll() is None
        socks.pop().close()
        deadline = time.monotonic() + 10
        while "alarm cleared" not in warren.log_since_start() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "file descriptor limit alarm cleared" in warren.log_since_start()
        serves_a_good_client(warren)
    finally:
        for sock in socks:
            sock.close()
        warren.kill()


def test_the_connections_get_what_the_logs_and_the_reserve_leave():
    assert DescriptorAlarm(200, 1024).connections_max == 1024 - 200 - 100
    assert DescriptorAlarm(600, 512).connections_max == 1

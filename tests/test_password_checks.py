"""Password checks under attack: unknown users cost the same KDF, a flood from one address
does not hold up another address's login, repeated failures slow their address down, and the
metadata file (password hashes) is readable by its owner only.

No timed assertions: each asserts an order of events (a login done while a flood is not).
"""

from __future__ import annotations

import asyncio
import os
import stat
import threading

import pika
import pytest
from pamqp import commands

from warrenmq.amqp import frames
from warrenmq.amqp.connection import ConnectionState
from warrenmq.server.metadata import METADATA_FILE, MetadataStore, password_checks, passwords
from warrenmq.server.metadata import commands as metadata_commands
from warrenmq.server.metadata.password_checks import PasswordChecks

FLOOD_CONNECTIONS = 200
# Another loopback address than the valid login's 127.0.0.1 (all of 127/8 is loopback).
FLOOD_ADDRESS = "127.0.0.2"


class RecordingVerify:
    """A verify function that records what it was asked and answers like the real one."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, password: str, stored: str) -> bool:
        with self.lock:
            self.calls.append(stored)
        return passwords.verify_password(password, stored)


def test_an_unknown_user_costs_the_same_kdf_as_a_known_one():
    verify = RecordingVerify()
    stored = passwords.hash_password("right")

    async def run():
        checks = PasswordChecks(2, verify=verify)
        try:
            return (
                await checks.check("wrong", stored, "10.0.0.1"),
                await checks.check("right", None, "10.0.0.1"),
                await checks.check("right", stored, "10.0.0.1"),
            )
        finally:
            checks.close()

    assert asyncio.run(run()) == (False, False, True)
    assert len(verify.calls) == 3
    decoy = verify.calls[1]
    # The decoy has the cost of a hash made now, so it takes as long to refuse.
    assert passwords.parse_hash(decoy)[:3] == passwords.parse_hash(stored)[:3]


def test_the_store_runs_the_kdf_for_users_that_do_not_exist(tmp_path, monkeypatch):
    derived = []
    real_derive = passwords._derive

    def counting_derive(*args):
        derived.append(args[2:])
        return real_derive(*args)

    monkeypatch.setattr(passwords, "_derive", counting_derive)

    async def run():
        store = await MetadataStore.open(tmp_path / METADATA_FILE)
        try:
            derived.clear()
            assert await store.authenticate("nobody", "guest", "10.0.0.1") is None
            assert await store.authenticate("guest", "wrong", "10.0.0.1") is None
        finally:
            await store.close()

    asyncio.run(run())
    assert len(derived) == 2 and derived[0] == derived[1]


def test_a_flood_from_one_address_does_not_hold_up_another_address():
    release = threading.Event()

    def slow_verify(password: str, stored: str) -> bool:
        release.wait(10)
        return False

    async def run():
        checks = PasswordChecks(1, verify=slow_verify)
        try:
            flood = [
                asyncio.ensure_future(checks.check("wrong", None, "10.0.0.1")) for _ in range(50)
            ]
            await asyncio.sleep(0)
            other = asyncio.ensure_future(checks.check("wrong", None, "10.0.0.2"))
            release.set()
            await other
            return sum(task.done() for task in flood), flood
        finally:
            checks.close()

    async def main():
        done_when_other_was, flood = await run()
        for task in flood:
            task.cancel()
        await asyncio.gather(*flood, return_exceptions=True)
        return done_when_other_was

    # One check per address is queued at a time: at most the one check of 10.0.0.1 that was
    # running and the one queued beside 10.0.0.2's came first.
    assert asyncio.run(main()) <= 2


def test_repeated_failures_slow_their_address_down_only():
    async def run():
        checks = PasswordChecks(2, verify=lambda password, stored: password == "right")
        try:
            for _ in range(password_checks.FAILURES_FREE):
                assert await checks.check("wrong", "stored", "10.0.0.1") is False
            assert checks.penalty_s("10.0.0.1") >= password_checks.PENALTY_S_MIN
            assert checks.penalty_s("10.0.0.2") == 0
            penalised = asyncio.ensure_future(checks.check("right", "stored", "10.0.0.1"))
            assert await checks.check("right", "stored", "10.0.0.2") is True
            waiting = not penalised.done()
            # A success clears the address's failures.
            assert await penalised is True
            return waiting, checks.penalty_s("10.0.0.1")
        finally:
            checks.close()

    waiting, penalty_after_success = asyncio.run(run())
    assert waiting and penalty_after_success == 0


def test_failures_are_forgotten_after_a_quiet_spell():
    now = [1000.0]

    async def run():
        checks = PasswordChecks(1, verify=lambda password, stored: False, clock=lambda: now[0])
        try:
            for _ in range(password_checks.FAILURES_FREE + 3):
                now[0] += 1
                if checks.penalty_s("10.0.0.1") == 0:
                    await checks.check("wrong", "stored", "10.0.0.1")
                else:
                    break
            penalty_s = checks.penalty_s("10.0.0.1")
            now[0] += password_checks.FAILURES_FORGOTTEN_S
            return penalty_s, checks.penalty_s("10.0.0.1")
        finally:
            checks.close()

    penalty_s, later_s = asyncio.run(run())
    assert penalty_s > 0 and later_s == 0


def test_the_metadata_file_is_readable_by_its_owner_only(tmp_path):
    path = tmp_path / METADATA_FILE
    path.touch(mode=0o644)
    os.chmod(path, 0o644)

    async def run():
        store = await MetadataStore.open(path)
        try:
            await store.apply(
                metadata_commands.AddUser("bob", passwords.hash_password("pw", log2_n=2))
            )
            return {
                name: stat.S_IMODE(os.stat(tmp_path / name).st_mode)
                for name in os.listdir(tmp_path)
            }
        finally:
            await store.close()

    modes = asyncio.run(run())
    assert modes and set(modes) >= {METADATA_FILE, METADATA_FILE + "-wal"}
    assert all(mode == 0o600 for mode in modes.values()), modes


# -- over real sockets ----------------------------------------------------------------------


async def _wrong_password_login(port: int) -> None:
    """One PLAIN login with a wrong password from FLOOD_ADDRESS, until the broker answers."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(FLOOD_ADDRESS, 0))
    try:
        writer.write(frames.PROTOCOL_HEADER)
        await reader.readexactly(7)  # connection.start's frame header
        start_ok = commands.Connection.StartOk(
            client_properties={"capabilities": {"authentication_failure_close": True}},
            mechanism="PLAIN",
            response="\0guest\0wrong",
        )
        writer.write(frames.encode_method(0, start_ok))
        # The rest of connection.start, then the 403 connection.close or EOF.
        while await reader.read(65536):
            pass
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


@pytest.mark.slow
def test_a_valid_login_completes_while_a_wrong_password_flood_is_in_progress(
    tmp_path, start_broker
):
    running = start_broker(tmp_path)
    broker = running.broker
    # A user of its own: no earlier successful login of it is remembered.
    running.call(
        broker.store.apply(metadata_commands.AddUser("alice", passwords.hash_password("pw")))
    )
    running.call(
        broker.store.apply(metadata_commands.SetPermissions("alice", "/", ".*", ".*", ".*"))
    )
    answered = 0

    async def flood():
        nonlocal answered

        async def one():
            nonlocal answered
            await _wrong_password_login(running.port)
            answered += 1

        await asyncio.gather(*(one() for _ in range(FLOOD_CONNECTIONS)))

    flood_loop = asyncio.new_event_loop()
    flood_thread = threading.Thread(target=flood_loop.run_until_complete, args=(flood(),))
    flood_thread.start()
    try:
        # Wait until the whole flood is at the broker: each login has been answered or
        # awaits its password check.
        while answered + _authenticating(broker) < FLOOD_CONNECTIONS:
            flood_thread.join(0.01)
        connection = pika.BlockingConnection(
            pika.ConnectionParameters(
                "127.0.0.1",
                running.port,
                credentials=pika.PlainCredentials("alice", "pw"),
                connection_attempts=1,
                blocked_connection_timeout=60,
                socket_timeout=60,
            )
        )
        answered_at_login = answered
        connection.close()
    finally:
        # The penalised flood would take minutes to be answered: cut it off.
        running.call(_abort_unauthenticated(broker))
        flood_thread.join(60)
        flood_loop.close()
    assert answered_at_login < FLOOD_CONNECTIONS


def _authenticating(broker) -> int:
    return sum(
        connection.amqp.state is ConnectionState.AUTHENTICATING
        for connection in list(broker.connections)
    )


async def _abort_unauthenticated(broker) -> None:
    for connection in list(broker.connections):
        if connection.transport is not None and connection.username == "":
            connection.transport.abort()

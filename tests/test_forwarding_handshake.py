"""The link's handshake (`server/forward`): each end proves the cluster secret over a nonce
the other end chose, and the entry node sends no queue work before the owner proved it."""

from __future__ import annotations

import asyncio
from typing import Any

from warrenmq.cluster import auth
from warrenmq.cluster.transport import FrameDecoder, encode_frame
from warrenmq.server.forward import wire
from warrenmq.server.forward.entry import EntryLink
from warrenmq.server.forward.owner import OwnerLink

SECRET = "s3cret"
ENTRY_NODE, OWNER_NODE = 1, 2


class RecordingTransport:
    def __init__(self) -> None:
        self.written = b""
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.written += data

    def abort(self) -> None:
        self.aborted = True

    def get_extra_info(self, name: str) -> Any:
        return None


def _messages(written: bytes) -> list[tuple[wire.Kind, list[Any]]]:
    return [wire.decode(frame) for frame in FrameDecoder(1 << 20).feed(written)]


def _frame(kind: wire.Kind, *fields: Any) -> bytes:
    return encode_frame(wire.encode(kind, *fields))


def _entry() -> tuple[EntryLink, RecordingTransport]:
    link = EntryLink(OWNER_NODE, ENTRY_NODE, SECRET, 1 << 20, lambda _: None, lambda: 0)
    transport = RecordingTransport()
    link.connection_made(transport)
    return link, transport


async def _challenged_entry() -> tuple[EntryLink, RecordingTransport, list[Any]]:
    """An entry link with a request queued, answered a CHALLENGE: its HELLO's fields."""
    link, transport = _entry()
    link.send(wire.Kind.STATS, 1, "/", "q")
    await asyncio.sleep(0)
    assert transport.written == wire.MAGIC
    link.data_received(_frame(wire.Kind.CHALLENGE, b"owner-nonce-0001"))
    await asyncio.sleep(0)
    [(kind, hello)] = _messages(transport.written[len(wire.MAGIC) :])
    assert kind is wire.Kind.HELLO
    assert hello[0] == ENTRY_NODE
    assert auth.proof_valid(SECRET, wire.Role.ENTRY, b"owner-nonce-0001", ENTRY_NODE, hello[2])
    return link, transport, hello


def test_the_entry_sends_work_only_after_the_owner_proved_the_secret():
    async def scenario() -> None:
        link, transport, hello = await _challenged_entry()
        welcome = auth.proof(SECRET, wire.Role.OWNER, hello[1], OWNER_NODE)
        link.data_received(_frame(wire.Kind.WELCOME, OWNER_NODE, welcome))
        await asyncio.sleep(0)
        kinds = [kind for kind, _ in _messages(transport.written[len(wire.MAGIC) :])]
        assert kinds == [wire.Kind.HELLO, wire.Kind.STATS]
        assert not transport.aborted

    asyncio.run(scenario())


def test_an_owner_without_the_secret_gets_nothing():
    async def scenario() -> None:
        link, transport, hello = await _challenged_entry()
        forged = auth.proof("guess", wire.Role.OWNER, hello[1], OWNER_NODE)
        link.data_received(_frame(wire.Kind.WELCOME, OWNER_NODE, forged))
        await asyncio.sleep(0)
        assert transport.aborted
        kinds = [kind for kind, _ in _messages(transport.written[len(wire.MAGIC) :])]
        assert kinds == [wire.Kind.HELLO]

    asyncio.run(scenario())


def test_an_entrys_own_proof_reflected_back_is_no_welcome():
    async def scenario() -> None:
        link, transport, hello = await _challenged_entry()
        reflected = auth.proof(SECRET, wire.Role.ENTRY, hello[1], OWNER_NODE)
        link.data_received(_frame(wire.Kind.WELCOME, OWNER_NODE, reflected))
        await asyncio.sleep(0)
        assert transport.aborted

    asyncio.run(scenario())


def _owner() -> tuple[OwnerLink, RecordingTransport, bytes]:
    link = OwnerLink(None, OWNER_NODE, SECRET, 1 << 20)  # type: ignore[arg-type]
    transport = RecordingTransport()
    link.connection_made(transport)
    [(kind, (nonce,))] = _messages(transport.written)
    assert kind is wire.Kind.CHALLENGE
    link.data_received(wire.MAGIC)
    return link, transport, nonce


def test_the_owner_welcomes_a_hello_proven_over_its_own_nonce():
    async def scenario() -> None:
        link, transport, nonce = _owner()
        mac = auth.proof(SECRET, wire.Role.ENTRY, nonce, ENTRY_NODE)
        link.data_received(_frame(wire.Kind.HELLO, ENTRY_NODE, b"entry-nonce-0001", mac))
        await asyncio.sleep(0)
        [_, (kind, (node, welcome))] = _messages(transport.written)
        assert kind is wire.Kind.WELCOME and node == OWNER_NODE
        assert auth.proof_valid(SECRET, wire.Role.OWNER, b"entry-nonce-0001", node, welcome)
        assert link.peer_node == ENTRY_NODE

    asyncio.run(scenario())


def test_the_owner_refuses_a_replayed_hello():
    async def scenario() -> None:
        first, _, first_nonce = _owner()
        recorded = _frame(
            wire.Kind.HELLO,
            ENTRY_NODE,
            b"entry-nonce-0001",
            auth.proof(SECRET, wire.Role.ENTRY, first_nonce, ENTRY_NODE),
        )
        second, transport, second_nonce = _owner()
        assert second_nonce != first_nonce
        second.data_received(recorded)
        assert transport.aborted
        assert second.peer_node == 0

    asyncio.run(scenario())

"""Proving a shared cluster secret without sending it: each end of a connection answers the
other's fresh nonce with an HMAC of the secret over that nonce, its role and its node id.

The role is a byte that names which end of which protocol proves: one end's proof can then
never be reflected back as the other end's, nor carried from one protocol to another. Every
protocol that proves the secret takes its own role numbers (`RAFT_DIALLER` and
`RAFT_LISTENER` here; the broker's forwarding link has its own).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import struct

NONCE_BYTES = 16
PROOF_BYTES = hashlib.sha256().digest_size
RAFT_DIALLER = 3
RAFT_LISTENER = 4

_NODE_ID = struct.Struct(">Q")


def proof(secret: str, role: int, nonce: bytes, node_id: int) -> bytes:
    """HMAC-SHA256 of the secret over the other end's nonce, this end's role and node id."""
    message = bytes([role]) + nonce + _NODE_ID.pack(node_id)
    return hmac.new(secret.encode(), message, hashlib.sha256).digest()


def proof_valid(secret: str, role: int, nonce: bytes, node_id: int, mac: bytes) -> bool:
    return hmac.compare_digest(proof(secret, role, nonce, node_id), mac)


def nonce() -> bytes:
    return os.urandom(NONCE_BYTES)

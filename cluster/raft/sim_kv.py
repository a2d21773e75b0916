"""The simulator's replicated state machine: a string key-value store with client sessions.

Writes go through the Raft log as `encode_put` commands. Each client numbers its operations
and the store remembers the last number applied per client, so a command that reaches the
log twice (a retried or duplicated request) takes effect once (Raft dissertation §6.3);
without that, a retried write could be applied again after a later one and a correct Raft
would produce non-linearizable histories.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

_SEP = b"\x1f"


def encode_put(client: int, op_id: int, key: str, value: str) -> bytes:
    return _SEP.join((b"%d" % client, b"%d" % op_id, key.encode(), value.encode()))


def decode_put(data: bytes) -> tuple[int, int, str, str]:
    client, op_id, key, value = data.split(_SEP)
    return int(client), int(op_id), key.decode(), value.decode()


@dataclass
class KvStore:
    values: dict[str, str] = field(default_factory=dict)
    # Client -> the last of its operation ids applied.
    sessions: dict[int, int] = field(default_factory=dict)

    def apply(self, data: bytes) -> bool:
        """Apply one put command; False if it was a duplicate and had no effect."""
        client, op_id, key, value = decode_put(data)
        if self.sessions.get(client, -1) >= op_id:
            return False
        self.sessions[client] = op_id
        self.values[key] = value
        return True

    def to_bytes(self) -> bytes:
        body = {
            "values": self.values,
            "sessions": {str(c): n for c, n in self.sessions.items()},
        }
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> KvStore:
        if not data:
            return cls()
        body = json.loads(data)
        return cls(dict(body["values"]), {int(c): n for c, n in body["sessions"].items()})

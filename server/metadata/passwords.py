"""Password hashing with a slow, memory-hard KDF, and its constant-time verification.

The stored form is self-describing, `scrypt$<log2 N>$<r>$<p>$<salt b64>$<key b64>`, so the
cost can be raised later while old hashes still verify with the cost they were made with.

Cost (documented, measured on the 2-core development machine): scrypt N=2**14, r=8, p=1 with a
16-byte random salt and a 32-byte key: 16 MiB of memory and ~40 ms per hash. These are the
scrypt paper's parameters for interactive logins. RabbitMQ itself stores salted SHA-256, which
is fast enough to brute-force offline; we pay ~40 ms per connection open instead. Verification
runs off the event loop (`hashlib.scrypt` releases the GIL) and callers bound how many run at
once, since each one holds 16 MiB.

Hashing needs randomness (the salt), so it happens before a command is built: the state
machine only ever sees the finished hash, which keeps it deterministic for replication.

Users moved over from RabbitMQ (its definitions export) keep the hash RabbitMQ made, so their
passwords keep working: `rabbit_password_hashing_sha256` (RabbitMQ's default), `_sha512` and
`_md5`, each base64(4-byte salt + H(salt + password)), stored as `<algorithm>$<that base64>`.
They are as weak as they were in RabbitMQ; setting the password again stores an scrypt hash.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os

SCHEME = "scrypt"
LOG2_N_DEFAULT = 14
BLOCK_SIZE_DEFAULT = 8
PARALLELISM_DEFAULT = 1
SALT_BYTES = 16
KEY_BYTES = 32
# Refuse stored parameters beyond these: a tampered or corrupt hash must not make a login
# allocate gigabytes or spin for minutes.
LOG2_N_MAX = 20
BLOCK_SIZE_MAX = 16
PARALLELISM_MAX = 4
PASSWORD_BYTES_MAX = 4096
# The names RabbitMQ's definitions give its hashing algorithms, and ours.
RABBIT_SHA256 = "rabbit_password_hashing_sha256"
RABBIT_HASHES = {
    RABBIT_SHA256: hashlib.sha256,
    "rabbit_password_hashing_sha512": hashlib.sha512,
    "rabbit_password_hashing_md5": hashlib.md5,
}
RABBIT_SALT_BYTES = 4
WARREN_SCRYPT = "warren_scrypt"


def hash_password(
    password: str,
    *,
    log2_n: int = LOG2_N_DEFAULT,
    block_size: int = BLOCK_SIZE_DEFAULT,
    parallelism: int = PARALLELISM_DEFAULT,
    salt: bytes | None = None,
) -> str:
    """A new salted hash of `password` in the stored form."""
    assert 1 <= log2_n <= LOG2_N_MAX and 1 <= block_size <= BLOCK_SIZE_MAX
    assert 1 <= parallelism <= PARALLELISM_MAX
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    assert len(salt) >= 8
    key = _derive(password.encode("utf-8"), salt, log2_n, block_size, parallelism)
    return "$".join((SCHEME, str(log2_n), str(block_size), str(parallelism), _b64(salt), _b64(key)))


def verify_password(password: str, stored: str) -> bool:
    """Whether `password` matches the stored hash; False (never an exception) if malformed."""
    rabbit = _parse_rabbit_hash(stored)
    if rabbit is not None:
        digest, salt, key = rabbit
        candidate = digest(salt + password.encode("utf-8")).digest()
        return hmac.compare_digest(candidate, key)
    parsed = parse_hash(stored)
    if parsed is None:
        return False
    log2_n, block_size, parallelism, salt, key = parsed
    encoded = password.encode("utf-8")
    if len(encoded) > PASSWORD_BYTES_MAX:
        return False
    candidate = _derive(encoded, salt, log2_n, block_size, parallelism)
    return hmac.compare_digest(candidate, key)


def parse_hash(stored: str) -> tuple[int, int, int, bytes, bytes] | None:
    """(log2 N, r, p, salt, key) of a stored hash, or None if it is not one we accept."""
    parts = stored.split("$")
    if len(parts) != 6 or parts[0] != SCHEME:
        return None
    try:
        log2_n, block_size, parallelism = int(parts[1]), int(parts[2]), int(parts[3])
        salt = base64.b64decode(parts[4], validate=True)
        key = base64.b64decode(parts[5], validate=True)
    except ValueError:
        return None
    if not (1 <= log2_n <= LOG2_N_MAX and 1 <= block_size <= BLOCK_SIZE_MAX):
        return None
    if not (1 <= parallelism <= PARALLELISM_MAX and salt and len(key) == KEY_BYTES):
        return None
    return log2_n, block_size, parallelism, salt, key


def is_password_hash(stored: str) -> bool:
    """Whether `stored` is a hash this module verifies (scrypt, or one kept from RabbitMQ)."""
    return parse_hash(stored) is not None or _parse_rabbit_hash(stored) is not None


def imported(algorithm: str, password_hash: str) -> str | None:
    """The stored form of a hash from a definitions file (RabbitMQ's or ours), or None when
    it is not one this module verifies."""
    if algorithm == WARREN_SCRYPT:
        stored = password_hash
    elif algorithm in RABBIT_HASHES:
        stored = f"{algorithm}${password_hash}"
    else:
        return None
    return stored if is_password_hash(stored) else None


def exported(stored: str) -> tuple[str, str]:
    """(hashing algorithm, password hash) of a stored hash, as a definitions file has them."""
    algorithm, _, rest = stored.partition("$")
    if algorithm in RABBIT_HASHES:
        return algorithm, rest
    return WARREN_SCRYPT, stored


def _parse_rabbit_hash(stored: str):
    """(digest, salt, key) of a hash kept from RabbitMQ, or None."""
    algorithm, separator, encoded = stored.partition("$")
    digest = RABBIT_HASHES.get(algorithm)
    if digest is None or not separator:
        return None
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return None
    if len(raw) != RABBIT_SALT_BYTES + digest().digest_size:
        return None
    return digest, raw[:RABBIT_SALT_BYTES], raw[RABBIT_SALT_BYTES:]


def _derive(password: bytes, salt: bytes, log2_n: int, block_size: int, parallelism: int) -> bytes:
    n = 1 << log2_n
    # scrypt needs 128 * r * N bytes (plus p * 128 * r); give OpenSSL that much headroom.
    memory_bytes_max = 128 * block_size * (n + parallelism + 2) + (1 << 20)
    return hashlib.scrypt(
        password,
        salt=salt,
        n=n,
        r=block_size,
        p=parallelism,
        maxmem=memory_bytes_max,
        dklen=KEY_BYTES,
    )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")

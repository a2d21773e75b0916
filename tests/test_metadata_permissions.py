"""Permission regexes as RabbitMQ runs them, refusal texts, loopback detection, password KDF and
the field-value encoding the store and snapshots rely on."""

from __future__ import annotations

import datetime
import decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warrenmq.server.metadata import encoding, passwords, permissions
from warrenmq.server.metadata.errors import PreconditionFailed
from warrenmq.server.metadata.permissions import Permission

# (regex, resource name, allowed): rabbit_auth_backend_internal runs re:run(Name, Regex), an
# unanchored search, after replacing "" with "^$".
REGEX_TABLE = [
    (".*", "anything", True),
    (".*", "", True),
    ("", "q", False),
    ("", "", True),
    ("^$", "q", False),
    ("foo", "a-foo-b", True),
    ("foo", "fo", False),
    ("^foo$", "foo", True),
    ("^foo$", "foox", False),
    ("^foo", "foobar", True),
    ("bar$", "foobar", True),
    ("^(q1|q2)$", "q2", True),
    ("^(q1|q2)$", "q3", False),
    ("a|b", "xbx", True),
    ("\\.", "a.b", True),
    ("\\.", "ab", False),
    (".", "", False),
    ("^amq\\.gen-.*", "amq.gen-JzTY20BRgKO-HjmUJj0wLg", True),
    ("^amq\\.gen-.*", "xamq.gen-1", False),
    ("^[a-z]+$", "Upper", False),
    ("(?i)^upper$", "UPPER", True),
]


@pytest.mark.parametrize(("pattern", "name", "allowed"), REGEX_TABLE)
def test_pattern_allows_like_rabbitmq(pattern, name, allowed):
    assert permissions.pattern_allows(pattern, name) is allowed


def test_default_exchange_is_checked_as_amq_default():
    permission = Permission("bob", "/", "", "^amq\\.default$", "^$")
    assert permissions.allows(permission, "write", "exchange", "")
    assert not permissions.allows(permission, "read", "exchange", "")
    assert not permissions.allows(permission, "write", "queue", "amq.default2")
    assert not permissions.allows(None, "read", "queue", "q")


def test_refusal_texts():
    refused = permissions.resource_refused("write", "exchange", "", "/", "bob")
    assert refused.reply_code == 403 and not refused.connection_level
    assert refused.reply_text == (
        "access to exchange 'amq.default' in vhost '/' refused for user 'bob'"
    )
    vhost = permissions.vhost_refused("v", "bob")
    assert vhost.reply_code == 530 and vhost.connection_level
    assert vhost.reply_text == "access to vhost 'v' refused for user 'bob'"
    assert permissions.vhost_not_found("v").reply_text == "vhost v not found"
    assert permissions.login_refused_text("PLAIN") == (
        "Login was refused using authentication mechanism PLAIN. "
        "For details see the broker logfile."
    )
    assert permissions.login_refused_log_text("PLAIN", "guest", loopback=True) == (
        "PLAIN login refused: user 'guest' can only connect via localhost"
    )


@pytest.mark.parametrize("pattern", ["(", "[a-", "\\Qa.b\\E", "x" * 5000])
def test_validate_pattern_refuses(pattern):
    with pytest.raises(PreconditionFailed):
        permissions.validate_pattern(pattern)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("10.0.0.1", False),
        ("::ffff:10.0.0.1", False),
        ("fe80::1%eth0", False),
        ("localhost", False),
        ("", False),
    ],
)
def test_is_loopback(host, loopback):
    assert permissions.is_loopback(host) is loopback


@pytest.mark.parametrize(
    ("user", "host", "loopback_users", "refused"),
    [
        # RabbitMQ's default: guest is local only, everyone else may log in from anywhere.
        ("guest", "10.1.2.3", ("guest",), True),
        ("guest", "127.0.0.1", ("guest",), False),
        ("guest", "::ffff:127.0.0.1", ("guest",), False),
        ("bob", "10.1.2.3", ("guest",), False),
        # An empty list lets guest log in remotely too.
        ("guest", "10.1.2.3", (), False),
        # Any user listed is local only, and guest is no longer when it is not listed.
        ("bob", "10.1.2.3", ("bob",), True),
        ("bob", "::1", ("bob",), False),
        ("guest", "10.1.2.3", ("bob",), False),
    ],
)
def test_loopback_users_rule(user, host, loopback_users, refused):
    assert permissions.loopback_refused(user, host, loopback_users) is refused


# --- passwords ------------------------------------------------------------------------------


def test_hash_and_verify():
    stored = passwords.hash_password("s3cret", log2_n=4)
    assert stored.startswith("scrypt$4$8$1$")
    assert passwords.verify_password("s3cret", stored)
    assert not passwords.verify_password("s3cret ", stored)
    assert not passwords.verify_password("", stored)
    # Salted: the same password hashes differently each time.
    assert passwords.hash_password("s3cret", log2_n=4) != stored


def test_default_cost_is_the_documented_one():
    log2_n, block_size, parallelism, salt, key = passwords.parse_hash(passwords.hash_password("x"))
    assert (log2_n, block_size, parallelism) == (14, 8, 1)
    assert len(salt) == passwords.SALT_BYTES and len(key) == passwords.KEY_BYTES


@pytest.mark.parametrize(
    "stored",
    [
        "",
        "plain",
        "md5$x",
        "scrypt$14$8$1$c2FsdA==",
        "scrypt$99$8$1$c2FsdHNhbHQ=$" + "A" * 44,  # cost beyond the bound
        "scrypt$4$8$1$!!!$" + "A" * 44,
        "scrypt$4$8$1$c2FsdHNhbHQ=$c2hvcnQ=",  # key of the wrong length
    ],
)
def test_malformed_hashes_never_verify(stored):
    assert passwords.parse_hash(stored) is None
    assert not passwords.verify_password("x", stored)


def test_unicode_password():
    stored = passwords.hash_password("pässwörd✓", log2_n=4)
    assert passwords.verify_password("pässwörd✓", stored)
    assert not passwords.verify_password("passwörd✓", stored)


# --- field values ---------------------------------------------------------------------------

scalars = st.one_of(
    st.text(max_size=8),
    st.binary(max_size=8),
    st.binary(max_size=8).map(bytearray),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64),
    st.floats(allow_nan=True, allow_infinity=True),
    st.decimals(allow_nan=False, allow_infinity=False, places=3),
    st.datetimes(timezones=st.sampled_from([None, datetime.UTC])),
    st.none(),
)
field_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300)
@given(field_values)
def test_encoding_round_trips_types_exactly(value):
    encoded = encoding.encode_value(value)
    decoded = encoding.decode_value(encoded)
    assert encoding.encode_value(decoded) == encoded
    assert type(decoded) is type(value) or isinstance(value, tuple)


@settings(max_examples=100)
@given(st.dictionaries(st.text(max_size=5), field_values, max_size=5))
def test_table_json_round_trip_keeps_order(table):
    text = encoding.table_to_json(table)
    back = encoding.table_from_json(text)
    assert list(back) == list(table)
    assert encoding.table_to_json(back) == text


def test_encoding_keeps_distinctions_plain_json_loses():
    for value in (True, 1, 1.0, "a", b"a", bytearray(b"a"), decimal.Decimal("1.00"), None):
        assert type(encoding.decode_value(encoding.encode_value(value))) is type(value)
    assert encoding.decode_value(encoding.encode_value(decimal.Decimal("1.00"))).as_tuple() == (
        decimal.Decimal("1.00").as_tuple()
    )


@pytest.mark.parametrize(
    "encoded", [None, [], ["int"], ["int", "1"], ["bool", 1], ["nope", 1], ["table", [[1, 2]]]]
)
def test_decoding_refuses_what_it_did_not_produce(encoded):
    with pytest.raises(ValueError):
        encoding.decode_value(encoded)


def test_decoding_bounds_depth():
    deep = ["void", None]
    for _ in range(encoding.DEPTH_MAX + 2):
        deep = ["array", [deep]]
    with pytest.raises(ValueError):
        encoding.decode_value(deep)

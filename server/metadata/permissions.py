"""configure/write/read permissions as RabbitMQ checks them, and the texts of its refusals.

Matched against RabbitMQ's sources (rabbit_auth_backend_internal.erl, rabbit_access_control.erl,
rabbit_misc.erl, rabbit_reader.erl):

* A user may use a vhost (connection.open) when the vhost exists and the user has a permission
  entry for it, whatever its regexes: otherwise 530 NOT_ALLOWED "access to vhost 'v' refused for
  user 'u'", or "vhost v not found" when it does not exist (checked against RabbitMQ 3.10.8).
* A resource check takes the regex for the kind of access and runs `re:run(Name, Regex)`: an
  unanchored search, so "foo" allows "a-foo-b" and anchors must be written ("^foo$"). An empty
  regex is replaced by "^$", which matches only the empty name, so "" grants nothing that can
  be named. Python's `re.search` has the same semantics for the syntax both engines share;
  PCRE-only syntax (\\Q...\\E, recursion) is refused when the permission is set.
* The default exchange is checked under the name "amq.default".
* A refusal is 403 ACCESS_REFUSED "access to <kind> 'name' in vhost 'v' refused for user 'u'":
  3.10 does not name the kind of access (later versions prefix "configure "/"write "/"read ";
  the texts here were checked against a running 3.10.8).
* The user has no permission entry for the vhost at all: every resource check fails.

What is deliberately not here: topic permissions (rabbit's per-exchange routing-key regexes)
and the `{username}`/`{vhost}` variable expansion they allow.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

from warrenmq.server.metadata.errors import AccessRefused, NotAllowed, PreconditionFailed

Access = Literal["configure", "write", "read"]
ACCESSES: tuple[Access, ...] = ("configure", "write", "read")
RESOURCE_KINDS = ("queue", "exchange")
DEFAULT_EXCHANGE_RESOURCE = "amq.default"
# Compiled regexes kept per pattern text; users share patterns (".*", "^$") so this stays small,
# and the bound keeps a stream of distinct patterns from growing it without end.
COMPILED_PATTERNS_MAX = 4096
PATTERN_CHARS_MAX = 4096

_compiled: dict[str, re.Pattern[str]] = {}


@dataclass(frozen=True, slots=True)
class Permission:
    """A user's regexes on one vhost (RabbitMQ's #user_permission)."""

    user: str
    vhost: str
    configure: str
    write: str
    read: str

    def pattern(self, access: Access) -> str:
        if access == "configure":
            return self.configure
        if access == "write":
            return self.write
        assert access == "read", access
        return self.read


def validate_pattern(pattern: str) -> None:
    """Raise PreconditionFailed unless `pattern` is a regex RabbitMQ and Python both accept."""
    if len(pattern) > PATTERN_CHARS_MAX:
        raise PreconditionFailed(f"permission regex longer than {PATTERN_CHARS_MAX} characters")
    if "\\Q" in pattern or "\\E" in pattern:
        raise PreconditionFailed(f"invalid regular expression '{pattern}': \\Q...\\E is PCRE-only")
    try:
        re.compile(pattern)
    except re.error as error:
        raise PreconditionFailed(f"invalid regular expression '{pattern}': {error}") from error


def pattern_allows(pattern: str, name: str) -> bool:
    """`re:run(Name, Regex)` after rabbit's "" -> "^$" substitution."""
    return _compile(pattern or "^$").search(name) is not None


def resource_name(kind: str, name: str) -> str:
    """The name a permission is checked against: the default exchange is "amq.default"."""
    assert kind in RESOURCE_KINDS, kind
    return DEFAULT_EXCHANGE_RESOURCE if kind == "exchange" and name == "" else name


def allows(permission: Permission | None, access: Access, kind: str, name: str) -> bool:
    if permission is None:
        return False
    return pattern_allows(permission.pattern(access), resource_name(kind, name))


def resource_refused(access: Access, kind: str, name: str, vhost: str, user: str) -> AccessRefused:
    assert access in ACCESSES, access
    shown = resource_name(kind, name)
    return AccessRefused(f"access to {kind} '{shown}' in vhost '{vhost}' refused for user '{user}'")


def vhost_refused(vhost: str, user: str) -> NotAllowed:
    return NotAllowed(f"access to vhost '{vhost}' refused for user '{user}'")


def vhost_not_found(vhost: str) -> NotAllowed:
    return NotAllowed(f"vhost {vhost} not found")


def login_refused_text(mechanism: str) -> str:
    """What RabbitMQ sends in connection.close for any failed login (rabbit_reader:auth_fail),
    when the client announced `authentication_failure_close`: the reason goes to the log only."""
    return (
        f"Login was refused using authentication mechanism {mechanism}. "
        "For details see the broker logfile."
    )


def login_refused_log_text(mechanism: str, user: str, *, loopback: bool) -> str:
    """The reason RabbitMQ logs for a failed login."""
    if loopback:
        return f"{mechanism} login refused: user '{user}' can only connect via localhost"
    return f"{mechanism} login refused: user '{user}' - invalid credentials"


def is_loopback(host: str) -> bool:
    """Whether a peer address is a loopback one (rabbit_net:is_loopback): 127.0.0.0/8, ::1,
    and IPv4-mapped loopback (::ffff:127.0.0.1), as a dual-stack listener reports it."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def loopback_refused(user: str, host: str, loopback_users: Collection[str]) -> bool:
    """rabbit_access_control:check_user_loopback: a user named in the loopback_users setting
    may log in from a loopback address only; every other user from anywhere."""
    return user in loopback_users and not is_loopback(host)


def _compile(pattern: str) -> re.Pattern[str]:
    compiled = _compiled.get(pattern)
    if compiled is None:
        if len(_compiled) >= COMPILED_PATTERNS_MAX:
            _compiled.clear()
        compiled = _compiled[pattern] = re.compile(pattern)
    return compiled

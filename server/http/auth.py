"""Who is calling, and what RabbitMQ's management plugin lets them do (rabbit_mgmt_util).

Every request logs in with HTTP basic auth as one of the broker's users (the same password
check, and the same loopback_users rule, as an AMQP login). Then, as in RabbitMQ 3.10:

* only users tagged ``administrator``, ``monitoring``, ``policymaker`` or ``management`` may
  use the API at all ("Not management user");
* ``administrator`` manages users, vhosts, permissions and definitions and sees every vhost;
* ``monitoring`` (and ``administrator``) sees nodes, and every connection and channel;
* anyone else sees and acts on the vhosts they have permissions on, and on their own
  connections and channels only;
* the resource permissions (configure, write, read) of an operation are checked as the AMQP
  method's are.
"""

from __future__ import annotations

import base64
import binascii
import logging
from dataclasses import dataclass

from warrenmq.server.metadata import MetadataState, User, loopback_refused

from .errors import AUTH_REALM, ApiError, login_failed, not_authorised

log = logging.getLogger("warrenmq.server.http")

ADMINISTRATOR = "administrator"
MONITORING = "monitoring"
POLICYMAKER = "policymaker"
MANAGEMENT = "management"
MANAGEMENT_TAGS = frozenset((ADMINISTRATOR, MONITORING, POLICYMAKER, MANAGEMENT))


@dataclass(frozen=True, slots=True)
class Caller:
    """A logged-in user of the API."""

    user: User

    @property
    def name(self) -> str:
        return self.user.name

    @property
    def is_admin(self) -> bool:
        return ADMINISTRATOR in self.user.tags

    @property
    def is_monitor(self) -> bool:
        return self.is_admin or MONITORING in self.user.tags

    @property
    def is_policymaker(self) -> bool:
        return self.is_admin or POLICYMAKER in self.user.tags

    def login_vhosts(self, state: MetadataState) -> list[str]:
        """The vhosts this user may open an AMQP connection to (has permissions on)."""
        return [name for name in state.vhosts if (self.name, name) in state.permissions]

    def visible_vhosts(self, state: MetadataState) -> list[str]:
        """Monitors learn of every vhost; others of those they may use."""
        return list(state.vhosts) if self.is_monitor else self.login_vhosts(state)

    def listed_vhosts(self, state: MetadataState) -> list[str]:
        """Whose queues, exchanges and bindings the lists show (rabbit_mgmt_util:filter_vhost)."""
        return list(state.vhosts) if self.is_admin else self.login_vhosts(state)

    def may_use(self, state: MetadataState, vhost: str) -> bool:
        return self.is_admin or (self.name, vhost) in state.permissions


def credentials(header: str | None) -> tuple[str, str] | None:
    """(user, password) of a basic Authorization header; None when there is none to read."""
    if not header:
        return None
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    user, separator, password = decoded.partition(":")
    return (user, password) if separator else None


def no_credentials() -> ApiError:
    """No (readable) Authorization header: cowboy's bare 401 asking for basic auth."""
    return ApiError(401, "not_authorized", "Login failed", {"WWW-Authenticate": AUTH_REALM})


async def log_in(store, header: str | None, address: str, loopback_users) -> Caller:
    """The caller of a request, or the ApiError that refuses it."""
    given = credentials(header)
    if given is None:
        raise no_credentials()
    username, password = given
    user = await store.authenticate(username, password, address)
    if user is None:
        log.warning("HTTP access denied: user '%s' - invalid credentials", username)
        raise login_failed()
    if loopback_refused(user.name, address, loopback_users):
        return _refused(username, "User can only log in via localhost")
    if not MANAGEMENT_TAGS.intersection(user.tags):
        return _refused(username, "Not management user")
    return Caller(user)


def _refused(username: str, reason: str) -> Caller:
    log.warning("HTTP access denied: user '%s' - %s", username, reason)
    raise not_authorised(reason)

"""The broker's settings: embedded defaults, then a TOML file, then WARREN_* variables, then flags.

Each later source overrides the earlier ones field by field, so a script can keep a config
file and still move the port with ``--port``. Every bound the broker enforces lives here.

TOML keys are the field names (``port = 5673``, ``data_dir = "/var/lib/warren"``); the
environment uses the same names upper-cased with a ``WARREN_`` prefix (``WARREN_PORT``).

Besides AMQP the broker serves two HTTP listeners on the same address, as RabbitMQ's plugins
do: the management API (``management_port``, 15672) and Prometheus metrics (``metrics_port``,
15692). As for ``port``, 0 picks a free port; ``management_enabled = false`` and
``metrics_enabled = false`` turn a listener off (its HTTPS one too).

TLS takes RabbitMQ's names: ``ssl_options.certfile``, ``ssl_options.keyfile``,
``ssl_options.cacertfile``, ``ssl_options.verify`` (``verify_none`` or ``verify_peer``) and
``ssl_options.fail_if_no_peer_cert``, written exactly so in the TOML file (a TOML table's keys
join its name with ``_``: the fields are ``ssl_options_certfile``...), and
``WARREN_SSL_OPTIONS_CERTFILE``... in the environment. With a certificate and its key set, the
broker also listens for AMQP over TLS on ``tls_port`` (5671, RabbitMQ's ``listeners.ssl``), and
``http_tls = true`` serves the management API and the metrics over HTTPS with the same
settings on listeners of their own beside the plain ones: ``management_ssl_port`` (15671)
and ``metrics_ssl_port`` (15691), as RabbitMQ's management.ssl and prometheus.ssl listeners.
``ssl_cert_login_from`` names the certificate field a SASL EXTERNAL login takes its
user name from, as RabbitMQ's rabbitmq_auth_mechanism_ssl does.

A cluster: ``node_id`` (1 by default) and ``cluster``, the metadata Raft group's address of
every bootstrap voter, this node included (``"1=10.0.0.1:25672,2=10.0.0.2:25672"``); the node
listens for its peers on its own entry's port, on ``bind``. Unset, the node is a one-member
group. ``advertise_host`` is the host other nodes and clients reach this node's AMQP and HTTP
ports at (default: the host of its own ``cluster`` entry, else 127.0.0.1). ``join`` starts
the node as a non-voter waiting to be added (`warren cluster join`); its ``cluster`` then
lists the existing voters and itself. ``forward_addresses`` (same form) is where this node
dials other nodes' links for forwarded work instead of the addresses they registered; with
``cluster`` naming the peers' Raft addresses, it lets every connection a node opens to its
peers go through something in between (the fault tests' proxies).
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
SSL_VERIFY_MODES = ("verify_none", "verify_peer")
# rabbitmq_auth_mechanism_ssl's choices (subject_alternative_name: the first DNS name).
SSL_CERT_LOGIN_FROM = ("distinguished_name", "common_name", "subject_alternative_name")
ENV_PREFIX = "WARREN_"


# RabbitMQ refuses a max_message_size above 512 MiB; a queue's log records must hold a
# whole message, content header included, within 32-bit positions.
MESSAGE_BYTES_LIMIT = 512 << 20
FRAME_BYTES_LIMIT = 1 << 30


class ConfigError(ValueError):
    """A setting is unknown or its value is out of range."""


# RabbitMQ's two, and one of Warren's (see BrokerConfig.queue_leader_locator).
QUEUE_LEADER_LOCATORS = ("client-local", "balanced", "other-node")


@dataclass(frozen=True, slots=True)
class BrokerConfig:
    port: int = 5672
    bind: str = "0.0.0.0"
    data_dir: Path = Path("./data")
    log_level: str = "info"
    frame_bytes_max: int = 131072
    """Offered in connection.tune (RabbitMQ's frame_max default)."""
    channel_max: int = 2047
    heartbeat_s: int = 60
    message_bytes_max: int = 128 * 1024 * 1024
    """RabbitMQ's max_message_size default; larger bodies are refused with 406."""
    connections_max: int = 65_536
    """Connections beyond this are closed at accept."""
    read_buffer_bytes_max: int = 4 << 20
    """Unparsed input above this pauses reading from that socket."""
    write_buffer_bytes_high: int = 4 << 20
    """Queued output above this stops deliveries to that connection until it drains."""
    unacked_per_channel_max: int = 1_000_000
    """In-flight deliveries on one channel even without a prefetch limit."""
    consumers_per_channel_max: int = 0
    """Consumers one channel may hold; one more is 530 NOT_ALLOWED "reached maximum (N) of
    consumers per channel", closing the connection (RabbitMQ 3.12's consumer_max_per_channel).
    0 is no limit, RabbitMQ's default (infinity)."""
    channel_tx_message_max: int = 10_000
    """Publishes one open transaction holds until tx.commit; the next is refused with 406
    (RabbitMQ 4.3.6's channel_tx_message_max and its default). Their bytes have no limit of
    their own, as in RabbitMQ: the memory alarm blocks a transaction's publisher at the
    content header once memory runs short (tests/test_floods.py)."""
    queue_batch_records_max: int = 128
    """Records appended to one queue in one write: one batch of its log. The tail cache keeps
    and drops whole batches, so small ones keep what it holds close to its byte bound."""
    segment_bytes_max: int = 64 << 20
    tail_cache_bytes_max: int = 128 << 20
    """The newest messages of every queue and stream together, up to this many bytes of
    memory, are delivered from memory rather than read back from their files; past it the
    ones cached longest ago go first, whichever queue holds them. Any one queue may use it
    all, so a busy one keeps its consumers' whole in-flight window (1,000 messages of 16 KiB
    are 16 MiB). At most a quarter of the memory high watermark is used; 0 reads every
    delivery back from the file."""
    log_open_files_max: int = 0
    """Descriptors the queues' logs keep open at most: a pool that closes the least recently
    used beyond this and reopens a file on its next use, so the number of queues is not
    bounded by open files. 0 takes half the process's open-file limit (RLIMIT_NOFILE at
    start); the rest is for connections, the metadata store and short-lived files."""
    loopback_users: tuple[str, ...] = ("guest",)
    """Users that may log in only from a loopback address, everyone else from anywhere
    (RabbitMQ's loopback_users, and as there the one place this is set): empty lets guest
    log in remotely."""
    consumer_timeout_ms: int = 1_800_000
    """How long a delivery may stay unacknowledged before its consumer is cancelled (its
    deliveries requeued) or, for a client without consumer_cancel_notify or a basic.get, its
    channel closed with 406: RabbitMQ's consumer_timeout and its default, 30 minutes. A
    queue's x-consumer-timeout overrides it; 0 disables it."""
    shutdown_timeout_s: float = 5.0
    """How long SIGTERM waits for clients to answer connection.close."""
    management_port: int = 15672
    """The HTTP management API (RabbitMQ's management plugin port)."""
    management_enabled: bool = True
    metrics_port: int = 15692
    """Prometheus metrics at /metrics (RabbitMQ's rabbitmq_prometheus port)."""
    metrics_enabled: bool = True
    http_body_bytes_max: int = 20 << 20
    """The largest HTTP request body accepted (a definitions import included): larger ones
    are refused with 413 before they are read."""
    tls_port: int = 5671
    """AMQP over TLS (amqps), listening only when ssl_options_certfile and _keyfile are set."""
    ssl_options_certfile: str = ""
    """The server's certificate (PEM), followed by any intermediate certificates."""
    ssl_options_keyfile: str = ""
    ssl_options_cacertfile: str = ""
    """The CA bundle (PEM) client certificates are verified against."""
    ssl_options_verify: str = "verify_none"
    """verify_peer asks clients for a certificate and refuses one the CA bundle does not
    verify (RabbitMQ's default is verify_none: no client certificate is asked for)."""
    ssl_options_fail_if_no_peer_cert: bool = False
    """With verify_peer, refuse clients that send no certificate at all."""
    ssl_cert_login_from: str = "distinguished_name"
    """Where SASL EXTERNAL finds the user name: the subject's distinguished name in RFC 4514
    form ("CN=client,O=Warren"), its common name, or its first DNS subject alternative name.
    distinguished_name is RabbitMQ 3.x's default, kept so the same users work."""
    http_tls: bool = False
    """Also serve the management API and the metrics over HTTPS, with the ssl_options
    settings, each on a listener of its own beside the plain one (RabbitMQ's management.ssl
    and prometheus.ssl listeners)."""
    management_ssl_port: int = 15671
    """The management API over HTTPS, with http_tls (RabbitMQ's management.ssl.port)."""
    metrics_ssl_port: int = 15691
    """The metrics over HTTPS, with http_tls (rabbitmq_prometheus's prometheus.ssl.port)."""
    memory_high_watermark_relative: float = 0.6
    """Resident memory above this fraction of the machine's memory raises the memory alarm,
    which blocks publishing connections (RabbitMQ's vm_memory_high_watermark.relative and its
    default since 3.13; 0.4 before). 0 blocks every publisher, as in RabbitMQ."""
    memory_high_watermark_bytes: int = 0
    """The watermark in bytes instead (vm_memory_high_watermark.absolute); 0: the relative one."""
    disk_free_limit_bytes: int = 50_000_000
    """Free space on the data dir's disk below this raises the disk alarm, which blocks
    publishing connections (RabbitMQ's disk_free_limit.absolute and its default, 50 MB)."""
    disk_free_limit_relative: float = 0.0
    """The limit as a multiple of the machine's memory instead (disk_free_limit.relative, e.g.
    1.0); 0: the absolute one."""
    node_id: int = 1
    """This node's id in the cluster (1 for a single node)."""
    cluster: str = ""
    """The metadata group's bootstrap voters, "ID=HOST:PORT,..." with this node among them;
    empty for a single node."""
    advertise_host: str = ""
    """Where other nodes and clients reach this node (default: its cluster entry's host,
    else 127.0.0.1)."""
    join: bool = False
    """Start as a non-voter waiting to be added to the running cluster (`warren cluster
    join`), rather than as a bootstrap voter."""
    queue_leader_locator: str = "client-local"
    """Where a queue declared through this node goes when neither its
    x-queue-leader-locator argument nor a policy says (RabbitMQ's queue_leader_locator):
    "client-local" (this node), "balanced" (the node leading the fewest queues), or Warren's
    "other-node" (the fewest among the OTHER nodes: every queue a client uses through this
    node is forwarded, which the compat suite's cluster run relies on)."""
    node_gone_ms: int = 3_000
    """The metadata leader judges a node gone after hearing nothing from it for this long,
    and elects new leaders for the partitions it led (`server/partition_controller.py`)."""
    metadata_snapshot_entries: int = 20_000
    """The metadata log is compacted into a snapshot once this many entries were applied
    after the last one; a node that joins, or fell behind further, catches up by snapshot."""
    forward_addresses: str = ""
    """"ID=HOST:PORT,..." of other nodes: where this node dials their links for forwarded
    work, instead of the address each registered (its advertise_host and AMQP port). Empty:
    the registered addresses."""
    replicate: bool = True
    """In a cluster, replicate durable queues' and streams' logs to their followers
    (`server/replication.py`): a confirm means fsynced on every in-sync replica (at least a
    majority), consumers see only what is, and a killed leader's in-sync follower takes
    over. Off (`--no-replicate`), a queue lives on its leader's disk alone and is unavailable
    while its node is down. Every node of a cluster must agree."""
    cluster_secret: str = ""
    """Shared by the nodes of a cluster: both ends of every connection between nodes prove it
    (an HMAC, never the secret itself), the metadata Raft's (`cluster/transport.py`) and the
    links that forward queue work (`server/forward`)."""
    resource_check_interval_ms: int = 100
    """How often memory and free disk space are sampled. RabbitMQ checks memory every second
    and disk space up to ten times a second near the limit; both samples cost microseconds
    here, so Warren takes them at the faster rate always."""

    def __post_init__(self) -> None:
        for name in (
            "port",
            "management_port",
            "metrics_port",
            "tls_port",
            "management_ssl_port",
            "metrics_ssl_port",
        ):
            if not 0 <= getattr(self, name) <= 65535:
                raise ConfigError(f"{name} must be 0..65535, got {getattr(self, name)}")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(
                f"log_level must be one of {', '.join(LOG_LEVELS)}, got {self.log_level!r}"
            )
        if self.frame_bytes_max < 4096:
            raise ConfigError(f"frame_bytes_max must be at least 4096, got {self.frame_bytes_max}")
        if not 1 <= self.channel_max <= 65535:
            raise ConfigError(f"channel_max must be 1..65535, got {self.channel_max}")
        if not 0 <= self.heartbeat_s <= 65535:
            raise ConfigError(f"heartbeat_s must be 0..65535, got {self.heartbeat_s}")
        for name in (
            "message_bytes_max",
            "connections_max",
            "read_buffer_bytes_max",
            "write_buffer_bytes_high",
            "unacked_per_channel_max",
            "channel_tx_message_max",
            "queue_batch_records_max",
            "segment_bytes_max",
            "http_body_bytes_max",
            "resource_check_interval_ms",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.message_bytes_max > MESSAGE_BYTES_LIMIT:
            raise ConfigError(
                f"message_bytes_max must be at most {MESSAGE_BYTES_LIMIT} (as RabbitMQ's "
                f"max_message_size), got {self.message_bytes_max}"
            )
        if self.frame_bytes_max > FRAME_BYTES_LIMIT:
            raise ConfigError(
                f"frame_bytes_max must be at most {FRAME_BYTES_LIMIT}, got {self.frame_bytes_max}"
            )
        for name in (
            "memory_high_watermark_relative",
            "memory_high_watermark_bytes",
            "disk_free_limit_bytes",
            "disk_free_limit_relative",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must not be negative, got {getattr(self, name)}")
        if self.queue_leader_locator not in QUEUE_LEADER_LOCATORS:
            raise ConfigError(
                f"queue_leader_locator must be one of {', '.join(QUEUE_LEADER_LOCATORS)}, "
                f"got {self.queue_leader_locator!r}"
            )
        if self.tail_cache_bytes_max < 0:
            raise ConfigError(
                f"tail_cache_bytes_max must not be negative, got {self.tail_cache_bytes_max}"
            )
        if self.log_open_files_max < 0:
            raise ConfigError(
                "log_open_files_max must not be negative (0 is "
                f"automatic), got {self.log_open_files_max}"
            )
        if self.consumers_per_channel_max < 0:
            raise ConfigError(
                "consumers_per_channel_max must not be negative (0 is no limit), "
                f"got {self.consumers_per_channel_max}"
            )
        if self.consumer_timeout_ms < 0:
            raise ConfigError(
                f"consumer_timeout_ms must not be negative, got {self.consumer_timeout_ms}"
            )
        if self.shutdown_timeout_s < 0:
            raise ConfigError(
                f"shutdown_timeout_s must not be negative, got {self.shutdown_timeout_s}"
            )
        self._check_tls()
        self._check_cluster()

    @property
    def cluster_peers(self) -> dict[int, tuple[str, int]]:
        """The metadata group's members from `cluster` (empty for a single node)."""
        return parse_cluster(self.cluster)

    @property
    def forward_peers(self) -> dict[int, tuple[str, int]]:
        """`forward_addresses` by node id (empty: dial the registered addresses)."""
        return parse_cluster(self.forward_addresses, "forward_addresses")

    @property
    def node_host(self) -> str:
        """The host this node's ports are reached at: see `advertise_host`."""
        if self.advertise_host:
            return self.advertise_host
        own = self.cluster_peers.get(self.node_id)
        return own[0] if own is not None else "127.0.0.1"

    def _check_cluster(self) -> None:
        if self.node_id < 1:
            raise ConfigError(f"node_id must be at least 1, got {self.node_id}")
        peers = self.cluster_peers
        if peers and self.node_id not in peers:
            raise ConfigError(
                f"node_id {self.node_id} is not in cluster ({self.cluster}): list this node too"
            )
        if self.node_gone_ms < 1:
            raise ConfigError(f"node_gone_ms must be at least 1, got {self.node_gone_ms}")
        entries = self.metadata_snapshot_entries
        if entries < 1:
            raise ConfigError(f"metadata_snapshot_entries must be at least 1, got {entries}")
        if self.join and len(peers) < 2:
            raise ConfigError("join needs cluster to list the running voters and this node")
        if self.node_id in self.forward_peers:
            raise ConfigError(f"forward_addresses lists this node ({self.node_id}) itself")

    @property
    def tls_enabled(self) -> bool:
        """Whether a certificate is configured: the amqps listener runs."""
        return bool(self.ssl_options_certfile)

    def _check_tls(self) -> None:
        if self.ssl_options_verify not in SSL_VERIFY_MODES:
            raise ConfigError(
                f"ssl_options.verify must be one of {', '.join(SSL_VERIFY_MODES)}, "
                f"got {self.ssl_options_verify!r}"
            )
        if self.ssl_cert_login_from not in SSL_CERT_LOGIN_FROM:
            raise ConfigError(
                f"ssl_cert_login_from must be one of {', '.join(SSL_CERT_LOGIN_FROM)}, "
                f"got {self.ssl_cert_login_from!r}"
            )
        if bool(self.ssl_options_certfile) != bool(self.ssl_options_keyfile):
            raise ConfigError("ssl_options.certfile and ssl_options.keyfile go together")
        if self.ssl_options_verify == "verify_peer" and not self.ssl_options_cacertfile:
            raise ConfigError("ssl_options.verify = verify_peer needs ssl_options.cacertfile")
        if self.http_tls and not self.tls_enabled:
            raise ConfigError("http_tls needs ssl_options.certfile and ssl_options.keyfile")


def parse_cluster(text: str, setting: str = "cluster") -> dict[int, tuple[str, int]]:
    """ "1=HOST:PORT,2=HOST:PORT" as {1: (HOST, PORT), ...}; ConfigError, naming `setting`,
    if malformed."""
    peers: dict[int, tuple[str, int]] = {}
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        node, separator, address = entry.partition("=")
        host, colon, port = address.strip().rpartition(":")
        host = host.strip("[]")
        if not (separator and colon and host and node.strip().isdigit() and port.isdigit()):
            raise ConfigError(f"{setting} entry {entry!r} is not ID=HOST:PORT")
        node_id, port_number = int(node), int(port)
        if node_id < 1:
            raise ConfigError(f"{setting} entry {entry!r}: node ids start at 1")
        if not 0 < port_number <= 65535:
            raise ConfigError(f"{setting} entry {entry!r}: port must be 1..65535")
        if node_id in peers:
            raise ConfigError(f"{setting} lists node {node_id} twice")
        peers[node_id] = (host, port_number)
    if len(set(peers.values())) != len(peers):
        raise ConfigError(f"{setting} gives two nodes the same address: {text}")
    return peers


_FIELDS = {f.name: f for f in dataclasses.fields(BrokerConfig)}


def _coerce(name: str, value: Any) -> Any:
    """A raw value (TOML value or environment string) as the field's type."""
    default = _FIELDS[name].default
    try:
        if isinstance(default, bool):
            if isinstance(value, str):
                return value.strip().lower() in ("1", "true", "yes", "on")
            return bool(value)
        if isinstance(default, int):
            if isinstance(value, bool):
                raise ValueError("a boolean is not a number")
            return int(value)
        if isinstance(default, float):
            return float(value)
        if isinstance(default, Path):
            return Path(value)
        if isinstance(default, tuple):
            if isinstance(value, str):
                return tuple(part.strip() for part in value.split(",") if part.strip())
            return tuple(str(part) for part in value)
        return str(value).lower() if name == "log_level" else str(value)
    except (TypeError, ValueError) as error:
        raise ConfigError(f"bad value for {name}: {value!r} ({error})") from None


def from_toml(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            raw = tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise ConfigError(f"cannot read config file {path}: {error}") from None
    settings = _flattened(raw)
    unknown = sorted(set(settings) - set(_FIELDS))
    if unknown:
        raise ConfigError(f"unknown setting(s) in {path}: {', '.join(unknown)}")
    return {name: _coerce(name, value) for name, value in settings.items()}


def _flattened(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A TOML table's settings with nested tables' keys joined by ``_``: RabbitMQ's
    ``ssl_options.certfile = "..."`` is the field ``ssl_options_certfile``."""
    settings: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            settings.update(_flattened(value, f"{prefix}{key}_"))
        else:
            settings[prefix + key] = value
    return settings


def from_environment(environ: Mapping[str, str]) -> dict[str, Any]:
    settings = {}
    for key, value in environ.items():
        if not key.startswith(ENV_PREFIX):
            continue
        name = key[len(ENV_PREFIX) :].lower()
        if name in _FIELDS:
            settings[name] = _coerce(name, value)
    return settings


def load(
    config_file: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> BrokerConfig:
    """Defaults < TOML file < environment < overrides (flags; None values are ignored)."""
    environ = os.environ if environ is None else environ
    settings: dict[str, Any] = {}
    config_file = config_file or environ.get(ENV_PREFIX + "CONFIG")
    if config_file:
        settings.update(from_toml(config_file))
    settings.update(from_environment(environ))
    for name, value in (overrides or {}).items():
        if value is not None:
            if name not in _FIELDS:
                raise ConfigError(f"unknown setting {name}")
            settings[name] = _coerce(name, value)
    return BrokerConfig(**settings)

"""`warren serve`: run the broker until SIGTERM or SIGINT.

Prints "Warren listening on HOST:PORT" on stdout once every listener accepts connections
(test harnesses and scripts wait for that line); the HTTP listeners that run follow on the
same line: "; management on HOST:PORT; metrics on HOST:PORT", after "; amqps on HOST:PORT"
when a TLS certificate is configured. SIGTERM and SIGINT shut down
cleanly: no new connections, clients closed with 320 CONNECTION_FORCED, queues flushed and
fsynced.

A start that fails (the port taken, the metadata unreadable) logs one line and exits with
status 1 at once, so a supervisor sees it and restarts or alerts.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import signal
import sys
from typing import Any

from .broker import Broker
from .config import LOG_LEVELS, SSL_VERIFY_MODES, BrokerConfig, ConfigError, load

log = logging.getLogger("warrenmq.server")
# The settings `warren serve` takes as flags of the same names.
TLS_FLAGS = (
    "tls_port",
    "ssl_options_certfile",
    "ssl_options_keyfile",
    "ssl_options_cacertfile",
    "ssl_options_verify",
    "ssl_options_fail_if_no_peer_cert",
    "http_tls",
    "management_ssl_port",
    "metrics_ssl_port",
)
# The cluster settings `warren serve` takes as flags of the same names.
CLUSTER_FLAGS = ("node_id", "cluster", "advertise_host", "join", "cluster_secret", "replicate")


def register(commands: Any) -> None:
    parser = commands.add_parser("serve", help="run the AMQP 0-9-1 broker")
    parser.add_argument("--port", type=int, help="AMQP port (default 5672; 0 picks a free one)")
    parser.add_argument("--bind", help="address to listen on (default 0.0.0.0)")
    parser.add_argument("--data-dir", dest="data_dir", help="data directory (default ./data)")
    parser.add_argument("--config", help="TOML config file (also WARREN_CONFIG)")
    parser.add_argument("--log-level", dest="log_level", choices=LOG_LEVELS)
    parser.add_argument(
        "--management-port",
        dest="management_port",
        type=int,
        help="HTTP management API port (default 15672; 0 picks a free one)",
    )
    parser.add_argument(
        "--no-management",
        dest="management_enabled",
        action="store_const",
        const=False,
        help="do not serve the management API",
    )
    parser.add_argument(
        "--metrics-port",
        dest="metrics_port",
        type=int,
        help="Prometheus metrics port (default 15692; 0 picks a free one)",
    )
    parser.add_argument(
        "--no-metrics",
        dest="metrics_enabled",
        action="store_const",
        const=False,
        help="do not serve Prometheus metrics",
    )
    parser.add_argument(
        "--tls-port",
        dest="tls_port",
        type=int,
        help="AMQP over TLS port, when a certificate is set (default 5671; 0 picks a free one)",
    )
    parser.add_argument(
        "--ssl-certfile", dest="ssl_options_certfile", help="server certificate (PEM)"
    )
    parser.add_argument("--ssl-keyfile", dest="ssl_options_keyfile", help="its private key")
    parser.add_argument(
        "--ssl-cacertfile", dest="ssl_options_cacertfile", help="CA bundle for client certificates"
    )
    parser.add_argument(
        "--ssl-verify",
        dest="ssl_options_verify",
        choices=SSL_VERIFY_MODES,
        help="verify_peer asks clients for a certificate (default verify_none)",
    )
    parser.add_argument(
        "--ssl-fail-if-no-peer-cert",
        dest="ssl_options_fail_if_no_peer_cert",
        action="store_const",
        const=True,
        help="with verify_peer, refuse clients without a certificate",
    )
    parser.add_argument(
        "--http-tls",
        dest="http_tls",
        action="store_const",
        const=True,
        help="also serve the management API and metrics over HTTPS, on their ssl ports",
    )
    parser.add_argument(
        "--management-ssl-port",
        dest="management_ssl_port",
        type=int,
        help="the management API over HTTPS (default 15671; 0 picks a free one)",
    )
    parser.add_argument(
        "--metrics-ssl-port",
        dest="metrics_ssl_port",
        type=int,
        help="the metrics over HTTPS (default 15691; 0 picks a free one)",
    )
    parser.add_argument(
        "--node-id", dest="node_id", type=int, help="this node's id in the cluster (default 1)"
    )
    parser.add_argument(
        "--cluster",
        help='the metadata group\'s voters, "1=HOST:PORT,2=HOST:PORT,..." with this node '
        "among them (its Raft port); unset: a single node",
    )
    parser.add_argument(
        "--advertise-host",
        dest="advertise_host",
        help="the host other nodes and clients reach this node at (default: its --cluster "
        "entry's host, else 127.0.0.1)",
    )
    parser.add_argument(
        "--join",
        action="store_const",
        const=True,
        help="start as a non-voter waiting for `warren cluster join` to add it",
    )
    parser.add_argument(
        "--cluster-secret",
        dest="cluster_secret",
        help="the secret every node of the cluster shares, checked when a node links to another "
        "(also WARREN_CLUSTER_SECRET)",
    )
    parser.add_argument(
        "--replicate",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="in a cluster, replicate durable queues and streams to their follower nodes, "
        "confirming on their in-sync replicas (the default; --no-replicate keeps each on its "
        "leader alone; also WARREN_REPLICATE=0/1; every node of the cluster must agree)",
    )
    parser.set_defaults(handler=run_command)


def run_command(args: argparse.Namespace) -> int:
    try:
        config = load(
            args.config,
            overrides={
                "port": args.port,
                "bind": args.bind,
                "data_dir": args.data_dir,
                "log_level": args.log_level,
                "management_port": args.management_port,
                "management_enabled": args.management_enabled,
                "metrics_port": args.metrics_port,
                "metrics_enabled": args.metrics_enabled,
                **{name: getattr(args, name) for name in (*TLS_FLAGS, *CLUSTER_FLAGS)},
            },
        )
    except ConfigError as error:
        print(f"warren serve: {error}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=config.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        import uvloop
    except ImportError:
        uvloop = None
    status = uvloop.run(serve(config)) if uvloop is not None else asyncio.run(serve(config))
    # Everything the broker keeps is on disk now (or, after a failed start, was never
    # written), so the process ends here. Interpreter exit would free the objects created
    # since start one by one (32 s of a 37 s SIGTERM stop with 355,000 queues and priority
    # levels), and join worker threads that a failed start may leave blocked (an fsync on a
    # hung disk). Deletes still queued in a worker are redone by the next start.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


async def serve(config: BrokerConfig) -> int:
    broker = Broker(config)
    try:
        await broker.start()
    except Exception as error:
        log.critical("start-up failed: %s: %s", type(error).__name__, error)
        log.debug("start-up failed", exc_info=error)
        return 1
    # What exists now (modules, metadata, recovered queues) lives as long as the process.
    # Frozen out of the collector's sight, it is no longer walked by every full collection:
    # those took 8-12 ms of the event loop under load, and 0.5-1 ms once frozen.
    gc.freeze()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    listening = f"Warren listening on {config.bind}:{broker.port}"
    if config.tls_enabled:
        listening += f"; amqps on {config.bind}:{broker.tls_port}"
    for name, port in broker.http.ports().items():
        listening += f"; {name} on {config.bind}:{port}"
    print(listening, flush=True)
    log.info("data in %s", config.data_dir)
    await stop.wait()
    log.info("shutting down")
    try:
        await broker.stop()
    except Exception as error:
        log.critical("stopping failed: %s: %s", type(error).__name__, error)
        log.debug("stopping failed", exc_info=error)
        return 1
    log.info("stopped")
    return 0

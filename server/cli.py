"""The `warren` command line: one subcommand per tool, dispatched by argparse."""

from __future__ import annotations

import argparse
import importlib
import json
import sys

import warrenmq


def _bench(args: argparse.Namespace) -> int:
    from warrenmq.log import bench as log_bench

    report = log_bench.run(
        directory=args.dir,
        records_64b=args.records,
        records_1k=args.records // 4,
        batch_records=args.batch,
        seconds_disk=args.disk_seconds,
    )
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        print(log_bench.format_report(report))
    return 0


# Modules that add their own subcommands: each has `register(commands)`, taking the
# argparse sub-parsers object; a parser's `handler` default receives the parsed args.
COMMAND_MODULES: tuple[str, ...] = (
    "warrenmq.server.serve",
    "warrenmq.server.admin_cli",
    "warrenmq.server.dlq_cli",
    "warrenmq.server.broker_cli",
    "warrenmq.server.streams_cli",
    "warrenmq.server.tls_cli",
    "warrenmq.server.cluster_cli",
)
# Modules that add `warren bench TARGET` scenarios: `register(targets)` likewise.
BENCH_MODULES: tuple[str, ...] = (
    "warrenmq.server.bench.loadgen",
    "warrenmq.server.queue.bench",
    "warrenmq.server.bench.delayed",
    "warrenmq.server.bench.redrive",
    "warrenmq.server.bench.topic",
    "warrenmq.server.bench.flood",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="warren",
        description="Warren: an AMQP 0-9-1 message broker on a partitioned commit log.",
    )
    parser.add_argument("--version", action="version", version=f"warren {warrenmq.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    bench = commands.add_parser("bench", help="measure Warren on this machine")
    targets = bench.add_subparsers(dest="target", metavar="TARGET", required=True)
    log = targets.add_parser(
        "log", help="append/read throughput of the commit log against the disk's own limit"
    )
    log.add_argument("--json", action="store_true", help="print the report as JSON")
    log.add_argument("--dir", help="scratch directory (default: a temporary one)")
    log.add_argument("--records", type=int, default=1_000_000, help="64-byte records to append")
    log.add_argument("--batch", type=int, default=1000, help="records per appended batch")
    log.add_argument(
        "--disk-seconds", type=float, default=2.0, help="how long to measure the raw disk"
    )
    log.set_defaults(handler=_bench)
    for name in BENCH_MODULES:
        importlib.import_module(name).register(targets)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 0
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())

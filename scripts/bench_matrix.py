"""Issue 16's scenarios in one run: every `warren bench` scenario of the 3x goal against a
broker and a compared one (the reference RabbitMQ), alternating, each figure with its ratio.

    url=$(scripts/rabbitmq_reference.sh start)
    .venv/bin/warren serve --port 35672 --data-dir /tmp/warren-matrix &
    .venv/bin/python scripts/bench_matrix.py --url amqp://guest:guest@127.0.0.1:35672/%2F \
        --compare "$url" [--out DIR] [--quick] [--only e2e,drain]
    scripts/rabbitmq_reference.sh stop

Prints a Markdown table (each scenario's throughput and latency percentiles, Warren's figure,
the compared broker's and their ratio); with --out, each scenario's whole JSON report too.
About 9 minutes on two cores; --quick runs each scenario small, to check the script.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

# name -> `warren bench` arguments (full size, quick size).
SCENARIOS: dict[str, tuple[list[str], list[str]]] = {
    "publish-quorum": (
        ["publish", "--queue-type", "quorum", "--messages", "200000", "--runs", "3"],
        ["publish", "--queue-type", "quorum", "--messages", "2000"],
    ),
    "publish-classic": (
        ["publish", "--messages", "200000", "--runs", "3"],
        ["publish", "--messages", "2000"],
    ),
    "e2e": (["e2e", "--messages", "200000", "--runs", "3"], ["e2e", "--messages", "2000"]),
    "publish-1k": (
        ["publish", "--size", "1024", "--messages", "100000", "--runs", "3"],
        ["publish", "--size", "1024", "--messages", "1000"],
    ),
    "e2e-1k": (
        ["e2e", "--size", "1024", "--messages", "100000", "--runs", "3"],
        ["e2e", "--size", "1024", "--messages", "1000"],
    ),
    "publish-16k": (
        ["publish", "--size", "16384", "--messages", "20000", "--runs", "3"],
        ["publish", "--size", "16384", "--messages", "200"],
    ),
    "e2e-16k": (
        ["e2e", "--size", "16384", "--messages", "20000", "--runs", "3"],
        ["e2e", "--size", "16384", "--messages", "200"],
    ),
    "queues-10": (
        ["queues", "--queues", "10", "--messages", "200000", "--runs", "3"],
        ["queues", "--queues", "10", "--messages", "2000"],
    ),
    "fanout-10": (
        ["fanout", "--queues", "10", "--messages", "100000", "--runs", "3"],
        ["fanout", "--queues", "10", "--messages", "1000"],
    ),
    "connections-1000": (
        ["connections", "--connections", "1000", "--rate-per-connection", "20", "--seconds", "20"],
        ["connections", "--connections", "20", "--rate-per-connection", "20", "--seconds", "2"],
    ),
    "steady-10k": (
        ["steady", "--rate", "10000", "--seconds", "15"],
        ["steady", "--rate", "1000", "--seconds", "2"],
    ),
    "steady-50k": (
        ["steady", "--rate", "50000", "--seconds", "15"],
        ["steady", "--rate", "2000", "--seconds", "2"],
    ),
    "drain-1m": (["drain", "--messages", "1000000"], ["drain", "--messages", "5000"]),
}
FIGURES = (
    "msgs_per_s",
    "confirm_latency_ms_p50",
    "confirm_latency_ms_p99",
    "latency_ms_p50",
    "latency_ms_p99",
    "latency_ms_p999",
    "rate_achieved",
)


def run_scenario(warren: Path, arguments: list[str], url: str, compare: str) -> dict:
    finished = subprocess.run(
        [str(warren), "bench", *arguments, "--url", url, "--compare", compare],
        capture_output=True,
        text=True,
        check=False,
    )
    if finished.returncode != 0:
        raise RuntimeError(f"warren bench {' '.join(arguments)}: {finished.stderr.strip()}")
    return json.loads(finished.stdout)


def rows(name: str, report: dict) -> list[str]:
    target, compared = report["target"], report["compare"]
    lines = []
    for figure in FIGURES:
        ours, theirs = target.get(figure), compared.get(figure)
        if ours is None or theirs is None:
            continue
        if isinstance(ours, bool):
            lines.append(f"| {name} | {figure} | {ours} | {theirs} | |")
            continue
        ratio = f"{ours / theirs:.2f}" if theirs else "-"
        lines.append(f"| {name} | {figure} | {ours:,.1f} | {theirs:,.1f} | {ratio} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", required=True, help="the broker measured (Warren)")
    parser.add_argument("--compare", required=True, help="the broker compared (RabbitMQ)")
    parser.add_argument("--out", help="a directory for each scenario's JSON report")
    parser.add_argument("--quick", action="store_true", help="each scenario small")
    parser.add_argument("--only", help="comma-separated scenario names (default: all)")
    args = parser.parse_args(argv)
    chosen = args.only.split(",") if args.only else list(SCENARIOS)
    unknown = [name for name in chosen if name not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenarios {unknown}: choose from {list(SCENARIOS)}")
    warren = Path(sys.executable).with_name("warren")
    out = Path(args.out) if args.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    print("| scenario | figure | measured | compared | ratio |")
    print("|---|---|---|---|---|")
    for name in chosen:
        full, quick = SCENARIOS[name]
        report = run_scenario(warren, quick if args.quick else full, args.url, args.compare)
        if out is not None:
            (out / f"{name}.json").write_text(json.dumps(report, indent=2))
        print("\n".join(rows(name, report)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""scripts/cluster_bench.py's table: a row per figure with the ratio where both sides have a
number, the members each broker reported, and the failover verdicts in words."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import cluster_bench  # noqa: E402


def side(members: int, **figures) -> dict:
    return {"queue_members": {"leader": "a", "members": ["a", "b", "c"][:members]}, **figures}


def test_the_table_gives_ratios_members_and_verdicts():
    results = {
        "publish": {
            "Warren": side(1, msgs_per_s=30_000.0, confirm_latency_ms_p50=2.0),
            "RabbitMQ": side(3, msgs_per_s=10_000.0, confirm_latency_ms_p50=4.0),
        },
        "e2e": {"Warren": side(1), "RabbitMQ": side(3)},
        "steady": {
            "Warren": side(1, rate_achieved=True),
            "RabbitMQ": side(3, rate_achieved=False),
        },
        "failover": {
            "Warren": side(1, failover_ms=None, verdict="no confirms resumed within 30 s"),
            "RabbitMQ": side(
                3, failover_ms=250.0, verdict="confirms resumed 250 ms after the kill"
            ),
        },
    }
    lines = cluster_bench.table(results, ["Warren", "RabbitMQ"]).splitlines()
    assert lines[0] == "| scenario | figure | Warren | RabbitMQ | ratio Warren/RabbitMQ |"
    assert "| publish | msgs_per_s | 30000.0 | 10000.0 | 3.00 |" in lines
    assert "| publish | confirm_latency_ms_p50 | 2.0 | 4.0 | 0.50 |" in lines
    assert "| publish | queue members | 1 | 3 | |" in lines
    assert "| e2e | latency_ms_p99 | — | — |  |" in lines
    assert "| steady | rate_achieved | True | False |  |" in lines
    assert "| failover | failover_ms | — | 250.0 |  |" in lines
    assert lines[-1] == (
        "| failover | verdict | no confirms resumed within 30 s "
        "| confirms resumed 250 ms after the kill | |"
    )

"""scripts/bench_matrix.py: its table's rows, and a quick run of two scenarios against a
Warren compared with itself (the figures are not checked, only that each is reported with
its ratio and that the JSON reports are written)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import bench_matrix  # noqa: E402


def test_rows_give_each_figure_both_sides_have_with_its_ratio():
    report = {
        "target": {"msgs_per_s": 30_000.0, "latency_ms_p99": 2.0, "rate_achieved": True},
        "compare": {"msgs_per_s": 10_000.0, "latency_ms_p99": 4.0, "rate_achieved": False},
    }
    assert bench_matrix.rows("e2e", report) == [
        "| e2e | msgs_per_s | 30,000.0 | 10,000.0 | 3.00 |",
        "| e2e | latency_ms_p99 | 2.0 | 4.0 | 0.50 |",
        "| e2e | rate_achieved | True | False | |",
    ]


def test_an_unknown_scenario_is_refused(capsys):
    with pytest.raises(SystemExit):
        bench_matrix.main(["--url", "amqp://x", "--compare", "amqp://y", "--only", "nope"])
    assert "unknown scenarios ['nope']" in capsys.readouterr().err


@pytest.mark.slow
def test_a_quick_run_reports_every_scenario_asked_for(warren_process, tmp_path, capsys):
    warren = warren_process.start()
    out = tmp_path / "reports"
    only = "publish-classic,drain-1m"
    bench_matrix.main(
        ["--url", warren.url, "--compare", warren.url, "--quick", "--only", only, "--out", str(out)]
    )
    table = capsys.readouterr().out.splitlines()
    assert table[0] == "| scenario | figure | measured | compared | ratio |"
    for name in only.split(","):
        assert any(line.startswith(f"| {name} | msgs_per_s |") for line in table), table
        report = json.loads((out / f"{name}.json").read_text())
        assert report["target"]["msgs_per_s"] > 0

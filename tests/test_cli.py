"""The `warren` command: version, help, and the log benchmark's JSON report."""

import json
import subprocess
import sys
from pathlib import Path

import warrenmq

WARREN = str(Path(sys.executable).with_name("warren"))


def run(*args):
    return subprocess.run([WARREN, *args], check=True, capture_output=True, text=True).stdout


def test_version():
    assert run("--version").strip() == f"warren {warrenmq.__version__}"


def test_help_lists_the_commands():
    out = run("--help")
    assert "usage: warren" in out
    assert "bench" in out


def test_bench_log_reports_the_issue_keys_as_json(tmp_path):
    report = json.loads(
        run(
            "bench",
            "log",
            "--json",
            "--dir",
            str(tmp_path),
            "--records",
            "20000",
            "--batch",
            "500",
            "--disk-seconds",
            "0.2",
        )
    )
    for key in (
        "append_64b_records_per_s",
        "append_1k_synced_mb_per_s",
        "disk_synced_mb_per_s",
        "read_mb_per_s",
    ):
        assert report[key] > 0, key
    assert list(tmp_path.iterdir()) == [], "the benchmark cleans up its scratch files"


def test_a_run_where_no_test_passed_fails(tmp_path):
    """`.ci/run` must not pass when no test ran: the suite's conftest turns that into exit 5."""
    root = Path(__file__).resolve().parent.parent
    (tmp_path / "conftest.py").write_text((root / "conftest.py").read_text())
    (tmp_path / "test_nothing.py").write_text(
        "import pytest\n\n\ndef test_skipped():\n    pytest.skip('no')\n"
    )
    pytest_bin = str(Path(sys.executable).with_name("pytest"))
    skipped_only = subprocess.run(
        [pytest_bin, "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
    )
    assert skipped_only.returncode == 5, skipped_only.stdout
    (tmp_path / "test_nothing.py").write_text("def test_passes():\n    pass\n")
    passing = subprocess.run(
        [pytest_bin, "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        capture_output=True,
    )
    assert passing.returncode == 0, passing.stdout

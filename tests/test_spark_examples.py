"""The Spark examples (`spark/examples/`) run as their README says, each script in a process of
its own against a broker: the streaming job writes each closed minute's per-user counts once,
and the same counts the events say, also when run a second time from its checkpoint; the
dead-letter report counts every dead letter by reason and source queue."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from http_api import eventually

pytest.importorskip("pyspark")

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parent.parent / "spark" / "examples"
EVENTS = 3_000
DEAD_LETTERS = 60


@pytest.fixture(scope="module", autouse=True)
def java():
    if shutil.which("java") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("Spark needs Java (17) on PATH")
        pytest.skip("Spark needs Java (17) on PATH")


def run_example(script: str, broker, cwd: Path, *arguments: str) -> str:
    finished = subprocess.run(
        [sys.executable, str(EXAMPLES / script), "--url", broker.management_url]
        + ["--amqp", f"amqp://guest:guest@127.0.0.1:{broker.port}/%2F", *arguments],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert finished.returncode == 0, finished.stderr[-4000:]
    return finished.stdout


def retained(topic_client, stream: str) -> list:
    """Every record of a stream (or of a super stream's partitions) as the topic API reads
    them, decoded by the log's own decoder."""
    from warrenmq.log.batch import decode_records, read_header

    records = []
    for partition in topic_client.partitions(stream):
        offset = partition.first_offset
        while offset < partition.next_offset:
            data = topic_client.batches(stream, partition.index, offset)
            position = 0
            while position < len(data):
                header = read_header(data, position)
                records += [
                    record
                    for record in decode_records(data, position, header, header.base_offset)
                    if record.offset >= offset
                ]
                position += header.total_bytes
            offset = header.base_offset + header.record_count
    return records


def test_events_per_minute_writes_each_closed_minute_once_with_the_events_counts(
    module_broker, topic_client, tmp_path
):
    out = run_example("generate_events.py", module_broker, tmp_path, "--events", str(EVENTS))
    assert f"published {EVENTS:,} events" in out
    events = [json.loads(record.body) for record in retained(topic_client, "events")]
    assert len(events) == EVENTS
    per_minute = Counter((event["time"] // 60_000, event["user"]) for event in events)

    out = run_example("events_per_minute.py", module_broker, tmp_path)
    assert f"read {EVENTS:,} events" in out
    first = [json.loads(record.body) for record in retained(topic_client, "events-per-minute")]
    # The second run carries on from its checkpoint: nothing to read, nothing written again.
    out = run_example("events_per_minute.py", module_broker, tmp_path)
    assert "read 0 events" in out
    rows = [json.loads(record.body) for record in retained(topic_client, "events-per-minute")]
    assert rows == first
    assert rows, "no minute closed"
    keys = [(row["minute"], row["user"]) for row in rows]
    assert len(keys) == len(set(keys)), "a minute's result was written twice"
    for row in rows:
        minute_ms = _epoch_ms(row["minute"])
        assert row["events"] == per_minute[(minute_ms // 60_000, row["user"])], row
    latest_minute = max(event["time"] for event in events) // 60_000
    closed = {key for key in per_minute if key[0] < latest_minute - 1}
    assert {(_epoch_ms(minute) // 60_000, user) for minute, user in keys} >= closed


def _epoch_ms(spark_time: str) -> int:
    """Spark's JSON timestamp (2026-11-24T03:05:00.000Z or with an offset) as epoch ms."""
    from datetime import datetime

    return int(datetime.fromisoformat(spark_time.replace("Z", "+00:00")).timestamp() * 1000)


def test_the_dead_letter_report_counts_every_dead_letter_by_reason_and_queue(
    module_broker, topic_client, tmp_path
):
    out = run_example(
        "generate_dead_letters.py", module_broker, tmp_path, "--messages", str(DEAD_LETTERS)
    )
    assert f"dead-lettered {DEAD_LETTERS}" in out
    letters = eventually(lambda: len(retained(topic_client, "dead-letters")), DEAD_LETTERS)
    assert letters == DEAD_LETTERS

    out = run_example("dead_letter_report.py", module_broker, tmp_path)
    counts: Counter = Counter()
    for line in out.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == 4 and re.fullmatch(r"\d+", cells[3]):
            counts[cells[1]] += int(cells[3])
    assert counts == {"expired": DEAD_LETTERS // 3, "rejected": DEAD_LETTERS - DEAD_LETTERS // 3}

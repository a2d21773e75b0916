"""`warren bench log`: the log's append and read throughput beside the disk's own limit.

The disk figure is measured the same way the synced log figure is: batches of the same size
written and fdatasync-ed one at a time, so the ratio between them is the log's overhead.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from .config import LogConfig
from .partition import PartitionLog

_MB = 1_000_000


def _append_run(
    directory: Path, record_count: int, body_bytes: int, batch_records: int, synced: bool
) -> dict[str, float]:
    batch = [(b"", b"bench", b"", os.urandom(body_bytes)) for _ in range(batch_records)]
    log = PartitionLog.open(directory, LogConfig(segment_bytes_max=256 << 20))
    batches = max(1, record_count // batch_records)
    start = time.perf_counter()
    for _ in range(batches):
        log.append(batch, timestamp_ms=0)
        if synced:
            log.sync()
    elapsed = time.perf_counter() - start
    log.sync()
    log.close()
    records = batches * batch_records
    return {"records_per_s": records / elapsed, "mb_per_s": records * body_bytes / elapsed / _MB}


def _read_run(directory: Path) -> dict[str, float]:
    """Sequential read of a whole log from its segments (the tail cache is off)."""
    log = PartitionLog.open(
        directory, LogConfig(segment_bytes_max=256 << 20, tail_cache_bytes_max=0)
    )
    offset, records, payload = log.start_offset, 0, 0
    start = time.perf_counter()
    while offset < log.end_offset:
        got = log.read(offset, max_records=10_000, max_bytes=8 << 20)
        records += len(got)
        payload += sum(len(r.body) for r in got)
        offset = got[-1].offset + 1
    elapsed = time.perf_counter() - start
    log.close()
    return {"records_per_s": records / elapsed, "mb_per_s": payload / elapsed / _MB}


def _disk_synced_write(directory: Path, chunk_bytes: int, seconds: float) -> float:
    chunk = os.urandom(chunk_bytes)
    path = directory / "disk-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    written = 0
    start = time.perf_counter()
    try:
        while time.perf_counter() - start < seconds:
            written += os.write(fd, chunk)
            os.fdatasync(fd)
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink()
    return written / elapsed / _MB


def run(
    directory: str | None,
    records_64b: int,
    records_1k: int,
    batch_records: int,
    seconds_disk: float,
) -> dict[str, float | int | str]:
    scratch = Path(tempfile.mkdtemp(prefix="warren-bench-log-", dir=directory))
    try:
        small = _append_run(scratch / "64b", records_64b, 64, batch_records, synced=False)
        read_small = _read_run(scratch / "64b")
        large = _append_run(scratch / "1k", records_1k, 1024, batch_records, synced=False)
        read = _read_run(scratch / "1k")
        large_synced = _append_run(
            scratch / "1k-synced", records_1k, 1024, batch_records, synced=True
        )
        disk = _disk_synced_write(scratch, batch_records * 1024, seconds_disk)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {
        "directory": str(directory or tempfile.gettempdir()),
        "batch_records": batch_records,
        "append_64b_records_per_s": round(small["records_per_s"]),
        "append_64b_mb_per_s": round(small["mb_per_s"], 1),
        "append_1k_records_per_s": round(large["records_per_s"]),
        "append_1k_mb_per_s": round(large["mb_per_s"], 1),
        "append_1k_synced_records_per_s": round(large_synced["records_per_s"]),
        "append_1k_synced_mb_per_s": round(large_synced["mb_per_s"], 1),
        "disk_synced_mb_per_s": round(disk, 1),
        "append_1k_synced_to_disk_ratio": round(large_synced["mb_per_s"] / disk, 3),
        "read_64b_records_per_s": round(read_small["records_per_s"]),
        "read_mb_per_s": round(read["mb_per_s"], 1),
    }


def format_report(report: dict[str, float | int | str]) -> str:
    width = max(map(len, report))
    return "\n".join(f"{key:<{width}}  {value}" for key, value in report.items())

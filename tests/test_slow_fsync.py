"""The fault tests' slow disk (`native/slow_fsync.c`): preloaded into a process, it delays
that process's fsync and fdatasync by what its file says, read again at every call."""

import shutil
import subprocess
import sys

import pytest
from fault_cluster import build_slow_fsync

pytestmark = pytest.mark.skipif(
    not (shutil.which("cc") or shutil.which("gcc")), reason="needs a C compiler (gcc)"
)

# Times an fsync, then an fdatasync, each after the delay file is rewritten to the next value.
_TIMED_SYNCS = """
import os, sys, time
delay_file = sys.argv[1]
fd = os.open(sys.argv[2], os.O_CREAT | os.O_WRONLY)
for sync, delay_us in ((os.fsync, "300000"), (os.fdatasync, "300000"), (os.fsync, "0")):
    with open(delay_file + ".tmp", "w") as f:
        f.write(delay_us)
    os.replace(delay_file + ".tmp", delay_file)
    started = time.monotonic()
    sync(fd)
    print(time.monotonic() - started)
"""

_TIMED_FSYNC = """
import os, sys, time
fd = os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY)
started = time.monotonic()
os.fsync(fd)
print(time.monotonic() - started)
"""


def test_fsyncs_take_as_long_as_the_file_says_and_no_longer_once_it_says_0(tmp_path):
    library = build_slow_fsync(tmp_path)
    delay_file = tmp_path / "delay-us"
    timed = subprocess.run(
        [sys.executable, "-c", _TIMED_SYNCS, str(delay_file), str(tmp_path / "data")],
        env={"LD_PRELOAD": str(library), "SLOW_FSYNC_FILE": str(delay_file)},
        capture_output=True,
        text=True,
        check=True,
    )
    fsync_s, fdatasync_s, healed_s = (float(line) for line in timed.stdout.split())
    assert fsync_s >= 0.3 and fdatasync_s >= 0.3
    assert healed_s < 0.25


def test_without_its_file_the_library_delays_nothing(tmp_path):
    library = build_slow_fsync(tmp_path)
    timed = subprocess.run(
        [sys.executable, "-c", _TIMED_FSYNC, str(tmp_path / "data")],
        env={"LD_PRELOAD": str(library), "SLOW_FSYNC_FILE": str(tmp_path / "missing")},
        capture_output=True,
        text=True,
        check=True,
    )
    assert float(timed.stdout) < 0.25

"""The management API client: compat_tests' own (compat_tests/management_client.py), shared so
that the unit tests and the compat tests speak HTTP the same way."""

import sys
from pathlib import Path

# compat_tests is a folder of test modules, not a package; its helpers are found by path.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "compat_tests"))

from management_client import HttpApi, Reply, path  # noqa: E402

__all__ = ["HttpApi", "Reply", "path"]

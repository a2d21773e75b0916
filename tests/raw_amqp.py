"""The raw-socket AMQP client: compat_tests' own (compat_tests/raw_client.py), shared so that the
unit tests and the compat tests send hand-made frames the same way."""

import sys
from pathlib import Path

# compat_tests is a folder of test modules, not a package; its helpers are found by path.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "compat_tests"))

from raw_client import PROTOCOL_HEADER, Closed, RawClient, raw_frame  # noqa: E402

__all__ = ["PROTOCOL_HEADER", "Closed", "RawClient", "raw_frame"]

"""Shared helpers of the unit tests live in modules of this folder (`doubles.py`); the suite runs
in importlib mode with the repository root off sys.path, so the folder itself is put there."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

"""Small files the broker keeps beside its logs (redrive tasks, the dead-letter journal),
written so that a crash leaves either the old content or the new, fsynced."""

from __future__ import annotations

import os
from pathlib import Path


def replace(path: Path, text: str) -> None:
    """Replace the file's content atomically: a temporary file, fsynced, renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".new")
    with open(temporary, "w") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    descriptor = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def append(path: Path, text: str) -> None:
    """Append to the file and fsync it (a crash may leave the last line torn)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())

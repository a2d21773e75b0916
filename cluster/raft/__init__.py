"""A sans-I/O Raft core (`core.py`, `messages.py`), its deterministic simulator and checker."""

"""A sans-I/O Raft core, its deterministic simulator and its asyncio transport."""

"""Metadata: vhosts, users, permissions, exchanges, queues and bindings as a replicated state machine."""

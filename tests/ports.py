"""Free TCP ports for the tests that must name one before they listen (Raft peers): several
at once with `free_ports`, which never repeats one."""

from warrenmq.cluster.local_cluster import free_port, free_ports

__all__ = ["free_port", "free_ports"]

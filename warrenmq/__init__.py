"""Warren: an AMQP 0-9-1 broker whose queues and streams are partitioned commit logs.

The subpackages live in the repository's top-level folders (`amqp/`, `log/`, ...) and are
mapped under this one import package by pyproject.toml's `package-dir`.
"""

__version__ = "0.1.0"

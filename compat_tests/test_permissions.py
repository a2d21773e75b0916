"""configure/write/read permissions as RabbitMQ enforces them (403 texts).

compat-limited may configure ``cfg.*`` and ``limited.*``, write ``limited.*``, and read
``cfg.*`` and ``limited.*`` on "/" (see compat_harness.LIMITED_PERMISSIONS).
"""

from __future__ import annotations

import pika
import pytest
from compat_harness import LIMITED_USER
from pika_helpers import channel_error, drain


def _refused(kind: str, name: str) -> tuple[int, str]:
    return 403, (
        f"ACCESS_REFUSED - access to {kind} '{name}' in vhost '/' "
        f"refused for user '{LIMITED_USER[0]}'"
    )


@pytest.fixture
def limited(seeded):
    conn = pika.BlockingConnection(seeded.params(credentials=pika.PlainCredentials(*LIMITED_USER)))
    yield conn
    if conn.is_open:
        conn.close()


@pytest.fixture
def guest_channel(seeded):
    conn = pika.BlockingConnection(seeded.params())
    yield conn.channel()
    conn.close()


def test_configure_permission_on_queue_declare(limited, uid):
    assert channel_error(limited.channel().queue_declare, f"other.{uid}") == _refused(
        "queue", f"other.{uid}"
    )
    limited.channel().queue_declare(f"cfg.{uid}", exclusive=True)


def test_configure_permission_on_exchange_declare(limited, uid):
    assert channel_error(limited.channel().exchange_declare, f"other.{uid}", "fanout") == _refused(
        "exchange", f"other.{uid}"
    )
    ch = limited.channel()
    ch.exchange_declare(f"limited.{uid}", "fanout")
    ch.exchange_delete(f"limited.{uid}")


def test_configure_permission_on_delete(limited, guest_channel, uid):
    guest_channel.queue_declare(f"other.{uid}")
    assert channel_error(limited.channel().queue_delete, f"other.{uid}") == _refused(
        "queue", f"other.{uid}"
    )
    guest_channel.queue_delete(f"other.{uid}")


def test_passive_declare_needs_no_configure_permission(limited, guest_channel, uid):
    guest_channel.queue_declare(f"other.{uid}")
    try:
        limited.channel().queue_declare(f"other.{uid}", passive=True)
    finally:
        guest_channel.queue_delete(f"other.{uid}")


def test_write_permission_on_publish(limited, uid):
    ch = limited.channel()
    ch.queue_declare(f"cfg.{uid}", exclusive=True)
    ch.basic_publish("", f"cfg.{uid}", b"x")
    assert channel_error(ch.queue_declare, f"cfg.{uid}", passive=True) == _refused(
        "exchange", "amq.default"
    )


def test_bind_needs_write_on_queue_and_read_on_exchange(limited, uid):
    ch = limited.channel()
    ch.exchange_declare(f"limited.{uid}", "fanout", auto_delete=True)
    ch.queue_declare(f"cfg.{uid}", exclusive=True)
    assert channel_error(ch.queue_bind, f"cfg.{uid}", f"limited.{uid}") == _refused(
        "queue", f"cfg.{uid}"
    )
    ch = limited.channel()
    ch.queue_declare(f"limited.{uid}-q", exclusive=True)
    assert channel_error(ch.queue_bind, f"limited.{uid}-q", "amq.fanout") == _refused(
        "exchange", "amq.fanout"
    )


def test_permitted_round_trip(limited, uid):
    ch = limited.channel()
    ch.exchange_declare(f"limited.{uid}", "fanout", auto_delete=True)
    ch.queue_declare(f"limited.{uid}-q", exclusive=True)
    ch.queue_bind(f"limited.{uid}-q", f"limited.{uid}")
    ch.basic_publish(f"limited.{uid}", "", b"allowed")
    ch.queue_declare(f"limited.{uid}-q", passive=True)
    assert drain(ch, f"limited.{uid}-q") == [b"allowed"]


def test_read_permission_on_get_consume_and_purge(limited, guest_channel, uid):
    guest_channel.queue_declare(f"other.{uid}")
    try:
        for call, args in [
            ("basic_get", (f"other.{uid}",)),
            ("basic_consume", (f"other.{uid}", lambda *a: None)),
            ("queue_purge", (f"other.{uid}",)),
        ]:
            assert channel_error(getattr(limited.channel(), call), *args) == _refused(
                "queue", f"other.{uid}"
            ), call
    finally:
        guest_channel.queue_delete(f"other.{uid}")


def test_a_dead_letter_exchange_needs_write_on_it_and_read_on_the_queue(limited, uid):
    # cfg.* is configurable and readable but not writable; limited.* is all three.
    assert channel_error(
        limited.channel().queue_declare,
        f"cfg.{uid}",
        arguments={"x-dead-letter-exchange": f"cfg.{uid}-dlx"},
    ) == _refused("exchange", f"cfg.{uid}-dlx")
    ch = limited.channel()
    ch.queue_declare(
        f"cfg.{uid}", exclusive=True, arguments={"x-dead-letter-exchange": f"limited.{uid}"}
    )

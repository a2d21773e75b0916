"""What an old release's data dir holds in tests/fixtures/upgrade-*.tar.gz: declared by
scripts/make_upgrade_fixtures.py against that release, checked after the upgrade by
tests/test_upgrade_data_dir.py. One description, so that the two cannot drift apart.

Everything lives in the vhost LEGACY unless said otherwise. The release is the last commit of
main before the metadata went through Raft (d695ba6 merged it): SQLite rows were the
metadata's only durable form."""

from __future__ import annotations

RELEASE = "d69f15e4e281ce868a233347c8aed2974664545a"
FIXTURES = ("sigterm", "sigkill")
"""How the old release was stopped: one fixture each (tests/fixtures/upgrade-{how}.tar.gz)."""

LEGACY = "legacy"
VHOST_LIMITS = {"max-queues": 100}

USERS = {
    # name: (password, tags, {vhost: (configure, write, read)})
    "alice": ("alice-secret", "management", {LEGACY: (".*", ".*", ".*")}),
    "bob": ("bob-secret", "administrator", {"/": (".*", ".*", ".*"), LEGACY: ("^$", "^$", ".*")}),
    "guest": ("guest", "administrator", {"/": (".*", ".*", ".*"), LEGACY: (".*", ".*", ".*")}),
}

POLICIES = {
    # name: (vhost, pattern, apply-to, priority, definition)
    "capped": (LEGACY, r"^capped\.", "queues", 1, {"max-length": 2}),
    "big": ("/", r"^big$", "queues", 0, {"max-length-bytes": 1_000_000}),
}

EXCHANGES = {
    # name: (type, arguments)
    "orders": ("direct", {"alternate-exchange": "unrouted"}),
    "unrouted": ("fanout", {}),
    "events": ("topic", {}),
    "broadcast": ("fanout", {}),
    "match": ("headers", {}),
    "dlx": ("direct", {}),
    "later": ("x-delayed-message", {"x-delayed-type": "direct"}),
}

EXCHANGE_BINDINGS = [
    # (source, destination, routing key): nothing went through it before the upgrade
    ("events", "broadcast", "*.audit"),
]

QUEUES = {
    # name: (arguments, [(exchange, routing key)])
    "orders.q": ({}, [("orders", "order.created")]),
    "unrouted.q": ({}, [("unrouted", "")]),
    "events.q": ({}, [("events", "eu.#"), ("events", "*.signup")]),
    "broadcast.a": ({}, [("broadcast", "")]),
    "broadcast.b": ({}, [("broadcast", "")]),
    "match.q": ({}, [("match", "")]),
    "dead.q": ({}, [("dlx", "limited"), ("dlx", "expired")]),
    "limited": (
        {
            "x-max-length": 3,
            "x-dead-letter-exchange": "dlx",
            "x-dead-letter-routing-key": "limited",
        },
        [],
    ),
    "ttl.q": (
        {
            "x-message-ttl": 2000,
            "x-dead-letter-exchange": "dlx",
            "x-dead-letter-routing-key": "expired",
        },
        [],
    ),
    "capped.q": ({}, []),
    "prio.q": ({"x-max-priority": 5}, []),
    "later.q": ({}, [("later", "later")]),
}
MATCH_ARGUMENTS = {"x-match": "all", "kind": "invoice"}
"""The headers binding of match.q."""

ORDERS = 6
"""orders.q got order-0 … order-5 (persistent, every property set); 0 and 1 were acked, 2 and
3 delivered and unacked when the broker stopped, 4 and 5 never delivered."""
ACKED_ORDERS = 2
UNACKED_ORDERS = 2


def order_properties(i: int) -> dict:
    """pika.BasicProperties' keyword arguments of order-i."""
    return dict(
        content_type="application/json",
        content_encoding="utf-8",
        headers={"n": i, "tag": "order", "nested": {"ok": True}},
        delivery_mode=2,
        priority=3,
        correlation_id=f"corr-{i}",
        reply_to="replies",
        message_id=f"m-{i}",
        timestamp=1_700_000_000 + i,
        type="order",
        app_id="upgrade-fixture",
    )


PUBLISHED = [
    # (exchange, routing key, body, headers): every other message, persistent, in order
    ("orders", "order.lost", b"lost-0", None),
    ("events", "eu.user.login", b"event-eu", None),
    ("events", "us.signup", b"event-signup", None),
    ("events", "us.login", b"event-dropped", None),
    ("broadcast", "", b"to-all", None),
    ("match", "", b"invoice-1", {"kind": "invoice"}),
    ("match", "", b"receipt-1", {"kind": "receipt"}),
    ("", "limited", b"limited-0", None),
    ("", "limited", b"limited-1", None),
    ("", "limited", b"limited-2", None),
    ("", "limited", b"limited-3", None),
    ("", "capped.q", b"capped-0", None),
    ("", "capped.q", b"capped-1", None),
    ("", "capped.q", b"capped-2", None),
]
PRIORITIES = [(b"prio-1", 1), (b"prio-5", 5), (b"prio-3", 3)]
"""Published to prio.q in this order: a consumer gets them highest first."""

EXPECTED_QUEUES = {
    # name: the bodies it holds after the upgrade, in delivery order (orders.q apart)
    "unrouted.q": [b"lost-0"],
    "events.q": [b"event-eu", b"event-signup"],
    "broadcast.a": [b"to-all"],
    "broadcast.b": [b"to-all"],
    "match.q": [b"invoice-1"],
    "limited": [b"limited-1", b"limited-2", b"limited-3"],
    "capped.q": [b"capped-1", b"capped-2"],
    "prio.q": [b"prio-5", b"prio-3", b"prio-1"],
    "ttl.q": [],
}
DEAD_LETTERS = {b"limited-0": "maxlen", b"ttl-0": "expired"}
"""dead.q's messages and their x-death reason: ttl-0 went to ttl.q just before the stop and
expired before or after it."""

DELAYED = [(b"later-0", 5000), (b"later-1", 6000)]
"""Published to `later` (routing key later) with these x-delay just before the stop: held by
the delayed store then, due at the upgrade's start, routed to later.q."""

STREAM = "log.s"
STREAM_ARGUMENTS = {"x-queue-type": "stream", "x-max-length-bytes": 10_000_000}
STREAM_RECORDS = 10
"""log.s holds record-0 … record-9, headers {"i": i}."""
TRACKER = "reader"
TRACKED = 4
"""The consumer tagged TRACKER acked records 0 … 3: its tracked offset resumes at 4."""

SUPER_STREAM = "clicks"
PARTITIONS = 3
GROUP = "dashboard"
CLICKS_COMMITTED = 9
CLICKS_LATER = 3
"""clicks got click-0 … click-8 (routing key user-i), all acked by GROUP's one member, then
click-9 … click-11 nobody consumed: GROUP's committed offset on each partition is the
number of the first nine it holds."""

ROOT_QUEUE = "root.q"
"""In vhost "/": holds root-0."""

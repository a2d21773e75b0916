"""Routes per second on the publish path: direct and topic exchanges, cached and uncached,
and a headers exchange (never cached).

    .venv/bin/python -m warrenmq.exchanges.bench [--bindings 1000] [--seconds 0.5]

Each exchange gets `bindings` queue bindings; routing keys cycle over keys that hit one
binding each (the topic keys also hit '*' and '#' patterns; the headers bindings all share
"kind": "order" and differ in "shop"). "uncached" calls the router's miss path directly,
which is what the first publish of a key after any binding change costs.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from warrenmq.exchanges.router import Router

_PROBE_KEYS_MAX = 1_000


def _topic_binding(index: int) -> str:
    # A mix RabbitMQ users write: exact, one-word wildcard, and multi-word tail/head wildcards.
    patterns = ("eu.shop{}.order", "eu.shop{}.*", "us.#.shop{}", "shop{}.#")
    return patterns[index % 4].format(index)


def _topic_key(index: int) -> str:
    keys = ("eu.shop{}.order", "eu.shop{}.refund", "us.a.b.shop{}", "shop{}.x.y")
    return keys[index % 4].format(index)


def build_router(bindings: int) -> Router:
    queue_names = {f"q{index}" for index in range(bindings)}
    router = Router(queue_exists=queue_names.__contains__)
    router.declare("bench.direct", "direct")
    router.declare("bench.topic", "topic")
    router.declare("bench.headers", "headers")
    for index in range(bindings):
        router.bind_queue("bench.direct", f"q{index}", f"key{index}")
        router.bind_queue("bench.topic", f"q{index}", _topic_binding(index))
        router.bind_queue(
            "bench.headers", f"q{index}", "", {"x-match": "all", "kind": "order", "shop": index}
        )
    return router


def _rate(
    route: Callable[[str, str], frozenset[str]], exchange: str, keys: list[str], seconds: float
) -> float:
    routes = 0
    started = time.perf_counter()
    deadline = started + seconds
    while True:
        for key in keys:
            route(exchange, key)
        routes += len(keys)
        now = time.perf_counter()
        if now >= deadline:
            return routes / (now - started)


def bench(bindings: int = 1_000, seconds: float = 0.5) -> dict[str, float]:
    """Routes per second by scenario name."""
    router = build_router(bindings)
    probes = min(bindings, _PROBE_KEYS_MAX)
    direct_keys = [f"key{index}" for index in range(probes)]
    topic_keys = [_topic_key(index) for index in range(probes)]
    for key in topic_keys:
        assert router.route("bench.topic", key), key

    def uncached(exchange: str, key: str) -> frozenset[str]:
        return router._route_uncached(exchange, (key,), None)

    headers_by_key = {str(index): {"kind": "order", "shop": index} for index in range(probes)}

    def by_headers(exchange: str, key: str) -> frozenset[str]:
        return router.route(exchange, "", headers_by_key[key])

    return {
        "direct cached": _rate(router.route, "bench.direct", direct_keys, seconds),
        "direct uncached": _rate(uncached, "bench.direct", direct_keys, seconds),
        "topic cached": _rate(router.route, "bench.topic", topic_keys, seconds),
        "topic uncached": _rate(uncached, "bench.topic", topic_keys, seconds),
        # Headers routes depend on the headers, so they are never cached.
        "headers": _rate(by_headers, "bench.headers", list(headers_by_key), seconds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bindings", type=int, default=1_000)
    parser.add_argument("--seconds", type=float, default=0.5)
    arguments = parser.parse_args()
    for scenario, rate in bench(arguments.bindings, arguments.seconds).items():
        print(f"{scenario:16} {rate:12,.0f} routes/s  ({arguments.bindings} bindings)")


if __name__ == "__main__":
    main()

"""Router under random operation sequences: every route (cached or not) equals a plain
transcription of RabbitMQ's rabbit_exchange:route1/3 over the router's current bindings, and
the binding indexes stay consistent through deletes and auto-delete cascades."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from warrenmq.exchanges.binding import EXCHANGE, QUEUE, Destination
from warrenmq.exchanges.errors import RoutingError
from warrenmq.exchanges.router import Router

EXCHANGES = ["e0", "e1", "e2", "e3"]
QUEUES = ["q0", "q1", "q2"]
KEYS = ["a", "b"]


def naive_match(router: Router, name: str, key: str) -> list[Destination]:
    exchange = router.get(name)
    assert exchange is not None
    found = []
    for binding in router.bindings(name):
        if exchange.type == "fanout" or binding.routing_key == key:
            found.append(binding.destination)
    return found


def reference_route(router: Router, name: str, key: str) -> frozenset[str]:
    """route1/3: a worklist, a seen-set seeded with the start, alternates on an empty match."""
    work = [name]
    seen = {name}
    queues: set[str] = set()
    while work:
        current = work.pop()
        destinations = naive_match(router, current, key)
        alternate = router.get(current).alternate
        if not destinations and alternate is not None:
            destinations = [Destination(EXCHANGE, alternate)]
        for destination in destinations:
            if destination.kind == QUEUE:
                queues.add(destination.name)
            elif destination.name not in seen:
                seen.add(destination.name)
                if router.get(destination.name) is not None:
                    work.append(destination.name)
    return frozenset(queues)


def assert_indexes_consistent(router: Router, live_queues: set[str]) -> None:
    names = {exchange.name for exchange in router.exchanges()}
    for name in names:
        for binding in router.bindings(name):
            destination = binding.destination
            if destination.kind == EXCHANGE:
                assert destination.name in names  # bindings die with their destination
            else:
                assert destination.name in live_queues
            assert name in router.sources_of(destination)
    for name in names:
        exchange = router.get(name)
        assert exchange.table.exchange_destinations == len(
            {b.destination for b in exchange.table.bindings() if b.destination.kind == EXCHANGE}
        )


exchange_names = st.sampled_from(EXCHANGES)
queue_names = st.sampled_from(QUEUES)
keys = st.sampled_from(KEYS)
operation = st.one_of(
    st.tuples(
        st.just("declare"),
        st.sampled_from(EXCHANGES),
        st.sampled_from(["direct", "fanout"]),
        st.booleans(),
        st.sampled_from([None, *EXCHANGES, "missing"]),
    ),
    st.tuples(st.just("bind_queue"), exchange_names, queue_names, keys),
    st.tuples(st.just("bind_exchange"), exchange_names, exchange_names, keys),
    st.tuples(st.just("unbind_queue"), exchange_names, queue_names, keys),
    st.tuples(st.just("unbind_exchange"), exchange_names, exchange_names, keys),
    st.tuples(st.just("delete"), exchange_names),
    st.tuples(st.just("delete_queue"), queue_names),
    st.tuples(st.just("create_queue"), queue_names),
)


@settings(max_examples=300)
@given(st.lists(operation, max_size=60))
def test_routes_equal_the_reference_after_any_operations(operations: list[tuple]) -> None:
    live_queues = set(QUEUES)
    router = Router(queue_exists=live_queues.__contains__)
    for op in operations:
        kind = op[0]
        try:
            if kind == "declare":
                _, name, type_name, auto_delete, alternate = op
                arguments = {} if alternate is None else {"alternate-exchange": alternate}
                router.declare(name, type_name, auto_delete=auto_delete, arguments=arguments)
            elif kind == "bind_queue":
                router.bind_queue(op[1], op[2], op[3])
            elif kind == "bind_exchange":
                router.bind_exchange(op[1], op[2], op[3])
            elif kind == "unbind_queue":
                router.unbind_queue(op[1], op[2], op[3])
            elif kind == "unbind_exchange":
                router.unbind_exchange(op[1], op[2], op[3])
            elif kind == "delete":
                router.delete(op[1])
            elif kind == "delete_queue":
                live_queues.discard(op[1])
                router.queue_deleted(op[1])
            elif kind == "create_queue":
                live_queues.add(op[1])
        except RoutingError:
            # Inequivalent redeclares and binds to missing ends are refused; state is unchanged.
            pass
        assert_indexes_consistent(router, live_queues)
        for name in EXCHANGES:
            if router.get(name) is None:
                continue
            for key in KEYS:
                assert router.route(name, key) == reference_route(router, name, key)

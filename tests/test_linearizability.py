"""The linearizability checker on small histories whose answer is known by hand, and against
a brute-force checker on random small histories."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from warrenmq.cluster.raft.linearizability import UNKNOWN, KvModel, Operation, check


def put(client, key, value, call, ret):
    return Operation(client, ("put", key, value), call, None, ret)


def get(client, key, value, call, ret):
    return Operation(client, ("get", key), call, value, ret)


def ok(history):
    return check(history, KvModel()).ok


def test_empty_and_sequential_histories_are_linearizable():
    assert ok([]) is True
    assert ok([put(1, "k", "a", 1, 2), get(1, "k", "a", 3, 4), put(1, "k", "b", 5, 6)]) is True
    assert ok([get(1, "k", None, 1, 2)]) is True


def test_stale_read_after_write_returned_is_not_linearizable():
    history = [put(1, "k", "a", 1, 2), put(1, "k", "b", 3, 4), get(2, "k", "a", 5, 6)]
    result = check(history, KvModel())
    assert result.ok is False and result.failing_part is not None


def test_concurrent_read_may_see_either_value():
    assert ok([put(1, "k", "a", 1, 2), put(1, "k", "b", 3, 10), get(2, "k", "a", 4, 5)])
    assert ok([put(1, "k", "a", 1, 2), put(1, "k", "b", 3, 10), get(2, "k", "b", 4, 5)])


def test_reads_must_not_go_back_in_time():
    # While the write of b is in flight, one reader sees b and a later reader sees a again.
    history = [
        put(1, "k", "a", 1, 2),
        put(1, "k", "b", 3, 20),
        get(2, "k", "b", 4, 5),
        get(3, "k", "a", 6, 7),
    ]
    assert ok(history) is False


def test_read_of_a_value_never_written_is_not_linearizable():
    assert ok([put(1, "k", "a", 1, 2), get(2, "k", "zzz", 3, 4)]) is False
    assert ok([get(2, "k", "a", 1, 2), put(1, "k", "a", 3, 4)]) is False


def test_unknown_write_may_take_effect_late_or_never():
    lost = put(1, "k", "b", 3, None)
    assert ok([put(1, "k", "a", 1, 2), lost, get(2, "k", "a", 10, 11)])
    assert ok([put(1, "k", "a", 1, 2), lost, get(2, "k", "b", 10, 11)])
    assert (
        ok(
            [
                put(1, "k", "a", 1, 2),
                lost,
                get(2, "k", "b", 10, 11),
                get(2, "k", "a", 12, 13),
            ]
        )
        is False
    )
    # ...but never before it was called.
    assert ok([put(1, "k", "a", 1, 2), get(2, "k", "b", 3, 4), put(1, "k", "b", 5, None)]) is False


def test_unknown_read_output_constrains_nothing():
    assert ok([put(1, "k", "a", 1, 2), get(2, "k", UNKNOWN, 3, None)])


def test_keys_are_checked_independently():
    history = [put(1, "x", "a", 1, 2), put(1, "y", "b", 3, 4), get(2, "x", "a", 5, 6)]
    assert ok(history)
    history.append(get(2, "y", None, 7, 8))
    assert ok(history) is False


def test_search_bound_gives_undecided():
    history = [put(c, "k", f"v{c}", 1, 100) for c in range(12)] + [get(99, "k", "v3", 101, 102)]
    assert check(history, KvModel(), steps_max=5).ok is None
    assert check(history, KvModel()).ok is True


def brute_force(history):
    """Try every total order consistent with real time (tiny histories only)."""
    model = KvModel()
    known = [op for op in history if op.ret is not None]
    unknown = [op for op in history if op.ret is None]
    for k in range(len(unknown) + 1):
        for chosen in itertools.combinations(unknown, k):
            ops = known + list(chosen)
            for order in itertools.permutations(ops):
                legal = all(
                    not (b.ret is not None and b.ret < a.call)
                    for i, a in enumerate(order)
                    for b in order[i + 1 :]
                )
                if not legal:
                    continue
                state = model.init()
                for op in order:
                    good, state = model.step(state, op.input, op.output)
                    if not good:
                        break
                else:
                    return True
    return False


@st.composite
def small_histories(draw):
    n = draw(st.integers(1, 5))
    ops = []
    for i in range(n):
        call = draw(st.integers(0, 10))
        ret = draw(st.none() | st.integers(call + 1, 12))
        if draw(st.booleans()):
            ops.append(put(i, "k", draw(st.sampled_from("abc")), call, ret))
        elif ret is not None:
            ops.append(get(i, "k", draw(st.sampled_from(["a", "b", "c", None])), call, ret))
    return ops


@settings(max_examples=300)
@given(small_histories())
def test_agrees_with_brute_force(history):
    assert check(history, KvModel()).ok is brute_force(history)


def test_many_lost_writes_nobody_read_are_cheap():
    history = [put(c, "k", f"lost{c}", c, None) for c in range(60)]
    history += [put(99, "k", "a", 100, 101), get(98, "k", "a", 102, 103)]
    result = check(history, KvModel(), steps_max=1000)
    assert result.ok is True
    history.append(get(97, "k", "lost7", 104, 105))  # one was read: it must be placed
    assert check(history, KvModel()).ok is True
    history.append(get(97, "k", "a", 106, 107))  # ...and then "a" cannot come back
    assert check(history, KvModel()).ok is False

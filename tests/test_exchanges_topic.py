"""Topic exchange: RabbitMQ's word splitting, '*' and '#', checked against a reference."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warrenmq.exchanges.binding import QUEUE, Destination
from warrenmq.exchanges.topic import TopicExchange, split_topic_key


def q(name: str) -> Destination:
    return Destination(QUEUE, name)


def reference_words(key: str) -> list[str]:
    # RabbitMQ's split_topic_key/3, transcribed as a character loop: "" has no words, and
    # every '.' ends a word (so a trailing '.' leaves an empty last word).
    if key == "":
        return []
    words, word = [], ""
    for char in key:
        if char == ".":
            words.append(word)
            word = ""
        else:
            word += char
    words.append(word)
    return words


def reference_match(pattern: list[str], words: list[str]) -> bool:
    if not pattern:
        return not words
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        return reference_match(rest, words) or (bool(words) and reference_match(pattern, words[1:]))
    if not words:
        return False
    return (head == "*" or head == words[0]) and reference_match(rest, words[1:])


def regex_match(binding_key: str, routing_key: str) -> bool:
    """A second, independent reference: the pattern as a regex over '.'-joined words."""
    pattern_words = reference_words(binding_key)
    key_words = reference_words(routing_key)
    # Each word becomes "<word>/", so zero words is the empty string (no word holds a '/').
    subject = "".join(w + "/" for w in key_words)
    parts = []
    for w in pattern_words:
        if w == "#":
            parts.append("(?:[^/]*/)*")
        elif w == "*":
            parts.append("[^/]*/")
        else:
            parts.append(re.escape(w) + "/")
    return re.fullmatch("".join(parts), subject) is not None


words = st.sampled_from(["a", "b", "", "*", "#", "ab"])
key_words = st.sampled_from(["a", "b", "", "*", "#", "ab", "c"])
binding_keys = st.lists(words, max_size=6).map(".".join)
routing_keys = st.lists(key_words, max_size=7).map(".".join)


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("", []),
        ("a", ["a"]),
        ("a.b", ["a", "b"]),
        ("a..b", ["a", "", "b"]),
        (".", ["", ""]),
        ("a.", ["a", ""]),
        (".a", ["", "a"]),
        ("..", ["", "", ""]),
    ],
)
def test_split_topic_key_is_rabbitmqs(key: str, expected: list[str]) -> None:
    assert split_topic_key(key) == expected
    assert reference_words(key) == expected


@pytest.mark.parametrize(
    ("binding_key", "routing_key", "matches"),
    [
        ("a.b.c", "a.b.c", True),
        ("a.b.c", "a.b", False),
        ("a.*.c", "a.b.c", True),
        ("a.*.c", "a..c", True),  # '*' matches one empty word
        ("a.*.c", "a.c", False),
        ("*", "", False),  # "" is zero words, '*' needs one
        ("*", ".", False),  # "." is two empty words
        ("*.*", ".", True),
        ("", "", True),
        ("", "a", False),
        ("#", "", True),
        ("#", "a.b.c", True),
        ("#.#", "", True),
        ("a.#", "a", True),
        ("a.#", "a.b.c", True),
        ("a.#", "b.a", False),
        ("#.c", "c", True),
        ("#.c", "a.b.c", True),
        ("#.c", "a.b.c.d", False),
        ("a.#.c", "a.c", True),
        ("a.#.c", "a.b.b.c", True),
        ("a.#.#.c", "a.c", True),
        ("#.a.#", "a", True),
        ("#.a.#", "b.b.a.b", True),
        ("#.a.#", "b.b", False),
        ("*.#", "", False),
        ("#.*", "a", True),
        ("a.*", "a.*", True),  # routing-key wildcards are plain words
        ("a.b", "a.*", False),
        ("a.#", "a.#", True),
        ("a.b", "a.#", False),
        ("a.", "a", False),
        ("a.", "a.", True),
        ("a.*", "a.", True),
    ],
)
def test_topic_cases(binding_key: str, routing_key: str, matches: bool) -> None:
    table = TopicExchange()
    table.bind(q("q"), binding_key)
    assert (q("q") in table.match(routing_key, None)) is matches
    assert reference_match(reference_words(binding_key), reference_words(routing_key)) is matches
    assert regex_match(binding_key, routing_key) is matches


@given(binding_keys, routing_keys)
def test_the_two_references_agree(binding_key: str, routing_key: str) -> None:
    assert reference_match(
        reference_words(binding_key), reference_words(routing_key)
    ) == regex_match(binding_key, routing_key)


@settings(max_examples=300)
@given(st.lists(binding_keys, max_size=12), st.lists(routing_keys, min_size=1, max_size=5))
def test_matches_reference_for_many_bindings(keys: list[str], probes: list[str]) -> None:
    table = TopicExchange()
    for index, key in enumerate(keys):
        assert table.bind(q(str(index)), key)
    for routing_key in probes:
        expected = {
            q(str(index))
            for index, key in enumerate(keys)
            if reference_match(reference_words(key), reference_words(routing_key))
        }
        assert set(table.match(routing_key, None)) == expected


@settings(max_examples=200)
@given(
    st.lists(st.tuples(st.booleans(), st.integers(0, 3), binding_keys), max_size=30),
    st.lists(routing_keys, min_size=1, max_size=4),
)
def test_bind_unbind_sequences_keep_the_trie_exact(
    operations: list[tuple[bool, int, str]], probes: list[str]
) -> None:
    """Unbinding prunes the trie; after any sequence the table matches the live bindings."""
    table = TopicExchange()
    live: set[tuple[int, str]] = set()
    for is_bind, queue, key in operations:
        if is_bind:
            assert table.bind(q(str(queue)), key) is ((queue, key) not in live)
            live.add((queue, key))
        else:
            assert table.unbind(q(str(queue)), key) is ((queue, key) in live)
            live.discard((queue, key))
    assert len(table) == len(live)
    for routing_key in probes:
        expected = {
            q(str(queue))
            for queue, key in live
            if reference_match(reference_words(key), reference_words(routing_key))
        }
        assert set(table.match(routing_key, None)) == expected
    for queue, key in list(live):
        table.unbind(q(str(queue)), key)
    assert table._root.children == {}
    assert not table._root.destinations


def test_same_destination_through_two_patterns_is_counted_once_and_survives_one_unbind() -> None:
    table = TopicExchange()
    assert table.bind(q("q"), "a.*")
    assert table.bind(q("q"), "#")
    assert not table.bind(q("q"), "#")
    assert set(table.match("a.b", None)) == {q("q")}
    assert table.unbind(q("q"), "#")
    assert set(table.match("a.b", None)) == {q("q")}
    assert set(table.match("b", None)) == set()
    assert not table.unbind(q("q"), "#")


def test_same_key_different_arguments_are_two_bindings() -> None:
    table = TopicExchange()
    assert table.bind(q("q"), "a", {"k": 1})
    assert table.bind(q("q"), "a", {"k": True})  # bool is not 1 for RabbitMQ
    assert not table.bind(q("q"), "a", {"k": 1})
    assert len(table) == 2
    assert table.unbind(q("q"), "a", {"k": 1})
    assert set(table.match("a", None)) == {q("q")}
    assert table.unbind(q("q"), "a", {"k": True})
    assert set(table.match("a", None)) == set()


def test_many_hashes_against_a_long_key_stay_polynomial() -> None:
    # A depth-first trie walk (RabbitMQ's) is exponential here; the automaton is not.
    table = TopicExchange()
    table.bind(q("q"), ".".join(["#"] * 20 + ["x"]))
    table.bind(q("r"), ".".join(["#", "a"] * 10))
    routing_key = ".".join(["a"] * 200)
    assert set(table.match(routing_key, None)) == {q("r")}
    assert set(table.match(routing_key + ".x", None)) == {q("q")}


def test_unbind_destination_removes_all_its_patterns() -> None:
    table = TopicExchange()
    table.bind(q("q"), "a.#")
    table.bind(q("q"), "*.b")
    table.bind(q("r"), "a.b")
    assert table.unbind_destination(q("q")) == 2
    assert set(table.match("a.b", None)) == {q("r")}
    assert not table.has_destination(q("q"))

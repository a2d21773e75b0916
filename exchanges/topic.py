"""The topic exchange: binding keys are patterns over '.'-separated words.

Semantics are RabbitMQ's (rabbit_exchange_type_topic.erl, 3.10):

* keys split on every '.', so "a..b" is the three words "a", "", "b" and "a." ends with an
  empty word; the empty key "" is zero words (not one empty word);
* '*' matches exactly one word (an empty word included), '#' matches zero or more words, and
  anything else matches only itself; a '*' or '#' in a routing key is an ordinary word.

RabbitMQ walks a trie of binding words depth-first, which is exponential in the number of
'#' in a pattern. Here the same trie is run as a nondeterministic automaton: the set of trie
nodes reachable after each routing-key word, so a match costs O(words x live nodes).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from warrenmq.exchanges.binding import Binding, BindingTable, Destination, DestinationCounts

_STAR = "*"
_HASH = "#"
_NOTHING: Collection[Destination] = frozenset()


def split_topic_key(key: str) -> list[str]:
    """RabbitMQ's `split_topic_key`: "" is no words; otherwise split on every '.'."""
    return key.split(".") if key else []


class _Node:
    __slots__ = ("children", "destinations", "hash", "is_hash", "parent", "star", "word")

    def __init__(self, parent: _Node | None, word: str) -> None:
        self.parent = parent
        self.word = word
        # A '#' node can swallow further words while staying where it is.
        self.is_hash = word == _HASH and parent is not None
        self.children: dict[str, _Node] = {}
        # children["*"] and children["#"], kept apart so a match step needs no lookup for them.
        self.star: _Node | None = None
        self.hash: _Node | None = None
        self.destinations = DestinationCounts()

    def add_child(self, word: str) -> _Node:
        child = self.children[word] = _Node(self, word)
        if word == _STAR:
            self.star = child
        elif word == _HASH:
            self.hash = child
        return child

    def remove_child(self, word: str) -> None:
        del self.children[word]
        if word == _STAR:
            self.star = None
        elif word == _HASH:
            self.hash = None


class TopicExchange(BindingTable):
    type_name = "topic"

    __slots__ = ("_root",)

    def __init__(self) -> None:
        super().__init__()
        self._root = _Node(None, "")

    def match(
        self, routing_key: str, headers: Mapping[str, Any] | None = None
    ) -> Collection[Destination]:
        root = self._root
        live = [root] if root.hash is None else _with_hash_children([root])
        for word in split_topic_key(routing_key):
            step = []
            for node in live:
                child = node.children.get(word)
                if child is not None:
                    step.append(child)
                if node.star is not None:
                    step.append(node.star)
                if node.is_hash:
                    step.append(node)
            if not step:
                return _NOTHING
            if len(step) == 1 and step[0].hash is None:
                live = step
            else:
                live = _with_hash_children(step)
        if len(live) == 1:
            return live[0].destinations.counts.keys()
        found: set[Destination] = set()
        for node in live:
            if node.destinations:
                found.update(node.destinations.counts)
        return found

    def _index(self, binding_id: tuple, binding: Binding) -> None:
        node = self._root
        for word in split_topic_key(binding.routing_key):
            child = node.children.get(word)
            if child is None:
                child = node.add_child(word)
            node = child
        node.destinations.add(binding.destination)

    def _unindex(self, binding_id: tuple, binding: Binding) -> None:
        node = self._root
        for word in split_topic_key(binding.routing_key):
            node = node.children[word]
        node.destinations.remove(binding.destination)
        # Prune the now-empty tail so the automaton never walks dead branches.
        while node.parent is not None and not node.children and not node.destinations:
            node.parent.remove_child(node.word)
            node = node.parent


def _with_hash_children(nodes: list[_Node]) -> list[_Node]:
    """The nodes without repeats, plus every '#' child, transitively: '#' may match no word."""
    unique = dict.fromkeys(nodes)
    pending = [node.hash for node in unique if node.hash is not None]
    while pending:
        child = pending.pop()
        if child not in unique:
            unique[child] = None
            if child.hash is not None:
                pending.append(child.hash)
    return list(unique)

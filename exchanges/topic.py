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


def split_topic_key(key: str) -> list[str]:
    """RabbitMQ's `split_topic_key`: "" is no words; otherwise split on every '.'."""
    return key.split(".") if key else []


class _Node:
    __slots__ = ("children", "destinations", "is_hash", "parent", "word")

    def __init__(self, parent: _Node | None, word: str) -> None:
        self.parent = parent
        self.word = word
        # A '#' node can swallow further words while staying where it is.
        self.is_hash = word == _HASH and parent is not None
        self.children: dict[str, _Node] = {}
        self.destinations = DestinationCounts()


class TopicExchange(BindingTable):
    type_name = "topic"

    __slots__ = ("_root",)

    def __init__(self) -> None:
        super().__init__()
        self._root = _Node(None, "")

    def match(
        self, routing_key: str, headers: Mapping[str, Any] | None = None
    ) -> Collection[Destination]:
        live = _with_hash_children({self._root: None})
        for word in split_topic_key(routing_key):
            step: dict[_Node, None] = {}
            for node in live:
                children = node.children
                if children:
                    child = children.get(word)
                    if child is not None:
                        step[child] = None
                    child = children.get(_STAR)
                    if child is not None:
                        step[child] = None
                if node.is_hash:
                    step[node] = None
            if not step:
                return frozenset()
            live = _with_hash_children(step)
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
                child = node.children[word] = _Node(node, word)
            node = child
        node.destinations.add(binding.destination)

    def _unindex(self, binding_id: tuple, binding: Binding) -> None:
        node = self._root
        for word in split_topic_key(binding.routing_key):
            node = node.children[word]
        node.destinations.remove(binding.destination)
        # Prune the now-empty tail so the automaton never walks dead branches.
        while node.parent is not None and not node.children and not node.destinations:
            del node.parent.children[node.word]
            node = node.parent


def _with_hash_children(nodes: dict[_Node, None]) -> dict[_Node, None]:
    """Add the '#' children of every node, transitively: a '#' may match zero words."""
    pending = [node for node in nodes if _HASH in node.children]
    while pending:
        child = pending.pop().children[_HASH]
        if child not in nodes:
            nodes[child] = None
            if _HASH in child.children:
                pending.append(child)
    return nodes

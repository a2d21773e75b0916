"""The arrows of ARCHITECTURE.md: no import circle among `server/` modules (imports under
TYPE_CHECKING count), the queue never imports the session or the process, the core never
imports an adapter, and one adapter never imports another (HTTP reads AMQP sessions through
the protocols of `server/http/host.py`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS = {"warrenmq.server": ROOT / "server"}


def _module_name(path: Path) -> str:
    relative = path.relative_to(ROOT / "server").with_suffix("")
    parts = ["warrenmq", "server", *relative.parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path, name: str) -> set[str]:
    """Every warrenmq.server module `path` imports, at any depth of the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return {module for module in found if module.startswith("warrenmq.server")}


def server_graph() -> dict[str, set[str]]:
    paths = {_module_name(path): path for path in (ROOT / "server").rglob("*.py")}
    graph = {}
    for name, path in paths.items():
        # `from . import x` names a module or an attribute: keep what is a module.
        graph[name] = {module for module in _imports(path, name) if module in paths} - {name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return stack[stack.index(target) :] + [target]
            if target not in state and (found := visit(target)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_circle_among_server_modules():
    graph = server_graph()
    # A package imports its own modules to re-export them; that is not a circle of code.
    for name in graph:
        graph[name] = {target for target in graph[name] if not name.startswith(target + ".")}
    assert _cycle(graph) is None


@pytest.mark.parametrize(
    ("importer", "forbidden"),
    [
        ("warrenmq.server.queue", "warrenmq.server.session"),
        ("warrenmq.server.queue", "warrenmq.server.broker"),
        ("warrenmq.server.queue", "warrenmq.server.vhost"),
        ("warrenmq.server.vhost", "warrenmq.server.session"),
        ("warrenmq.server.vhost", "warrenmq.server.broker"),
        ("warrenmq.server.session", "warrenmq.server.broker"),
        ("warrenmq.server.metadata", "warrenmq.server.session"),
        ("warrenmq.server.metadata", "warrenmq.server.vhost"),
        ("warrenmq.server.bench", "warrenmq.server.vhost"),
        ("warrenmq.server.bench", "warrenmq.server.queue"),
        ("warrenmq.server.http", "warrenmq.server.session"),
        ("warrenmq.server.http", "warrenmq.server.broker"),
        ("warrenmq.server.vhost", "warrenmq.server.http"),
        ("warrenmq.server.queue", "warrenmq.server.http"),
        ("warrenmq.server.session", "warrenmq.server.http"),
        ("warrenmq.server.metadata", "warrenmq.server.http"),
    ],
)
def test_the_arrows_point_down(importer, forbidden):
    graph = server_graph()
    offending = {
        (name, target)
        for name, targets in graph.items()
        if name == importer or name.startswith(importer + ".")
        for target in targets
        if target == forbidden or target.startswith(forbidden + ".")
    }
    assert offending == set()

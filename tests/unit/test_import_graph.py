"""The import graph of geoedge/, edge/, origin/ and tunnel/: no circles (each is
a file split by size rather than by concern), no arrow from tunnel/ into the
shared package or the daemons, none between the two daemons, and none from the
shared package into a daemon. Every import counts, including the lazy ones inside functions and
those under TYPE_CHECKING: a circle hidden from the interpreter is still one
for the reader."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("geoedge", "edge", "origin", "tunnel")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    graph: dict[str, set[str]] = {name: set() for name in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names if a.name in mods}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    full = f"{target}.{alias.name}"
                    if full in mods:
                        graph[name].add(full)
                    elif target in mods:
                        graph[name].add(target)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_lazy_and_type_only_imports() -> None:
    graph = import_graph()
    assert "tunnel.mux.session" in graph["tunnel.aio.connection"] or any(
        m.startswith("tunnel.mux") for m in graph["tunnel.aio.connection"]
    )
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circles() -> None:
    assert circles(import_graph()) == []


def arrows(graph: dict[str, set[str]], source: str, targets: tuple[str, ...]) -> list[str]:
    """Every import from package ``source`` into one of the packages ``targets``."""
    return sorted(
        f"{name} -> {target}"
        for name, imported in graph.items()
        if name.split(".")[0] == source
        for target in imported
        if target.split(".")[0] in targets
    )


def test_tunnel_imports_neither_the_shared_package_nor_a_daemon() -> None:
    assert arrows(import_graph(), "tunnel", ("geoedge", "edge", "origin")) == []


def test_the_shared_package_imports_no_daemon() -> None:
    assert arrows(import_graph(), "geoedge", ("edge", "origin")) == []


def test_the_daemons_do_not_import_each_other() -> None:
    graph = import_graph()
    assert arrows(graph, "edge", ("origin",)) == []
    assert arrows(graph, "origin", ("edge",)) == []


def test_the_arrow_finder_sees_a_daemon_import() -> None:
    graph = {"tunnel.aio.x": {"geoedge.pki"}, "edge.a": {"origin.b", "tunnel.mux"}}
    assert arrows(graph, "tunnel", ("geoedge",)) == ["tunnel.aio.x -> geoedge.pki"]
    assert arrows(graph, "edge", ("origin",)) == ["edge.a -> origin.b"]

"""``tunnel.mux`` is sans-I/O (STYLE.md §1, DESIGN.md principle 1): no module in
it imports an event loop, a socket, TLS, a clock, or any layer above it."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import tunnel.mux

MUX_DIR = Path(tunnel.mux.__file__).parent
MODULES = sorted(MUX_DIR.glob("*.py"))

#: Top-level packages the multiplexer may never import.
FORBIDDEN = {
    "asyncio",
    "socket",
    "ssl",
    "selectors",
    "time",
    "datetime",
    "threading",
    "multiprocessing",
    "subprocess",
    "uvloop",
    "edge",
    "origin",
}
#: Packages inside ``tunnel`` it may never import: only the mux itself is below it.
FORBIDDEN_TUNNEL = {"tunnel.aio", "geoedge", "tunnel.peer_name", "tunnel.policy"}


def _imports(path: Path) -> list[str]:
    """Absolute names of every module ``path`` imports, wherever the import sits."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against tunnel.mux
                base = "tunnel.mux" if node.level == 1 else "tunnel"
                names.append(f"{base}.{node.module}" if node.module else base)
            else:
                names.append(node.module or "")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "__import__":
            names.append("<dynamic __import__>")
    return names


def test_the_package_has_the_expected_modules() -> None:
    names = {p.stem for p in MODULES}
    assert {"constants", "frames", "reader", "session", "stream", "window"} <= names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_module_imports_nothing_impure(path: Path) -> None:
    bad = []
    for name in _imports(path):
        top = name.split(".")[0]
        if top in FORBIDDEN or name == "<dynamic __import__>" or name == "importlib":
            bad.append(name)
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN_TUNNEL):
            bad.append(name)
        if top == "tunnel" and not (name == "tunnel.mux" or name.startswith("tunnel.mux.")):
            bad.append(name)
    assert bad == [], f"{path.name} imports {bad}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_module_imports_cleanly(path: Path) -> None:
    module = importlib.import_module(
        f"tunnel.mux.{path.stem}" if path.stem != "__init__" else "tunnel.mux"
    )
    assert module.__file__ is not None


def test_importing_the_mux_loads_no_io_module() -> None:
    """The AST check above, confirmed by what actually lands in sys.modules
    (``time`` is loaded by the interpreter itself, so it is left out here)."""
    code = (
        "import sys, tunnel.mux, tunnel.mux.session;"
        "print(','.join(sorted(m for m in ('asyncio', 'socket', 'ssl', 'selectors', 'uvloop',"
        " 'tunnel.aio', 'edge', 'origin', 'threading') if m in sys.modules)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=MUX_DIR.parent.parent,
        check=True,
    )
    assert result.stdout.strip() == ""

"""Which build of the hot modules runs: compiled (Cython) or pure Python.

DESIGN.md principle 15. Each module named in :data:`COMPILED_MODULES` is
Python that a reader follows; the platform wheel and ``make venv`` also
compile it with Cython in its pure-Python mode (the ``.pxd`` beside the
``.py`` declares the types) into an extension module of the same name in the
same folder, which Python's import system prefers to the ``.py``
(``hatch_build.py`` builds them). The pure-Python build is the reference: the
same tests run on both, and differential tests hold the two to the same
results (``tests/compiled.py``).

All or nothing: compiled modules use each other's types (a ``.pxd`` may
``cimport`` another's), so either every listed module is an extension or none
is. The choice is made once, when the first of ``tunnel``, ``edge`` or
``origin`` is imported (each package's ``__init__`` imports this module
first, before any listed module can be):

- ``GEOEDGE_NO_EXTENSIONS`` set to anything but ``""`` or ``"0"``: pure
  Python, as asked;
- an extension missing (installed from the sdist without a compiler, or the
  pure wheel), or older than its ``.py``/``.pxd`` (a checkout edited since
  ``make venv``): pure Python, and one warning line saying which and how to
  build;
- else compiled.

Run from a zip (``PYTHONPATH=geoedge-....whl``, the release tool's
bootstrap), nothing can load an extension: pure Python, silently.

Pure Python is enforced by a finder placed first on ``sys.meta_path`` that
loads the listed modules from their ``.py``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

__all__ = [
    "BINDINGS",
    "COMPILED_MODULES",
    "NO_EXTENSIONS_VARIABLE",
    "build_mode",
    "extensions_disabled",
    "load_binding",
    "load_pure",
]

#: The modules compiled, chosen by profile (README "Compiled modules" says
#: what each costs); ``hatch_build.py`` reads this list.
COMPILED_MODULES: tuple[str, ...] = (
    "edge.http1.syntax",
    "edge.http1.events",
    "edge.http1.head",
    "edge.http1.request_head",
    "edge.http1.response",
    "edge.http1.request",
    "edge.front_h1",
    "edge.front_h1_requests",
    "edge.front_h1_responses",
    "edge.exchange",
    "edge.exchange_upstream",
    "edge.ledger",
    "edge.front_h2",
    "edge.front_h2_requests",
    "edge.front_h2_stream",
    "edge.h2_decoder",
    "edge.h2_encoder",
    "edge.h2_fields",
    "edge.h2_translate",
    "tunnel.mux.frames",
    "tunnel.mux.reader",
    "tunnel.mux.session",
    "tunnel.mux.inbound",
    "tunnel.mux.outbound",
    "tunnel.mux.stream",
    "tunnel.mux.stream_table",
    "tunnel.mux.window",
    "tunnel.mux.receive_credit",
    "tunnel.mux.scheduler",
    "tunnel.mux.metadata",
    "tunnel.aio.stream",
    "tunnel.aio.connection",
    "tunnel.aio.connection_writer",
    "origin.forward",
    "origin.dispatch",
    "origin.balancer",
    "origin.keepalive",
    "origin.pool_queues",
    "edge.tls_transport",
    "edge.origins",
    "edge.exchange_rules",
    "tunnel.policy",
    "tunnel.aio.pool",
)

#: Cython bindings to C libraries (``.pyx``): module -> the system libraries
#: it links. Each is optional on its own, outside the all-or-nothing rule of
#: the list above: a machine without a library's headers builds the rest, and
#: the code that uses a binding has a pure-Python way to do the same
#: (:func:`load_binding`; :mod:`edge.h2_engine` for ``edge.h2_nghttp2``).
BINDINGS: dict[str, tuple[str, ...]] = {"edge.h2_nghttp2": ("nghttp2",)}

NO_EXTENSIONS_VARIABLE = "GEOEDGE_NO_EXTENSIONS"
ROOT = Path(__file__).resolve().parent.parent  # the folder holding tunnel/, edge/, origin/
CHECKOUT = (ROOT / "pyproject.toml").exists()  # a source tree (make venv), not site-packages


def extensions_disabled() -> bool:
    """``GEOEDGE_NO_EXTENSIONS`` asks for pure Python (at build and at import)."""
    return os.environ.get(NO_EXTENSIONS_VARIABLE, "") not in ("", "0")


def source_path(module: str) -> Path:
    return ROOT.joinpath(*module.split(".")).with_suffix(".py")


def extension_path(module: str) -> Path | None:
    """The module's built extension beside its source, if there is one."""
    source = source_path(module)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = source.with_name(source.stem + suffix)
        if candidate.exists():
            return candidate
    return None


def _why_pure(modules: Sequence[str]) -> str | None:
    """Why the compiled build cannot be used, or None when it can."""
    missing: list[str] = []
    stale: list[str] = []
    for module in modules:
        built = extension_path(module)
        if built is None:
            missing.append(module)
            continue
        if not CHECKOUT:
            continue  # installed from a wheel: built together, whatever the files' times
        source = source_path(module)
        built_at = built.stat().st_mtime
        if any(
            path.exists() and path.stat().st_mtime > built_at
            for path in (source, source.with_suffix(".pxd"))
        ):
            stale.append(module)
    if missing:
        return f"no compiled extension for {', '.join(missing)}"
    if stale:
        return f"compiled extension older than its source for {', '.join(stale)}"
    return None


class _PureFinder(importlib.abc.MetaPathFinder):
    """Loads every listed module from its ``.py``, never from an extension."""

    def __init__(self, modules: Sequence[str]) -> None:
        self._modules = frozenset(modules)

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        if fullname not in self._modules:
            return None
        return importlib.util.spec_from_file_location(fullname, source_path(fullname))


def _choose(modules: Sequence[str]) -> tuple[str, str | None]:
    """(the build mode, why pure when it is not by request), installing the
    finder when pure."""
    if not modules or not ROOT.is_dir():  # run from a zip (a wheel): no extension loads
        return "pure Python", None
    if extensions_disabled():
        reason = None
    else:
        reason = _why_pure(modules)
        if reason is None:
            return "compiled", None
    sys.meta_path.insert(0, _PureFinder(modules))
    return "pure Python", reason


_MODE, FALLBACK_REASON = _choose(COMPILED_MODULES)
if FALLBACK_REASON is not None:
    # One line on stderr (no logging: the sans-I/O mux below loads no threads).
    print(
        f"geoedge: running pure Python: {FALLBACK_REASON} "
        "(make venv, or pip install with a C compiler, builds it)",
        file=sys.stderr,
    )


def build_mode() -> str:
    """``"compiled"`` when the listed modules run as extensions, else ``"pure Python"``."""
    return _MODE


def load_binding(module: str) -> tuple[ModuleType | None, str]:
    """(the binding ``module``, one of :data:`BINDINGS`, or None; why not).
    None when pure Python is asked for, when it is not built, when it is
    older than its ``.pyx`` or the ``lib<library>.pxd`` beside it (a
    checkout edited since ``make venv``), or when it does not load (its
    library missing at run time)."""
    if extensions_disabled():
        return None, f"{NO_EXTENSIONS_VARIABLE} is set"
    source = source_path(module).with_suffix(".pyx")
    built = extension_path(module)
    if built is None:
        libraries = ", ".join(f"lib{name}" for name in BINDINGS[module])
        return None, f"{module} is not built (make venv, with {libraries} and its headers)"
    if CHECKOUT and source.exists():
        inputs = [source, *(source.with_name(f"lib{name}.pxd") for name in BINDINGS[module])]
        built_at = built.stat().st_mtime
        if any(path.exists() and path.stat().st_mtime > built_at for path in inputs):
            return None, f"{module} is older than its source (make venv builds it again)"
    try:
        return importlib.import_module(module), ""
    except ImportError as exc:
        return None, f"{module} does not load: {exc}"


def load_pure(module: str) -> ModuleType:
    """A fresh copy of ``module`` run from its ``.py`` under the name
    ``<module>_pure``, beside whatever build is imported: the other side of a
    differential test. Its own imports are the running build's."""
    name = module + "_pure"
    spec = importlib.util.spec_from_file_location(name, source_path(module))
    assert spec is not None and spec.loader is not None
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[name] = loaded  # dataclasses and pickling look a module up by name
    spec.loader.exec_module(loaded)
    return loaded

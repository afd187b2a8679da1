"""Helpers for tests of the two builds (tunnel.build_mode): is a compiler here,
and both implementations of a compiled module side by side (as yarl's and
multidict's fixtures do), for differential tests."""

from __future__ import annotations

import importlib
import shutil
import sysconfig
from pathlib import Path
from types import ModuleType

from tunnel.build_mode import extensions_disabled, load_pure

__all__ = ["builds", "compiler_available", "expected_build_mode"]


def compiler_available() -> bool:
    """A C compiler and the Python headers: what building the extensions needs."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    include = sysconfig.get_paths()["include"]
    return shutil.which(compiler) is not None and (Path(include) / "Python.h").exists()


def expected_build_mode() -> str:
    """What this run must be on: compiled wherever it can be, unless asked not to."""
    if extensions_disabled() or not compiler_available():
        return "pure Python"
    return "compiled"


def builds(module: str) -> tuple[ModuleType, ModuleType]:
    """(the running build of ``module``, its ``.py`` run beside it). In the
    compiled run that is the extension against the pure Python; in the pure
    run both are the ``.py`` (the compiled side is the compiled run's)."""
    return importlib.import_module(module), load_pure(module)

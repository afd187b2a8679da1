"""Helpers for tests of the two builds (tunnel.build_mode): is a compiler here,
and both implementations of a compiled module side by side (as yarl's and
multidict's fixtures do), for differential tests."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import ModuleType

from tunnel.build_mode import NO_EXTENSIONS_VARIABLE, extensions_disabled, load_pure

__all__ = [
    "builds",
    "compiler_available",
    "copy_checkout",
    "expected_build_mode",
    "run_in_checkout",
]


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


def run_in_checkout(cwd: Path, script: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``script`` in a fresh interpreter importing the packages found in
    ``cwd`` (not this run's ``GEOEDGE_NO_EXTENSIONS``, unless ``env`` sets it)."""
    environ = {
        k: v for k, v in os.environ.items() if k not in {NO_EXTENSIONS_VARIABLE, "PYTHONPATH"}
    }
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=cwd,
        env=environ | {"PYTHONPATH": str(cwd)} | env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )


ROOT = Path(__file__).resolve().parents[1]


def copy_checkout(destination: Path) -> Path:
    """The three packages as built here (extensions included), and
    pyproject.toml, copied to ``destination``: a checkout elsewhere."""
    for package in ("tunnel", "edge", "origin"):
        shutil.copytree(
            ROOT / package, destination / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", destination / "pyproject.toml")
    return destination

"""Which build runs (tunnel.build_mode, DESIGN.md principle 15): compiled
wherever a compiler is, pure Python when asked or when an extension is missing
or stale, all or nothing, one warning line when it falls back; and every
command says which."""

from __future__ import annotations

import ast
import importlib
import os
import re
from pathlib import Path

import pytest

from geoedge.cli import main as geoedge_main
from tests.compiled import compiler_available, copy_checkout, expected_build_mode, run_in_checkout
from tunnel.build_mode import (
    BINDINGS,
    COMPILED_MODULES,
    NO_EXTENSIONS_VARIABLE,
    build_mode,
    extension_path,
    load_pure,
)

ROOT = Path(__file__).resolve().parents[2]
PROBE = (
    "import json, sys, tunnel.build_mode as b, importlib;"
    "files = {m: importlib.import_module(m).__file__ for m in b.COMPILED_MODULES};"
    "print(json.dumps([b.build_mode(), files]))"
)


def _probe(cwd: Path, **env: str) -> tuple[str, dict[str, str], str]:
    """(build mode, each compiled module's file, stderr) of a fresh interpreter
    importing the packages found in ``cwd``."""
    import json

    result = run_in_checkout(cwd, PROBE, **env)
    mode, files = json.loads(result.stdout)
    return mode, files, result.stderr


def test_this_run_is_on_the_build_it_must_be() -> None:
    """``make test`` fails here when a compiler is present but the build came
    out pure (or stale: run ``make venv``)."""
    assert compiler_available() or build_mode() == "pure Python"
    assert build_mode() == expected_build_mode(), "the extensions are missing or stale: make venv"


def test_the_hot_path_is_listed_and_every_listed_module_has_its_source() -> None:
    assert {"edge.http1.head", "edge.exchange", "tunnel.mux.session"} <= set(COMPILED_MODULES)
    for module in COMPILED_MODULES:
        assert (ROOT / Path(*module.split("."))).with_suffix(".py").exists(), module


def test_asking_for_pure_python_loads_every_listed_module_from_its_source() -> None:
    mode, files, stderr = _probe(ROOT, **{NO_EXTENSIONS_VARIABLE: "1"})
    assert mode == "pure Python"
    assert all(path.endswith(".py") for path in files.values()), files
    assert stderr == ""  # asked for: no warning


@pytest.fixture
def built_copy(tmp_path: Path) -> Path:
    """The three packages with their built extensions, copied elsewhere (in
    the pure run too: ``GEOEDGE_NO_EXTENSIONS`` only chooses, the files are
    there)."""
    missing = [module for module in COMPILED_MODULES if extension_path(module) is None]
    if missing and not compiler_available():
        pytest.skip("no C compiler on this machine: nothing was compiled")
    assert not missing, f"no extension for {missing}: make venv"
    return copy_checkout(tmp_path)


def _edit_after_build(source: Path) -> None:
    built = next(source.parent.glob(source.stem + ".*.so"))
    later = built.stat().st_mtime + 60
    os.utime(source, (later, later))


def test_the_copy_runs_compiled(built_copy: Path) -> None:
    mode, files, stderr = _probe(built_copy)
    assert (mode, stderr) == ("compiled", "")
    assert not [path for path in files.values() if path.endswith(".py")]


def test_a_missing_extension_makes_every_module_pure_with_one_warning_line(
    built_copy: Path,
) -> None:
    missing = "edge.exchange"
    built = extension_path(missing)
    assert built is not None
    (built_copy / built.relative_to(ROOT)).unlink()
    mode, files, stderr = _probe(built_copy)
    assert mode == "pure Python"
    assert all(path.endswith(".py") for path in files.values()), files  # all or nothing
    assert stderr.count("\n") == 1 and missing in stderr and "pure Python" in stderr


def test_an_extension_older_than_its_source_is_not_used(built_copy: Path) -> None:
    stale = "tunnel.mux.session"
    source = built_copy / "tunnel" / "mux" / "session.py"
    _edit_after_build(source)
    mode, files, stderr = _probe(built_copy)
    assert mode == "pure Python" and files[stale].endswith(".py")
    assert "older than its source" in stderr and stale in stderr


def test_an_installed_build_is_not_judged_by_its_files_times(built_copy: Path) -> None:
    (built_copy / "pyproject.toml").unlink()  # site-packages: no checkout around it
    _edit_after_build(built_copy / "tunnel" / "mux" / "session.py")
    assert _probe(built_copy)[:1] == ("compiled",)


def test_load_pure_runs_the_source_beside_the_running_build() -> None:
    pure = load_pure("edge.http1.head")
    assert pure.__file__ is not None and pure.__file__.endswith("head.py")
    running = importlib.import_module("edge.http1.head")
    assert pure.HeadParser is not running.HeadParser


def test_version_says_which_build(capsys: pytest.CaptureFixture[str]) -> None:
    assert geoedge_main(["version"]) == 0
    assert capsys.readouterr().out.strip().endswith(f"({expected_build_mode()})")


def _pxd_classes(pxd: Path) -> dict[str, set[str]]:
    """``cdef class`` name -> the attributes its ``.pxd`` declares."""
    classes: dict[str, set[str]] = {}
    current: set[str] | None = None
    for line in pxd.read_text().splitlines():
        match = re.match(r"cdef class (\w+)", line)
        if match:
            current = classes.setdefault(match[1], set())
        elif current is not None and line.startswith("    cdef ") and "(" not in line:
            current.add(line.split()[-1])
        elif line and not line.startswith((" ", "#")):
            current = None
    return classes


def _slots(source: Path) -> dict[str, set[str]]:
    found = {}
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if (
                    isinstance(item, ast.Assign)
                    and getattr(item.targets[0], "id", "") == "__slots__"
                ):
                    found[node.name] = set(ast.literal_eval(item.value))
    return found


#: The .pxd files declaring a C library's API for a binding (lib<name>.pxd): no module's types.
LIBRARY_PXDS = {f"lib{library}.pxd" for libraries in BINDINGS.values() for library in libraries}
PXDS = sorted(
    p
    for package in ("tunnel", "edge", "origin")
    for p in (ROOT / package).rglob("*.pxd")
    if p.name not in LIBRARY_PXDS
)


@pytest.mark.parametrize("pxd", PXDS, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_typed_class_declares_exactly_its_slots(pxd: Path) -> None:
    """A compiled class has no ``__dict__``: an attribute its ``__slots__``
    gains and its ``.pxd`` lacks would fail only in the compiled build, at
    run time. Add it to the ``.pxd`` beside the ``.py``."""
    module = ".".join(pxd.relative_to(ROOT).with_suffix("").parts)
    assert module in COMPILED_MODULES, f"{pxd.name} types a module that is not compiled"
    slots = _slots(pxd.with_suffix(".py"))
    for name, declared in _pxd_classes(pxd).items():
        assert name in slots, f"{name} has no __slots__ in {pxd.with_suffix('.py').name}"
        assert declared == slots[name], f"{name}: .pxd and __slots__ differ"

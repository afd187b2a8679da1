"""Build hook: compile the hot modules with Cython into the wheel (hatchling).

Which modules: ``tunnel.build_mode.COMPILED_MODULES`` (read from that file,
without importing the package), each compiled from its own ``.py`` in
Cython's pure-Python mode, typed by the ``.pxd`` beside it.

The extensions are always built in place, beside their sources (ignored by
git), with Cython's C files kept in ``build/cython``: a second build compiles
only what changed, and the editable install (``make venv``), the wheels of
``make dist`` and the wheel test share one compilation.

- the editable install: the checkout is on ``sys.path``, the extensions with
  it; ``tunnel.build_mode`` refuses one older than its source;
- the standard wheel: the extensions go into it beside their sources, which
  makes it a platform wheel (``cp311-cp311-linux_x86_64``; ``make dist``
  repairs it to a manylinux tag);
- ``GEOEDGE_NO_EXTENSIONS=1``, or a build that fails (no C compiler, no
  Python headers): a pure-Python wheel (``py3-none-any``), and one warning
  line; it runs the same code, slower.

Why a hatchling hook rather than setuptools as the backend: the wheel's layout
(``deploy/`` shipped as ``geoedge/deploy``, ``dev-mode-dirs``) is hatchling's
configuration already; setuptools' ``build_ext`` is used here only for what it
is the ecosystem's tool for, driving the C compiler with the interpreter's
flags.
"""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

NO_EXTENSIONS_VARIABLE = "GEOEDGE_NO_EXTENSIONS"

#: Cython's directives for every module: the semantics of the pure-Python
#: build. Types come from the ``.pxd`` files alone (annotations are for mypy:
#: a ``float`` annotation would otherwise turn an ``int`` into a C double).
DIRECTIVES = {
    "language_level": 3,
    "annotation_typing": False,
    "embedsignature": True,
}


def compiled_modules(root: Path) -> tuple[str, ...]:
    """``COMPILED_MODULES`` as written in ``tunnel/build_mode.py``."""
    tree = ast.parse((root / "tunnel" / "build_mode.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "COMPILED_MODULES":
            assert node.value is not None
            return tuple(ast.literal_eval(node.value))
    raise RuntimeError("tunnel/build_mode.py names no COMPILED_MODULES")


def bindings(root: Path) -> dict[str, tuple[str, ...]]:
    """``BINDINGS`` as written in ``tunnel/build_mode.py``: module -> libraries."""
    tree = ast.parse((root / "tunnel" / "build_mode.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "BINDINGS":
            assert node.value is not None
            found: dict[str, tuple[str, ...]] = ast.literal_eval(node.value)
            return found
    raise RuntimeError("tunnel/build_mode.py names no BINDINGS")


# No debug information (a third of the compile time, smaller wheels); GCC 12
# warns of array bounds in code Cython generates for every int operation.
FLAGS = ["-g0", "-Wno-array-bounds"]


def build_extensions(root: Path) -> list[Path]:
    """Compile every extension in place, beside its source (only what changed
    since the last build), then each binding (:func:`build_bindings`);
    returns the files, relative to ``root``."""
    from setuptools import Extension

    sources = [
        Extension(name, [str(Path(*name.split(".")).with_suffix(".py"))], extra_compile_args=FLAGS)
        for name in compiled_modules(root)
    ]
    return _compile(root, sources) + build_bindings(root)


def build_bindings(root: Path) -> list[Path]:
    """Compile each binding to a C library (``BINDINGS``) on its own: one that
    fails (the library's headers are not installed) is left out with one
    line on stderr, and what uses it takes its pure-Python way."""
    from setuptools import Extension

    built: list[Path] = []
    for name, libraries in bindings(root).items():
        source = str(Path(*name.split(".")).with_suffix(".pyx"))
        extension = Extension(name, [source], libraries=list(libraries), extra_compile_args=FLAGS)
        try:
            built += _compile(root, [extension])
        except Exception as exc:
            print(
                f"geoedge: the binding {name} was not built ({type(exc).__name__}: {exc}); "
                f"install the headers of {', '.join('lib' + lib for lib in libraries)} for it",
                file=sys.stderr,
            )
    return built


def _compile(root: Path, sources: list[Any]) -> list[Path]:
    from Cython.Build import cythonize
    from setuptools import Distribution
    from setuptools.command.build_ext import build_ext

    scratch = root / "build" / "cython"
    modules = cythonize(
        sources,
        compiler_directives=DIRECTIVES,
        build_dir=str(scratch / "c"),
        nthreads=os.cpu_count() or 1,
        quiet=True,
    )
    command = build_ext(Distribution({"ext_modules": modules, "script_name": "hatch_build.py"}))
    command.inplace = True
    command.build_temp = str(scratch / "temp")
    command.parallel = os.cpu_count() or 1
    command.ensure_finalized()
    command.run()
    return [Path(command.get_ext_filename(ext.name)) for ext in modules]


class CompiledModulesHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        if os.environ.get(NO_EXTENSIONS_VARIABLE, "") not in ("", "0"):
            self.app.display_info(f"{NO_EXTENSIONS_VARIABLE} is set: a pure-Python wheel")
            return
        root = Path(self.root)
        cwd = os.getcwd()
        os.chdir(root)
        try:
            built = build_extensions(root)
        except Exception as exc:  # no compiler, no headers: the pure build is complete too
            print(
                f"geoedge: building the compiled modules failed ({type(exc).__name__}: {exc}); "
                "building pure Python",
                file=sys.stderr,
            )
            return
        finally:
            os.chdir(cwd)
        if version == "editable":
            return  # beside the sources, which the editable install puts on sys.path
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        for relative in built:
            build_data["force_include"][str(root / relative)] = str(relative)


def main() -> int:
    """``python hatch_build.py``: build the extensions in place, beside their
    sources (what ``make venv`` does after the editable install, so that a
    changed source is compiled again)."""
    if os.environ.get(NO_EXTENSIONS_VARIABLE, "") not in ("", "0"):
        print(f"{NO_EXTENSIONS_VARIABLE} is set: nothing compiled")
        return 0
    root = Path(__file__).resolve().parent
    os.chdir(root)
    built = build_extensions(root)
    print(f"built {len(built)} extension(s) in place")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

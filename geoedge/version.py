"""The installed geoedge version and build, and the ``--version`` option every command has."""

from __future__ import annotations

import argparse
from importlib import metadata

from tunnel import build_mode as _build

__all__ = ["add_version_option", "build_mode", "package_version", "version_line"]

DISTRIBUTION = "geoedge"


def package_version() -> str:
    """The version of the installed distribution (a wheel or an editable checkout).

    Package metadata is the one place the version is written (pyproject.toml);
    an import of the sources without any install reports that instead.
    """
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def build_mode() -> str:
    """``"compiled"`` when the hot modules run as Cython extensions, else
    ``"pure Python"`` (:mod:`tunnel.build_mode` says how it is chosen)."""
    return _build.build_mode()


def version_line() -> str:
    """``<version> (<build mode>)``, as ``--version`` and the start-up lines say it."""
    return f"{package_version()} ({build_mode()})"


def add_version_option(parser: argparse.ArgumentParser) -> None:
    """``--version``: print ``<prog> <version> (<build mode>)`` and exit 0."""
    parser.add_argument("--version", action="version", version=f"%(prog)s {version_line()}")

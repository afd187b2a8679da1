"""The installed geoedge version, the version this interpreter runs, the build
mode, and the ``--version`` option every command has."""

from __future__ import annotations

import argparse
import functools
from importlib import metadata

__all__ = ["add_version_option", "build_mode", "package_version", "running_version"]

DISTRIBUTION = "geoedge"


def package_version() -> str:
    """The version of the installed distribution (a wheel or an editable checkout),
    read from its metadata now.

    Package metadata is the one place the version is written (pyproject.toml);
    an import of the sources without any install reports that instead.
    """
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


@functools.cache
def running_version() -> str:
    """The version of the code this interpreter runs: the metadata as it was at
    the first call, which a daemon's supervisor makes when it starts (before it
    imports anything lazily or forks a worker).

    Why not read it again in each worker: workers are forked from the
    supervisor and run the code it imported. A ``pip install`` changes the
    metadata on disk at once but the running code only at the next reload
    (the supervisor re-executes itself, :mod:`geoedge.reload`); a worker
    restarted in between (a crash) would report the new version while running
    the old code. Each reload is a fresh interpreter, so this is what was
    installed when the code now running was loaded."""
    return package_version()


def build_mode() -> str:
    """How the per-request code runs: ``"pure Python"`` (this build).

    The compiled build (branch ``compiled``, issue 26) returns ``"compiled"``
    when its Cython extensions are loaded and the pure-Python path was not
    chosen (``GEOEDGE_NO_EXTENSIONS=1``); that branch fills in this body."""
    return "pure Python"


def add_version_option(parser: argparse.ArgumentParser) -> None:
    """``--version``: print ``<prog> <version>`` and exit 0."""
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")

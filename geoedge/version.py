"""The installed geoedge version, and the ``--version`` option every command has."""

from __future__ import annotations

import argparse
from importlib import metadata

__all__ = ["add_version_option", "package_version"]

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


def add_version_option(parser: argparse.ArgumentParser) -> None:
    """``--version``: print ``<prog> <version>`` and exit 0."""
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")

"""The deployment files that ship with geoedge, wherever geoedge is installed.

The wheel carries ``deploy/`` of the repository as package data under
``geoedge/deploy/`` (pyproject.toml, ``[tool.hatch.build]``), with the
locustfile at ``loadtests/locustfile.py`` beneath it. An editable install (a
checkout, ``make venv``) has no such directory; there the files are read from
the checkout's ``deploy/`` and ``loadtests/``. Callers name a file relative to
``deploy/`` (``"systemd/geoedge-edge.service"``) and never see which it was.

The Node.js sample app ships without ``node_modules``. :func:`prepare_node_app`
installs its one dependency (``ws``, pinned with its integrity hash in
``package-lock.json``) with ``npm ci`` into a cache directory on first use
rather than vendoring it in the wheel: the wheel then carries no third-party
JavaScript whose updates and licence we would have to track, and a user who
runs the sample app needs Node.js and npm anyway. After the first run the demo
works offline. A checkout where ``make node`` has run uses its own
``node_modules`` as is.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "NODE_APP_FILES",
    "AssetsError",
    "deploy_file",
    "deploy_root",
    "node_app_dir",
    "prepare_node_app",
]

_PACKAGED = Path(__file__).resolve().with_name("deploy")
_CHECKOUT = Path(__file__).resolve().parents[1]
_LOCUSTFILE = "loadtests/locustfile.py"

#: The sample app's own files: what ships and what is copied into the cache.
NODE_APP_FILES = ("server.js", "proxy.js", "package.json", "package-lock.json", "README.md")
_NODE_APP_READY = ".geoedge-ready"


class AssetsError(RuntimeError):
    """A shipped file is missing, or the sample app cannot be prepared; the
    message says which and what to do."""


def deploy_root() -> Path:
    """The directory holding the deployment files (packaged, else the checkout's)."""
    if _PACKAGED.is_dir():
        return _PACKAGED
    checkout = _CHECKOUT / "deploy"
    if checkout.is_dir():
        return checkout
    raise AssetsError(
        f"this installation carries no deployment files (looked in {_PACKAGED} and "
        f"{checkout}); reinstall geoedge from its wheel"
    )


def deploy_file(relative: str) -> Path:
    """The path of one shipped file, named relative to ``deploy/``."""
    root = deploy_root()
    if relative == _LOCUSTFILE and root != _PACKAGED:
        path = _CHECKOUT / _LOCUSTFILE
    else:
        path = root / relative
    if not path.is_file():
        raise AssetsError(f"{relative}: not shipped with this installation ({path})")
    return path


def node_app_dir() -> Path:
    """The sample app's shipped directory (``server.js``, ``package.json``, ...)."""
    return deploy_file("node-app/server.js").parent


def _cache_home() -> Path:
    explicit = os.environ.get("GEOEDGE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "geoedge"


def _app_digest(source: Path) -> str:
    digest = hashlib.sha256()
    for name in NODE_APP_FILES:
        digest.update(name.encode() + b"\0" + (source / name).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def prepare_node_app(*, log: Callable[[str], None] | None = None) -> Path:
    """A directory where ``node server.js PORT`` runs: the sample app with ``ws``.

    The checkout's own app when ``make node`` has installed its modules;
    otherwise a copy in ``$GEOEDGE_CACHE_DIR`` (default ``~/.cache/geoedge``),
    one per content of the app's files, set up once with ``npm ci`` and moved
    into place only when complete (an interrupted install is redone).
    """
    source = node_app_dir()
    if (source / "node_modules" / "ws").is_dir():
        return source
    target = _cache_home() / f"node-app-{_app_digest(source)}"
    if (target / _NODE_APP_READY).is_file():
        return target
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        raise AssetsError(
            "the sample app needs Node.js and npm (Debian: apt-get install nodejs npm)"
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():  # left incomplete by hand: rename would not replace it
        shutil.rmtree(target)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        for name in NODE_APP_FILES:
            shutil.copy2(source / name, staging / name)
        if log is not None:
            log(f"installing the sample app's dependencies (npm ci) into {target}")
        result = subprocess.run(
            [npm, "ci", "--omit=dev", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=staging,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if result.returncode != 0:
            raise AssetsError(
                f"npm ci for the sample app failed (status {result.returncode}):\n"
                f"{(result.stderr or result.stdout).strip()}"
            )
        (staging / _NODE_APP_READY).write_text(_app_digest(source) + "\n")
        try:
            staging.rename(target)
        except OSError:
            if not (target / _NODE_APP_READY).is_file():  # not a concurrent first run
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target

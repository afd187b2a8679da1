"""Versioned installs: each release in its own directory, ``current`` a link.

The one way geoedge is installed on a host (cloud-init, CloudFormation and
by hand all run it)::

    /opt/geoedge/
      releases/0.1.0-3f2a9c1b7d4e/   a virtual environment: the wheel and the
      releases/0.2.0-8e1d0a44c2b9/   dependencies pinned in its lock file
      current  -> releases/0.2.0-8e1d0a44c2b9
      previous -> releases/0.1.0-3f2a9c1b7d4e
    /usr/local/bin/geoedge-edge -> /opt/geoedge/current/bin/geoedge-edge  (and the others)

- ``install WHEEL``: a new virtual environment named after the wheel's
  version and the first 12 hex digits of its SHA-256 (two builds of one
  version do not collide), the dependencies from the lock file the wheel
  carries (``geoedge/deploy/requirements.lock``: exact versions with hashes,
  ``pip --require-hashes --no-deps``: nothing unpinned can slip in), then the
  wheel itself, then ``pip check``. A release that fails to install leaves
  nothing behind; one that is there already is not installed again.
- ``activate NAME`` switches ``current`` with one ``rename(2)`` (atomic: a
  process starting at that moment sees the old or the new release, never
  neither) and keeps the release it replaced as ``previous``.
- ``rollback`` activates ``previous``: ``current`` and ``previous`` swap.
- ``list`` shows the releases, which is current and which previous.

Switching the link changes nothing that runs: the daemons pick the new code
up when they are reloaded or restarted (docs/operations.md, "Upgrade and
roll back"). The units run ``/usr/local/bin/geoedge-*``, which resolve
through ``current`` at each start.

This module uses the standard library only, so a host with nothing but
``python3`` can run it straight from the wheel, before any geoedge is
installed (pip is started the same way)::

    PYTHONPATH=geoedge-0.2.0-py3-none-any.whl python3 -m geoedge.release install \\
        geoedge-0.2.0-py3-none-any.whl --activate
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DEFAULT_ROOT",
    "LOCK_IN_WHEEL",
    "Release",
    "ReleaseError",
    "activate",
    "install",
    "list_releases",
    "main",
    "rollback",
]

DEFAULT_ROOT = Path("/opt/geoedge")
DEFAULT_BIN_DIR = Path("/usr/local/bin")
#: Where the wheel carries its lock file (deploy/requirements.lock in the repository).
LOCK_IN_WHEEL = "geoedge/deploy/requirements.lock"
#: The commands linked into ``--bin-dir``, through ``current``.
COMMANDS = ("geoedge", "geoedge-edge", "geoedge-origin")
#: Written last into a release directory: its presence means the install finished.
MANIFEST = "release.json"
_WHEEL_NAME = re.compile(r"(?P<name>geoedge)-(?P<version>[^-]+)-.+\.whl")


class ReleaseError(Exception):
    """An install, activation or rollback that cannot be done; the message says why."""


@dataclass(frozen=True, slots=True)
class Release:
    """One installed release (a directory under ``releases/``)."""

    name: str
    """``<version>-<first 12 hex digits of the wheel's SHA-256>``."""
    version: str
    wheel_sha256: str
    path: Path
    current: bool = False
    previous: bool = False


def wheel_release_name(wheel: Path) -> tuple[str, str, str]:
    """(release name, version, sha256) of a geoedge wheel file."""
    match = _WHEEL_NAME.fullmatch(wheel.name)
    if match is None:
        raise ReleaseError(f"{wheel}: not a geoedge wheel (geoedge-<version>-...whl)")
    digest = hashlib.sha256()
    with wheel.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    sha = digest.hexdigest()
    version = match.group("version")
    return f"{version}-{sha[:12]}", version, sha


def _lock_from_wheel(wheel: Path, into: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as archive:
            data = archive.read(LOCK_IN_WHEEL)
    except KeyError:
        raise ReleaseError(f"{wheel}: carries no {LOCK_IN_WHEEL} (pass --lock)") from None
    except zipfile.BadZipFile as exc:
        raise ReleaseError(f"{wheel}: {exc}") from None
    path = into / "requirements.lock"
    path.write_bytes(data)
    return path


def _run(argv: Sequence[str], what: str) -> None:
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip()[-3000:]
        raise ReleaseError(f"{what} failed (exit {done.returncode}):\n{output}")


def install(
    wheel: Path,
    *,
    root: Path = DEFAULT_ROOT,
    lock: Path | None = None,
    python: str = sys.executable,
    pip_args: Sequence[str] = (),
) -> Release:
    """Install ``wheel`` and its locked dependencies into a release directory of
    its own under ``root/releases``; the release (installed now or before)."""
    wheel = wheel.resolve()
    if not wheel.is_file():
        raise ReleaseError(f"{wheel}: no such wheel file")
    name, version, sha = wheel_release_name(wheel)
    releases = root / "releases"
    target = releases / name
    if (target / MANIFEST).is_file():
        return _read_release(target, root)
    if target.exists():  # an install that died half-way: start again
        shutil.rmtree(target)
    releases.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="geoedge-release-") as scratch:
        lock_file = lock if lock is not None else _lock_from_wheel(wheel, Path(scratch))
        try:
            # At its final path: a virtual environment cannot be moved afterwards.
            _run([python, "-m", "venv", str(target)], "creating the virtual environment")
            pip = [str(target / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
            locked = ["install", "-q", "--no-deps", "--require-hashes", "-r", str(lock_file)]
            _run(
                [*pip, *locked, *pip_args],
                f"installing the locked dependencies ({lock_file.name})",
            )
            _run(
                [*pip, "install", "-q", "--no-deps", "--no-index", str(wheel)],
                f"installing {wheel.name}",
            )
            _run([*pip, "check"], "pip check (the locked set is consistent)")
            shutil.copyfile(lock_file, target / "requirements.lock")
            manifest = {
                "version": version,
                "wheel": wheel.name,
                "wheel_sha256": sha,
                "python": python,
                "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            (target / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        except BaseException:
            shutil.rmtree(target, ignore_errors=True)
            raise
    return _read_release(target, root)


def _read_release(path: Path, root: Path) -> Release:
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError) as exc:
        raise ReleaseError(f"{path}: not a finished release ({exc})") from None
    return Release(
        name=path.name,
        version=str(manifest["version"]),
        wheel_sha256=str(manifest["wheel_sha256"]),
        path=path,
        current=_link_target(root / "current") == path.name,
        previous=_link_target(root / "previous") == path.name,
    )


def _link_target(link: Path) -> str | None:
    """The release name a ``current``/``previous`` link points at, if any."""
    try:
        return Path(os.readlink(link)).name
    except OSError:
        return None


def _switch_link(link: Path, target: str) -> None:
    """Point ``link`` at ``releases/<target>`` with one atomic rename."""
    temporary = link.with_name(f".{link.name}.{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()
    temporary.symlink_to(Path("releases") / target)
    os.replace(temporary, link)


def list_releases(root: Path = DEFAULT_ROOT) -> list[Release]:
    """Every finished release under ``root``, oldest install first."""
    releases = root / "releases"
    if not releases.is_dir():
        return []
    found = [
        _read_release(path, root)
        for path in releases.iterdir()
        if path.is_dir() and (path / MANIFEST).is_file()
    ]
    return sorted(found, key=lambda r: (r.path / MANIFEST).stat().st_mtime)


def activate(name: str, *, root: Path = DEFAULT_ROOT, bin_dir: Path | None = None) -> Release:
    """Make release ``name`` (a directory name, or a version installed once) current;
    the one it replaces becomes ``previous``. ``bin_dir``: link the commands there."""
    release = _find(name, root)
    old = _link_target(root / "current")
    if old != release.name:
        _switch_link(root / "current", release.name)
        if old is not None and (root / "releases" / old).is_dir():
            _switch_link(root / "previous", old)
    if bin_dir is not None:
        link_commands(root, bin_dir)
    return _read_release(release.path, root)


def rollback(*, root: Path = DEFAULT_ROOT) -> Release:
    """Activate ``previous`` (which then becomes the one rolled back from)."""
    previous = _link_target(root / "previous")
    if previous is None or not (root / "releases" / previous / MANIFEST).is_file():
        raise ReleaseError(f"{root}: no previous release to roll back to")
    return activate(previous, root=root)


def link_commands(root: Path, bin_dir: Path) -> list[Path]:
    """``bin_dir/geoedge*`` -> ``root/current/bin/geoedge*`` (made once; they
    follow ``current`` from then on)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    made = []
    for command in COMMANDS:
        link = bin_dir / command
        temporary = link.with_name(f".{command}.{os.getpid()}")
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        temporary.symlink_to(root / "current" / "bin" / command)
        os.replace(temporary, link)
        made.append(link)
    return made


def _find(name: str, root: Path) -> Release:
    releases = list_releases(root)
    exact = [r for r in releases if r.name == name]
    if exact:
        return exact[0]
    by_version = [r for r in releases if r.version == name]
    if len(by_version) == 1:
        return by_version[0]
    known = ", ".join(r.name for r in releases) or "none"
    if by_version:
        raise ReleaseError(f"version {name} has several builds: name one of {known}")
    raise ReleaseError(f"no release {name!r} under {root / 'releases'} (installed: {known})")


# ------------------------------------------------------------------------ command line


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(
        prog="geoedge release", description="versioned installs with a current link"
    )
    parser.add_argument(
        "--root", type=Path, default=DEFAULT_ROOT, help="install root (/opt/geoedge)"
    )
    sub = parser.add_subparsers(title="release commands", metavar="COMMAND", required=True)
    inst = sub.add_parser("install", help="install a wheel into a release directory of its own")
    inst.add_argument("wheel", type=Path)
    inst.add_argument(
        "--lock", type=Path, help="the lock file (default: the one the wheel carries)"
    )
    inst.add_argument(
        "--python", default=sys.executable, help="interpreter of the release (default: this one)"
    )
    inst.add_argument("--activate", action="store_true", help="make it current once installed")
    inst.add_argument("--bin-dir", type=Path, help=f"link the commands there ({DEFAULT_BIN_DIR})")
    inst.set_defaults(handler=_cmd_install)
    act = sub.add_parser("activate", help="make an installed release current")
    act.add_argument("name", help="a release directory name, or a version installed once")
    act.add_argument("--bin-dir", type=Path, help="link the commands there")
    act.set_defaults(handler=_cmd_activate)
    back = sub.add_parser("rollback", help="make the previous release current again")
    back.set_defaults(handler=_cmd_rollback)
    show = sub.add_parser("list", help="the installed releases")
    show.set_defaults(handler=_cmd_list)
    return parser


def _next_step(release: Release) -> None:
    print(f"current: {release.name} (geoedge {release.version})")
    print(
        "running daemons keep the code they started with: "
        "systemctl reload geoedge-edge (or geoedge-origin) to run it"
    )


def _cmd_install(args: argparse.Namespace) -> int:
    release = install(args.wheel, root=args.root, lock=args.lock, python=args.python)
    print(f"installed {release.name} in {release.path}")
    if args.activate:
        _next_step(activate(release.name, root=args.root, bin_dir=args.bin_dir))
    elif args.bin_dir is not None:
        link_commands(args.root, args.bin_dir)
    return 0


def _cmd_activate(args: argparse.Namespace) -> int:
    _next_step(activate(args.name, root=args.root, bin_dir=args.bin_dir))
    return 0


def _cmd_rollback(args: argparse.Namespace) -> int:
    _next_step(rollback(root=args.root))
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    for release in list_releases(args.root):
        mark = "current" if release.current else "previous" if release.previous else ""
        print(f"{release.name:<32} {release.version:<12} {mark}".rstrip())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except ReleaseError as exc:
        print(f"geoedge release: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

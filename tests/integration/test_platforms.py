"""The supported Pythons, as far as this machine has them (issue 28).

geoedge supports CPython 3.11 and newer (Debian 12: 3.11, Ubuntu 24.04: 3.12,
Ubuntu 22.04 and Amazon Linux 2023 with their 3.11 packages; docs/deployment.md,
"Supported platforms"). The suite itself runs on the machine's 3.11; here the
wheel is installed the one way hosts install it (``geoedge.release`` from the
wheel, dependencies from its lock file with hashes) under every other CPython
3.11+ found on this machine (on PATH, or pyenv's), and each install imports
every module and checks a config of both daemons made by its own ``geoedge
init`` with certificates from its own ``geoedge pki``. An interpreter this
machine does not have is skipped, saying so.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import scaled
from tests.integration.test_release_upgrade import VERSION, build_wheel, clean_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(scaled(900))]

#: Minor versions beyond the suite's own that the lock file covers.
ALL_OTHER_MINORS = ("3.12", "3.13")
#: The ones this run tries: ``make test`` (CI) takes 3.12 only, the Python of
#: Ubuntu 24.04, the one supported platform whose Python differs from the
#: suite's (each minor costs a locked install, ~100 s, of CI's 25 minutes);
#: ``make test-platforms`` sets ``GEOEDGE_TEST_PYTHONS`` to every minor.
OTHER_MINORS = tuple(
    minor for minor in os.environ.get("GEOEDGE_TEST_PYTHONS", "3.12").split(",") if minor.strip()
)


def find_python(minor: str) -> str | None:
    """pyenv's build of ``minor``, else one on PATH (not a pyenv shim, which
    runs only the version pyenv selects)."""
    pattern = os.path.expanduser(f"~/.pyenv/versions/{minor}.*/bin/python{minor}")
    candidates = sorted(glob.glob(pattern))
    if candidates:
        return candidates[-1]
    found = shutil.which(f"python{minor}")
    return found if found is not None and "/shims/" not in found else None


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(VERSION, tmp_path_factory.mktemp("platform-wheel"))


@pytest.mark.parametrize("minor", OTHER_MINORS)
def test_the_wheel_installs_from_its_lock_and_runs_on(
    minor: str, wheel: Path, tmp_path: Path
) -> None:
    python = find_python(minor)
    if python is None:
        pytest.skip(f"no python{minor} on this machine (PATH or ~/.pyenv)")
    root, bin_dir = tmp_path / "opt", tmp_path / "bin"
    env = clean_env() | {"PYTHONPATH": str(wheel)}
    install = subprocess.run(
        [python, "-m", "geoedge.release", "--root", str(root), "install", str(wheel),
         "--python", python, "--activate", "--bin-dir", str(bin_dir)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=scaled(600),
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr
    venv_python = root / "current" / "bin" / "python"
    version = subprocess.run(
        [str(venv_python), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert version == minor

    def run(command: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(bin_dir / command), *args], cwd=tmp_path, env=clean_env(),
            capture_output=True, text=True, timeout=scaled(120),
        )  # fmt: skip

    # Every module imports under this Python (compiled extensions included).
    imports = subprocess.run(
        [str(venv_python), "-c",
         "import pkgutil, importlib, edge, origin, tunnel, geoedge\n"
         "for pkg in (edge, origin, tunnel, geoedge):\n"
         "    for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
         "        if m.name != 'geoedge.demo': importlib.import_module(m.name)\n"],
        cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=scaled(120),
    )  # fmt: skip
    assert imports.returncode == 0, imports.stderr

    etc, ca = tmp_path / "etc", str(tmp_path / "ca")
    steps = [
        ["geoedge", "init", "edge", "--out", str(tmp_path / "edge"), "--id", "tokyo-1",
         "--etc", str(etc)],
        ["geoedge", "init", "origin", "--out", str(tmp_path / "origin"), "--etc", str(etc)],
        ["geoedge", "pki", "init", "--dir", ca],
        ["geoedge", "pki", "peer", "--dir", ca, "--role", "edge", "--id", "tokyo-1",
         "--out-dir", str(etc / "pki")],
        ["geoedge", "pki", "peer", "--dir", ca, "--role", "origin", "--id", "origin-1",
         "--out", "origin", "--out-dir", str(etc / "pki")],
        ["geoedge", "pki", "server", "--dir", ca, "--name", "app.example.com",
         "--out", "app-ecdsa", "--out-dir", str(etc / "tls")],
    ]  # fmt: skip
    for command, *args in steps:
        result = run(command, *args)
        assert result.returncode == 0, f"{command} {args}: {result.stderr}"
    shutil.copy(tmp_path / "ca" / "ca.pem", etc / "pki" / "ca.pem")
    for role in ("edge", "origin"):
        config = tmp_path / role / f"{role}.toml"
        check = run(f"geoedge-{role}", "--config", str(config), "--check")
        assert check.returncode == 0, check.stderr
        assert check.stdout.startswith(f"{config}: ok"), check.stdout
    assert sys.version_info[:2] != tuple(int(x) for x in minor.split("."))

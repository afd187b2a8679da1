"""deploy/requirements.lock pins every runtime dependency pyproject.toml names.

A dependency added to pyproject.toml without ``make lock`` installs nowhere
the lock is used (every release, cloud-init, CloudFormation): the release's
``pip check`` refuses it on the host, at install time. This catches it here.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "deploy" / "requirements.lock"


def _name(requirement: str) -> str:
    """PEP 503 normalised name of a requirement string."""
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement.strip())
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


def locked() -> dict[str, list[str]]:
    """Each pinned name: the lines of its entry (the pin and its hashes)."""
    entries: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in LOCK.read_text().splitlines():
        if m := re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==", line):
            current = entries.setdefault(_name(m.group(1)), [])
        if current is not None and line.strip():
            current.append(line)
    return entries


def test_every_runtime_dependency_is_pinned_with_hashes() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    entries = locked()
    missing = [r for r in project["dependencies"] if _name(r) not in entries]
    assert not missing, f"not in {LOCK.name} (run `make lock`): {missing}"
    unhashed = [n for n, lines in entries.items() if not any("--hash=sha256:" in x for x in lines)]
    assert not unhashed, f"pinned without a hash: {unhashed}"

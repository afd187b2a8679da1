"""A reload's config check (:mod:`geoedge.reload`): this process's own command
line with ``--check``, run by a fresh interpreter, so the code on disk now
checks the config on disk now, and binds what the running daemon does not
hold (:func:`geoedge.listening.check_bindable`)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence

from geoedge.listening import HELD_ENV
from geoedge.reexec import own_command

__all__ = ["CHECK_TIMEOUT_S", "check_command", "run_check"]

#: How long the ``--check`` of a reload may take.
CHECK_TIMEOUT_S = 60.0


def check_command(argv: Sequence[str] | None = None) -> list[str]:
    """This process's command (:func:`geoedge.reexec.own_command`) with
    ``--check``: run by a fresh interpreter, the one a re-exec would run."""
    return [*own_command(argv), "--check"]


def run_check(
    command: Sequence[str], held: Sequence[str] = (), timeout_s: float = CHECK_TIMEOUT_S
) -> tuple[bool, list[str]]:
    """Run the config check; (passed, its message lines). ``held``: the
    addresses this supervisor listens on: the check binds any other the new
    config wants (:func:`geoedge.listening.check_bindable`)."""
    # The check must not write into the workers' metrics directory.
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    env[HELD_ENV] = ",".join(held)
    try:
        done = subprocess.run(
            list(command),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return False, [f"the config check took more than {timeout_s:g} s"]
    except OSError as exc:
        return False, [f"cannot run the config check: {exc}"]
    lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
    return done.returncode == 0, lines

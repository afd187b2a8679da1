"""``python -m loadtests.callgrind_shim <module> [args]``: run a daemon's module
under valgrind's callgrind so that :mod:`loadtests.hop_instructions` can count
one worker's instructions over a span of requests.

Two things valgrind 3.19 (Debian 12's) cannot do for a forked worker, done here:

- ``callgrind_control`` reaches only the process valgrind started, not the
  workers it forks, so counting is switched by signals the worker handles
  itself through callgrind's client requests (``valgrind/callgrind.h``, a
  five-line C library built on first use and loaded with ctypes):
  ``SIGRTMIN+3`` zeroes the counts and starts counting, ``SIGRTMIN+4`` writes
  them out (a dump file per signal, numbered).
- valgrind answers ENOSYS to ``pidfd_open``, which the supervisor needs
  (:mod:`geoedge.workers`): the emulated pidfd is the read end of a pipe that
  a thread makes readable once the process has exited (``waitid`` with
  ``WNOWAIT``: the supervisor still reaps it itself).

Measurement only; never in a daemon's own start-up.
"""

from __future__ import annotations

import ctypes
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType

START_SIGNAL = signal.SIGRTMIN + 3
DUMP_SIGNAL = signal.SIGRTMIN + 4
_C_SOURCE = """
#include <valgrind/callgrind.h>
void geoedge_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void geoedge_dump(void) { CALLGRIND_DUMP_STATS; }
"""
_pids: dict[int, int] = {}


def _library() -> ctypes.CDLL:
    directory = Path(tempfile.gettempdir()) / "geoedge-callgrind-shim"
    directory.mkdir(exist_ok=True)
    library = directory / "shim.so"
    if not library.exists():
        source = directory / "shim.c"
        source.write_text(_C_SOURCE)
        building = directory / f"shim.{os.getpid()}.so"
        subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-o", str(building), str(source)],
                       check=True)  # fmt: skip
        building.replace(library)
    return ctypes.CDLL(str(library))


def _pidfd_open(pid: int, flags: int = 0) -> int:
    read_end, write_end = os.pipe()
    _pids[read_end] = pid

    def wait() -> None:
        try:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        finally:
            os.write(write_end, b"x")
            os.close(write_end)

    threading.Thread(target=wait, name=f"pidfd-{pid}", daemon=True).start()
    return read_end


def _pidfd_send_signal(fd: int, sig: int, siginfo: object = None, flags: int = 0) -> None:
    os.kill(_pids[fd], sig)


def main() -> None:
    library = _library()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        (library.geoedge_start if signum == START_SIGNAL else library.geoedge_dump)()

    signal.signal(START_SIGNAL, on_signal)
    signal.signal(DUMP_SIGNAL, on_signal)
    os.pidfd_open = _pidfd_open
    signal.pidfd_send_signal = _pidfd_send_signal
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()

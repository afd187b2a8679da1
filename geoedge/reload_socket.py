"""The reload socket's protocol (:mod:`geoedge.reload`), and its client,
``--reload PID`` (the units' ``ExecReload=``).

The socket is abstract (``@geoedge/<pid>/reload``: no file to clean up, gone
with the process) and answers only root and the daemon's own user
(``SO_PEERCRED``). The client sends ``reload\\n``; the supervisor sends lines
of text, the last one starting with ``ok``, ``refused`` (the config was bad:
nothing changed) or ``failed``, then closes.
"""

from __future__ import annotations

import socket
import sys
import time

__all__ = ["FAILED", "OK", "REFUSED", "reload_socket_name", "request_reload"]

#: What a reload ended with: ``ok``, ``refused`` (bad config) or ``failed``.
OK, REFUSED, FAILED = "ok", "refused", "failed"


def reload_socket_name(pid: int) -> str:
    """The abstract socket address of the supervisor ``pid`` (leading NUL)."""
    return f"\0geoedge/{pid}/reload"


def request_reload(pid: int, *, timeout_s: float, prog: str) -> int:
    """``--reload PID`` (``ExecReload=``): ask supervisor ``pid`` to reload and
    wait for the outcome, printing what it says; the exit status: 0 done, 2 the
    config was refused, 1 anything else (failed, no answer, no such daemon)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.settimeout(timeout_s)
    try:
        sock.connect(reload_socket_name(pid))
    except OSError as exc:
        print(
            f"{prog}: cannot reach the reload socket of pid {pid} ({exc.strerror or exc}): "
            "not a running geoedge supervisor, or one from before in-place reloads "
            "(restart it once)",
            file=sys.stderr,
        )
        sock.close()
        return 1
    deadline = time.monotonic() + timeout_s
    received = b""
    last = ""
    try:
        sock.sendall(b"reload\n")
        while True:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
            *lines, received = received.split(b"\n")
            for line in lines:
                last = line.decode(errors="replace")
                print(f"{prog}: {last}", file=sys.stderr, flush=True)
    except TimeoutError:
        print(
            f"{prog}: no outcome after {timeout_s:g} s (the reload may go on: see the log)",
            file=sys.stderr,
        )
        return 1
    except OSError as exc:
        print(f"{prog}: the reload socket failed: {exc}", file=sys.stderr)
        return 1
    finally:
        sock.close()
    result = last.split(" ", 1)[0]
    if result == OK:
        return 0
    if result == REFUSED:
        return 2
    if result != FAILED:
        print(f"{prog}: the supervisor closed without an outcome", file=sys.stderr)
    return 1

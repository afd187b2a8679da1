"""The prefork supervisor with real forked workers: start, control messages,
restarts with backoff, signal forwarding, the stop deadline, inherited
descriptors. Workers report to a file the test reads.

A test that signals the supervisor's own process runs it in a child process
(:func:`in_child`): a handler regression then kills that child and fails its
test, not the whole pytest run."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import signal
import socket
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest
import uvloop

from geoedge.worker_fds import fds_opened_since, open_fds, release_fds
from geoedge.workers import (
    Supervisor,
    WorkerContext,
    listen_control,
    resolve_worker_count,
)
from tests.conftest import run_async, scaled
from tunnel.policy import Backoff

FAST = Backoff(base_s=0.05, cap_s=0.2)


def report(path: Path, line: str) -> None:
    with path.open("a") as out:
        out.write(line + "\n")


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def until(condition: object, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + scaled(timeout)
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


def fd_targets() -> list[str]:
    """What this process's descriptors refer to (``socket:[inode]``, a path, ...)."""
    targets = []
    for name in os.listdir("/proc/self/fd"):
        try:
            targets.append(os.readlink(f"/proc/self/fd/{name}"))
        except OSError:  # listdir's own descriptor, closed by now
            pass
    return targets


def fd_target(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


def serving_worker(
    path: Path,
    *,
    ignore_term: bool = False,
    parent_fd: tuple[int, int] | None = None,
    report_fds: bool = False,
    usr1: bool = False,
):
    """A worker that reports its life and every control message to ``path``
    (and, with ``report_fds``, what its descriptors refer to, before it starts)."""

    def main(context: WorkerContext) -> int:
        async def run() -> int:
            loop = asyncio.get_running_loop()
            stop = asyncio.Event()
            if not ignore_term:
                loop.add_signal_handler(signal.SIGTERM, stop.set)
            else:
                loop.add_signal_handler(signal.SIGTERM, lambda: None)
            loop.add_signal_handler(signal.SIGHUP, lambda: report(path, f"hup {context.index}"))
            if usr1:
                for sig in (signal.SIGUSR1, signal.SIGUSR2):
                    loop.add_signal_handler(
                        sig, lambda s=int(sig): report(path, f"usr {s} {context.index}")
                    )
            if parent_fd is not None:  # (fd, inode): the number itself may be reused
                try:
                    same = os.fstat(parent_fd[0]).st_ino == parent_fd[1]
                except OSError:
                    same = False
                report(path, "parent fd open" if same else "parent fd closed")
            if report_fds:
                report(path, f"fds {context.index} {json.dumps(fd_targets())}")
            await listen_control(
                context,
                lambda m: report(path, f"msg {context.index} {m['n']}"),
                lambda: report(path, "parent gone"),
            )
            report(path, f"started {context.index} {os.getpid()} {context.parent_pid}")
            await stop.wait()
            report(path, f"stopped {context.index}")
            return 0

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(run())

    return main


def started(path: Path) -> list[str]:
    return [line for line in lines(path) if line.startswith("started")]


def count(path: Path, prefix: str) -> int:
    return sum(line.startswith(prefix) for line in lines(path))


def in_child(scenario: Callable[[], None], timeout: float = 30.0) -> None:
    """Run ``scenario`` in a forked child (the signals it sends to its own
    process hit the child); re-raise its failure here, with its traceback."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, then leave without running pytest's exit
        os.close(read_fd)
        status = 0
        try:
            scenario()
        except BaseException:
            os.write(write_fd, traceback.format_exc().encode())
            status = 1
        os._exit(status)
    os.close(write_fd)
    deadline = time.monotonic() + scaled(timeout)
    try:
        while (waited := os.waitpid(pid, os.WNOHANG))[0] == 0:
            assert time.monotonic() < deadline, "the child did not finish in time"
            time.sleep(0.02)
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    finally:
        with os.fdopen(read_fd, "rb") as pipe:
            told = pipe.read().decode()
    code = os.waitstatus_to_exitcode(waited[1])
    assert code == 0, f"the child ended with {code}:\n{told}"


def test_worker_count_zero_means_cpus() -> None:
    assert resolve_worker_count(3) == 3
    assert resolve_worker_count(0) == len(os.sched_getaffinity(0))


def test_workers_start_get_messages_and_stop_on_sigterm(tmp_path: Path) -> None:
    in_child(lambda: _start_messages_and_sigterm(tmp_path))


def _start_messages_and_sigterm(tmp_path: Path) -> None:
    path = tmp_path / "report"
    reloads: list[int] = []
    exits: list[tuple[int, int]] = []
    supervisor = Supervisor(
        serving_worker(path),
        workers=2,
        restart_backoff=FAST,
        on_reload=lambda: reloads.append(1),
        on_worker_exit=lambda pid, code: exits.append((pid, code)),
    )

    async def main() -> None:
        task = asyncio.get_running_loop().create_task(supervisor.run())
        await until(lambda: len(started(path)) == 2)
        assert supervisor.all_running
        supervisor.broadcast({"n": 1})
        supervisor.broadcast({"n": 2})
        await until(lambda: sum(line.startswith("msg") for line in lines(path)) == 4)
        os.kill(os.getpid(), signal.SIGHUP)
        await until(lambda: sum(line.startswith("hup") for line in lines(path)) == 2)
        assert reloads == [1]
        os.kill(os.getpid(), signal.SIGTERM)  # the supervisor's handler, not pytest's death
        await asyncio.wait_for(task, 10)

    run_async(main(), 20)
    report_lines = lines(path)
    for index in (0, 1):
        assert [x for x in report_lines if x.startswith(f"msg {index}")] == [
            f"msg {index} 1",
            f"msg {index} 2",
        ]
        assert f"stopped {index}" in report_lines
    assert all(line.split()[3] == str(os.getpid()) for line in started(path))
    assert sorted(code for _, code in exits) == [0, 0]
    assert supervisor.statistics().running == 0 and supervisor.statistics().restarts == 0


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGUSR2])
def test_sigusr_reaches_the_workers_and_kills_none(tmp_path: Path, sig: int) -> None:
    # The daemons' workers reopen logs on SIGUSR1 and log a memory report on
    # SIGUSR2; one that does not take the signal (or not yet) must ignore it,
    # not die of it.
    in_child(lambda: _sigusr(tmp_path, sig))


def _sigusr(tmp_path: Path, sig: int) -> None:
    path = tmp_path / "report"
    takes_it, does_not = serving_worker(path, usr1=True), serving_worker(path)

    def worker(context: WorkerContext) -> int:
        return (takes_it if context.index == 0 else does_not)(context)

    exits: list[int] = []
    supervisor = Supervisor(
        worker, workers=2, restart_backoff=FAST, on_worker_exit=lambda pid, code: exits.append(code)
    )

    async def main() -> None:
        task = asyncio.get_running_loop().create_task(supervisor.run())
        try:
            await until(lambda: len(started(path)) == 2)
            os.kill(os.getpid(), sig)
            await until(lambda: f"usr {int(sig)} 0" in lines(path))
            # Worker 1 does not take the signal. It was signalled before this
            # message was sent, so its answer shows it outlived the signal.
            supervisor.broadcast({"n": 1})
            await until(lambda: "msg 1 1" in lines(path))
            assert supervisor.statistics().running == 2
            assert supervisor.statistics().restarts == 0
        finally:
            os.kill(os.getpid(), signal.SIGTERM)
            await asyncio.wait_for(task, 10)

    run_async(main(), 20)
    assert sorted(exits) == [0, 0]


def test_a_dead_worker_is_restarted_with_backoff(tmp_path: Path) -> None:
    path = tmp_path / "report"
    crash_marker = tmp_path / "crashed"
    serve = serving_worker(path)

    def flaky(context: WorkerContext) -> int:
        if not crash_marker.exists():
            crash_marker.write_text("x")
            return 3  # dies at once, the first time
        return serve(context)

    exits: list[int] = []
    supervisor = Supervisor(
        flaky, workers=1, restart_backoff=FAST, on_worker_exit=lambda pid, code: exits.append(code)
    )

    async def main() -> None:
        task = asyncio.get_running_loop().create_task(supervisor.run())
        await until(lambda: len(started(path)) == 1)
        assert supervisor.statistics().restarts == 1
        pid = int(started(path)[0].split()[2])
        os.kill(pid, signal.SIGKILL)  # a crash while serving
        await until(lambda: len(started(path)) == 2)
        assert supervisor.statistics().restarts == 2
        supervisor.stop()
        await asyncio.wait_for(task, 10)

    run_async(main(), 20)
    assert exits == [3, -signal.SIGKILL, 0]


def test_workers_that_ignore_sigterm_are_killed_after_the_deadline(tmp_path: Path) -> None:
    path = tmp_path / "report"
    exits: list[int] = []
    supervisor = Supervisor(
        serving_worker(path, ignore_term=True),
        workers=1,
        stop_timeout_s=0.3,
        on_worker_exit=lambda pid, code: exits.append(code),
    )

    async def main() -> float:
        task = asyncio.get_running_loop().create_task(supervisor.run())
        await until(lambda: len(started(path)) == 1)
        began = time.monotonic()
        supervisor.stop()
        supervisor.stop()  # idempotent
        await asyncio.wait_for(task, 10)
        return time.monotonic() - began

    took = run_async(main(), 20)
    assert exits == [-signal.SIGKILL]
    assert took > 0.25  # it waited for the deadline before killing


def test_parent_descriptors_are_closed_in_workers(tmp_path: Path) -> None:
    path = tmp_path / "report"
    read_fd, write_fd = os.pipe()
    try:
        supervisor = Supervisor(
            serving_worker(path, parent_fd=(read_fd, os.fstat(read_fd).st_ino)),
            workers=1,
            parent_fds=lambda: [read_fd],
        )

        async def main() -> None:
            task = asyncio.get_running_loop().create_task(supervisor.run())
            await until(lambda: len(started(path)) == 1)
            supervisor.stop()
            await asyncio.wait_for(task, 10)

        run_async(main(), 20)
        assert "parent fd closed" in lines(path)
        os.fstat(read_fd)  # still open here
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_a_restarted_worker_inherits_only_what_was_open_when_run_started(
    tmp_path: Path,
) -> None:
    path = tmp_path / "report"
    before_r, before_w = os.pipe()  # open before run(): every worker inherits it
    supervisor = Supervisor(serving_worker(path, report_fds=True), workers=1, restart_backoff=FAST)
    later: list[socket.socket] = []

    def worker_fds(nth: int) -> list[str]:
        return json.loads([x for x in lines(path) if x.startswith("fds ")][nth].split(" ", 2)[2])

    async def main() -> None:
        task = asyncio.get_running_loop().create_task(supervisor.run())
        try:
            await until(lambda: len(started(path)) == 1)
            # The parent opens a connection of its own (an admin client, say) ...
            later.extend(socket.socketpair())
            # ... then its worker dies and is forked again.
            os.kill(int(started(path)[0].split()[2]), signal.SIGKILL)
            await until(lambda: len(started(path)) == 2)
            restarted = worker_fds(1)
            assert fd_target(before_r) in restarted and fd_target(before_w) in restarted
            assert fd_target(later[0].fileno()) not in restarted
            assert fd_target(later[1].fileno()) not in restarted
            # The parent is done with the connection: its peer sees EOF, which it
            # would not if the restarted worker held a copy.
            later[0].close()
            later[1].settimeout(5)
            assert later[1].recv(1) == b""
        finally:
            supervisor.stop()
            await asyncio.wait_for(task, 10)

    try:
        run_async(main(), 30)
    finally:
        for pid in supervisor.statistics().pids:  # only if stopping timed out
            os.kill(pid, signal.SIGKILL)
        for sock in later:
            sock.close()
        os.close(before_r)
        os.close(before_w)


def test_descriptors_opened_since_a_record_are_released(tmp_path: Path) -> None:
    kept_r, kept_w = os.pipe()
    reused = os.open(tmp_path / "first", os.O_CREAT | os.O_RDWR)
    record = open_fds()
    assert record is not None and {kept_r, kept_w, reused} <= record.keys()
    other = os.open(tmp_path / "second", os.O_CREAT | os.O_RDWR)
    os.dup2(other, reused)  # the same number, now for another file
    os.close(other)
    sock_a, sock_b = socket.socketpair()
    try:
        now = open_fds()
        assert now is not None
        opened = fds_opened_since(record, now, keep={sock_a.fileno()})
        assert opened == sorted([reused, sock_b.fileno()])
        release_fds(opened)
        assert fd_target(reused) == fd_target(sock_b.fileno()) == os.devnull  # numbers kept
        sock_a.settimeout(5)
        assert sock_a.recv(1) == b""  # nothing holds the other end any more
        assert fd_target(kept_r).startswith("pipe:")
        assert fds_opened_since({}, {0: (1, 1), 1: (1, 2), 2: (1, 3)}, keep=()) == []
    finally:
        for fd in (kept_r, kept_w, reused):
            os.close(fd)
        sock_a.close()
        sock_b.close()


def test_release_skips_numbers_this_process_may_not_use() -> None:
    """valgrind keeps its own files above the open-file limit it shows the
    process, and /proc/self/fd lists them: a worker started under it must not
    die replacing one (dup2 answers EBADF there), and the others still go."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    read_fd, write_fd = os.pipe()
    try:
        release_fds([read_fd, soft + 3])
        assert fd_target(read_fd) == os.devnull
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_listen_control_reports_messages_and_parent_gone() -> None:
    async def main() -> tuple[list[object], int]:
        read_fd, write_fd = os.pipe()
        messages: list[object] = []
        gone = asyncio.Event()
        transport = await listen_control(
            WorkerContext(0, read_fd, os.getpid()), messages.append, gone.set
        )
        os.write(write_fd, b'{"op": "a"}\nnot json\n{"op":')
        os.write(write_fd, b' "b"}\n')
        os.close(write_fd)
        await asyncio.wait_for(gone.wait(), 5)
        transport.close()
        return messages, len(messages)

    messages, _ = run_async(main(), 10)
    assert messages == [{"op": "a"}, {"op": "b"}]


@pytest.mark.parametrize("workers", [1])
def test_stop_before_start_returns(workers: int) -> None:
    supervisor = Supervisor(lambda context: 0, workers=workers)

    async def main() -> None:
        supervisor.stop()
        await asyncio.wait_for(supervisor.run(), 5)

    run_async(main(), 10)
    assert supervisor.statistics().running == 0


def test_a_reload_the_parent_refuses_is_not_forwarded(tmp_path: Path) -> None:
    """``on_reload`` returning False: the parent logged the problem once, the
    workers are not signalled (each would log it again) and keep serving."""
    in_child(lambda: _reload_refused(tmp_path))


def _reload_refused(tmp_path: Path) -> None:
    path = tmp_path / "report"
    verdicts = [False, True]
    supervisor = Supervisor(
        serving_worker(path), workers=2, restart_backoff=FAST, on_reload=lambda: verdicts.pop(0)
    )

    async def main() -> None:
        task = asyncio.get_running_loop().create_task(supervisor.run())
        await until(lambda: len(started(path)) == 2)
        os.kill(os.getpid(), signal.SIGHUP)  # refused
        await until(lambda: verdicts == [True])  # the parent has judged it
        # A SIGHUP forwarded with the refusal would reach each worker before
        # this message, sent after it: once both answer, it would have shown.
        supervisor.broadcast({"n": 1})
        await until(lambda: count(path, "msg") == 2)
        assert count(path, "hup") == 0
        os.kill(os.getpid(), signal.SIGHUP)  # accepted
        await until(lambda: count(path, "hup") == 2)
        supervisor.broadcast({"n": 2})
        await until(lambda: count(path, "msg") == 4)
        assert count(path, "hup") == 2  # one each, for the accepted reload only
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(task, 10)

    run_async(main(), 20)
    assert verdicts == []


def test_a_cap_per_host_becomes_each_workers_share() -> None:
    from geoedge.workers import worker_share

    assert [worker_share(10_000, n) for n in (1, 2, 3, 8)] == [10_000, 5_000, 3_334, 1_250]
    assert worker_share(3, 8) == 1  # every worker may hold one
    assert worker_share(0, 8) == 0  # no cap stays no cap

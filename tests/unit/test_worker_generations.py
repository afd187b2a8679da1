"""A reload's two generations of workers, with real forked processes: a
supervisor adopts the workers of the one before it (what a re-exec hands
over), the new workers take over only once each reported ready, the old
ones are then retired (SIGTERM, SIGKILL past the deadline), never restarted,
and a new generation that never gets ready replaces nothing."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import uvloop

from geoedge.workers import AdoptedWorker, Supervisor, WorkerContext, report_ready
from tests.conftest import run_async
from tests.unit.test_runtime_workers import FAST, lines, serving_worker, started, until


def ready_when(path: Path, marker: Path, *, crash: bool = False):  # type: ignore[no-untyped-def]
    """A worker that reports ready once ``marker`` exists (or dies at once, ``crash``)."""

    def main(context: WorkerContext) -> int:
        if crash:
            return 3

        async def run() -> int:
            loop = asyncio.get_running_loop()
            stop = asyncio.Event()
            loop.add_signal_handler(signal.SIGTERM, stop.set)
            with path.open("a") as out:
                out.write(f"started {context.index} {os.getpid()} takeover={context.takeover}\n")
            while not marker.exists() and not stop.is_set():
                await asyncio.sleep(0.02)
            if not stop.is_set():
                report_ready(context)
            await stop.wait()
            with path.open("a") as out:
                out.write(f"stopped {context.index}\n")
            return 0

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(run())

    return main


async def first_generation(
    path: Path, *, ignore_term: bool = False
) -> tuple[Supervisor, list[AdoptedWorker]]:
    """Two workers under a supervisor that then hands them over (and is dropped)."""
    first = Supervisor(
        serving_worker(path, ignore_term=ignore_term), workers=2, restart_backoff=FAST
    )
    task = asyncio.get_running_loop().create_task(first.run())
    await until(lambda: len(started(path)) == 2)
    adopted = first.handover()
    task.cancel()  # the old image is gone; its workers are not
    await asyncio.gather(task, return_exceptions=True)
    return first, adopted


def test_new_workers_take_over_only_once_every_one_is_ready(tmp_path: Path) -> None:
    old_path, new_path, marker = tmp_path / "old", tmp_path / "new", tmp_path / "ready"
    taken_over: list[int] = []
    exits: list[tuple[int, int]] = []

    async def main() -> None:
        _, adopted = await first_generation(old_path)
        old_pids = sorted(w.pid for w in adopted)
        second = Supervisor(
            ready_when(new_path, marker),
            workers=2,
            restart_backoff=FAST,
            adopted=adopted,
            on_generation_ready=lambda: taken_over.append(1),
            on_worker_exit=lambda pid, code: exits.append((pid, code)),
        )
        task = asyncio.get_running_loop().create_task(second.run())
        try:
            await until(lambda: len(started(new_path)) == 2)
            stats = second.statistics()
            assert sorted(stats.previous) == old_pids and stats.ready == 0
            await asyncio.sleep(0.3)  # the new ones run, not ready: the old ones serve on
            assert not [x for x in lines(old_path) if x.startswith("stopped")]
            assert not taken_over and not second.generation_ready
            marker.write_text("go")
            await until(lambda: taken_over == [1])
            await until(lambda: len([x for x in lines(old_path) if x.startswith("stopped")]) == 2)
            await until(lambda: not second.statistics().retiring)
            assert second.statistics().ready == 2 and second.statistics().restarts == 0
        finally:
            second.stop()
            await asyncio.wait_for(task, 10)
        # The old workers exited cleanly and were reaped by the new supervisor.
        assert sorted(pid for pid, code in exits if pid in old_pids) == old_pids
        assert all(code == 0 for _, code in exits)

    run_async(main(), 40)
    assert all(x.endswith("takeover=True") for x in started(new_path))


def test_a_generation_that_never_gets_ready_replaces_nothing(tmp_path: Path) -> None:
    """New workers that die at start (a bug in the new code) are restarted with
    backoff while the old ones keep serving; a stop still ends them all."""
    old_path, new_path = tmp_path / "old", tmp_path / "new"
    exits: list[int] = []

    async def main() -> None:
        _, adopted = await first_generation(old_path)
        second = Supervisor(
            ready_when(new_path, tmp_path / "never", crash=True),
            workers=2,
            restart_backoff=FAST,
            adopted=adopted,
            on_worker_exit=lambda pid, code: exits.append(code),
        )
        task = asyncio.get_running_loop().create_task(second.run())
        try:
            await until(lambda: second.statistics().restarts >= 4)
            assert len(second.statistics().previous) == 2
            assert not [x for x in lines(old_path) if x.startswith("stopped")]
        finally:
            second.stop()
            await asyncio.wait_for(task, 10)
        assert len([x for x in lines(old_path) if x.startswith("stopped")]) == 2

    run_async(main(), 40)
    assert exits.count(3) >= 4 and exits.count(0) == 2


def test_a_retiring_worker_that_ignores_sigterm_is_killed_at_its_deadline(tmp_path: Path) -> None:
    old_path, new_path, marker = tmp_path / "old", tmp_path / "new", tmp_path / "ready"
    marker.write_text("go")
    exits: dict[int, int] = {}

    async def main() -> list[int]:
        _, adopted = await first_generation(old_path, ignore_term=True)
        second = Supervisor(
            ready_when(new_path, marker),
            workers=1,
            stop_timeout_s=0.5,
            restart_backoff=FAST,
            adopted=adopted,
            on_worker_exit=lambda pid, code: exits.__setitem__(pid, code),
        )
        task = asyncio.get_running_loop().create_task(second.run())
        try:
            await until(lambda: all(w.pid in exits for w in adopted))
            assert second.statistics().running == 1  # the new one serves on
        finally:
            second.stop()
            await asyncio.wait_for(task, 10)
        return [w.pid for w in adopted]

    old_pids = run_async(main(), 40)
    assert [exits[pid] for pid in old_pids] == [-signal.SIGKILL, -signal.SIGKILL]

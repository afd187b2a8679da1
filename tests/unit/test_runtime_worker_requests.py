"""Requests from the parent to its workers and their answers
(:mod:`geoedge.worker_requests`), with real forked workers: one answer per
worker, a failing handler, a worker that does not answer in time, one that
dies while asked, an answer too large for the pipe; and the parts alone: the
reply reader's line bound, the cap on pending requests."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest
import uvloop

from geoedge.worker_requests import (
    MAX_PENDING_REQUESTS,
    MAX_REPLY_BYTES,
    PendingRequests,
    ReplyReader,
    TooManyRequests,
    WorkerAnswer,
)
from geoedge.workers import Supervisor, WorkerContext, listen_control
from tests.conftest import run_async, scaled
from tests.unit.test_runtime_workers import FAST, lines, report, until


def answering_worker(path: Path):
    """A worker that answers requests: ``echo`` with its slot and pid,
    ``fail`` by raising, ``hang`` (in slot 1 only) never, ``big`` with more
    than the reply pipe carries."""

    def main(context: WorkerContext) -> int:
        async def on_request(message: dict[str, Any]) -> dict[str, Any]:
            op = message["op"]
            if op == "fail":
                raise ValueError("internal detail")
            if op == "hang" and context.index == 1:
                report(path, f"hanging {os.getpid()}")
                await asyncio.Event().wait()
            if op == "big":
                return {"blob": "x" * (MAX_REPLY_BYTES + 10)}
            return {"index": context.index, "pid": os.getpid(), "x": message.get("x")}

        async def run() -> int:
            stop = asyncio.Event()
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
            await listen_control(context, lambda m: None, stop.set, on_request)
            report(path, f"started {context.index}")
            await stop.wait()
            return 0

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(run())

    return main


def test_requests_gather_one_answer_per_worker(tmp_path: Path) -> None:
    path = tmp_path / "report"
    supervisor = Supervisor(answering_worker(path), workers=2, restart_backoff=FAST)

    async def main() -> None:
        task = asyncio.get_running_loop().create_task(supervisor.run())
        await until(lambda: sum(line.startswith("started") for line in lines(path)) == 2)
        pids = supervisor.statistics().pids
        answers = await supervisor.request({"op": "echo", "x": 7}, scaled(10))
        assert answers == [
            WorkerAnswer(0, pids[0], {"index": 0, "pid": pids[0], "x": 7}),
            WorkerAnswer(1, pids[1], {"index": 1, "pid": pids[1], "x": 7}),
        ]
        failed = await supervisor.request({"op": "fail"}, scaled(10))
        assert [(a.result, a.error) for a in failed] == [(None, "ValueError")] * 2
        big = await supervisor.request({"op": "big"}, scaled(10))
        assert [a.error for a in big] == ["ReplyTooLarge"] * 2
        # Slot 0 answers, slot 1 never does: the wait ends at its timeout (long
        # enough for slot 0 on a loaded machine: it is the positive check).
        hung = await supervisor.request({"op": "hang"}, scaled(3))
        assert hung[0].result is not None and hung[0].result["index"] == 0
        assert hung[1] == WorkerAnswer(1, pids[1], error="timeout")
        # A worker that dies while asked ends its part of the wait at once.
        waiting = asyncio.ensure_future(supervisor.request({"op": "hang"}, 3600))
        await until(lambda: sum(line.startswith("hanging") for line in lines(path)) == 2)
        os.kill(pids[1], signal.SIGKILL)
        exited = await waiting
        assert exited[1] == WorkerAnswer(1, pids[1], error="exited")
        await until(lambda: supervisor.all_running)  # restarted; it answers again
        await until(lambda: sum(line.startswith("started") for line in lines(path)) == 3)
        again = await supervisor.request({"op": "echo"}, scaled(10))
        assert [a.result is not None for a in again] == [True, True]
        supervisor.stop()
        await asyncio.wait_for(task, 10)

    run_async(main(), 40)


def test_a_reply_above_the_bound_is_dropped_and_the_next_one_read() -> None:
    async def main() -> list[dict[str, Any]]:
        read_fd, write_fd = os.pipe()
        got: list[dict[str, Any]] = []
        reader = ReplyReader(asyncio.get_running_loop(), read_fd, got.append)
        os.set_blocking(write_fd, False)
        huge = b'{"reply_to": 1, "result": {"x": "' + b"y" * (MAX_REPLY_BYTES + 1) + b'"}}\n'
        pending = memoryview(huge + b'{"reply_to": 2, "result": {}}\nnot json\n[1]\n')
        while pending:  # the pipe holds 64 KiB: let the reader drain it
            try:
                pending = pending[os.write(write_fd, pending) :]
            except BlockingIOError:
                await asyncio.sleep(0.001)
        await until(lambda: bool(got), 10)
        os.close(write_fd)
        reader.close()
        return got

    assert run_async(main(), 20) == [{"reply_to": 2, "result": {}}]


def test_pending_requests_are_bounded_and_late_answers_ignored() -> None:
    async def main() -> None:
        pending = PendingRequests()
        ids = [pending.open({0: 100}) for _ in range(MAX_PENDING_REQUESTS)]
        with pytest.raises(TooManyRequests):
            pending.open({0: 100})
        pending.answer(0, 100, {"reply_to": ids[0], "result": {"a": 1}})
        pending.answer(0, 100, {"reply_to": ids[0], "result": {"a": 2}})  # a second: ignored
        pending.answer(0, 999, {"reply_to": ids[1], "result": {}})  # not the pid asked
        assert await pending.wait(ids[0], 1) == [WorkerAnswer(0, 100, {"a": 1})]
        assert await pending.wait(ids[1], 0.01) == [WorkerAnswer(0, 100, error="timeout")]
        pending.answer(0, 100, {"reply_to": ids[1], "result": {}})  # too late: nobody waits
        assert pending.open({}) > ids[-1]  # room again; nobody to ask: done at once
        assert await pending.wait(ids[-1] + 1, 1) == []

    run_async(main(), 10)

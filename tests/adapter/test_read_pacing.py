"""ReadPacer on a real uvloop transport: the transport reads exactly while no
burst is yielding and no control backlog is pending, and a detached pacer
touches nothing."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from tests.conftest import run_async
from tunnel.aio.read_pacing import READ_BURST_BYTES, ReadPacer


@asynccontextmanager
async def transport() -> AsyncIterator[asyncio.Transport]:
    """A real socket transport (one end of a socketpair) that is reading."""
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()
    made, _ = await loop.connect_accepted_socket(asyncio.Protocol, ours)
    try:
        assert made.is_reading()
        yield made
    finally:
        made.close()
        theirs.close()


async def next_turn() -> None:
    """Let the loop run the callbacks already queued (``call_soon``)."""
    await asyncio.sleep(0)
    await asyncio.sleep(0)


def test_reading_yields_one_loop_turn_after_a_burst() -> None:
    async def scenario() -> None:
        async with transport() as t:
            pacer = ReadPacer(asyncio.get_running_loop())
            pacer.attach(t)
            pacer.received(READ_BURST_BYTES - 1)
            assert t.is_reading()
            pacer.received(1)
            assert not t.is_reading()
            pacer.received(READ_BURST_BYTES)  # more in the same turn: still one yield
            assert not t.is_reading()
            await next_turn()
            assert t.is_reading()
            # The count starts again after the yield.
            pacer.received(READ_BURST_BYTES - 1)
            assert t.is_reading()

    run_async(scenario())


def test_a_backlog_holds_reading_until_writing_resumes() -> None:
    async def scenario() -> None:
        async with transport() as t:
            pacer = ReadPacer(asyncio.get_running_loop())
            pacer.attach(t)
            pacer.pause_for_backlog()
            assert not t.is_reading()
            pacer.pause_for_backlog()  # idempotent
            pacer.resume_after_backlog()
            assert t.is_reading()
            pacer.resume_after_backlog()  # nothing pending: nothing to do
            assert t.is_reading()

    run_async(scenario())


def test_the_end_of_a_burst_does_not_resume_a_backlogged_transport() -> None:
    async def scenario() -> None:
        async with transport() as t:
            pacer = ReadPacer(asyncio.get_running_loop())
            pacer.attach(t)
            pacer.received(READ_BURST_BYTES)
            pacer.pause_for_backlog()
            await next_turn()
            assert not t.is_reading(), "resumed with control replies still backed up"
            pacer.resume_after_backlog()
            assert t.is_reading()

    run_async(scenario())


def test_writing_resumed_during_a_burst_waits_for_the_burst() -> None:
    async def scenario() -> None:
        async with transport() as t:
            pacer = ReadPacer(asyncio.get_running_loop())
            pacer.attach(t)
            pacer.pause_for_backlog()
            pacer.received(READ_BURST_BYTES)
            pacer.resume_after_backlog()
            assert not t.is_reading(), "resumed in the middle of a burst's yield"
            await next_turn()
            assert t.is_reading()

    run_async(scenario())


def test_a_detached_pacer_touches_nothing() -> None:
    async def scenario() -> None:
        async with transport() as t:
            pacer = ReadPacer(asyncio.get_running_loop())
            # Before attach: no transport to pause.
            pacer.received(READ_BURST_BYTES)
            pacer.pause_for_backlog()
            await next_turn()
            pacer.attach(t)
            assert t.is_reading()
            # A burst that began attached ends after the detach: the transport
            # (closed with its connection) is not resumed.
            pacer.received(READ_BURST_BYTES)
            assert not t.is_reading()
            pacer.detach()
            await next_turn()
            assert not t.is_reading()
            pacer.resume_after_backlog()
            assert not t.is_reading()

    run_async(scenario())

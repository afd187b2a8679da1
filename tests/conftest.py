"""Shared fixtures: a throwaway PKI, an event-loop runner on uvloop, a
timeout scale that a slow CI can raise (GEOEDGE_TEST_TIMEOUT_SCALE=2), and
each HTTP/2 engine in turn (``h2_engine``, tests/h2_engines.py)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
import uvloop

from geoedge import pki
from tests import (
    edge_fakes,
    example_budget,  # noqa: F401  (registers and loads the Hypothesis profile)
)
from tests.h2_engines import H2_ENGINES

#: The skip policy (a skip on CI fails unless allow-listed) and pytester, which
#: the policy's own test uses to run a small suite of its own.
pytest_plugins = ["tests.skip_policy", "pytester"]

T = TypeVar("T")
TIMEOUT_SCALE = float(os.environ.get("GEOEDGE_TEST_TIMEOUT_SCALE", "1"))


def scaled(seconds: float) -> float:
    return seconds * TIMEOUT_SCALE


def run_async(coro: Awaitable[T], timeout: float = 30.0) -> T:
    """Run ``coro`` on a fresh uvloop loop, failing after ``timeout`` (scaled)."""

    async def bounded() -> T:
        async with asyncio.timeout(scaled(timeout)):
            return await coro

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(bounded())


@dataclass(frozen=True)
class PkiFiles:
    dir: Path
    ca: Path
    origin: pki.CertPaths
    edge: pki.CertPaths
    edge2: pki.CertPaths
    server: pki.CertPaths
    rogue_ca: Path
    rogue_edge: pki.CertPaths
    impostor_origin: pki.CertPaths
    """Our CA, the origin's identity and names, but the *edge* role."""


@pytest.fixture(params=H2_ENGINES)
def h2_engine(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each HTTP/2 engine in turn: the engine the test's FakeServices configure."""
    engine: str = request.param
    edge_fakes.h2_engine_under_test = engine
    try:
        yield engine
    finally:
        edge_fakes.h2_engine_under_test = "auto"


@pytest.fixture(scope="session")
def test_pki(tmp_path_factory: pytest.TempPathFactory) -> PkiFiles:
    root = tmp_path_factory.mktemp("pki")
    pki.create_ca(root / "ca")
    ca = pki.load_ca(root / "ca")
    origin = pki.issue_peer_cert(
        ca, root, "origin", "origin-1", role="origin", dns_names=["localhost", "127.0.0.1"]
    )
    edge = pki.issue_peer_cert(ca, root, "edge", "edge-1", role="edge")
    edge2 = pki.issue_peer_cert(ca, root, "edge2", "edge-2", role="edge")
    server = pki.issue_server_cert(ca, root, "server", ["localhost", "127.0.0.1"])
    pki.create_ca(root / "rogue")
    rogue = pki.load_ca(root / "rogue")
    rogue_edge = pki.issue_peer_cert(rogue, root, "rogue-edge", "edge-1", role="edge")
    impostor_origin = pki.issue_peer_cert(
        ca, root, "impostor-origin", "origin-1", role="edge", dns_names=["localhost", "127.0.0.1"]
    )
    return PkiFiles(
        dir=root,
        ca=ca.paths.cert,
        origin=origin,
        edge=edge,
        edge2=edge2,
        server=server,
        rogue_ca=rogue.paths.cert,
        rogue_edge=rogue_edge,
        impostor_origin=impostor_origin,
    )

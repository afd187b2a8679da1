"""The HTTP/2 engines the tests run on (:mod:`edge.h2_engine`), as yarl's and
multidict's fixtures run on their C and Python implementations.

Both wherever the nghttp2 binding is built (``make venv`` with
``libnghttp2-dev``); ``h2`` alone in the pure-Python run
(``GEOEDGE_NO_EXTENSIONS=1``), where the binding is not loaded by design.
``tests/unit/test_h2_engine.py`` fails when the binding could be built here
but was not, so a missing engine never passes for a tested one.

- unit tests: ``pytestmark = pytest.mark.usefixtures("h2_engine")`` runs
  every test of a module on each engine; :class:`tests.edge_fakes.FakeServices`
  made during the test configure that engine;
- integration tests: a stack fixture parametrized with :data:`H2_ENGINES`
  writes ``[http] h2_engine`` into the edge's configuration
  (:func:`engine_config`).
"""

from __future__ import annotations

from pathlib import Path

from edge.h2_engine import nghttp2_problem
from tests.compiled import expected_build_mode

__all__ = ["H2_ENGINES", "NGHTTP2_HEADERS", "engine_config", "nghttp2_expected"]

#: The engines this run tests.
H2_ENGINES: tuple[str, ...] = ("nghttp2", "h2") if not nghttp2_problem() else ("h2",)

#: Where libnghttp2's header is when its development files are installed.
NGHTTP2_HEADERS = (
    Path("/usr/include/nghttp2/nghttp2.h"),
    Path("/usr/local/include/nghttp2/nghttp2.h"),
)


def nghttp2_expected() -> bool:
    """Must the nghttp2 engine run here: a compiled run, with libnghttp2's headers."""
    headers = any(path.exists() for path in NGHTTP2_HEADERS)
    return expected_build_mode() == "compiled" and headers


def engine_config(engine: str) -> str:
    """The edge configuration's lines that choose ``engine``."""
    return f'[http]\nh2_engine = "{engine}"\n'

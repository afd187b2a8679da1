"""Which HTTP/2 engine serves the edge's clients, and the one interface both offer.

Two engines run the same front end (:mod:`edge.front_h2` and its parts),
which keeps every decision of its own (field checks, the body against its
``content-length``, flood bounds, GOAWAY on drain, response flow control):

- ``nghttp2``: libnghttp2 through the Cython binding :mod:`edge.h2_nghttp2`,
  the library curl, Node.js and Apache httpd use; built when ``make venv``
  (or ``pip install`` with a C compiler) finds ``libnghttp2-dev``;
- ``h2``: the python-hyper ``h2`` library (:mod:`edge.h2_connection`), pure
  Python, the reference the binding is held to
  (``tests/property/test_h2_engines_agree.py``), and what runs with
  ``GEOEDGE_NO_EXTENSIONS=1`` or without the binding.

``[http] h2_engine`` chooses: ``"auto"`` (the default) is ``nghttp2`` when
the binding loads, else ``h2``; naming one that cannot run is an error at
start-up (:class:`EngineUnavailable`), not a silent fallback.
"""

from __future__ import annotations

import functools
from importlib import metadata
from types import ModuleType
from typing import TYPE_CHECKING, Protocol

import h2.events

from edge.h2_connection import EdgeH2Connection, new_h2_connection, release_h2
from tunnel.build_mode import load_binding

if TYPE_CHECKING:  # the binding loads only where it is built (load_binding)
    from edge.h2_nghttp2 import NgHttp2Connection

__all__ = [
    "CHOICES",
    "ENGINES",
    "EngineUnavailable",
    "ServerConnection",
    "engine_description",
    "new_server_connection",
    "nghttp2_problem",
    "release_connection",
    "resolve_engine",
]

#: The engines, in the order ``"auto"`` tries them.
ENGINES = ("nghttp2", "h2")
#: What ``[http] h2_engine`` accepts.
CHOICES = ("auto", *ENGINES)
BINDING = "edge.h2_nghttp2"


class ServerConnection(Protocol):
    """What the front end uses of an HTTP/2 server connection: a part of
    ``h2.connection.H2Connection``, with its arguments, results and
    exceptions (``h2.exceptions``), emitting ``h2.events``."""

    @property
    def max_outbound_frame_size(self) -> int: ...
    @property
    def highest_inbound_stream_id(self) -> int: ...
    def initiate_connection(self) -> None: ...
    def increment_flow_control_window(self, increment: int, stream_id: int | None = None) -> None:
        """Open a receive window: the connection's when ``stream_id`` is None."""

    def receive_data(self, data: bytes) -> list[h2.events.Event]:
        """The events of what the client sent; ``h2.exceptions.ProtocolError``
        on a connection error (its GOAWAY queued)."""

    def data_to_send(self, amount: int | None = None) -> bytes: ...
    def send_headers(
        self, stream_id: int, headers: list[tuple[bytes, bytes]], end_stream: bool = False
    ) -> None: ...
    def send_data(self, stream_id: int, data: bytes, end_stream: bool = False) -> None: ...
    def end_stream(self, stream_id: int) -> None: ...
    def reset_stream(self, stream_id: int, error_code: int = 0) -> None: ...
    def acknowledge_received_data(self, acknowledged_size: int, stream_id: int) -> None:
        """Credit back request DATA (``DataReceived.flow_controlled_length``)."""

    def local_flow_control_window(self, stream_id: int) -> int:
        """What may be sent on the stream now (its window and the connection's)."""

    def close_connection(self, error_code: int = 0) -> None:
        """GOAWAY with ``error_code``: the end of the connection."""


class EngineUnavailable(RuntimeError):
    """``[http] h2_engine`` names an engine this installation cannot run."""


@functools.cache
def _binding() -> tuple[ModuleType | None, str]:
    return load_binding(BINDING)


def nghttp2_problem() -> str:
    """Why the nghttp2 engine cannot run here ("" when it can)."""
    return _binding()[1]


@functools.cache
def resolve_engine(choice: str) -> str:
    """The engine ``[http] h2_engine = choice`` runs: ``"auto"`` is the first
    of :data:`ENGINES` that can run; :class:`EngineUnavailable` when
    ``choice`` names one that cannot."""
    if choice not in CHOICES:
        raise ValueError(f"h2_engine must be one of {', '.join(CHOICES)}, not {choice!r}")
    if choice == "h2":
        return "h2"
    problem = nghttp2_problem()
    if not problem:
        return "nghttp2"
    if choice == "nghttp2":
        raise EngineUnavailable(f"h2_engine = 'nghttp2' cannot run here: {problem}")
    return "h2"


@functools.cache
def engine_description(engine: str) -> str:
    """``<engine> <version>``, as the start-up line and ``/metrics`` say it."""
    if engine == "nghttp2":
        binding = _binding()[0]
        assert binding is not None
        return f"nghttp2 {binding.library_version()}"
    return f"h2 {metadata.version('h2')}"


def new_server_connection(
    engine: str, *, max_concurrent_streams: int, max_header_list_size: int, stream_window: int
) -> ServerConnection:
    """A server connection of ``engine`` (resolved: one of :data:`ENGINES`)
    with these settings; the caller starts it (``initiate_connection``)."""
    if engine == "nghttp2":
        binding = _binding()[0]
        assert binding is not None, nghttp2_problem()
        make: type[NgHttp2Connection] = binding.NgHttp2Connection
        connection: ServerConnection = make(
            max_concurrent_streams=max_concurrent_streams,
            max_header_list_size=max_header_list_size,
            stream_window=stream_window,
        )
        return connection
    return new_h2_connection(
        max_concurrent_streams=max_concurrent_streams,
        max_header_list_size=max_header_list_size,
        stream_window=stream_window,
    )


def release_connection(connection: ServerConnection) -> None:
    """The client's connection is lost: leave nothing that keeps the engine's
    state alive (``h2``'s connection is a reference cycle; the binding's
    session is freed with its object)."""
    if isinstance(connection, EdgeH2Connection):
        release_h2(connection)

"""geoedge's tunnel: the wire protocol, its sans-I/O core and its asyncio adapters.

Layers (each imports only the ones above it; none imports ``geoedge``, ``edge``
or ``origin``, tests/unit/test_import_graph.py):

- :mod:`tunnel.mux`       sans-I/O multiplexer (PROTOCOL.md made executable)
- :mod:`tunnel.policy`    pure decisions of the adapters (backoff, which connection)
- :mod:`tunnel.peer_name` who a tunnel peer certificate says it is
- :mod:`tunnel.aio`       thin asyncio adapters, transports, dialing, pooling
"""

from tunnel import build_mode as _build_mode  # noqa: F401  (before any compiled module)

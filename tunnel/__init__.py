"""geoedge's tunnel: the wire protocol, its sans-I/O core and its asyncio adapters.

Layers (each imports only the ones above it):

- :mod:`tunnel.mux`     sans-I/O multiplexer (PROTOCOL.md made executable)
- :mod:`tunnel.codecs`  other pure codecs shared by both daemons (PROXY protocol)
- :mod:`tunnel.aio`     thin asyncio adapters, transports, dialing, pooling
- :mod:`tunnel.runtime` what both daemons share: config loading, logs, metrics,
  workers, the ``geoedge`` command
"""

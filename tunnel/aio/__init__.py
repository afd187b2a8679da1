"""Thin asyncio adapters over :mod:`tunnel.mux`: the connection protocol, streams
as transports, TLS and plain-TCP transports, dialing with reconnect, pools."""

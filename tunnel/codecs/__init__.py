"""Pure codecs shared by both daemons: bytes in, values out, no I/O.

- :mod:`tunnel.codecs.proxy` PROXY protocol v1/v2 (HAProxy's proxy-protocol.txt):
  the edge parses it from a trusted load balancer, the origin sends it to backends.
"""

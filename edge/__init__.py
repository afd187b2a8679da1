"""The regional edge daemon: TLS termination, HTTP/1.1 + WebSocket handling, tunnel streams."""

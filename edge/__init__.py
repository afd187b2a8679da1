"""The regional edge daemon: terminates TLS near users, speaks HTTP/1.1, HTTP/2
and WebSocket to them, and carries each request on its own tunnel stream.

Its shape is the origin's (:mod:`origin`), one module per concern:

- :mod:`edge.__main__`: the command line (``--config``, ``--check``, preflight);
- :mod:`edge.daemon`: the parent process (sockets, supervisor, signals, admin, systemd);
- :mod:`edge.worker`: one worker (listeners, metrics, access log, drain), with
  :mod:`edge.origins` (the tunnel pools per origin) and :mod:`edge.listener` (the
  one accept loop: TLS, PROXY then TLS, plain-HTTP redirect);
- the connection logic: :mod:`edge.tls_transport` (OpenSSL on the socket),
  :mod:`edge.front_h1` (with :mod:`edge.front_h1_requests`, :mod:`edge.front_h1_responses`),
  :mod:`edge.front_h2` (with :mod:`edge.front_h2_session`, :mod:`edge.front_h2_stream`),
  and per request :mod:`edge.exchange` (with :mod:`edge.exchange_upstream`,
  :mod:`edge.exchange_wait`, :mod:`edge.exchange_websocket`; its pure decisions in
  :mod:`edge.exchange_rules`), which only sees the worker through :mod:`edge.services`;
- sans-I/O codecs: :mod:`edge.http1` (HTTP/1.1 heads and bodies), :mod:`edge.h2_translate`,
  :mod:`edge.h2_encoder` (HPACK for response heads), :mod:`edge.ws_frames`,
  :mod:`edge.stream_metadata`;
- :mod:`edge.config`, :mod:`edge.metrics`, :mod:`edge.tls` (certificates, SNI; with
  :mod:`edge.openssl`),
  :mod:`edge.ocsp`, :mod:`edge.deadlines`, :mod:`edge.admission`, :mod:`edge.ledger`,
  :mod:`edge.request_record`, :mod:`edge.status`.
"""

import tunnel.build_mode  # noqa: F401  (chooses the build before any compiled module loads)

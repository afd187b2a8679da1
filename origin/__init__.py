"""The origin balancer: accepts edges' tunnels, balances their streams over Node.js backends.

Its shape is the edge's (:mod:`edge`), one module per concern:

- :mod:`origin.__main__`: the command line (``--config``, ``--check``, preflight);
- :mod:`origin.daemon`: the parent process (listener, supervisor, signals, admin, systemd);
- the control plane, in the parent: :mod:`origin.control`, :mod:`origin.state`,
  :mod:`origin.health`, :mod:`origin.discovery`; :mod:`origin.snapshot` is the pool
  state it publishes to the workers;
- :mod:`origin.worker`: one worker (its life cycle and control messages), composed of
  :mod:`origin.edges` (the tunnel connections of the edges), :mod:`origin.dispatch`
  (per stream: choose a backend, reuse or connect, queue under a cap; with
  :mod:`origin.pool_queues` and :mod:`origin.queue`), :mod:`origin.deadlines` and
  :mod:`origin.publisher` (metrics once a second);
- the connection logic: :mod:`origin.forward` (the stream <-> backend splice, hot
  path) and :mod:`origin.keepalive` (parked backend connections);
- pure decisions: :mod:`origin.balancer` (algorithms, slow start, ejection, routing),
  :mod:`origin.hash_key`;
- :mod:`origin.config` (the typed ``origin.toml`` schema), :mod:`origin.metrics`,
  :mod:`origin.admission` (refused edges), :mod:`origin.stream_log`, :mod:`origin.status`.
"""

import tunnel.build_mode  # noqa: F401  (chooses the build before any compiled module loads)

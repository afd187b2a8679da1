"""The origin balancer: accepts edges' tunnels, balances their streams over Node.js backends.

Modules, each owning one thing:

- :mod:`origin.config`: the typed ``origin.toml`` schema;
- :mod:`origin.balancer`: pure decisions (algorithms, slow start, ejection, routing);
- :mod:`origin.snapshot`: the pool state the parent publishes to its workers;
- :mod:`origin.state`, :mod:`origin.control`, :mod:`origin.health`,
  :mod:`origin.discovery`: the control plane (parent process);
- :mod:`origin.forward`: the stream <-> backend splice (hot path);
- :mod:`origin.worker`: one worker (routing, connect with retries, drain);
- :mod:`origin.admission`: refused edges, logged and counted;
- :mod:`origin.daemon`, :mod:`origin.__main__`: the daemon and its command line.
"""

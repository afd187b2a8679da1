"""What both daemons run on, and the ``geoedge`` command.

``edge`` and ``origin`` are the two daemons, ``tunnel`` the protocol between
them; everything they share that is not the protocol lives here, one module per
concern:

- configuration: :mod:`geoedge.config` (schema, loading), :mod:`geoedge.config_renames`
  (renamed keys and values), :mod:`geoedge.config_toml` (TOML spelling),
  :mod:`geoedge.config_render`, :mod:`geoedge.config_reference` (docs/configuration.md)
- processes: :mod:`geoedge.workers` (the prefork supervisor), :mod:`geoedge.listening`
  (the one ``bind_listener``), :mod:`geoedge.systemd` (sd_notify, watchdog)
- observing: :mod:`geoedge.logs`, :mod:`geoedge.metrics`, :mod:`geoedge.admin` (the
  admin listener: liveness, readiness, metrics), :mod:`geoedge.cert_expiry`,
  :mod:`geoedge.memory`, :mod:`geoedge.status_page`, :mod:`geoedge.status_window`
- the PROXY protocol codec: :mod:`geoedge.proxy` (the edge reads it, the origin writes it)
- installing: :mod:`geoedge.release` (versioned installs from the lock file)
- the ``geoedge`` command and its tools: :mod:`geoedge.cli`, :mod:`geoedge.pki`,
  :mod:`geoedge.wireguard`, :mod:`geoedge.host_init`, :mod:`geoedge.preflight`,
  :mod:`geoedge.demo`, :mod:`geoedge.assets` (the shipped deployment files)
- the local stack the demo, the tests and the load tests run (throwaway PKI,
  ports, configs, processes): :mod:`geoedge.devstack`

The package shares the distribution's name, so it cannot collide with another
distribution's in site-packages (the three daemon packages keep the folder names
the layout asks for; README "Layout").
"""

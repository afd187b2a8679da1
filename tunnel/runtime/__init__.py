"""What both daemons share: config loading, logs, metrics, workers, the ``geoedge`` command."""

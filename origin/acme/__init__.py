"""ACME (RFC 8555) at the origin, for every edge: one client, one account,
the challenges and the issued certificates sent to the edges over the
tunnels (docs/acme.md).

- :mod:`origin.acme.config`: ``[acme]``;
- :mod:`origin.acme.manager`: what is due, attempts, backoff, distribution;
- :mod:`origin.acme.state`: what is known of one certificate, and its status;
- :mod:`origin.acme.issuer`: one issuance, challenges proven before the CA looks;
- :mod:`origin.acme.client`: the protocol, through certbot's ``acme`` package;
- :mod:`origin.acme.material`: keys, CSRs, challenge certificates;
- :mod:`origin.acme.files`: the account key and certificates on disk (0600);
- :mod:`origin.acme.schedule`: when to renew, when to retry (pure);
- :mod:`origin.acme.ocsp`, :mod:`origin.acme.stapling`: OCSP responses to staple;
- :mod:`origin.acme.dns`, :mod:`origin.acme.route53`: DNS-01 providers;
- :mod:`origin.acme.broadcast`: the interface to the edges.
"""

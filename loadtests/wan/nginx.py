"""The ``nginx`` scenario's configuration: a stock nginx edge, the peer geoedge must beat.

What an operator without geoedge would put near the users: nginx terminates
TLS on the edge host and proxies every request to the origin site over a pool
of persistent TLS connections (``upstream { keepalive }``,
``proxy_http_version 1.1``, the ``Connection`` field cleared), to the same
HAProxy the ``direct`` scenario uses, which hands it to the app. The user's
TLS matches the other scenarios (the shared certificate, TLS 1.2-1.3, the
Mozilla intermediate TLS 1.2 ciphers, ALPN ``h2,http/1.1``); one worker per
core, as geoedge's edge runs.

nginx keeps idle upstream connections in a most-recently-used list, so
sequential requests reuse the same connection and its congestion window:
that is the behaviour geoedge's tunnel is measured against.

Everything it writes (pid, temporary files, error log) goes under the work
directory; it runs in the foreground (``daemon off``) so that the stack stops
it by its PID.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from loadtests.wan.scenarios import HTTPS_PORT, SCENARIOS, StackFiles

__all__ = ["UPSTREAM_KEEPALIVE", "nginx_conf"]

#: Idle keep-alive connections each nginx worker keeps to the origin.
UPSTREAM_KEEPALIVE = 32
#: The name nginx verifies in HAProxy's certificate: nginx checks DNS names
#: only (X509_check_host), and the shared certificate carries this one.
SERVER_NAME = "app.geoedge.test"


def nginx_conf(files: StackFiles, addresses: Mapping[str, str], workdir: Path, ciphers: str) -> str:
    """nginx.conf for the edge host, proxying to HAProxy at the origin over TLS."""
    port = SCENARIOS["nginx"].port
    origin = addresses["origin"]
    tmp = workdir / "nginx-tmp"
    for sub in ("body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (tmp / sub).mkdir(parents=True, exist_ok=True)
    return f"""\
user root;
worker_processes auto;
daemon off;
pid {workdir / "nginx.pid"};
error_log {workdir / "logs" / "nginx-error.log"} warn;

events {{
    worker_connections 8192;
}}

http {{
    access_log off;
    client_body_temp_path {tmp / "body"};
    proxy_temp_path {tmp / "proxy"};
    fastcgi_temp_path {tmp / "fastcgi"};
    uwsgi_temp_path {tmp / "uwsgi"};
    scgi_temp_path {tmp / "scgi"};

    map $http_upgrade $connection_upgrade {{
        default upgrade;
        ''      '';
    }}

    upstream origin {{
        server {origin}:{HTTPS_PORT};
        keepalive {UPSTREAM_KEEPALIVE};
        keepalive_timeout 75s;
        keepalive_requests 100000;
    }}

    server {{
        listen {addresses["edge"]}:{port} ssl http2;
        ssl_certificate {files.server_cert};
        ssl_certificate_key {files.server_key};
        ssl_protocols TLSv1.2 TLSv1.3;
        ssl_ciphers {ciphers};
        ssl_session_tickets on;

        location / {{
            proxy_pass https://origin;
            proxy_http_version 1.1;
            proxy_set_header Host $host;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection $connection_upgrade;
            proxy_set_header X-Forwarded-For $remote_addr;
            proxy_read_timeout 75s;
            proxy_ssl_session_reuse on;
            proxy_ssl_server_name on;
            proxy_ssl_name {SERVER_NAME};
            proxy_ssl_verify on;
            proxy_ssl_trusted_certificate {files.ca};
            proxy_ssl_protocols TLSv1.2 TLSv1.3;
        }}
    }}
}}
"""

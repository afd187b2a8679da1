"""``geoedge acme status`` and ``geoedge acme renew --force [--id ID]``: the
origin's ACME client (docs/acme.md) through its admin listener.

- ``status``: ``GET /acme``: the account, and per certificate its names,
  expiry, when it is due for renewal, each edge's answer and the last error.
- ``renew --force``: ``POST /acme/renew`` (``?id=``): one attempt now for
  the certificate (or each), whatever its schedule; it returns when the
  attempt has ended (validated, issued and sent to every edge, or failed),
  so it can take as long as the CA does. Renewal is otherwise automatic;
  ``--force`` says that is understood.

The admin address is ``--admin``, else ``[admin] address`` of ``--config``
(default ``/etc/geoedge/origin.toml`` when it exists), else the origin's
default. Exit status: 0 done, 1 refused or failed (the message says why).
Only the standard library speaks HTTP here: the command runs on the origin
host, beside the daemon, and asks one question.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from geoedge import host_init
from geoedge.config import ConfigError, load_config

__all__ = ["AcmeCliError", "add_acme"]

#: How long ``renew`` waits for the attempt (the CA validates, issues, the edges ACK).
RENEW_TIMEOUT_S = 600.0


class AcmeCliError(Exception):
    """The origin could not be asked, or refused; the message says why."""


def add_acme(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    acme = commands.add_parser(
        "acme", help="the origin's ACME certificates: status, renew now (docs/acme.md)"
    )
    sub = acme.add_subparsers(title="acme commands", metavar="ACME_COMMAND", required=True)
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--admin", metavar="HOST:PORT", help="the origin's admin listener")
    where.add_argument(
        "--config",
        type=Path,
        help="origin.toml whose [admin] address to use (default: /etc/geoedge/origin.toml)",
    )
    where.add_argument("--json", action="store_true", help="print the origin's JSON answer")

    status = sub.add_parser(
        "status", parents=[where], help="each certificate: expiry, renewal due, edges, errors"
    )
    status.set_defaults(handler=_status)

    renew = sub.add_parser(
        "renew",
        parents=[where],
        help="renew now, whatever the schedule (renewal is otherwise automatic)",
    )
    renew.add_argument(
        "--force", action="store_true", help="renew now even though not due (required)"
    )
    renew.add_argument(
        "--id", dest="certificate", help="only this certificate ([[acme.certificates]] id)"
    )
    renew.add_argument(
        "--timeout", type=float, default=RENEW_TIMEOUT_S, help="seconds to wait (default 600)"
    )
    renew.set_defaults(handler=_renew)


def admin_address(admin: str | None, config: Path | None) -> str:
    """The origin's admin ``host:port``; see the module docstring."""
    if admin:
        return admin
    schema = host_init.load_schema("origin")
    path = config or host_init.DEFAULT_ETC / "origin.toml"
    if config is None and not path.exists():
        factory = next(f for f in dataclasses.fields(schema) if f.name == "admin").default_factory
        assert callable(factory)
        return str(factory().address)
    try:
        return str(load_config(path, schema).admin.address)
    except ConfigError as exc:
        raise AcmeCliError(str(exc)) from None


def request(address: str, method: str, path: str, timeout_s: float) -> tuple[int, Any]:
    """One request to the admin listener: its status and JSON body."""
    url = f"http://{address}{path}"
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, method=method), timeout=timeout_s
        ) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        body = exc.read()
        try:
            return exc.code, json.loads(body or b"null")
        except ValueError:
            raise AcmeCliError(f"{url}: HTTP {exc.code}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise AcmeCliError(f"cannot reach the origin's admin at {address}: {reason}") from None
    except ValueError:
        raise AcmeCliError(f"{url}: not a JSON answer") from None


def _status(args: argparse.Namespace) -> int:
    address = admin_address(args.admin, args.config)
    code, body = request(address, "GET", "/acme", 30.0)
    if code == 404:
        raise AcmeCliError(f"the origin at {address} runs no ACME client ([acme] is not set)")
    if code != 200:
        raise AcmeCliError(f"GET /acme: HTTP {code}: {body}")
    if args.json:
        print(json.dumps(body, indent=2))
        return 0
    print(f"account {body.get('account') or '(none yet)'} at {body['directory']}")
    for certificate in body["certificates"]:
        print()
        print(describe(certificate))
    return 0


def _renew(args: argparse.Namespace) -> int:
    if not args.force:
        print(
            "geoedge: error: certificates renew by themselves when due (geoedge acme status"
            " says when); add --force to renew now",
            file=sys.stderr,
        )
        return 2
    address = admin_address(args.admin, args.config)
    path = "/acme/renew"
    if args.certificate:
        path += "?" + urllib.parse.urlencode({"id": args.certificate})
    code, body = request(address, "POST", path, args.timeout)
    if code == 404:
        error = body.get("error") if isinstance(body, dict) else None
        raise AcmeCliError(error or f"the origin at {address} runs no ACME client")
    if code not in (200, 502) or not isinstance(body, dict):
        raise AcmeCliError(f"POST {path}: HTTP {code}: {body}")
    if args.json:
        print(json.dumps(body, indent=2))
    else:
        for certificate in body["renewed"]:
            print(describe(certificate))
    return 0 if body.get("ok") else 1


def describe(certificate: dict[str, Any], now: float | None = None) -> str:
    """One certificate of ``GET /acme``, for a person."""
    now = time.time() if now is None else now
    lines = [f"{certificate['id']}: {', '.join(certificate['domains'])}"]
    expiry = certificate.get("not_after_ts")
    if expiry is None:
        lines.append("  not issued yet")
    else:
        days = (expiry - now) / 86400
        left = "EXPIRED" if days < 0 else f"{days:.1f} days left"
        lines.append(
            f"  expires {certificate['not_after']} ({left}), serial {certificate['serial']}"
        )
        lines.append(f"  renewal due {certificate.get('renew_at') or 'now'}")
    if certificate.get("last_success"):
        lines.append(f"  last issued {certificate['last_success']}")
    edges = certificate.get("edges") or {}
    if edges:
        lines.append(
            "  edges: " + ", ".join(f"{edge} {state}" for edge, state in sorted(edges.items()))
        )
    if certificate.get("ocsp"):
        until = certificate.get("ocsp_next_update")
        lines.append(f"  OCSP: {certificate['ocsp']}" + (f" until {until}" if until else ""))
    if certificate.get("failures"):
        lines.append(
            f"  FAILING: {certificate['failures']} attempt(s) in a row, next"
            f" {certificate.get('next_try') or 'soon'}: {certificate.get('last_error')}"
        )
    return "\n".join(lines)

"""``python -m loadtests.wan.diagnose``: where a large response's time goes on a lossy tunnel.

Builds the ``make wan`` stack with the tunnel trace on
(:mod:`tunnel.aio.trace`, every ``--trace-s``) in both daemons, sets
``--loss`` on the long links, and fetches the 768 KB response ``--count``
times through the edge, each on a new client connection as ``make wan`` does.
Then it reads the trace lines back and puts, beside each response's time, the
origin-side tunnel connection that carried it (the one whose octets sent grew
by the response) and what that connection looked like: its congestion window
before and after, ssthresh, retransmits during the transfer, the delivery
rate, and the time it spent limited by the peer's receive window, its send
buffer or the application (``tcpi_busy_time``, ``tcpi_rwnd_limited``,
``tcpi_sndbuf_limited``); and the mux's view: the time streams waited for
stream credit and for connection credit. Writes ``wan_diagnosis.json`` to
``--results`` and prints a table. ``--edge-toml-extra`` and
``--origin-toml-extra`` append TOML to the daemons' configurations, to
compare variants (e.g. ``[tunnel] congestion_control = "bbr"``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtests.wan.run import DAEMON_SYSCTLS, RESULTS, say, set_loss
from loadtests.wan.scenarios import SCENARIOS
from loadtests.wan.stack import Stack
from tunnel.aio.trace import ENV

__all__ = ["main"]

MARK = "tunnel trace "


def read_trace(path: Path) -> list[dict[str, Any]]:
    """The trace records of one daemon log, in order."""
    records = []
    for line in path.read_text(errors="replace").splitlines():
        at = line.find(MARK)
        if at >= 0:
            try:
                records.append(json.loads(line[at + len(MARK) :]))
            except ValueError:
                continue
    return records


def by_connection(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        key = f"{record['pid']}:{record['local_port']}-{record['peer_port']}"
        out.setdefault(key, []).append(record)
    return out


def _at(series: list[dict[str, Any]], t: float) -> dict[str, Any] | None:
    """The last record at or before ``t``."""
    found = None
    for record in series:
        if record["t"] > t:
            break
        found = record
    return found


def attribute(
    sample: dict[str, Any], connections: dict[str, list[dict[str, Any]]]
) -> dict[str, Any]:
    """The server-side connection that sent the most during ``sample``, and its figures."""
    best: tuple[int, str, dict[str, Any], dict[str, Any]] | None = None
    for name, series in connections.items():
        if series[0]["side"] != "server":
            continue
        before = _at(series, sample["start"]) or series[0]
        after = _at(series, sample["end"] + 0.3) or series[-1]
        sent = after["mux"]["bytes_sent"] - before["mux"]["bytes_sent"]
        if best is None or sent > best[0]:
            best = (sent, name, before, after)
    if best is None or best[0] <= 0:
        return {"connection": None}
    sent, name, before, after = best
    tb, ta = before["tcp"] or {}, after["tcp"] or {}
    during = [r for r in connections[name] if sample["start"] <= r["t"] <= sample["end"] + 0.3]
    rates = [r["tcp"]["delivery_rate"] for r in during if r["tcp"]]

    def delta(key: str) -> float:
        return round(float(ta.get(key, 0) or 0) - float(tb.get(key, 0) or 0), 3)

    return {
        "connection": name,
        "cc": before.get("cc"),
        "sent": sent,
        "cwnd_before": tb.get("cwnd"),
        "ssthresh_before": tb.get("ssthresh"),
        "cwnd_min_during": min((r["tcp"]["cwnd"] for r in during if r["tcp"]), default=None),
        "cwnd_after": ta.get("cwnd"),
        "retrans": delta("total_retrans"),
        "delivery_rate_max": max(rates, default=None),
        "busy_ms": delta("busy_ms"),
        "rwnd_limited_ms": delta("rwnd_limited_ms"),
        "sndbuf_limited_ms": delta("sndbuf_limited_ms"),
        "stream_credit_wait_s": round(
            after["mux"]["stream_credit_wait_s"] - before["mux"]["stream_credit_wait_s"], 3
        ),
        "connection_window_wait_s": round(
            after["mux"]["connection_window_wait_s"] - before["mux"]["connection_window_wait_s"],
            3,
        ),
        "stream_window_estimate": after["mux"]["stream_window_estimate"],
    }


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m loadtests.wan.diagnose", description=__doc__)
    parser.add_argument("--loss", type=float, default=0.001, help="long links loss, 0: none")
    parser.add_argument("--count", type=int, default=20, help="768 KB GETs through the edge")
    parser.add_argument("--trace-s", type=float, default=0.05, help="trace interval")
    parser.add_argument("--pause-s", type=float, default=0.3, help="pause between GETs")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--label", default="", help="a name for this variant in the output")
    parser.add_argument("--edge-toml-extra", default="", help="TOML appended to edge.toml")
    parser.add_argument("--origin-toml-extra", default="", help="TOML appended to origin.toml")
    parser.add_argument("--nginx", action="store_true", help="also time the nginx edge")
    parser.add_argument(
        "--cold", action="store_true",
        help="restart the edge once the loss is on, so its tunnels connect and warm under loss",
    )  # fmt: skip
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from loadtests.wan.emulator import unsupported_reason

    reason = unsupported_reason()
    if reason is not None:
        print(f"WAN emulator unavailable: {reason}", file=sys.stderr)
        return 2
    samples: list[dict[str, Any]] = []
    nginx_ms: list[float] = []
    with tempfile.TemporaryDirectory(prefix="geoedge-diag-") as tmp:
        extra = {"edge": args.edge_toml_extra, "origin": args.origin_toml_extra}
        stack = Stack(Path(tmp), DAEMON_SYSCTLS, toml_extra=extra)
        stack.env[ENV] = str(args.trace_s)
        with stack:
            edge = SCENARIOS["edge"]
            spec = {
                "host": stack.wan.address(edge.terminator), "port": edge.port,
                "ca": stack.files.ca, "kind": "new", "path": "/large", "count": 1,
                "pause_s": 0.0,
            }  # fmt: skip
            say("warming up (no loss)")
            stack.agent_request({**spec, "count": 5})
            set_loss(stack.wan, args.loss)
            if args.cold:
                say("restarting the edge under loss")
                stack.restart("edge")
                stack.agent_request({**spec, "count": 3})
            say(f"{args.count} x 768 KB through the edge at {args.loss:.2%} loss")
            for i in range(args.count):
                start = time.time()
                reply = stack.agent_request(spec)
                end = time.time()
                total = reply["series"].get("total_ms", [None])[0]
                samples.append(
                    {"i": i, "start": start, "end": end, "ms": total, "errors": reply["errors"]}
                )
                if args.nginx:
                    where = SCENARIOS["nginx"]
                    nreply = stack.agent_request(
                        {**spec, "host": stack.wan.address(where.terminator), "port": where.port}
                    )
                    nginx_ms += nreply["series"].get("total_ms", [])
                time.sleep(args.pause_s)
            set_loss(stack.wan, 0.0)
            time.sleep(0.5)
            traces = {
                daemon: read_trace(stack.logs / f"{daemon}.log") for daemon in ("edge", "origin")
            }
            warm_ups = [
                f"{daemon}: {line.strip()}"
                for daemon in ("edge", "origin")
                for line in (stack.logs / f"{daemon}.log").read_text(errors="replace").splitlines()
                if "tunnel warm-up" in line
            ]
    connections = by_connection(traces["origin"])
    rows = [{**s, **attribute(s, connections)} for s in samples]
    times = [r["ms"] for r in rows if r["ms"] is not None]
    summary = {
        "label": args.label,
        "loss": args.loss,
        "edge_p50_ms": round(statistics.median(times), 1) if times else None,
        "nginx_p50_ms": round(statistics.median(nginx_ms), 1) if nginx_ms else None,
        "failed": sum(1 for r in rows if r["errors"]),
        "origin_connections": len([c for c in connections.values() if c[0]["side"] == "server"]),
        "edge_toml_extra": args.edge_toml_extra,
        "origin_toml_extra": args.origin_toml_extra,
    }
    out = {"summary": summary, "warm_ups": warm_ups, "samples": rows, "trace": traces}
    args.results.mkdir(parents=True, exist_ok=True)
    name = f"wan_diagnosis{'_' + args.label if args.label else ''}.json"
    (args.results / name).write_text(json.dumps(out, indent=1) + "\n")
    columns = ("ms", "connection", "cc", "cwnd_before", "ssthresh_before", "cwnd_min_during",
               "cwnd_after", "retrans", "busy_ms", "rwnd_limited_ms", "sndbuf_limited_ms",
               "stream_credit_wait_s", "connection_window_wait_s")  # fmt: skip
    print(" ".join(f"{c:>12}" for c in columns))
    for row in rows:
        print(" ".join(f"{row.get(c)!s:>12}" for c in columns))
    print("\n".join(warm_ups))
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

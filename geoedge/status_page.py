"""The admin's status page: a model both daemons fill, rendered as plain HTML.

Like HAProxy's stats page: one page per daemon, tables of what it connects
(tunnels, edges, pools, backends) with their state and the last minute's
latency, and buttons for the actions it takes (drain, undrain: plain HTML
forms). The page refreshes its ``<main>`` in place every few seconds with a
four-line script (``?fragment=1`` returns just that part); without script a
meta refresh reloads it. ``/status.json`` serves the same model as JSON.

Everything a daemon puts in the model is text; the renderer escapes all of it.
"""

from __future__ import annotations

import html
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Action", "Cell", "Row", "StatusPage", "Table", "render", "render_main"]

REFRESH_S = 5


@dataclass(frozen=True, slots=True)
class Cell:
    text: str
    #: "" (plain), "ok", "warn" or "bad": the cell's colour.
    tone: str = ""


@dataclass(frozen=True, slots=True)
class Action:
    """A button that POSTs to ``url`` (the admin answers a form with 303 to /status)."""

    label: str
    url: str


@dataclass(frozen=True, slots=True)
class Row:
    cells: list[Cell]
    actions: list[Action] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Table:
    title: str
    columns: list[str]
    rows: list[Row]
    note: str = ""
    #: Shown instead of an empty table.
    empty: str = "none"


@dataclass(frozen=True, slots=True)
class StatusPage:
    title: str
    facts: list[tuple[str, Cell]]
    tables: list[Table]

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def cell(
    value: float | None, unit: str = "", *, warn: float | None = None, bad: float | None = None
) -> Cell:
    """A number for a table: ``-`` when unknown; ``s`` values shown in ms."""
    if value is None:
        return Cell("-")
    if unit == "s":
        if value < 0.01:
            text = f"{value * 1000:.2f} ms"
        else:
            text = f"{value * 1000:.0f} ms" if value < 10 else f"{value:.1f} s"
    elif unit == "/s":
        text = f"{value:.1f}/s" if value < 100 else f"{value:.0f}/s"
    elif unit == "%":
        text = f"{value * 100:.2f} %" if 0 < value < 0.01 else f"{value * 100:.1f} %"
    elif unit == "B":
        text = _bytes(value)
    else:
        text = f"{value:g}" if isinstance(value, float) else str(value)
    tone = ""
    if bad is not None and value >= bad:
        tone = "bad"
    elif warn is not None and value >= warn:
        tone = "warn"
    return Cell(text, tone)


def _bytes(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}
h1{font-size:1.4em;margin:0 0 .3em}h2{font-size:1.1em;margin:1.4em 0 .4em}
.facts{display:flex;flex-wrap:wrap;gap:.4em 1.6em;margin:.5em 0}
.facts b{font-weight:600}
table{border-collapse:collapse;background:#fff;min-width:40em}
th,td{border:1px solid #ddd;padding:.25em .6em;text-align:left;white-space:nowrap}
th{background:#eef1f5;font-weight:600}
td.ok{background:#dff3e3}td.warn{background:#fff4d6}td.bad{background:#fbdada;font-weight:600}
form{display:inline;margin:0}button{font:inherit;padding:0 .5em}
.note{color:#666;font-size:.9em;margin:.3em 0}.empty{color:#666}
footer{color:#888;font-size:.85em;margin-top:2em}
"""

_SCRIPT = (
    "setInterval(async()=>{try{const r=await fetch(location.pathname+'?fragment=1',"
    "{cache:'no-store'});if(r.ok)document.querySelector('main').innerHTML=await r.text()}"
    f"catch(e){{}}}},{REFRESH_S * 1000});"
)


def render(page: StatusPage) -> str:
    """The whole page."""
    title = html.escape(page.title)
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{title}</title><style>{_STYLE}</style>"
        f'<noscript><meta http-equiv="refresh" content="{REFRESH_S}"></noscript>'
        f"</head><body><main>{render_main(page)}</main>"
        f"<footer>Refreshed every {REFRESH_S} s. JSON: <a href=status.json>status.json</a>,"
        " metrics: <a href=metrics>metrics</a>.</footer>"
        f"<script>{_SCRIPT}</script></body></html>"
    )


def render_main(page: StatusPage) -> str:
    """What the page refreshes in place."""
    out = [f"<h1>{html.escape(page.title)}</h1><div class=facts>"]
    for label, value in page.facts:
        out.append(
            f"<span>{html.escape(label)}: <b{_tone(value)}>{html.escape(value.text)}</b></span>"
        )
    out.append("</div>")
    for table in page.tables:
        out.append(_table(table))
    return "".join(out)


def _tone(value: Cell) -> str:
    return f" class={value.tone}" if value.tone else ""


def _table(table: Table) -> str:
    slug = "".join(c if c.isalnum() else "-" for c in table.title.lower())
    out = [f"<h2 id={slug}>{html.escape(table.title)}</h2>"]
    if table.note:
        out.append(f"<p class=note>{html.escape(table.note)}</p>")
    if not table.rows:
        out.append(f"<p class=empty>{html.escape(table.empty)}</p>")
        return "".join(out)
    actions = any(row.actions for row in table.rows)
    out.append(f'<table data-table="{slug}"><tr>')
    out += [f"<th>{html.escape(column)}</th>" for column in table.columns]
    if actions:
        out.append("<th></th>")
    out.append("</tr>")
    for row in table.rows:
        out.append("<tr>")
        out += [f"<td{_tone(c)}>{html.escape(c.text)}</td>" for c in row.cells]
        if actions:
            out.append("<td>")
            out += [
                f'<form method=post action="{html.escape(a.url)}">'
                f"<button>{html.escape(a.label)}</button></form>"
                for a in row.actions
            ]
            out.append("</td>")
        out.append("</tr>")
    out.append("</table>")
    return "".join(out)

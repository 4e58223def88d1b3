"""The RM web UI's shared page layout and live building blocks.

Every page is rendered on the server from the same JSON the REST API serves (works with
JavaScript off), and marks its live parts for rm/web/static/elastane-ui.js: an element with
`data-src` (a REST path) is refreshed from it, a table by its column specs (`data-columns`), a
field table cell by its `data-key` / `data-fmt`, a chart by its `data-chart` spec. The specs are
the ones the server rendered with, so both renderings agree. Everything shown is escaped: names,
diagnostics and reasons are user input.
"""
from __future__ import annotations

import html
import json
import urllib.parse
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from .format import fmt

SCRIPT = "/static/elastane-ui.js"
POLL_MS = 2000
NAV = (("/cluster", "Cluster"), ("/cluster/apps", "Applications"), ("/cluster/nodes", "Nodes"),
       ("/cluster/scheduler", "Scheduler"))

PAGE_CSS = """body{font-family:sans-serif;margin:0;color:#222}main{margin:1em 1.5em}
nav{background:#2c3e50;padding:.5em 1.5em}nav a{color:#ecf0f1;margin-right:1.2em;text-decoration:none}
nav a.active{font-weight:bold;border-bottom:2px solid #ecf0f1}nav .updated{color:#95a5a6;float:right;font-size:12px}
table{border-collapse:collapse;margin-bottom:1.5em}
th,td{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}th{background:#eef}
td.num{text-align:right}h1{font-size:20px}h2{font-size:16px}.nochart{color:#666}
svg{display:block;margin-bottom:1em}.charts{display:flex;flex-wrap:wrap;gap:0 1em}
.FAILED,.KILLED,.LOST,.UNHEALTHY{color:#b00}.RUNNING,.FINISHED{color:#070}.ACCEPTED{color:#a60}
.filters a{margin-right:.8em}"""


def escape(x: object) -> str:
    """HTML-escape any value (names, diagnostics and URLs are user input)."""
    return html.escape(str(x))


def attr_json(obj: Any) -> str:
    """`obj` as JSON, escaped for a double-quoted HTML attribute."""
    return html.escape(json.dumps(obj, separators=(",", ":")), quote=True)


def get_path(obj: Any, path: Sequence[str]) -> Any:
    """obj[path[0]][path[1]]...; None when a step is missing."""
    for step in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(step)
    return obj


def app_link(app_id: str) -> str:
    """A link to one app's page (YARN's `/cluster/app/{id}`)."""
    return f'<a href="/cluster/app/{escape(urllib.parse.quote(app_id))}">{escape(app_id)}</a>'


def node_link(node_id: str) -> str:
    """A link to one node's page (YARN's `/cluster/node/{id}`... Elastane's node ids are host:port)."""
    return f'<a href="/cluster/node/{escape(urllib.parse.quote(node_id))}">{escape(node_id)}</a>'


def state_badge(state: str) -> str:
    return f'<span class="{escape(state)}">{escape(state)}</span>'


@dataclass(frozen=True)
class Column:
    """A table column: `key` is the path in one REST record (dots between steps), `fmt` a
    rm.web.format formatter name, or "state" (a coloured badge), "app" / "node" (a link to the page)."""

    header: str
    key: str
    fmt: str = "text"

    def spec(self) -> dict[str, Any]:
        return {"h": self.header, "k": self.key.split("."), "f": self.fmt}

    def cell(self, record: Any, now_ms: float) -> str:
        v = get_path(record, self.key.split("."))
        if self.fmt == "state":
            return state_badge(fmt("text", v))
        if self.fmt in ("app", "node"):
            if not v:
                return ""
            return app_link(str(v)) if self.fmt == "app" else node_link(str(v))
        return escape(fmt(self.fmt, v, now_ms))


def html_table(headers: list[str], rows: list[list[str]]) -> str:
    """A table of already-escaped cells under escaped headers ("none" when empty)."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body or '<tr><td colspan=%d>none</td></tr>' % len(headers)}</table>"


def sort_records(records: list[Any], sort_key: Optional[str], descending: bool) -> list[Any]:
    """Records ordered by the value at `sort_key` (missing values last), as the script orders them."""
    if not sort_key:
        return list(records)
    path = sort_key.split(".")
    present = [r for r in records if get_path(r, path) is not None]
    missing = [r for r in records if get_path(r, path) is None]
    return sorted(present, key=lambda r: get_path(r, path), reverse=descending) + missing


def live_table(css_id: str, src: str, path: Sequence[str], columns: Sequence[Column], records: list[Any],
               now_ms: float, sort_key: Optional[str] = None, descending: bool = False,
               empty: str = "none") -> str:
    """A table of `records` that the script re-renders from `src` (the list at `path` in its JSON)."""
    head = "".join(f"<th>{escape(c.header)}</th>" for c in columns)
    rows = sort_records(records, sort_key, descending)
    body = "".join("<tr>" + "".join(f"<td>{c.cell(r, now_ms)}</td>" for c in columns) + "</tr>" for r in rows)
    if not body:
        body = f'<tr><td colspan="{len(columns)}">{escape(empty)}</td></tr>'
    return (f'<table id="{escape(css_id)}" class="live-table" data-src="{escape(src)}" data-path="{attr_json(path)}" '
            f'data-columns="{attr_json([c.spec() for c in columns])}" data-sort="{escape(sort_key or "")}" '
            f'data-desc="{int(descending)}" data-empty="{escape(empty)}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{body}</tbody></table>')


def live_fields(css_id: str, src: Optional[str], path: Sequence[str], rows: Sequence[tuple[str, str, str]],
                record: Any, now_ms: float) -> str:
    """A two-column table: label, then the value at key (a Column key) formatted with fmt; the
    script refreshes each value from `src` (none: a static table)."""
    cells = []
    for label, key, f in rows:
        col = Column(label, key, f)
        cells.append(f'<tr><th>{escape(label)}</th><td data-key="{attr_json(key.split("."))}" data-fmt="{escape(f)}">'
                     f'{col.cell(record, now_ms)}</td></tr>')
    src_attr = f' data-src="{escape(src)}" data-path="{attr_json(path)}"' if src else ""
    return f'<table id="{escape(css_id)}" class="live-fields"{src_attr}>{"".join(cells)}</table>'


def static_fields(rows: Sequence[tuple[str, str]]) -> str:
    """A two-column table of (label, already-escaped value)."""
    return "<table>" + "".join(f"<tr><th>{escape(k)}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"


def live_chart(css_id: str, src: Optional[str], spec: dict[str, Any], svg: str) -> str:
    """A chart the script redraws from `src` per `spec` (series and markers paths, formats)."""
    src_attr = f' data-src="{escape(src)}" data-chart="{attr_json(spec)}"' if src else ""
    return f'<div id="{escape(css_id)}" class="live-chart"{src_attr}>{svg}</div>'


def note_until(src: str, path: Sequence[str], text: str) -> str:
    """A note (plain text, escaped) that the script hides once `src` has a value at `path`."""
    return f'<p class="note" data-src="{escape(src)}" data-hide-when="{attr_json(path)}">{escape(text)}</p>'


def page(title: str, body: str, active: str = "") -> str:
    """A whole page: the navigation bar, `body`, the live-update script (deferred)."""
    nav = "".join(f'<a href="{href}"{" class=active" if href == active else ""}>{escape(label)}</a>'
                  for href, label in NAV)
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f'<link rel="icon" href="data:,"><style>{PAGE_CSS}</style>'
            f'<script src="{SCRIPT}" defer></script></head>'
            f'<body data-poll-ms="{POLL_MS}"><nav>{nav}<span class="updated" id="updated"></span></nav>'
            f'<main>{body}</main></body></html>')


__all__ = ["Column", "NAV", "PAGE_CSS", "POLL_MS", "SCRIPT", "app_link", "attr_json", "escape", "get_path",
           "html_table", "live_chart", "live_fields", "live_table", "node_link", "note_until", "page", "sort_records",
           "state_badge", "static_fields"]

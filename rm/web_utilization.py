"""CPU / memory / network / spill charts of the cluster or one node, from the RM's utilization
series (GET /ws/v1/cluster/utilization, served where the RM measures utilization).

The pages fetch that JSON from the RM's own REST API (so they follow its contract, not the code
behind it); an RM without the endpoint, or with no points yet, gets a note instead of charts.
"""
from __future__ import annotations

import asyncio
import urllib.parse
from typing import Any, Optional

import aiohttp
from aiohttp import web

from .web_layout import escape, get_path, live_chart
from .web_svg_chart import Series, chart

UTILIZATION = "/ws/v1/cluster/utilization"
FETCH_TIMEOUT_S = 2.0

# (css id suffix, title, y format, [(record key, series label)])
CHARTS: tuple[tuple[str, str, str, tuple[tuple[str, str], ...]], ...] = (
    ("cpu", "CPU (cores)", "num", (("cpuCores", "used"), ("vcoresTotal", "vcores"))),
    ("memory", "Memory", "mb", (("memoryMB", "used"), ("memoryTotalMB", "total"))),
    ("network", "Network", "rate", (("netRxBytesPerSec", "received"), ("netTxBytesPerSec", "sent"))),
    ("spill", "Disk spill", "bytes", (("spillBytes", "spilled"),)),
)


def has_utilization(app: web.Application) -> bool:
    """Whether this RM serves the utilization endpoint (the metrics part of the RM)."""
    return any(r.canonical == UTILIZATION for r in app.router.resources())


async def fetch_utilization(request: web.Request, node: Optional[str] = None) -> Optional[dict[str, Any]]:
    """The utilization JSON from this RM's REST API, as the caller (None: not served or failed)."""
    if not has_utilization(request.app):
        return None
    url = f"{request.url.origin()}{UTILIZATION}"
    params = {"node": node} if node else {}
    headers = {k: v for k, v in request.headers.items() if k.lower() == "authorization"}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S)) as s:
            async with s.get(url, params=params, headers=headers) as r:
                if r.status != 200:
                    return None
                body: Any = await r.json()
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError, ValueError):
        return None
    return body if isinstance(body, dict) else None


def _points(records: Any, key: str) -> list[tuple[float, float]]:
    out = []
    for rec in records if isinstance(records, list) else []:
        t, v = get_path(rec, ["t"]), get_path(rec, [key])
        if isinstance(t, (int, float)) and isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append((t / 1000.0, float(v)))
    return out


def utilization_charts(data: Optional[dict[str, Any]], served: bool, node: Optional[str] = None) -> str:
    """The charts of the cluster (node None) or of `node`, live when the endpoint is served."""
    if not served:
        return ('<p class="nochart">This ResourceManager does not measure utilization '
                f'(no {escape(UTILIZATION)}).</p>')
    path = ["utilization", "cluster"] if node is None else ["utilization", "nodes", node]
    records = get_path(data, path)
    src = UTILIZATION if node is None else f"{UTILIZATION}?{urllib.parse.urlencode({'node': node})}"
    out = []
    for suffix, title, y_fmt, keys in CHARTS:
        series = [Series(label, _points(records, key)) for key, label in keys]
        spec = {"title": title, "xFmt": "clock", "yFmt": y_fmt, "t0": 0,
                "series": [{"path": path, "x": "t", "y": key, "label": label} for key, label in keys]}
        out.append(live_chart(f"util-{suffix}", src, spec,
                              chart(title, series, x_fmt="clock", y_fmt=y_fmt, css_class=f"chart util-{suffix}")))
    return f'<div class="charts">{"".join(out)}</div>'


__all__ = ["CHARTS", "UTILIZATION", "fetch_utilization", "has_utilization", "utilization_charts"]

"""CPU / memory / network / spill charts of the cluster or one node, from the RM's utilization
series (rm/utilization_series.py: the JSON GET /ws/v1/cluster/utilization serves, which the
charts poll to stay live); with no points yet, a note instead of charts.
"""
from __future__ import annotations

import urllib.parse
from typing import Any, Optional

from .layout import get_path, live_chart
from .svg_chart import Series, chart

UTILIZATION = "/ws/v1/cluster/utilization"

# (css id suffix, title, y format, [(record key, series label)])
CHARTS: tuple[tuple[str, str, str, tuple[tuple[str, str], ...]], ...] = (
    ("cpu", "CPU (cores)", "num", (("cpuCores", "used"), ("vcoresTotal", "vcores"))),
    ("memory", "Memory", "mb", (("memoryMB", "used"), ("memoryTotalMB", "total"))),
    ("network", "Network", "rate", (("netRxBytesPerSec", "received"), ("netTxBytesPerSec", "sent"))),
    ("spill", "Disk spill", "bytes", (("spillBytes", "spilled"),)),
)


def _points(records: Any, key: str) -> list[tuple[float, float]]:
    out = []
    for rec in records if isinstance(records, list) else []:
        t, v = get_path(rec, ["t"]), get_path(rec, [key])
        if isinstance(t, (int, float)) and isinstance(v, (int, float)) and not isinstance(v, bool):
            out.append((t / 1000.0, float(v)))
    return out


def utilization_charts(data: Optional[dict[str, Any]], node: Optional[str] = None) -> str:
    """The live charts of the cluster (node None) or of `node`, first drawn from `data` (the
    series' JSON)."""
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


__all__ = ["CHARTS", "UTILIZATION", "utilization_charts"]

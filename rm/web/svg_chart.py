"""Inline SVG line charts for the RM web UI (no scripts, no external assets).

A chart draws one or more series of (x, y) points and marks events (shape changes, directives,
pauses) as dashed vertical lines at their x. rm/web/static/elastane-ui.js draws the same SVG from the
REST API's data when it refreshes a chart, so both follow the geometry here.
"""
from __future__ import annotations

import html
import time
from dataclasses import dataclass
from typing import Sequence

from .format import fmt, fmt_seconds

WIDTH, HEIGHT = 640, 200
_LEFT, _RIGHT, _TOP, _BOTTOM = 60, 15, 22, 30
COLORS = ("#2a6fd6", "#d6602a", "#2aa05a", "#8a2ad6")
MARKER_COLORS = {"shape": "#c0392b", "directive": "#7f8c8d", "pause": "#e67e22"}


@dataclass(frozen=True)
class Series:
    """One line: `label` and its points (x, y), x ascending."""

    label: str
    points: Sequence[tuple[float, float]]


@dataclass(frozen=True)
class Marker:
    """An event at `x`: `kind` is "shape", "directive" or "pause" (its colour), `label` its tooltip."""

    x: float
    label: str
    kind: str = "shape"


def _x_text(x: float, x_fmt: str) -> str:
    if x_fmt == "clock":
        return time.strftime("%H:%M:%S", time.localtime(x))
    return fmt_seconds(x)


def chart(title: str, series: Sequence[Series], markers: Sequence[Marker] = (), x_fmt: str = "s",
          y_fmt: str = "num", css_class: str = "chart") -> str:
    """An SVG chart of `series` with `markers`; a note when no series has a point.

    x is seconds (since the app started, or epoch seconds with x_fmt "clock"); y is drawn from 0
    (or its minimum when negative) so a speed that halves looks halved; y labels use the rm.web.format
    formatter `y_fmt`."""
    esc_title = html.escape(title)
    drawn = [s for s in series if s.points]
    if not drawn:
        return f'<p class="nochart">{esc_title}: no data reported yet.</p>'
    xs = [p[0] for s in drawn for p in s.points] + [m.x for m in markers]
    ys = [p[1] for s in drawn for p in s.points]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(0.0, min(ys)), max(ys)
    if x1 == x0:
        x1 = x0 + 1.0
    if y1 == y0:
        y1 = y0 + 1.0
    pw, ph = WIDTH - _LEFT - _RIGHT, HEIGHT - _TOP - _BOTTOM

    def sx(x: float) -> float:
        return _LEFT + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return _TOP + ph - (y - y0) / (y1 - y0) * ph

    parts = [f'<svg class="{html.escape(css_class)}" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
             f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{esc_title}">',
             f'<text x="{_LEFT}" y="14" font-size="12" font-weight="bold">{esc_title}</text>',
             f'<line x1="{_LEFT}" y1="{_TOP + ph}" x2="{_LEFT + pw}" y2="{_TOP + ph}" stroke="#888"/>',
             f'<line x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{_TOP + ph}" stroke="#888"/>',
             f'<text x="{_LEFT - 4}" y="{_TOP + 4}" font-size="10" text-anchor="end">'
             f'{html.escape(fmt(y_fmt, y1))}</text>',
             f'<text x="{_LEFT - 4}" y="{_TOP + ph}" font-size="10" text-anchor="end">'
             f'{html.escape(fmt(y_fmt, y0))}</text>',
             f'<text x="{_LEFT}" y="{HEIGHT - 8}" font-size="10">{html.escape(_x_text(x0, x_fmt))}</text>',
             f'<text x="{_LEFT + pw}" y="{HEIGHT - 8}" font-size="10" text-anchor="end">'
             f'{html.escape(_x_text(x1, x_fmt))}</text>']
    for m in markers:
        color = MARKER_COLORS.get(m.kind, "#999")
        parts.append(f'<line class="marker {html.escape(m.kind)}" x1="{sx(m.x):.1f}" y1="{_TOP}" x2="{sx(m.x):.1f}" '
                     f'y2="{_TOP + ph}" stroke="{color}" stroke-dasharray="4 3"><title>'
                     f'{html.escape(m.label)}</title></line>')
    for i, s in enumerate(drawn):
        color = COLORS[i % len(COLORS)]
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s.points)
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{coords}">'
                     f'<title>{html.escape(s.label)}</title></polyline>')
        if len(s.points) <= 60:
            parts.extend(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2" fill="{color}"><title>'
                         f'{html.escape(_x_text(x, x_fmt))}: {html.escape(fmt(y_fmt, y))}</title></circle>'
                         for x, y in s.points)
        if len(drawn) > 1:
            parts.append(f'<text x="{_LEFT + 8 + 110 * i}" y="{_TOP + 10}" font-size="10" fill="{color}">'
                         f'{html.escape(s.label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def line_chart(title: str, points: Sequence[tuple[float, float]], x_label: str = "seconds",
               css_class: str = "chart") -> str:
    """One series, x in seconds (the app page's original chart)."""
    return chart(title, [Series(title, points)], css_class=css_class)


__all__ = ["COLORS", "MARKER_COLORS", "Marker", "Series", "chart", "line_chart"]

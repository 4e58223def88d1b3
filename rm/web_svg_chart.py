"""Inline SVG line charts for the RM web UI (no scripts, no external assets)."""
from __future__ import annotations

import html
from typing import Sequence

WIDTH, HEIGHT = 640, 200
_LEFT, _RIGHT, _TOP, _BOTTOM = 60, 15, 22, 30


def _fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def line_chart(title: str, points: Sequence[tuple[float, float]], x_label: str = "seconds",
               css_class: str = "chart") -> str:
    """An SVG line chart of `points` (x, y), axes labelled with the ranges; a note if there are none.

    x is typically seconds since the app started; y is drawn from 0 (or its minimum when negative)
    so a speed that halves looks halved."""
    esc_title = html.escape(title)
    if not points:
        return f'<p class="nochart">{esc_title}: no data reported yet.</p>'
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
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

    coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points)
    dots = "".join(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2"><title>{_fmt(x)} {html.escape(x_label)}: '
                   f'{_fmt(y)}</title></circle>' for x, y in points) if len(points) <= 60 else ""
    return (f'<svg class="{html.escape(css_class)}" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
            f'height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{esc_title}">'
            f'<text x="{_LEFT}" y="14" font-size="12" font-weight="bold">{esc_title}</text>'
            f'<line x1="{_LEFT}" y1="{_TOP + ph}" x2="{_LEFT + pw}" y2="{_TOP + ph}" stroke="#888"/>'
            f'<line x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{_TOP + ph}" stroke="#888"/>'
            f'<text x="{_LEFT - 4}" y="{_TOP + 4}" font-size="10" text-anchor="end">{_fmt(y1)}</text>'
            f'<text x="{_LEFT - 4}" y="{_TOP + ph}" font-size="10" text-anchor="end">{_fmt(y0)}</text>'
            f'<text x="{_LEFT}" y="{HEIGHT - 8}" font-size="10">{_fmt(x0)}</text>'
            f'<text x="{_LEFT + pw}" y="{HEIGHT - 8}" font-size="10" text-anchor="end">{_fmt(x1)} '
            f'{html.escape(x_label)}</text>'
            f'<polyline fill="none" stroke="#2a6fd6" stroke-width="1.5" points="{coords}"/>{dots}</svg>')


__all__ = ["line_chart"]

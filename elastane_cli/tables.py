"""Plain-text rendering for the CLI: column-aligned tables, key: value blocks and cell formats."""
from __future__ import annotations

import time
from typing import Sequence

from protocol.json_types import JsonValue, json_int


def _is_number(s: str) -> bool:
    """True for cells like 12, 0.5, 40%, 512/2048: the ones a table right-aligns."""
    if not s:
        return False
    try:
        float(s.replace("/", "").replace("%", ""))
    except ValueError:
        return False
    return True


def render_table(headers: Sequence[str], rows: Sequence[Sequence[object]], gap: int = 2) -> str:
    """Columns padded to their widest cell; numeric columns right-aligned (like `yarn node -list`).
    A cell is any value, shown as str() of it (None as empty)."""
    cells = [[("" if v is None else str(v)) for v in row] for row in rows]
    for i, row in enumerate(cells):
        if len(row) != len(headers):
            raise ValueError(f"row {i} has {len(row)} cells, expected {len(headers)}")
    widths = [max([len(h)] + [len(r[c]) for r in cells]) for c, h in enumerate(headers)]
    numeric = [bool(cells) and all(_is_number(r[c]) or r[c] in ("", "-") for r in cells)
               and any(_is_number(r[c]) for r in cells) for c in range(len(headers))]
    sep = " " * gap

    def line(values: Sequence[str], header: bool = False) -> str:
        parts = [v.rjust(w) if numeric[c] and not header else v.ljust(w)
                 for c, (v, w) in enumerate(zip(values, widths))]
        return sep.join(parts).rstrip()

    out = [line(list(headers), header=True)]
    out.extend(line(r) for r in cells)
    return "\n".join(out)


def render_key_values(pairs: Sequence[tuple[str, object]]) -> str:
    """`key : value` lines with the colons aligned (like `yarn application -status`); values shown
    as str() of them (None as empty)."""
    if not pairs:
        return ""
    width = max(len(k) for k, _ in pairs)
    return "\n".join(f"{k.ljust(width)} : {'' if v is None else v}" for k, v in pairs)


def format_timestamp(ms: JsonValue) -> str:
    """A YARN millisecond timestamp (a JSON field: a number, or missing) as local time; 0 / missing as '-'."""
    try:
        t = json_int(ms)
    except (TypeError, ValueError):
        return "-"
    if t <= 0:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t / 1000))


def format_duration(seconds: float) -> str:
    """1.2s, 3m05s, 2h03m."""
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, s = divmod(int(seconds), 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m"


def format_age(ms: JsonValue, now_ms: float | None = None) -> str:
    """How long ago a millisecond timestamp (a JSON field) was ('-' if unknown)."""
    try:
        t = json_int(ms)
    except (TypeError, ValueError):
        return "-"
    if t <= 0:
        return "-"
    now_ms = time.time() * 1000 if now_ms is None else now_ms
    return format_duration((now_ms - t) / 1000) + " ago"

"""Numbers, sizes, rates and times formatted for people, for the RM web UI's pages.

Each formatter takes a value as the REST API carries it (None / missing: "N/A") and returns
plain text (the caller escapes it). rm/web/static/elastane-ui.js has a formatter of the same name for
each, so the live updates read as the server-rendered first view; `FORMATTERS` names them.
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable, Optional

NA = "N/A"
_BYTE_UNITS = ("B", "KB", "MB", "GB", "TB", "PB")


def _number(v: Any) -> Optional[float]:
    """`v` as a finite float, or None (missing, not a number, NaN, inf)."""
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def sig(v: float, digits: int = 3) -> str:
    """`v` to `digits` significant digits, without exponent for everyday magnitudes
    (0.000123, 1.23, 123, 1,235 -- integers of 4+ digits keep them all, grouped)."""
    if v == 0:
        return "0"
    if abs(v) >= 10 ** digits:
        return f"{v:,.0f}"
    if abs(v) < 1e-4:
        return f"{v:.{digits - 1}e}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(v))))
    text = f"{v:.{decimals}f}"
    if abs(float(text)) >= 10 ** digits:      # rounded up to a digit more (999.6 -> 1000)
        return f"{float(text):,.0f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def fmt_num(v: Any) -> str:
    """A measurement: 3 significant digits ("2.39", "8.14", "1,024")."""
    f = _number(v)
    return NA if f is None else sig(f)


def fmt_int(v: Any) -> str:
    """A count, digits grouped ("12", "1,024")."""
    f = _number(v)
    return NA if f is None else f"{int(round(f)):,}"


def fmt_bytes(v: Any) -> str:
    """A size in bytes, in binary units ("512 B", "1.5 KB", "3.21 GB")."""
    f = _number(v)
    if f is None:
        return NA
    unit = 0
    while abs(f) >= 1024 and unit < len(_BYTE_UNITS) - 1:
        f /= 1024
        unit += 1
    return f"{sig(f)} {_BYTE_UNITS[unit]}"


def fmt_mb(v: Any) -> str:
    """A size in MB as YARN counts memory ("512 MB", "1.5 GB")."""
    f = _number(v)
    return NA if f is None else fmt_bytes(f * 1024 * 1024)


def fmt_rate(v: Any) -> str:
    """Bytes per second ("1.2 MB/s")."""
    text = fmt_bytes(v)
    return text if text == NA else text + "/s"


def fmt_pct(v: Any) -> str:
    """A percentage given as 0-100 ("42.5%")."""
    f = _number(v)
    return NA if f is None else sig(f) + "%"


def fmt_cores(v: Any) -> str:
    """CPU in cores ("1.25 cores")."""
    f = _number(v)
    return NA if f is None else f"{sig(f)} {'core' if f == 1 else 'cores'}"


def fmt_speed(v: Any) -> str:
    """Training speed ("2.6 it/s")."""
    f = _number(v)
    return NA if f is None else f"{sig(f)} it/s"


def fmt_seconds(v: Any) -> str:
    """A duration in seconds ("850 ms", "8.14 s", "3 min 5 s", "2 h 3 min")."""
    f = _number(v)
    if f is None:
        return NA
    f = max(0.0, f)
    if f < 1:
        return f"{sig(f * 1000)} ms"
    if f < 60:
        return f"{sig(f)} s"
    s = int(f)
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


def fmt_measured_s(v: Any) -> str:
    """A measured time in seconds where 0 means not measured yet (a job report's worker / server
    times): as fmt_seconds, 0 as "N/A"."""
    f = _number(v)
    return NA if not f else fmt_seconds(f)


def fmt_duration_ms(v: Any) -> str:
    """A duration in milliseconds, as fmt_seconds."""
    f = _number(v)
    return NA if f is None else fmt_seconds(f / 1000)


def fmt_time(v: Any) -> str:
    """A timestamp in ms since the epoch as local time ("2026-11-23 14:06:54"); 0: "N/A"."""
    f = _number(v)
    if not f or f <= 0:
        return NA
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(f / 1000))


def fmt_age(v: Any, now_ms: Optional[float] = None) -> str:
    """How long before `now_ms` a timestamp in ms was ("1.2 s ago", "3 min 5 s ago"); 0: "never"."""
    f = _number(v)
    if f is None:
        return NA
    if f <= 0:
        return "never"
    now = time.time() * 1000 if now_ms is None else now_ms
    age = max(0.0, now - f) / 1000
    # Tenths of a second under a minute: a heartbeat every second reads "0.4 s ago", not "400 ms ago".
    return (f"{age:.1f} s" if age < 60 else fmt_seconds(age)) + " ago"


def fmt_text(v: Any) -> str:
    """Any value as text ("" for None; lists joined with ", ")."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (list, tuple)):
        return ", ".join(fmt_text(x) for x in v)
    return str(v)


def fmt_placement(v: Any) -> str:
    """A directive's placement ("n1: 2 w + 1 s; n2: 1 w"); empty: "anywhere"."""
    if not isinstance(v, list) or not v:
        return "anywhere"
    parts = []
    for p in v:
        if not isinstance(p, dict):
            continue
        roles = [f"{p[k]} {k[0]}" for k in ("workers", "servers") if p.get(k)]
        parts.append(f"{p.get('node', '?')}: {' + '.join(roles) or '0'}")
    return "; ".join(parts)


Formatter = Callable[[Any], str]

FORMATTERS: dict[str, Formatter] = {
    "text": fmt_text, "num": fmt_num, "int": fmt_int, "bytes": fmt_bytes, "mb": fmt_mb, "rate": fmt_rate,
    "pct": fmt_pct, "cores": fmt_cores, "speed": fmt_speed, "seconds": fmt_seconds, "measured_s": fmt_measured_s,
    "duration_ms": fmt_duration_ms, "time": fmt_time, "age": fmt_age, "placement": fmt_placement,
}


def fmt(name: str, v: Any, now_ms: Optional[float] = None) -> str:
    """Format `v` with the formatter called `name` (`age` relative to `now_ms`)."""
    if name == "age":
        return fmt_age(v, now_ms)
    return FORMATTERS[name](v)


__all__ = ["FORMATTERS", "NA", "fmt", "fmt_age", "fmt_bytes", "fmt_cores", "fmt_duration_ms", "fmt_int", "fmt_mb", "fmt_measured_s",
           "fmt_num", "fmt_pct", "fmt_placement", "fmt_rate", "fmt_seconds", "fmt_speed", "fmt_text", "fmt_time",
           "sig"]

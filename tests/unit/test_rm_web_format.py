"""The web UI's formatters (rm/web/format.py): units, significant digits, relative times."""
from __future__ import annotations

import math
import time

import pytest

from rm.web.format import (FORMATTERS, fmt, fmt_age, fmt_bytes, fmt_cores, fmt_duration_ms, fmt_int, fmt_mb, fmt_measured_s,
                           fmt_num, fmt_pct, fmt_placement, fmt_rate, fmt_seconds, fmt_speed, fmt_text, fmt_time, sig)


@pytest.mark.parametrize("v, text", [
    (0, "0"), (8.144906441000103, "8.14"), (2.2392394644510802, "2.24"), (0.5, "0.5"), (100.0, "100"),
    (123.456, "123"), (999.6, "1,000"), (12345.6, "12,346"), (0.000123, "0.000123"), (-3.25, "-3.25"),
    (1e-6, "1.00e-06")])
def test_sig_keeps_three_significant_digits(v: float, text: str) -> None:
    assert sig(v) == text


def test_missing_and_non_finite_values_are_na() -> None:
    for f in (fmt_num, fmt_int, fmt_bytes, fmt_mb, fmt_rate, fmt_pct, fmt_cores, fmt_speed, fmt_seconds,
              fmt_duration_ms, fmt_time):
        for v in (None, float("nan"), math.inf, "x", True):
            assert f(v) == "N/A", (f.__name__, v)


def test_sizes_rates_and_counts() -> None:
    assert [fmt_bytes(v) for v in (0, 512, 1536, 3 * 1024 ** 3, 2.5e6)] == ["0 B", "512 B", "1.5 KB", "3 GB",
                                                                             "2.38 MB"]
    assert [fmt_mb(v) for v in (512, 1536, 320.4, 0)] == ["512 MB", "1.5 GB", "320 MB", "0 B"]
    assert fmt_rate(1024 * 1024) == "1 MB/s"
    assert fmt_int(1234567) == "1,234,567" and fmt_int(2.6) == "3"
    assert fmt_pct(42.123) == "42.1%" and fmt_cores(1) == "1 core" and fmt_cores(1.25) == "1.25 cores"
    assert fmt_speed(2.6) == "2.6 it/s" and fmt_num("3.5") == "3.5"


def test_durations() -> None:
    assert [fmt_seconds(v) for v in (0.0123, 0.85, 8.1449, 59.9, 185, 7400, 90000)] == [
        "12.3 ms", "850 ms", "8.14 s", "59.9 s", "3 min 5 s", "2 h 3 min", "1 d 1 h"]
    assert fmt_seconds(-5) == "0 ms"
    assert fmt_duration_ms(65_000) == "1 min 5 s"
    assert fmt_measured_s(0.0) == "N/A" and fmt_measured_s(0.012) == "12 ms"


def test_times_absolute_and_relative() -> None:
    t = 1_700_000_000.0
    assert fmt_time(t * 1000) == time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
    assert fmt_time(0) == "N/A"
    assert fmt_age(1000, now_ms=2200) == "1.2 s ago"
    assert fmt_age(0, now_ms=5000) == "never"
    assert fmt_age(10_000, now_ms=5000) == "0.0 s ago"      # a clock a little ahead: never "-5 s ago"
    assert fmt_age(1000, now_ms=1400) == "0.4 s ago"
    assert fmt("age", 1000, now_ms=61_000) == "1 min 0 s ago"


def test_text_and_placement() -> None:
    assert [fmt_text(v) for v in (None, True, False, ["a", "b"], 3)] == ["", "yes", "no", "a, b", "3"]
    assert fmt_placement([]) == "anywhere" and fmt_placement(None) == "anywhere"
    assert fmt_placement([{"node": "n1", "workers": 2, "servers": 1}, {"node": "n2", "workers": 1, "servers": 0},
                          {"node": "n3", "workers": 0, "servers": 0}]) == "n1: 2 w + 1 s; n2: 1 w; n3: 0"


def test_every_formatter_is_named_for_the_script() -> None:
    # The script (rm/web/static/elastane-ui.js) has one formatter of each name.
    from pathlib import Path
    script = (Path(__file__).parents[2] / "rm" / "web" / "static" / "elastane-ui.js").read_text()
    for name in FORMATTERS:
        assert f"    {name}: " in script or f"    {name}," in script, name

"""Writing Prometheus text exposition (format 0.0.4): HELP and TYPE once per metric family, label
values escaped, one sample per line."""
from __future__ import annotations

import math
from typing import Iterable, Mapping

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Sample = tuple[Mapping[str, str], float]


def escape_label_value(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def format_value(v: float) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(round(v, 6))


def format_labels(labels: Mapping[str, str]) -> str:
    """`{a="x",b="y"}`; labels with an empty value are left out (Prometheus treats them as absent)."""
    parts = [f'{k}="{escape_label_value(v)}"' for k, v in labels.items() if v != ""]
    return "{" + ",".join(parts) + "}" if parts else ""


class Exposition:
    """Collects metric families; `text()` is the exposition body."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_: str, samples: Iterable[Sample]) -> None:
        """One family (`kind`: gauge | counter) with its samples; written even with none, so a
        scraper sees the metric exists."""
        self.lines.append(f"# HELP {name} {help_}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            self.lines.append(f"{name}{format_labels(labels)} {format_value(value)}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n" if self.lines else ""

"""A bounded, in-memory history of the job reports an app's AM sent (`AllocateRequest.shape`).

The RM keeps the latest report in `App.shape`; this keeps what the web UI's app page charts: a
series of samples over the app's whole life and the moments its workers / servers changed. Both
are bounded whatever the AM sends: a sample holds only a few scalar fields, the series thins
itself (drops every other sample, then keeps every 2nd, 4th, ... report) when full, and the change
log keeps the most recent changes. Pure: the caller passes the RM's clock reading.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Optional

from protocol.job_report import JobReport

MAX_SAMPLES = 200
MAX_CHANGES = 200


def _finite(v: Optional[float]) -> Optional[float]:
    return v if v is not None and math.isfinite(v) else None


@dataclass(frozen=True)
class ShapeSample:
    """The scalar parts of one shape report, at the RM's time `t` (epoch seconds)."""

    t: float
    workers: Optional[int] = None
    servers: Optional[int] = None
    iterations: Optional[int] = None
    speed: Optional[float] = None
    epoch: Optional[int] = None
    epoch_time_s: Optional[float] = None
    objective: Optional[float] = None
    changing: bool = False

    @classmethod
    def from_report(cls, t: float, report: JobReport) -> "ShapeSample":
        """The scalar fields of a report (a non-finite number becomes None)."""
        return cls(t=t, workers=report.workers, servers=report.servers, iterations=report.iterations,
                   speed=_finite(report.speed), epoch=report.epoch, epoch_time_s=_finite(report.epoch_time_s),
                   objective=_finite(report.objective), changing=report.changing)

    def to_json(self) -> dict[str, Any]:
        """The sample for the REST API and the web UI's charts (time in ms since the epoch)."""
        return {"time": int(self.t * 1000), "workers": self.workers, "servers": self.servers,
                "iterations": self.iterations, "speed": self.speed, "epoch": self.epoch,
                "epochTimeS": self.epoch_time_s, "objective": self.objective, "changing": self.changing}

    def same_values(self, other: "ShapeSample") -> bool:
        """Equal apart from the time (a repeated heartbeat that reports nothing new)."""
        return (self.workers, self.servers, self.iterations, self.speed, self.epoch, self.epoch_time_s,
                self.objective, self.changing) == (other.workers, other.servers, other.iterations, other.speed,
                                                   other.epoch, other.epoch_time_s, other.objective, other.changing)


@dataclass(frozen=True)
class ShapeChange:
    """Workers / servers went from `before` to `after` at time `t` (before is None for the first report)."""

    t: float
    before: Optional[tuple[Optional[int], Optional[int]]]
    after: tuple[Optional[int], Optional[int]]


class ShapeHistory:
    """Samples of an app's shape reports over its life, and its shape changes; memory-bounded."""

    def __init__(self, max_samples: int = MAX_SAMPLES, max_changes: int = MAX_CHANGES):
        if max_samples < 2 or max_changes < 1:
            raise ValueError("max_samples must be >= 2 and max_changes >= 1")
        self.max_samples = max_samples
        self._samples: list[ShapeSample] = []
        self.changes: deque[ShapeChange] = deque(maxlen=max_changes)
        self._stride = 1      # keep every stride-th new report once the series has been thinned
        self._seen = 0        # reports with new values since the last thinning
        self._last: Optional[ShapeSample] = None

    @property
    def samples(self) -> list[ShapeSample]:
        """The sampled series, oldest first, ending with the latest report."""
        if self._last is not None and (not self._samples or self._samples[-1] is not self._last):
            return [*self._samples, self._last]
        return list(self._samples)

    def record(self, t: float, report: JobReport) -> None:
        """Add one report received at time `t`."""
        s = ShapeSample.from_report(t, report)
        prev = self._last
        if prev is None or (prev.workers, prev.servers) != (s.workers, s.servers):
            self.changes.append(ShapeChange(t, None if prev is None else (prev.workers, prev.servers),
                                            (s.workers, s.servers)))
        if prev is not None and prev.same_values(s):
            return
        self._last = s
        if self._seen % self._stride == 0:
            self._samples.append(s)
            if len(self._samples) > self.max_samples:
                # Halve the resolution so the series still spans the app's whole life.
                self._samples = self._samples[::2]
                self._stride *= 2
                self._seen = 0
        self._seen += 1

    def __len__(self) -> int:
        return len(self.samples)


__all__ = ["MAX_CHANGES", "MAX_SAMPLES", "ShapeChange", "ShapeHistory", "ShapeSample"]

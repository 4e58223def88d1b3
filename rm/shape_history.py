"""A bounded, in-memory history of the shape reports an app's AM sent (`AllocateRequest.shape`).

The RM keeps the latest report in `App.shape`; this keeps what the web UI's app page charts: a
series of samples over the app's whole life and the moments its workers / servers changed. Both
are bounded whatever the AM sends: a sample holds only a few scalar fields, the series thins
itself (drops every other sample, then keeps every 2nd, 4th, ... report) when full, and the change
log keeps the most recent changes. Pure: the caller passes the RM's clock reading.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Optional

MAX_SAMPLES = 200
MAX_CHANGES = 200


def _int(v: Any) -> Optional[int]:
    # bool is an int in Python; a report's True is not a count.
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _num(v: Any) -> Optional[float]:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        f = float(v)
        return f if f == f and f not in (float("inf"), float("-inf")) else None
    return None


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
    def from_report(cls, t: float, shape: dict[str, Any]) -> "ShapeSample":
        """Pick the known fields out of a report; missing or mistyped ones become None."""
        return cls(t=t, workers=_int(shape.get("workers")), servers=_int(shape.get("servers")),
                   iterations=_int(shape.get("iterations")), speed=_num(shape.get("speed")),
                   epoch=_int(shape.get("epoch")), epoch_time_s=_num(shape.get("epoch_time_s")),
                   objective=_num(shape.get("objective")), changing=shape.get("changing") is True)

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

    def record(self, t: float, shape: Any) -> None:
        """Add one report received at time `t`; non-dict reports are ignored."""
        if not isinstance(shape, dict):
            return
        s = ShapeSample.from_report(t, shape)
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

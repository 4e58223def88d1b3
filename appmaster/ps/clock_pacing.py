"""How many mini-batches a worker runs per clock (one BSP iteration of the PS AM).

A clock is the unit of the AM's barrier and of every switch-over point (EPS changes, Cruise plans,
kill-restart checkpoints), so it should be short; but each clock costs one control round trip per
worker and a flush, so it should not be tiny. With the job's `clock_batches` > 0 every clock runs
that many mini-batches per worker. With 0 (auto) the pacer starts at START_BATCHES and then sizes
clocks so that the slowest worker takes about CLOCK_TARGET_S, from a moving average of the
seconds per mini-batch measured on the clocks so far. Pure: no I/O, no clock of its own.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

CLOCK_TARGET_S = 0.25       # a change waits at most about this long for the next clock boundary
START_BATCHES = 10
MAX_BATCHES = 10_000
SMOOTHING = 0.5             # weight of the latest clock in the per-batch time average


@dataclass
class ClockPacer:
    """Mini-batches per clock: fixed (`fixed` > 0) or sized to `target_s` from observed clocks."""

    fixed: int = 0
    target_s: float = CLOCK_TARGET_S
    per_batch_s: float | None = field(default=None)

    def __post_init__(self) -> None:
        if self.fixed < 0:
            raise ValueError(f"clock_batches must be >= 0, got {self.fixed}")
        if not self.target_s > 0:
            raise ValueError(f"the clock target must be > 0 seconds, got {self.target_s}")

    @property
    def batches(self) -> int:
        """Mini-batches per worker for the next clock."""
        if self.fixed > 0:
            return self.fixed
        if self.per_batch_s is None or self.per_batch_s <= 0:
            return START_BATCHES
        return max(1, min(MAX_BATCHES, int(round(self.target_s / self.per_batch_s))))

    def observe(self, batches: int, seconds: float) -> None:
        """Fold in one worker-clock: `batches` mini-batches took `seconds` (the slowest worker's)."""
        if batches <= 0 or not math.isfinite(seconds) or seconds < 0:
            return            # an idle worker (its pass of the epoch is over) says nothing
        sample = seconds / batches
        self.per_batch_s = sample if self.per_batch_s is None else (
            SMOOTHING * sample + (1 - SMOOTHING) * self.per_batch_s)

"""A PS job's progress as its job report tells the RM (protocol.job_report): iterations, early
feedback after the spec's `early_feedback_iterations`, speed over the iterations since the last
change, whether a change runs; and the job's shape (workers, servers) with the signed change
between two shapes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from protocol.job_report import JobReport
from protocol.records import Resource

DEFAULT_EARLY_FEEDBACK_ITERATIONS = 100   # EPS §2.1: "e.g. the first 100 iterations"

@dataclass(frozen=True)
class Shape:
    """Workers and servers of a job."""

    workers: int
    servers: int


@dataclass(frozen=True)
class ShapeDelta:
    """Signed change of each role: positive adds, negative removes."""

    workers: int
    servers: int

    @property
    def empty(self) -> bool:
        return self.workers == 0 and self.servers == 0

    def steps(self) -> list[tuple[str, int]]:
        """The ElasticOps calls to make, removals first (they free resources), then additions."""
        out: list[tuple[str, int]] = []
        if self.servers < 0:
            out.append(("remove_servers", -self.servers))
        if self.workers < 0:
            out.append(("remove_workers", -self.workers))
        if self.servers > 0:
            out.append(("add_servers", self.servers))
        if self.workers > 0:
            out.append(("add_workers", self.workers))
        return out


def diff(current: Shape, target: Shape) -> ShapeDelta:
    return ShapeDelta(target.workers - current.workers, target.servers - current.servers)



@dataclass
class ProgressTracker:
    """Training progress for the shape report (pure: the caller passes times and counts).

    An iteration is one pull-compute-push round of every worker: per clock (the AM calls
    `on_clock` after every BSP clock, and `on_epoch` at an epoch's end), the most mini-batches any
    worker ran in it.
    """

    early_feedback_iterations: int = DEFAULT_EARLY_FEEDBACK_ITERATIONS
    iterations: int = 0
    started: bool = False
    changing: bool = False
    _batches_seen: dict[str, int] = field(default_factory=dict)
    _speed_since: Optional[float] = None       # end of the last change (or training start)
    _speed_base: int = 0                       # iterations at that time
    _last_epoch_end: Optional[float] = None

    def start(self, now: float) -> None:
        self.started = True
        self._speed_since, self._speed_base = now, self.iterations

    def on_epoch(self, batches_by_worker: dict[str, int], now: float) -> int:
        """Fold in the workers' cumulative mini-batch counts after a clock or an epoch; returns
        iterations (counts already folded in add nothing)."""
        rounds = 0
        for w, n in batches_by_worker.items():
            rounds = max(rounds, n - self._batches_seen.get(w, 0))
            self._batches_seen[w] = n
        self.iterations += rounds
        self._last_epoch_end = now
        return self.iterations

    on_clock = on_epoch

    def change_started(self) -> None:
        self.changing = True

    def change_ended(self, now: float) -> None:
        self.changing = False
        self._speed_since, self._speed_base = now, self.iterations

    @property
    def early_feedback(self) -> bool:
        return self.iterations >= self.early_feedback_iterations

    @property
    def speed_iterations(self) -> int:
        return self.iterations - self._speed_base

    @property
    def speed(self) -> float:
        """Iterations per second over the epochs finished since the last change."""
        if self._speed_since is None or self._last_epoch_end is None or self.speed_iterations <= 0:
            return 0.0
        elapsed = self._last_epoch_end - self._speed_since
        return self.speed_iterations / elapsed if elapsed > 0 else 0.0

    def report(self, shape: Shape, resource: Optional[Resource], directive_version: int,
               **extra: Any) -> JobReport:
        """The `AllocateRequest.shape` report: this progress plus `extra` JobReport fields (phase,
        epoch, measurements ...: what the AM measured)."""
        return JobReport(workers=shape.workers, servers=shape.servers, started=self.started,
                         changing=self.changing, iterations=self.iterations, early_feedback=self.early_feedback,
                         early_feedback_iterations=self.early_feedback_iterations,
                         speed=self.speed, speed_iterations=self.speed_iterations,
                         executor_resource=resource, directive_version=directive_version, **extra)


# ===== the driver ================================================================================


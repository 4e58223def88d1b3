"""The objective every few clocks (`JobReport.clock_objectives`), as the PS AM samples it. Pure: no
I/O, no clock of its own -- the clock loop (appmaster.ps.clock_loop) asks `due`, evaluates, and
hands back what it measured.

Optimus fits a job's loss curve on its objectives (docs/optimus.md); with one point per epoch a job
of a few epochs has too few points for a fit until it is nearly done, so the AM also reports the
objective at fractional epochs. Which objective: the *same* one the epoch ends report, the app's
`combine` of every worker's part over its input data and every server's part over its keys
(appmaster.ps.evaluation), taken between two BSP clocks, when every worker has flushed and no push
is in flight: exact, in the epoch objective's sign and scale, so the fit sees one series. A cheaper
proxy -- the mini-batch losses workers see while they train -- would be a different quantity
(before each batch's update, without the servers' terms: L1 / L2 penalties, LDA's word part), and
Optimus would fit two series mixed.

An exact evaluation costs a pass over the data without pushes, so it is paced:

- one at most every `every` of an epoch (1/8, the simulator's spacing, sim/sim_job.py), at the
  first clock boundary past each mark;
- only while the time spent evaluating mid-epoch, the evaluation about to run included (its cost
  predicted by the last one's), stays within a budget of the training time so far (the clocks'
  wall time, as the AM waited for them): `first_epoch_budget` (50 %) in the first epoch, where the
  points matter most -- they let Optimus fit a job before its first epoch ends (4 points spanning
  half an epoch) -- and `budget` (10 %) after; the first sample is always taken (its cost is
  unknown until then). A job whose evaluation is slow next to its clocks gets fewer points, and never
  spends more than the budget's share of its training so far on them, bar that first sample;
- the epoch ends' objectives go in too (`record` with whole epochs, no evaluation cost), so the
  series is continuous.

Points are kept whole (three numbers each) and thinned evenly to `MAX_CLOCK_OBJECTIVES` when
reported (protocol.job_report.recent_clock_objectives), oldest first. A job that goes back to an
earlier clock (a restart from a checkpoint) drops the points after it (`go_back`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from protocol.job_report import ClockObjective, recent_clock_objectives

CLOCK_OBJECTIVE_EVERY = 1.0 / 8      # of an epoch between two samples (sim/sim_job.py's spacing)
EVALUATION_BUDGET = 0.1              # mid-epoch evaluations' share of the training time at most
FIRST_EPOCH_BUDGET = 0.5             # the same during the first epoch (a first-epoch fit needs points)
_EPS = 1e-9

Point = tuple[int, float, float]     # (iteration, epochs trained, objective)


def epoch_fraction(positions: Mapping[int, tuple[int, int]], epoch: int, block_rows: Sequence[int]) -> float:
    """The share of epoch `epoch`'s rows trained, in [0, 1], from each input block's place
    (`positions`: block -> (epoch, next_row), as the workers report them after a clock). A block
    not in `positions`, or at an earlier epoch, has none of `epoch` trained; one at a later epoch
    has all of it."""
    total = sum(block_rows)
    if total <= 0:
        return 0.0
    done = 0
    for block, rows in enumerate(block_rows):
        e, row = positions.get(block, (0, 0))
        done += rows if e > epoch else min(max(row, 0), rows) if e == epoch else 0
    return done / total


@dataclass
class ClockObjectives:
    """The job's sampled objectives and the pacing of the next sample (see the module doc)."""

    every: float = CLOCK_OBJECTIVE_EVERY
    budget: float = EVALUATION_BUDGET
    first_epoch_budget: float = FIRST_EPOCH_BUDGET
    points: list[Point] = field(default_factory=list)
    train_s: float = 0.0          # seconds the clocks took (wall time, as the AM waited for them)
    eval_s: float = 0.0           # seconds the mid-epoch evaluations took
    evaluations: int = 0          # mid-epoch evaluations made (not the epoch ends)
    last_eval_s: float = 0.0      # the latest one's seconds (the next one's predicted cost)
    _report: Optional[list[ClockObjective]] = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not 0.0 < self.every <= 1.0:
            raise ValueError(f"clock objectives: every must be in (0, 1] epoch, got {self.every}")
        for name in ("budget", "first_epoch_budget"):
            if not getattr(self, name) >= 0.0:
                raise ValueError(f"clock objectives: {name} must be >= 0, got {getattr(self, name)}")

    def trained(self, seconds: float) -> None:
        """A clock ran for `seconds` (what the budget is a share of)."""
        if math.isfinite(seconds) and seconds > 0.0:
            self.train_s += seconds

    def next_mark(self) -> float:
        """The fractional epoch from which the next sample is due (the mark after the last point)."""
        last = self.points[-1][1] if self.points else 0.0
        return (math.floor(last / self.every + _EPS) + 1) * self.every

    def due(self, epochs: float) -> bool:
        """Whether to evaluate now, `epochs` (fractional) trained: past the next mark, and within
        the budget with this evaluation counted (always, for the first)."""
        if epochs + _EPS < self.next_mark():
            return False
        budget = self.first_epoch_budget if epochs < 1.0 else self.budget
        return self.evaluations == 0 or self.eval_s + self.last_eval_s <= budget * self.train_s

    def record(self, iteration: int, epochs: float, objective: float, eval_s: float = 0.0) -> None:
        """The objective after `iteration` iterations, `epochs` trained; `eval_s` > 0: a mid-epoch
        evaluation that took that long. A point not past the last one (a repeated epoch end) is
        ignored; a non-finite objective is kept out of the report (recent_clock_objectives)."""
        if self.points and (iteration < self.points[-1][0] or epochs <= self.points[-1][1] + _EPS):
            return
        self.points.append((int(iteration), float(epochs), float(objective)))
        if eval_s > 0.0:
            self.eval_s += eval_s
            self.last_eval_s = eval_s
            self.evaluations += 1
        self._report = None

    def go_back(self, iteration: int) -> None:
        """Training went back to `iteration` (a checkpoint's): forget the points after it."""
        kept = [p for p in self.points if p[0] <= iteration]
        if len(kept) != len(self.points):
            self.points = kept
            self._report = None

    def report(self) -> list[ClockObjective]:
        """The points as JobReport.clock_objectives carries them (thinned evenly, oldest first)."""
        if self._report is None:
            self._report = recent_clock_objectives(self.points)
        return self._report


__all__ = ["CLOCK_OBJECTIVE_EVERY", "ClockObjectives", "EVALUATION_BUDGET", "FIRST_EPOCH_BUDGET", "epoch_fraction"]

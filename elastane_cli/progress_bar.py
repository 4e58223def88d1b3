"""The live progress bar of a training job over its epochs: epoch i/max, objective, last epoch
time, ETA. Redrawn in place on a terminal; one line per epoch (and per phase change) otherwise.

Rendering (`EpochProgress` -> text) is pure so it is tested on its own; `ProgressBar` only decides
when to write, through `StatusLine`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence, TextIO

from .status_line import StatusLine
from .tables import format_duration

BAR_WIDTH = 20
FULL, EMPTY = "#", "."


@dataclass(frozen=True)
class EpochPoint:
    """One finished epoch: objective after it, its training time, and when it ended (unix time)."""

    epoch: int
    objective: float
    epoch_time_s: float
    time: float


@dataclass(frozen=True)
class EpochProgress:
    """What the bar shows about a job: its phase, epochs done out of at most `max_epochs`, history."""

    phase: str
    epochs_done: int
    max_epochs: int
    history: Sequence[EpochPoint] = ()
    initial_objective: float | None = None
    converged: bool = False
    heldout: str | None = None          # the latest held-out score, e.g. "cross_entropy 0.65 (true 0.49)"
    diverging: bool = False             # training improves while held-out worsens

    @property
    def objective(self) -> float | None:
        return self.history[-1].objective if self.history else self.initial_objective

    @property
    def last_epoch_time_s(self) -> float | None:
        return self.history[-1].epoch_time_s if self.history else None

    def wall_time_per_epoch_s(self) -> float | None:
        """Mean wall-clock time between epoch ends (includes objective and sync); the last epoch's
        training time when only one epoch is done."""
        if len(self.history) >= 2:
            span = self.history[-1].time - self.history[0].time
            if span > 0:
                return span / (len(self.history) - 1)
        return self.last_epoch_time_s

    def eta_s(self) -> float | None:
        """Time left if the job runs to `max_epochs` (an upper bound: it may converge earlier)."""
        if self.converged:
            return 0.0
        per_epoch = self.wall_time_per_epoch_s()
        if per_epoch is None:
            return None
        return max(0, self.max_epochs - self.epochs_done) * per_epoch


def _bar(done: int, total: int, width: int) -> str:
    filled = 0 if total <= 0 else min(width, math.floor(width * done / total))
    return "[" + FULL * filled + EMPTY * (width - filled) + "]"


def format_objective(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def format_progress(p: EpochProgress, width: int = BAR_WIDTH) -> str:
    """`epoch  3/20 [###.................]  objective 0.8123  epoch 1.23s  ETA <=21.0s` plus the
    phase while the job is not training."""
    digits = len(str(p.max_epochs))
    text = f"epoch {p.epochs_done:>{digits}}/{p.max_epochs} {_bar(p.epochs_done, p.max_epochs, width)}"
    text += f"  objective {format_objective(p.objective)}"
    if p.heldout is not None:
        text += f"  held-out {p.heldout}" + ("  OVERFITTING" if p.diverging else "")
    if p.last_epoch_time_s is not None:
        text += f"  epoch {p.last_epoch_time_s:.2f}s"
    if p.converged:
        text += "  converged"
    else:
        eta = p.eta_s()
        if eta is not None and p.phase == "TRAINING":
            text += f"  ETA <={format_duration(eta)}"
    if p.phase != "TRAINING":
        text += f"  ({p.phase})"
    return text


class ProgressBar:
    """Shows successive `EpochProgress` values on `out` (see the module doc)."""

    def __init__(self, out: TextIO, width: int = BAR_WIDTH) -> None:
        self._line = StatusLine(out)
        self.width = width
        self.shown = False

    def update(self, p: EpochProgress) -> None:
        # On a pipe the key decides what is new: an epoch or a phase, not the ETA ticking.
        self._line.update(format_progress(p, self.width),
                          key=f"{p.phase}:{p.epochs_done}:{p.converged}:{p.heldout}:{p.diverging}")
        self.shown = True

    def message(self, text: str, key: str) -> None:
        """A status line before there is any epoch progress (e.g. the app waiting for its AM)."""
        self._line.update(text, key=key)
        self.shown = True

    def finish(self) -> None:
        """End the live line so the next output starts on a new line."""
        if self.shown:
            self._line.finish()
        self.shown = False

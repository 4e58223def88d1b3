"""The growth trial of EPS's running-job scheduling, as an explicit, pure state machine.

EPS §4.2: the H-scheduler adds one worker and one server to a job, "monitors the training speed
of the job. If the speed drops due to the additional communication overhead, it removes the added
worker and server". A trial is that watch over one addition:

    SETTLING  --REACHED------->  MEASURING   the AM reports the new shape, no change under way
    SETTLING  --TIMEOUT------->  ABANDONED   the addition never came (no container, AM stuck)
    MEASURING --SPEED_KEPT---->  KEPT        speed after >= speed before (within a tolerance)
    MEASURING --SPEED_DROPPED->  REVERTED    the addition is taken back; the job is capped there
    MEASURING --TIMEOUT------->  KEPT        no speed measured in time: no evidence of a drop
    SETTLING / MEASURING --PREEMPTED--> ABANDONED   a job is waiting: give the addition back

`observe` turns a report and the time into the event (or None); `advance` applies the table.
Neither does I/O or reads a clock: time is the snapshot's `now`.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Optional

from protocol.job_report import JobReport
from protocol.state_machine import InvalidTransition, TransitionTable


class TrialState(str, enum.Enum):
    SETTLING = "SETTLING"
    MEASURING = "MEASURING"
    KEPT = "KEPT"
    REVERTED = "REVERTED"
    ABANDONED = "ABANDONED"

    @property
    def is_final(self) -> bool:
        return self in (TrialState.KEPT, TrialState.REVERTED, TrialState.ABANDONED)


class TrialEvent(str, enum.Enum):
    REACHED = "REACHED"
    SPEED_KEPT = "SPEED_KEPT"
    SPEED_DROPPED = "SPEED_DROPPED"
    TIMEOUT = "TIMEOUT"
    PREEMPTED = "PREEMPTED"


TRANSITIONS: TransitionTable[TrialState, TrialEvent, TrialState] = TransitionTable({
    (TrialState.SETTLING, TrialEvent.REACHED): TrialState.MEASURING,
    (TrialState.SETTLING, TrialEvent.TIMEOUT): TrialState.ABANDONED,
    (TrialState.SETTLING, TrialEvent.PREEMPTED): TrialState.ABANDONED,
    (TrialState.MEASURING, TrialEvent.SPEED_KEPT): TrialState.KEPT,
    (TrialState.MEASURING, TrialEvent.SPEED_DROPPED): TrialState.REVERTED,
    (TrialState.MEASURING, TrialEvent.TIMEOUT): TrialState.KEPT,
    (TrialState.MEASURING, TrialEvent.PREEMPTED): TrialState.ABANDONED,
}, lambda state, event: IllegalTrialTransition(f"{event.value} in state {state.value}", state, event))


class IllegalTrialTransition(InvalidTransition):
    """An event that the trial's state does not accept (a bug in the caller)."""


@dataclass(frozen=True)
class TrialConfig:
    """Knobs of the speed check. The paper says only "if the speed drops"; measured speeds are
    noisy, so a drop must exceed `speed_drop_tolerance` (a fraction of the speed before)."""

    speed_drop_tolerance: float = 0.05
    min_speed_iterations: int = 5        # iterations a speed must be measured over to be trusted
    settle_timeout_s: float = 120.0      # time for the addition to be granted and applied
    measure_timeout_s: float = 600.0     # time to measure the speed once it is applied


@dataclass(frozen=True)
class Trial:
    """One addition under watch: the shape before and after, and the speed before it."""

    app_id: str
    before: tuple[int, int]              # (workers, servers) before the addition
    after: tuple[int, int]               # (workers, servers) asked for
    speed_before: float
    started_at: float
    state: TrialState = TrialState.SETTLING
    reached_at: float = 0.0
    speed_after: float = 0.0

    @property
    def added_workers(self) -> bool:
        return self.after[0] > self.before[0]

    @property
    def added_servers(self) -> bool:
        return self.after[1] > self.before[1]


def advance(trial: Trial, event: TrialEvent, now: float, speed_after: float = 0.0) -> Trial:
    """The trial after `event` (IllegalTrialTransition if its state does not accept it)."""
    try:
        nxt = TRANSITIONS.next(trial.state, event)
    except IllegalTrialTransition as e:
        raise IllegalTrialTransition(f"trial of {trial.app_id}: {e}", e.state, e.event) from None
    if nxt == TrialState.MEASURING:
        return replace(trial, state=nxt, reached_at=now)
    return replace(trial, state=nxt, speed_after=speed_after or trial.speed_after)


def observe(trial: Trial, report: Optional[JobReport], now: float,
            cfg: TrialConfig) -> Optional[TrialEvent]:
    """What the latest report (or the passing of time) means for the trial; None: keep waiting."""
    if trial.state == TrialState.SETTLING:
        if (report is not None and not report.changing
                and (report.workers, report.servers) == trial.after):
            return TrialEvent.REACHED
        if now - trial.started_at >= cfg.settle_timeout_s:
            return TrialEvent.TIMEOUT
        return None
    if trial.state == TrialState.MEASURING:
        # The AM resets speed_iterations when a reconfiguration finishes, so this speed is the new shape's.
        if report is not None and report.speed_iterations >= cfg.min_speed_iterations:
            if report.speed < trial.speed_before * (1.0 - cfg.speed_drop_tolerance):
                return TrialEvent.SPEED_DROPPED
            return TrialEvent.SPEED_KEPT
        if now - trial.reached_at >= cfg.measure_timeout_s:
            return TrialEvent.TIMEOUT
        return None
    return None


__all__ = ["IllegalTrialTransition", "TRANSITIONS", "Trial", "TrialConfig", "TrialEvent", "TrialState",
           "advance", "observe"]

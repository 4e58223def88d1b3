"""What each of the PS-job controller's step instructions costs a simulated job, from its app's
calibration (sim/calibration.py), so the simulator charges the calibrated costs it charged before
it ran the controller: an EPS change stalls training for `reshape_cost`, a kill-based restart, a
recovery and a resume for `restart_cost`, a pause for `pause_s`, the start for `startup_s`, the end
for `finish_s`.

The calibration measured whole changes, not their steps, so a change's cost is shared out over
the steps that make it up:

- EPS's live steps (appmaster/ps/controller/planners/eps.py) share `reshape_cost` so that each of
  EPS's four functions costs exactly one `reshape_cost` whatever its stages:
      add_servers     Join 1/4 + MoveModelBlocks 3/4
      add_workers     Join 1/4 + StageSplits 1/2 + CommitSplits 1/4
      remove_servers  MoveModelBlocks 3/4 + WaitClockBoundary 0 + RetireExecutors 1/4
      remove_workers  StageSplits 1/2 + CommitSplits 1/4 + RetireExecutors 1/4
  A change whose parts run in several groups one after the other (removals, then additions) has
  each step's share divided by the number of groups: the whole change costs one `reshape_cost`,
  as the calibrated reshape (measured on whole changes) did. A worker replaced live (a loss or a
  straggler: Join + TakeOverSplits 3/4) costs what adding one does, and so does a lost server
  rebuilt (Join + RebuildServers 3/4: its blocks arrive as an added server's do).
- Changes that stop training first (PauseTraining: a restart, a migration, a recovery through a
  checkpoint, a pause, a resume) are charged at their checkpoint and restore steps: WriteCheckpoint
  costs `pause_s` where the change is a pause or a migration (the "checkpoint and release" of a
  pause), RestoreCheckpoint `restart_cost` (the restart from a checkpoint); their other steps are
  within those figures (0). A restore that keeps the workers (a lost server) is charged the same,
  an upper bound: the calibration measured whole restarts, and simulated jobs lose executors only
  where a replay injects it (sim/am_replay.py).
- SetupTraining costs `startup_s` (executors granted -> training), ScoreModel `finish_s`
  (converged -> unregistered; the final checkpoint is within it), PauseTraining / ResumeTraining
  nothing beyond the change's figure. Launching granted executors costs nothing on its own: the
  calibrated figures are measured from the grant.
"""
from __future__ import annotations

from typing import Optional

from appmaster.ps.controller import instructions as ins
from appmaster.ps.controller.state import Change, ChangeKind

from .calibration import AppCalibration

# Shares of `reshape_cost` per live step (module doc): each EPS function's steps sum to 1.
RESHAPE_SHARE: dict[type, float] = {
    ins.JoinExecutors: 0.25, ins.MoveModelBlocks: 0.75, ins.StageSplits: 0.5, ins.CommitSplits: 0.25,
    ins.WaitClockBoundary: 0.0, ins.RetireExecutors: 0.25, ins.DiscardStaged: 0.0, ins.SwitchRole: 0.5,
    ins.SendExecutorRequest: 0.0, ins.TakeOverSplits: 0.75, ins.ComputePlan: 0.0, ins.RebuildServers: 0.75,
}
# A pause (and a migration, which pauses first) pays pause_s for its checkpoint and release.
PAUSES = frozenset({ChangeKind.PAUSE, ChangeKind.MIGRATE})


def groups_of(change: Optional[Change]) -> int:
    """How many groups one after the other an EPS change runs (1 for anything else)."""
    if change is None or not change.parts:
        return 1
    return max(1, len({p.group for p in change.parts}))


def step_cost(cal: AppCalibration, step: ins.StepInstruction, change: Optional[Change], model_mb: float,
              data_scale: float, halted: bool = False) -> float:
    """Seconds `step` (of `change`, the change in the job's slot) takes a simulated job; `halted`:
    the change stopped training first (PauseTraining), so its live steps are within its figure."""
    kind = change.kind if change is not None else None
    if isinstance(step, ins.SetupTraining):
        return cal.startup_s
    if isinstance(step, ins.ScoreModel):
        return cal.finish_s
    if isinstance(step, ins.RestoreCheckpoint):
        return cal.restart_cost(model_mb, data_scale)
    if isinstance(step, ins.WriteCheckpoint):
        return cal.pause_s if kind in PAUSES else 0.0
    if not halted:
        return RESHAPE_SHARE.get(type(step), 0.0) * cal.reshape_cost(model_mb, data_scale) / groups_of(change)
    return 0.0


__all__ = ["PAUSES", "RESHAPE_SHARE", "groups_of", "step_cost"]

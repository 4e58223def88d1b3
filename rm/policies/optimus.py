"""The `optimus` policy: Optimus (Peng et al., EuroSys'18) §3-4 over the elastic PS jobs.

Every round, per running PS job (rm/policies/eps_jobs.classify: started, its AM reporting):

1. **Models** (models/optimus_fit.py). The loss curve (eq. 1) is fitted to the job report's
   objective history (`initial_objective` at k = 0, epoch e's objective at k = e + 1) and gives Q,
   the epochs left until an epoch improves the objective by less than the job's convergence
   threshold (the runtime's own test), at most the epochs left to `max_epochs`. The speed function
   (eq. 3 for SSP, eq. 4 for BSP) is fitted to (servers, workers, epochs/s) samples: one sample per
   epoch trained entirely at a settled shape (1 / that epoch's training time from the report).
   Fits are redone only when their inputs change, all jobs' loss curves in one vectorised call.
2. **Allocation** (§4.1, rm/policies/optimus_alloc.py): each fitted job starts at one worker and
   one server; the rest of the budget goes one executor at a time to the largest marginal gain
   (eq. 9) per dominant-resource share, up to the job's max_workers / max_servers. The gain of a
   job early in training (fitted progress below `EARLY_PROGRESS`) is multiplied by
   `PRIORITY_FACTOR` (0.95): the paper applies the factor at "the beginning state (i.e., larger
   prediction errors)" -- not near completion -- and so does this policy.
3. **Placement** (§4.2, rm/policies/optimus_placement.py): each job whose shape changes is placed
   on the fewest nodes with equal workers and servers per node (Theorem 1), in the Decision's
   placement.

The budget is what the managed jobs' executors may hold: the cluster's total, less what other
apps and every AM hold, less what waiting apps still need (an incoming PS job's outstanding AM and
executors, a queued app's pending asks) so they can start -- as EPS does, running jobs shrink to
make room for a job that arrives.

Departures from the paper, and why:
* Jobs not yet fitted (fewer than `models.optimus_fit.MIN_LOSS_POINTS` loss points or no speed
  sample) keep their requested shape; so does a job in the middle of a reconfiguration (its
  target), so a directive is not changed while the AM carries it out.
* The paper pre-runs each job at several shapes to seed its speed function; here the fit is seeded
  with a reference function scaled to the job's own samples (see models/optimus_fit.py).
* A job that cannot be placed evenly is not paused (pausing is Harmony's run state): it takes only
  the shrinking part of its change, with no placement (its AM removes executors where they are),
  and keeps its shape otherwise; the next round may place it.
* A reshaped job's own executors are placed anew (the AM moves those not on the named nodes), so
  the room they take on their nodes (`AppView.executors_on`) counts as free when placing it.

State between calls (decide() is deterministic for a sequence of snapshots): per job, its speed
samples, the shape it settled at and since when, and the cached fits.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from models.optimus_fit import FEATURES, MIN_LOSS_POINTS, LossCurve, SpeedFunction, fit_loss_curves, fit_speed, inverse_speed
from protocol.job_report import MAX_OBJECTIVES, JobReport
from protocol.records import Resource

from .decision import Decision, JobDecision
from .eps_jobs import IncomingJob, RunningJob, clamp0, classify
from .optimus_alloc import AllocationProblem, allocate
from .optimus_placement import NodeBook, PlacementJob, place_jobs
from .snapshot import AppView, ClusterSnapshot

PRIORITY_FACTOR = 0.95      # §4.1: gains of jobs at the beginning of training, to damp prediction errors
EARLY_PROGRESS = 0.2        # "beginning": fitted progress (epochs trained / predicted total) below this
# §4: Optimus re-plans every scheduling interval (10 minutes in §6.1), not on every RM tick, so a
# job is not reshaped again before its last change has been measured; a job arriving, starting,
# leaving or becoming fittable triggers a round at once (its room must be made, its resources
# reused, or its first fit acted on).
SCHEDULING_INTERVAL_S = 30.0
MAX_SPEED_SAMPLES = 16      # the most recent samples kept per job
DEFAULT_THRESHOLD = 1e-3    # the apps' default convergence_threshold, for a spec that cannot be read
DEFAULT_MAX_EPOCHS = 1000   # remaining epochs are capped by max_epochs; without one, by this


@dataclass(frozen=True)
class JobTraits:
    """What the policy needs of a job's spec: its mode and stopping rules."""

    sync: bool
    threshold: float
    max_epochs: int


@dataclass
class JobModel:
    """One job's state between rounds: its speed samples and cached fits."""

    traits: JobTraits
    samples: list[tuple[int, int, float]] = field(default_factory=list)   # (servers, workers, epochs/s)
    added: int = 0                        # samples ever added (the speed fit's cache key)
    settled: Optional[tuple[int, int]] = None   # (workers, servers) the job has been settled at
    settled_epoch: int = -1               # epochs after this one were trained entirely at `settled`
    sampled_epoch: int = -1               # the last epoch a sample was taken from
    initial: Optional[float] = None       # the loss history seen so far: initial objective, then
    epochs: list[int] = field(default_factory=list)       # per finished epoch (the report keeps
    losses: list[float] = field(default_factory=list)     # only the latest MAX_OBJECTIVES)
    curve_epoch: Optional[int] = None     # the last epoch the cached curve was fitted with
    curve: Optional[LossCurve] = None
    speed_key: int = -1
    speed: Optional[SpeedFunction] = None


def job_traits(app: AppView) -> JobTraits:
    """The job's sync mode, convergence threshold and max_epochs from its spec (with defaults)."""
    ps = app.ps
    if ps is None:
        return JobTraits(True, DEFAULT_THRESHOLD, DEFAULT_MAX_EPOCHS)
    threshold = ps.convergence_threshold if ps.convergence_threshold is not None else DEFAULT_THRESHOLD
    return JobTraits(ps.bsp, threshold, ps.max_epochs if ps.max_epochs is not None else DEFAULT_MAX_EPOCHS)


def observe(model: JobModel, report: JobReport, is_settled: bool) -> None:
    """Take speed samples from `report`: 1 / epoch time for each new epoch trained entirely at the
    shape the job is settled at (`settled`)."""
    shape = (report.workers, report.servers)
    if not is_settled or report.workers < 1 or report.servers < 1:
        model.settled = None
        return
    if model.settled != shape:
        model.settled = shape
        # A job never reshaped (no directive acted on) trained every epoch at this shape.
        model.settled_epoch = -1 if report.directive_version == 0 else (
            report.epoch if report.epoch is not None else -1) + 1
    if report.epoch is None or report.epoch <= model.sampled_epoch:
        return
    first = max(model.sampled_epoch, model.settled_epoch) + 1   # oldest epoch that counts
    fresh = report.epoch - first + 1
    if fresh <= 0:
        return
    times = report.epoch_times[-fresh:] if report.epoch_times else (
        [report.epoch_time_s] if report.epoch_time_s is not None else [])
    for t in times:
        if t > 0:
            model.samples.append((report.servers, report.workers, 1.0 / t))
            model.added += 1
    del model.samples[:-MAX_SPEED_SAMPLES]
    model.sampled_epoch = report.epoch


def update_history(model: JobModel, report: JobReport) -> bool:
    """Extend the job's loss history with the report's new epochs (only those: the report repeats
    up to MAX_OBJECTIVES of them every time); True when it changed. A history that does not go on
    from what was seen (the job went back to a checkpoint) replaces it."""
    objs = report.objectives
    initial = report.initial_objective if report.initial_objective is not None and math.isfinite(
        report.initial_objective) else None
    last = model.epochs[-1] if model.epochs else -1
    if initial == model.initial and (not objs or objs[-1].epoch == last):
        return False
    if initial != model.initial or (objs and objs[-1].epoch < last):
        model.initial, model.epochs, model.losses, last = initial, [], [], -1
    fresh = []
    for o in reversed(objs):
        if o.epoch <= last:
            break
        fresh.append(o)
    for o in reversed(fresh):
        model.epochs.append(o.epoch)
        model.losses.append(o.objective)
    del model.epochs[:-MAX_OBJECTIVES]
    del model.losses[:-MAX_OBJECTIVES]
    return True


def settled(job: RunningJob, app: AppView) -> bool:
    """The job is not in the middle of a change: it reports no change running and either has the
    shape of its directive or has acted on that directive already (an AM that could not reach the
    shape -- no containers in time -- ends the change at the shape it got)."""
    r = job.report
    if r.changing:
        return False
    version = app.directive.version if app.directive is not None else 0
    return (r.workers, r.servers) == (job.workers, job.servers) or r.directive_version >= version


@dataclass(frozen=True)
class _Fitted:
    """A job the allocation sizes: its remaining epochs, speed function and bounds."""

    job: RunningJob
    remaining: float
    speed: SpeedFunction
    early: bool


class OptimusPolicy:
    """Optimus's allocation and placement (see the module docstring). One instance per RM."""

    name = "optimus"

    def __init__(self, settings: object = None) -> None:
        # `settings`: whatever the policy registry may hand its factories; Optimus has none of its
        # own (its constants are this module's).
        self._models: dict[str, JobModel] = {}
        self._last_round: Optional[float] = None
        self._last_jobs: tuple[tuple[str, ...], ...] = ()

    def decide(self, snapshot: ClusterSnapshot) -> Decision:
        """Job decisions for the running PS jobs whose shape changes this round. Speed samples are
        taken on every call; a round (fits, allocation, placement) runs every
        `SCHEDULING_INTERVAL_S`, or at once when a job arrives, starts, leaves or has just gathered
        the data to be fitted."""
        view = classify(snapshot)
        apps = {a.app_id: a for a in snapshot.apps}
        jobs = list(view.running)
        self._models = {j.app_id: self._models.get(j.app_id) or JobModel(job_traits(apps[j.app_id]))
                        for j in jobs}
        for j in jobs:
            observe(self._models[j.app_id], j.report, settled(j, apps[j.app_id]))
        # A job that has just gathered enough data to be fitted counts as a newcomer too.
        ready = tuple(j.app_id for j in jobs if self._models[j.app_id].samples
                      and len(j.report.objectives) + (j.report.initial_objective is not None) >= MIN_LOSS_POINTS)
        present = (tuple(j.app_id for j in jobs), tuple(j.app_id for j in view.incoming), view.other_queued, ready)
        if (self._last_round is not None and present == self._last_jobs
                and snapshot.now < self._last_round + SCHEDULING_INTERVAL_S):
            return Decision({})
        self._last_round, self._last_jobs = snapshot.now, present
        self._refit(jobs)
        fitted, fixed = self._split(jobs, apps)
        budget = self._budget(snapshot, view.running, view.incoming, view.other_queued, apps)
        targets: dict[str, tuple[int, int]] = {}
        reasons: dict[str, str] = {}
        for j in fixed:
            targets[j.app_id] = self._fixed_target(j, apps[j.app_id])
            budget = budget - j.executor.scale(sum(targets[j.app_id]))
            reasons[j.app_id] = "optimus: not fitted yet; requested shape"
        if fitted:
            for f in fitted:
                budget = budget - f.job.executor.scale(2)
            servers, workers = allocate(self._problem(fitted, budget, snapshot.total))
            for f, s, w in zip(fitted, servers, workers):
                targets[f.job.app_id] = (int(w), int(s))
                t = f.remaining * inverse_speed(f.speed.coefficients, int(s), int(w))
                reasons[f.job.app_id] = (f"optimus: ~{f.remaining:.0f} epochs left, ~{t:.0f}s at "
                                         f"{int(w)} workers / {int(s)} servers")
        return self._place(snapshot, jobs, targets, reasons)

    # ----- models -----------------------------------------------------------------------------
    def _refit(self, jobs: list[RunningJob]) -> None:
        stale: list[JobModel] = []
        for j in jobs:
            m = self._models[j.app_id]
            if update_history(m, j.report) and m.curve_epoch != (m.epochs[-1] if m.epochs else None):
                stale.append(m)
            if m.added != m.speed_key:
                m.speed = fit_speed(m.samples, m.traits.sync, j.spec.max_servers, j.spec.max_workers)
                m.speed_key = m.added
        series = [(np.array(([0.0] if m.initial is not None else []) + [e + 1.0 for e in m.epochs]),
                   np.array(([m.initial] if m.initial is not None else []) + m.losses)) for m in stale]
        for m, curve in zip(stale, fit_loss_curves(series)):
            m.curve, m.curve_epoch = curve, (m.epochs[-1] if m.epochs else None)

    def _split(self, jobs: list[RunningJob], apps: dict[str, AppView]) -> tuple[list[_Fitted], list[RunningJob]]:
        fitted: list[_Fitted] = []
        fixed: list[RunningJob] = []
        for j in jobs:
            m, r = self._models[j.app_id], j.report
            if not settled(j, apps[j.app_id]) or m.curve is None or m.speed is None:
                fixed.append(j)
                continue
            trained = (r.objectives[-1].epoch + 1) if r.objectives else 0
            left = min(m.curve.remaining_epochs(trained, m.traits.threshold),
                       float(max(0, m.traits.max_epochs - trained)))
            total = trained + left
            fitted.append(_Fitted(j, left, m.speed, total > 0 and trained / total < EARLY_PROGRESS))
        return fitted, fixed

    @staticmethod
    def _fixed_target(j: RunningJob, app: AppView) -> tuple[int, int]:
        if not settled(j, app):
            return (j.workers, j.servers)            # a change is under way: keep its target
        return (j.spec.workers, j.spec.servers)      # not fitted: the requested shape

    # ----- allocation ---------------------------------------------------------------------------
    @staticmethod
    def _budget(snapshot: ClusterSnapshot, running: tuple[RunningJob, ...], incoming: tuple[IncomingJob, ...],
                other_queued: tuple[str, ...], apps: dict[str, AppView]) -> Resource:
        """What the managed jobs' executors may hold in all (see the module doc)."""
        budget = snapshot.total - snapshot.used
        for j in running:
            budget = budget + clamp0(j.held - j.am)
        for inc in incoming:
            budget = budget - inc.need
        for app_id in other_queued:
            budget = budget - apps[app_id].pending
        return budget

    @staticmethod
    def _problem(fitted: list[_Fitted], budget: Resource, total: Resource) -> AllocationProblem:
        n = len(fitted)
        coef = np.array([f.speed.coefficients for f in fitted], dtype=float).reshape(n, len(FEATURES))
        ex = np.array([[f.job.executor.memory, f.job.executor.vcores] for f in fitted], dtype=float)
        cap = np.array([max(1, total.memory), max(1, total.vcores)], dtype=float)
        dominant = np.maximum((ex / cap).max(axis=1), 1e-12)
        return AllocationProblem(
            remaining=np.array([f.remaining for f in fitted], dtype=float), coefficients=coef,
            servers=np.ones(n, dtype=np.int64), workers=np.ones(n, dtype=np.int64),
            max_servers=np.array([max(1, f.job.spec.max_servers) for f in fitted], dtype=np.int64),
            max_workers=np.array([max(1, f.job.spec.max_workers) for f in fitted], dtype=np.int64),
            executor=ex, dominant=dominant,
            factor=np.array([PRIORITY_FACTOR if f.early else 1.0 for f in fitted]),
            budget=np.array([budget.memory, budget.vcores], dtype=float))

    # ----- placement ----------------------------------------------------------------------------
    @staticmethod
    def _place(snapshot: ClusterSnapshot, jobs: list[RunningJob], targets: dict[str, tuple[int, int]],
               reasons: dict[str, str]) -> Decision:
        changed = [j for j in jobs if targets[j.app_id] != (j.workers, j.servers)]
        if not changed:
            return Decision({})
        running = [n for n in snapshot.nodes if n.state == "RUNNING"]
        index = {n.node_id: i for i, n in enumerate(running)}
        mem = [n.capacity.memory - n.used.memory for n in running]
        vc = [n.capacity.vcores - n.used.vcores for n in running]
        views = {a.app_id: a for a in snapshot.apps}
        for j in changed:      # a reshaped job's own executors are placed anew: their room is free
            for node_id, held in _executors_on(views[j.app_id], j.executor):
                if node_id in index:
                    mem[index[node_id]] += held.memory
                    vc[index[node_id]] += held.vcores
        book = NodeBook([n.node_id for n in running], mem, vc)
        placed = place_jobs(book, [PlacementJob(j.app_id, *targets[j.app_id], j.executor.memory, j.executor.vcores)
                                   for j in changed])
        out: dict[str, JobDecision] = {}
        for j in changed:
            w, s = targets[j.app_id]
            where = placed[j.app_id]
            if where is not None:
                out[j.app_id] = JobDecision(w, s, where, reason=reasons[j.app_id])
                continue
            # No even placement: only the shrinking part of the change, where the job runs.
            w, s = min(w, j.workers), min(s, j.servers)
            if (w, s) != (j.workers, j.servers):
                out[j.app_id] = JobDecision(w, s, reason=reasons[j.app_id] + "; no even placement: shrinks only")
        return Decision(dict(sorted(out.items())))


def _executors_on(app: AppView, executor: Resource) -> tuple[tuple[str, Resource], ...]:
    """Where the app's executors are: the snapshot's own account, else (a snapshot without it, e.g.
    a simulator's) where its current directive placed them."""
    if app.executors_on:
        return app.executors_on
    d = app.directive
    return tuple((p.node, executor.scale(p.workers + p.servers)) for p in (d.placement if d is not None else []))


__all__ = ["JobModel", "JobTraits", "OptimusPolicy", "observe"]

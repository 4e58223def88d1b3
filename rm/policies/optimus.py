"""The `optimus` policy: Optimus (Peng et al., EuroSys'18) §3-4 over the elastic PS jobs.

Every round, per running PS job (rm/policies/eps_jobs.classify: started, its AM reporting):

1. **Models** (models/optimus_fit.py). The loss curve (eq. 1) is fitted to the job report's
   objective history -- `initial_objective` at k = 0, epoch e's objective at k = e + 1, and the
   objective every few clocks at its fractional epochs (`clock_objectives`) -- made a positive,
   falling loss first whatever its sign and direction (LDA's log-likelihood rises). It gives Q,
   the epochs left until an epoch improves the objective by less than the job's convergence
   threshold (the runtime's own test), at most the epochs left to `max_epochs`. The speed function
   (eq. 3 for SSP, eq. 4 for BSP) is fitted to (servers, workers, epochs/s) samples: one per
   epoch trained entirely at a settled shape (1 / that epoch's training time from the report),
   and, before the first such epoch, the report's per-clock speed at the settled shape (iterations
   per second over `speed_iterations` >= `MIN_CLOCK_SPEED_ITERATIONS`, per epoch via the clocks per
   epoch the clock objectives give). The fit is seeded with the app's prior
   (rm/policies/optimus_priors.py: per-app measured shapes and what finished jobs of the app
   showed), the paper's ResNet-50 reference only for an app with none.
   Fits are redone only when their inputs change, all jobs' loss curves in one vectorised call.
2. **Allocation** (§4.1, rm/policies/optimus_alloc.py): each sized job starts at one worker and
   one server (its spec's min_workers / min_servers where larger); the rest of the budget goes one
   executor at a time to the largest marginal gain (eq. 9) per dominant-resource share, up to the
   job's max_workers / max_servers. The gain of a job early in training (progress below
   `EARLY_PROGRESS`) is multiplied by `PRIORITY_FACTOR` (0.95): the paper applies the factor at
   "the beginning state (i.e., larger prediction errors)" -- not near completion -- and so does
   this policy.
3. **Hysteresis**: a job is moved off its current shape only when the predicted cut in its
   remaining time exceeds `HYSTERESIS_FACTOR` x its resize cost (the time its AM last spent
   `changing`, `RESIZE_COST_S` until measured) and `MIN_RELATIVE_GAIN` of that time; a change
   that gains less is dropped where the budget allows, smallest first, so fits that wobble do not
   reshape jobs back and forth.
4. **Placement** (§4.2, rm/policies/optimus_placement.py): each job whose shape changes is placed
   on the fewest nodes with equal workers and servers per node (Theorem 1), in the Decision's
   placement.

The budget is what the managed jobs' executors may hold: the cluster's total, less what other
apps and every AM hold, less what waiting apps still need (an incoming PS job's outstanding AM and
executors, a queued app's pending asks) so they can start -- as EPS does, running jobs shrink to
make room for a job that arrives.

Departures from the paper, and why:
* The paper pre-runs each job at several shapes to seed its speed function; here the fit is seeded
  with the app's prior scaled to the job's own speed. A pre-run inside the job's own training
  (each new job stepped through the paper's five shapes by this policy, the next at once on a
  sample at the last) was built and measured, and lost on both workloads: 1.26x over DRF against
  1.36x without on §6's, 0.99x against 1.21x on the default trace (docs/optimus.md, departures).
* A job whose loss curve cannot be fitted yet (too few points) is sized too, by the same rule,
  with a prior on its remaining epochs: `max_epochs` less the epochs trained (`PRIOR_EPOCHS` when
  the spec has no limit). A job with no speed measured at all yet, and one in the middle of a
  reconfiguration (its target), keep their shape, so a directive is not changed while the AM
  carries it out.
* A job that cannot be placed evenly is not paused (pausing is Harmony's run state): it takes only
  the shrinking part of its change, with no placement (its AM removes executors where they are),
  and keeps its shape otherwise; the next round may place it.
* A reshaped job's own executors are placed anew (the AM moves those not on the named nodes), so
  the room they take on their nodes (`AppView.executors_on`) counts as free when placing it.

Known inputs (`KnownInputs`): a caller that knows a job's speed function or remaining epochs
better than the fits may hand them in; the policy then uses them in place of its estimate and
changes nothing else (rule, priority factor, hysteresis, placement, cadence). The RM hands none.
The simulator does, with the truth, to measure what each estimate costs (sim/optimus_truth.py,
docs/simulator.md "Where Optimus's loss comes from").

State between calls (decide() is deterministic for a sequence of snapshots): per job, its speed
samples, the shape it settled at and since when, its loss history, resize cost and cached fits;
per app, the priors learned from finished jobs. The RM stores all of it but the fits
(`export_state`, `OptimusState`): a new active RM refits them from it and the AMs' next reports
(its rounds wait for those, rm/policy_resync.py) and keeps the round cadence. Only what a report
cannot give again needs storing -- the shapes the samples were taken at, the priors -- but the
history is stored too, so the refit is on the points the old RM had (a report holds fewer clock
points, thinned); a job's stored clock points are thinned to `STORED_CLOCK_POINTS`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple, Optional, Protocol

import msgspec
import numpy as np

from models.optimus_fit import (FEATURES, MIN_FIT_SPAN, MIN_LOSS_POINTS, LossCurve, SpeedFunction,
                                fit_loss_histories, fit_speed, inverse_speed, loss_arrays)
from protocol.job_report import MAX_OBJECTIVES, JobReport
from protocol.records import AppState, FinalStatus, Resource

from .decision import Decision, JobDecision
from .eps_jobs import IncomingJob, RunningJob, clamp0, classify
from .optimus_alloc import AllocationProblem, allocate
from .optimus_placement import NodeBook, PlacementJob, place_jobs
from .optimus_priors import AppPriors, LearnedJob
from .snapshot import AppView, ClusterSnapshot

PRIORITY_FACTOR = 0.95      # §4.1: gains of jobs at the beginning of training, to damp prediction errors
EARLY_PROGRESS = 0.2        # "beginning": progress (epochs trained / predicted total) below this
# §4: Optimus re-plans every scheduling interval (10 minutes in §6.1), not on every RM tick, so a
# job is not reshaped again before its last change has been measured; a job arriving, starting,
# leaving or gathering the data for a fit triggers a round at once (its room must be made, its
# resources reused, or its first estimate acted on).
SCHEDULING_INTERVAL_S = 30.0
MAX_SPEED_SAMPLES = 16      # the most recent samples kept per job
MAX_CLOCK_POINTS = 2000     # per-clock loss points kept per job (the fit averages them to 32)
DEFAULT_THRESHOLD = 1e-3    # the apps' default convergence_threshold, for a spec that cannot be read
DEFAULT_MAX_EPOCHS = 1000   # remaining epochs are capped by max_epochs; without one, by this
PRIOR_EPOCHS = 30           # an unfitted job's total epochs when its spec has no max_epochs
MIN_CLOCK_SPEED_ITERATIONS = 20   # a per-clock speed measured over fewer iterations is not a sample
RESIZE_COST_S = 5.0         # a resize's cost (s) until the job's own has been measured
HYSTERESIS_FACTOR = 2.0     # a change must cut the remaining time by this many resize costs ...
MIN_RELATIVE_GAIN = 0.05    # ... and by this fraction of it
# Clock points stored per job (of up to MAX_CLOCK_POINTS kept): a job's stored state stays a few KB
# (etcd takes requests of 1.5 MiB); the fit averages its points into 32 anyway.
STORED_CLOCK_POINTS = 256


@dataclass(frozen=True)
class JobTraits:
    """What the policy needs of a job's spec: its app, mode and stopping rules (max_epochs None:
    the spec sets no limit)."""

    sync: bool
    threshold: float
    max_epochs: Optional[int]
    app: str = ""


@dataclass
class JobModel:
    """One job's state between rounds: its speed samples, loss history and cached fits."""

    traits: JobTraits
    samples: list[tuple[int, int, float]] = field(default_factory=list)   # (servers, workers, epochs/s)
    added: int = 0                        # samples ever added (the speed fit's cache key)
    settled: Optional[tuple[int, int]] = None   # (workers, servers) the job has been settled at
    settled_epoch: int = -1               # epochs after this one were trained entirely at `settled`
    sampled_epoch: int = -1               # the last epoch a sample was taken from
    clock_sample: Optional[tuple[int, int, float]] = None   # the per-clock speed at the settled shape
    clocks_per_epoch: Optional[float] = None
    initial: Optional[float] = None       # the loss history seen so far: initial objective, then
    epochs: list[int] = field(default_factory=list)       # per finished epoch (the report keeps
    losses: list[float] = field(default_factory=list)     # only the latest MAX_OBJECTIVES)
    clock_k: list[float] = field(default_factory=list)    # per-clock points: fractional epochs and
    clock_l: list[float] = field(default_factory=list)    # objectives (JobReport.clock_objectives)
    curve_key: Optional[tuple[object, ...]] = None   # the loss history the cached curve was fitted on
    curve: Optional[LossCurve] = None
    speed_key: Optional[tuple[object, ...]] = None
    speed: Optional[SpeedFunction] = None
    fitted_samples: list[tuple[int, int, float]] = field(default_factory=list)   # the speed fit's samples
    changing_since: Optional[float] = None
    resize_cost: float = RESIZE_COST_S

    @property
    def shapes(self) -> int:
        """Distinct shapes the speed fit's samples cover (counted when asked: only a job that
        leaves is asked, so the rounds do not count them for every job)."""
        return len({s[:2] for s in self.fitted_samples})

    @property
    def trained(self) -> float:
        """Epochs trained, fractional where per-clock points say more than finished epochs."""
        done = float(self.epochs[-1] + 1) if self.epochs else 0.0
        return max(done, self.clock_k[-1]) if self.clock_k else done

    @property
    def history_key(self) -> tuple[object, ...]:
        """Changes whenever the loss history does (the curve's cache key), without building it."""
        return (self.initial, len(self.epochs), self.epochs[-1] if self.epochs else None,
                len(self.clock_k), self.clock_k[-1] if self.clock_k else None)

    @property
    def can_fit(self) -> bool:
        """The loss history has the points a curve needs (models/optimus_fit.fittable), counted
        without building it (an epoch point and a clock point at the same k count twice)."""
        n = len(self.epochs) + len(self.clock_k) + (self.initial is not None)
        firsts = ([0.0] if self.initial is not None else []) + ([self.epochs[0] + 1.0] if self.epochs else []) + (
            [self.clock_k[0]] if self.clock_k else [])
        return n >= MIN_LOSS_POINTS and bool(firsts) and self.trained - min(firsts) >= MIN_FIT_SPAN

    def speed_samples(self) -> list[tuple[int, int, float]]:
        """The epoch samples, and the per-clock sample where no epoch sample has its shape."""
        out = list(self.samples)
        c = self.clock_sample
        if c is not None and all(s[:2] != c[:2] for s in out):
            out.append(c)
        return out


class StoredJob(msgspec.Struct, forbid_unknown_fields=True):
    """A JobModel as the RM stores it: its observations, without the fits (refitted from them)."""

    app: str
    sync: bool
    threshold: float
    max_epochs: Optional[int]
    samples: list[tuple[int, int, float]]
    added: int
    settled: Optional[tuple[int, int]]
    settled_epoch: int
    sampled_epoch: int
    clock_sample: Optional[tuple[int, int, float]]
    clocks_per_epoch: Optional[float]
    initial: Optional[float]
    epochs: list[int]
    losses: list[float]
    clock_k: list[float]
    clock_l: list[float]
    changing_since: Optional[float]
    resize_cost: float

    @classmethod
    def of(cls, m: JobModel) -> "StoredJob":
        t = m.traits
        k, lo = m.clock_k, m.clock_l
        if len(k) > STORED_CLOCK_POINTS:    # evenly thinned, the latest point kept
            idx = np.linspace(0, len(k) - 1, STORED_CLOCK_POINTS).round().astype(int)
            k, lo = [k[i] for i in idx], [lo[i] for i in idx]
        return cls(t.app, t.sync, t.threshold, t.max_epochs, list(m.samples), m.added, m.settled, m.settled_epoch,
                   m.sampled_epoch, m.clock_sample, m.clocks_per_epoch, m.initial, list(m.epochs), list(m.losses),
                   list(k), list(lo), m.changing_since, m.resize_cost)

    def model(self) -> JobModel:
        return JobModel(JobTraits(self.sync, self.threshold, self.max_epochs, self.app), samples=list(self.samples),
                        added=self.added, settled=self.settled, settled_epoch=self.settled_epoch,
                        sampled_epoch=self.sampled_epoch, clock_sample=self.clock_sample,
                        clocks_per_epoch=self.clocks_per_epoch, initial=self.initial, epochs=list(self.epochs),
                        losses=list(self.losses), clock_k=list(self.clock_k), clock_l=list(self.clock_l),
                        changing_since=self.changing_since, resize_cost=self.resize_cost)


Present = tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[tuple[str, bool, bool], ...]]


class OptimusState(msgspec.Struct, forbid_unknown_fields=True):
    """What the `optimus` policy keeps between rounds, as the RM stores it (module doc)."""

    jobs: dict[str, StoredJob]
    learned: dict[str, list[tuple[float, ...]]]
    prior_versions: dict[str, int]
    prior_epochs: dict[str, list[float]]
    last_round: Optional[float]
    last_jobs: Optional[Present]
    # The finished jobs' speed samples the priors are fitted on (a state stored before they were
    # kept has none: its priors are the `learned` fits' mean).
    learned_samples: dict[str, list[LearnedJob]] = {}


def job_traits(app: AppView) -> JobTraits:
    """The job's app, sync mode, convergence threshold and max_epochs from its spec (with defaults)."""
    ps = app.ps
    if ps is None:
        return JobTraits(True, DEFAULT_THRESHOLD, None)
    threshold = ps.convergence_threshold if ps.convergence_threshold is not None else DEFAULT_THRESHOLD
    return JobTraits(ps.bsp, threshold, ps.max_epochs, ps.app)


def observe(model: JobModel, report: JobReport, is_settled: bool) -> None:
    """Take speed samples from `report`: 1 / epoch time for each new epoch trained entirely at the
    shape the job is settled at (`settled`), and the per-clock speed there (`clock_sample`)."""
    shape = (report.workers, report.servers)
    if not is_settled or report.workers < 1 or report.servers < 1:
        model.settled = None
        model.clock_sample = None
        return
    if model.settled != shape:
        model.settled = shape
        model.clock_sample = None
        # A job never reshaped (no directive acted on) trained every epoch at this shape.
        model.settled_epoch = -1 if report.directive_version == 0 else (
            report.epoch if report.epoch is not None else -1) + 1
    cpe = model.clocks_per_epoch
    if cpe and report.speed > 0 and report.speed_iterations >= MIN_CLOCK_SPEED_ITERATIONS:
        model.clock_sample = (report.servers, report.workers, report.speed / cpe)
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


def observe_resize(model: JobModel, report: JobReport, now: float) -> None:
    """Measure the job's resize cost: how long its AM reports a change under way."""
    if report.changing:
        if model.changing_since is None:
            model.changing_since = now
    elif model.changing_since is not None:
        model.resize_cost = max(0.0, now - model.changing_since)
        model.changing_since = None


def update_history(model: JobModel, report: JobReport) -> bool:
    """Extend the job's loss history with the report's new epochs and clock points (only those: the
    report repeats its latest ones every time); True when it changed. A history that does not go on
    from what was seen (the job went back to a checkpoint) replaces it."""
    objs = report.objectives
    initial = report.initial_objective if report.initial_objective is not None and math.isfinite(
        report.initial_objective) else None
    last = model.epochs[-1] if model.epochs else -1
    changed = False
    if initial != model.initial or (objs and objs[-1].epoch < last):
        model.initial, model.epochs, model.losses, last = initial, [], [], -1
        model.clock_k, model.clock_l = [], []
        changed = True
    if objs and objs[-1].epoch != last:
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
        changed = True
    clocks = report.clock_objectives
    if clocks:
        if model.clock_k and clocks[-1].epochs < model.clock_k[-1]:
            model.clock_k, model.clock_l = [], []           # went back: start the clock points over
        seen = model.clock_k[-1] if model.clock_k else -1.0
        new = [c for c in clocks if c.epochs > seen and math.isfinite(c.objective)]
        if new:
            model.clock_k.extend(c.epochs for c in new)
            model.clock_l.extend(c.objective for c in new)
            del model.clock_k[:-MAX_CLOCK_POINTS]
            del model.clock_l[:-MAX_CLOCK_POINTS]
            changed = True
        tail = clocks[-1]
        if tail.epochs > 0 and tail.iteration > 0:
            model.clocks_per_epoch = tail.iteration / tail.epochs
    return changed


def loss_series(model: JobModel) -> tuple[np.ndarray, np.ndarray]:
    """The (k, objective) points the job's curve is fitted on (models/optimus_fit.loss_points)."""
    return loss_arrays(model.initial, model.epochs, model.losses, model.clock_k, model.clock_l)


def settled(job: RunningJob, app: AppView) -> bool:
    """The job is not in the middle of a change: it reports no change running and either has the
    shape of its directive or has acted on that directive already (an AM that could not reach the
    shape -- no containers in time -- ends the change at the shape it got)."""
    r = job.report
    if r.changing:
        return False
    version = app.directive.version if app.directive is not None else 0
    return (r.workers, r.servers) == (job.workers, job.servers) or r.directive_version >= version


def least_shape(job: RunningJob) -> tuple[int, int]:
    """(workers, servers) the allocation starts a job at: its spec's minimum (the paper's one worker
    and one server where the spec allows it; the AM would not go below its minimum anyway)."""
    return max(1, job.spec.min_workers), max(1, job.spec.min_servers)


class KnownInputs(Protocol):
    """A job's inputs known better than the policy's estimates (module doc): None where not known."""

    def speed(self, app_id: str, sync: bool) -> Optional[SpeedFunction]: ...

    def remaining_epochs(self, app_id: str) -> Optional[float]: ...


class _Sized(NamedTuple):
    """A job the allocation sizes: its remaining epochs (from its curve, or the prior when
    `fitted` is False), speed function and bounds (a tuple: thousands are made per round)."""

    job: RunningJob
    remaining: float
    speed: SpeedFunction
    early: bool
    fitted: bool
    resize_cost: float


class OptimusPolicy:
    """Optimus's allocation and placement (see the module docstring). One instance per RM."""

    name = "optimus"

    def __init__(self, settings: object = None, known: Optional[KnownInputs] = None) -> None:
        # `settings`: whatever the policy registry may hand its factories; Optimus has none of its
        # own (its constants are this module's).
        self._known = known
        self._models: dict[str, JobModel] = {}
        self._priors = AppPriors()
        self._last_round: Optional[float] = None
        self._last_jobs: Optional[Present] = None

    def export_state(self) -> bytes:
        """The jobs' observations, the priors and the round cadence (rm/policies/base.py)."""
        p = self._priors
        return msgspec.json.encode(OptimusState(
            {a: StoredJob.of(m) for a, m in sorted(self._models.items())}, p.learned, p.versions, p.epochs,
            self._last_round, self._last_jobs, p.samples))

    def restore_state(self, doc: bytes) -> None:
        try:
            st = msgspec.json.decode(doc, type=OptimusState)
        except msgspec.DecodeError as e:
            raise ValueError(f"optimus policy state: {e}") from None
        self._models = {a: j.model() for a, j in st.jobs.items()}
        self._priors = AppPriors(learned={a: list(v) for a, v in st.learned.items()}, versions=dict(st.prior_versions),
                                 epochs={a: list(v) for a, v in st.prior_epochs.items()},
                                 samples={a: [(sync, list(smp)) for sync, smp in v] for a, v in st.learned_samples.items()})
        self._last_round, self._last_jobs = st.last_round, st.last_jobs

    def decide(self, snapshot: ClusterSnapshot) -> Decision:
        """Job decisions for the running PS jobs whose shape changes this round. Speed samples and
        loss points are taken on every call; a round (fits, allocation, placement) runs every
        `SCHEDULING_INTERVAL_S`, or at once when a job arrives, starts, leaves or has just gathered
        the data for its first speed or loss-curve fit."""
        view = classify(snapshot)
        apps = {a.app_id: a for a in snapshot.apps}
        jobs = list(view.running)
        running = {j.app_id for j in jobs}
        # A job out of this round but alive (its next AM attempt not training yet, its AM held by
        # the queue's AM limit) keeps its model: taken for finished, it taught its app a partial
        # epoch count and lost its samples and loss history.
        resting = {}
        for app_id, gone in self._models.items():
            if app_id in running:
                continue
            a = apps.get(app_id)
            if a is not None and not a.state.is_final:
                resting[app_id] = gone
                continue
            # Only a job that ran to its end says how many epochs its app runs (a killed or failed
            # one says nothing of that); its speed samples hold however it ended. An app that ended
            # has left the scheduler's apps: its final status is in `ended` (nothing known there,
            # nothing taught).
            succeeded = (snapshot.ended.get(app_id) == FinalStatus.SUCCEEDED.value if a is None
                         else a.state is AppState.FINISHED)
            if succeeded:
                self._priors.finished(gone.traits.app, gone.trained)
            if gone.speed is not None and gone.shapes >= 2:
                self._priors.learn(gone.traits.app, gone.speed, gone.fitted_samples)
        self._models = {j.app_id: self._models.get(j.app_id) or JobModel(job_traits(apps[j.app_id]))
                        for j in jobs}
        self._models.update(resting)
        fit_ok: dict[str, bool] = {}       # can_fit per job, counted once (the history is final here)
        at_rest: dict[str, bool] = {}      # settled() per job, for this round
        ready_list = []
        for j in jobs:
            m = self._models[j.app_id]
            update_history(m, j.report)
            at_rest[j.app_id] = still = settled(j, apps[j.app_id])
            observe(m, j.report, still)
            observe_resize(m, j.report, snapshot.now)
            fit_ok[j.app_id] = ok = m.can_fit
            ready_list.append((j.app_id, bool(m.samples or m.clock_sample), ok))
        # A job that has just gathered the data for a speed or curve fit counts as a newcomer too.
        ready = tuple(ready_list)
        present: Present = (tuple(j.app_id for j in jobs), tuple(j.app_id for j in view.incoming),
                            tuple(view.other_queued), ready)
        if (self._last_round is not None and present == self._last_jobs
                and snapshot.now < self._last_round + SCHEDULING_INTERVAL_S):
            return Decision({})
        self._last_round, self._last_jobs = snapshot.now, present
        self._refit(jobs, fit_ok)
        sized, fixed = self._split(jobs, at_rest)
        budget = self._budget(snapshot, view.running, view.incoming, view.other_queued, apps)
        targets: dict[str, tuple[int, int]] = {}
        reasons: dict[str, str] = {}
        for j in fixed:
            targets[j.app_id] = self._fixed_target(j, apps[j.app_id])
            budget = budget - j.executor.scale(sum(targets[j.app_id]))
            reasons[j.app_id] = "optimus: no speed measured yet; requested shape"
        if sized:
            base = budget
            for f in sized:
                budget = budget - f.job.executor.scale(sum(least_shape(f.job)))
            servers, workers = allocate(self._problem(sized, budget, snapshot.total))
            planned = {f.job.app_id: (int(w), int(s)) for f, s, w in zip(sized, servers, workers)}
            targets.update(self._hysteresis(sized, planned, base))
            for f in sized:
                w, s = targets[f.job.app_id]
                t = f.remaining * inverse_speed(f.speed.coefficients, s, w)
                how = "epochs left" if f.fitted else "epochs left (not fitted: the app's or max_epochs prior)"
                reasons[f.job.app_id] = f"optimus: ~{f.remaining:.0f} {how}, ~{t:.0f}s at {w} workers / {s} servers"
        return self._place(snapshot, jobs, targets, reasons)

    # ----- models -----------------------------------------------------------------------------
    def _refit(self, jobs: list[RunningJob], fit_ok: dict[str, bool]) -> None:
        stale: list[JobModel] = []
        priors: dict[tuple[str, bool], tuple[int, Optional[SpeedFunction], float]] = {}
        for j in jobs:
            m = self._models[j.app_id]
            key = m.history_key
            if key != m.curve_key:
                m.curve_key = key
                if fit_ok[j.app_id]:
                    stale.append(m)
                else:
                    m.curve = None
            # The prior of the job's app and mode: looked up once per round for each (thousands of
            # jobs share a few apps).
            app = (m.traits.app, m.traits.sync)
            if app not in priors:
                prior = self._priors.prior(*app)
                priors[app] = (self._priors.version(app[0]), prior, self._priors.weight(prior))
            version, prior, weight = priors[app]
            skey = (m.added, m.clock_sample, version)
            if skey != m.speed_key:
                samples = m.speed_samples()
                m.speed = fit_speed(samples, m.traits.sync, j.spec.max_servers, j.spec.max_workers,
                                    prior_weight=weight, prior=prior)
                m.speed_key = skey
                m.fitted_samples = samples
        # All stale curves in one call, built from the kept lists (loss_series's points, not
        # one pair of arrays per job).
        for m, curve in zip(stale, fit_loss_histories([(m.initial, m.epochs, m.losses, m.clock_k, m.clock_l)
                                                        for m in stale])):
            m.curve = curve

    def _split(self, jobs: list[RunningJob], at_rest: dict[str, bool]) -> tuple[list[_Sized], list[RunningJob]]:
        sized: list[_Sized] = []
        fixed: list[RunningJob] = []
        for j in jobs:
            m = self._models[j.app_id]
            if not at_rest[j.app_id] or m.speed is None:
                fixed.append(j)
                continue
            trained, limit = m.trained, m.traits.max_epochs
            speed, known_left = m.speed, None
            if self._known is not None:
                speed = self._known.speed(j.app_id, m.traits.sync) or speed
                known_left = self._known.remaining_epochs(j.app_id)
            if known_left is not None:
                left = known_left
            elif m.curve is not None:
                left = min(m.curve.remaining_epochs(trained, m.traits.threshold),
                           float(limit if limit is not None else DEFAULT_MAX_EPOCHS) - trained)
            else:
                cap = float(limit if limit is not None else PRIOR_EPOCHS) - trained
                learned = self._priors.remaining_epochs(m.traits.app, trained)
                left = cap if learned is None else min(learned, cap)
            if not left > 0:                 # about to stop: nothing to gain from any change
                fixed.append(j)
                continue
            total = trained + left
            sized.append(_Sized(j, left, speed, trained / total < EARLY_PROGRESS, m.curve is not None,
                                m.resize_cost))
        return sized, fixed

    @staticmethod
    def _fixed_target(j: RunningJob, app: AppView) -> tuple[int, int]:
        if not settled(j, app):
            return (j.workers, j.servers)            # a change is under way: keep its target
        if j.report.workers >= 1 and j.report.servers >= 1 and j.report.directive_version > 0:
            return (j.report.workers, j.report.servers)   # reshaped before: the shape it has
        return (j.spec.workers, j.spec.servers)      # never reshaped: the requested shape

    @staticmethod
    def _hysteresis(sized: list[_Sized], planned: dict[str, tuple[int, int]],
                    budget: Resource) -> dict[str, tuple[int, int]]:
        """`planned` with the changes that gain too little dropped (module doc, step 3): smallest
        predicted gain first, each only where keeping the current shape fits the budget."""
        out = dict(planned)
        used = Resource(0, 0)
        for f in sized:
            used = used + f.job.executor.scale(sum(planned[f.job.app_id]))
        small: list[tuple[float, _Sized]] = []
        for f in sized:
            j = f.job
            (w, s), now = planned[j.app_id], (j.workers, j.servers)
            if (w, s) == now or j.workers < 1 or j.servers < 1:
                continue
            t_now = f.remaining * inverse_speed(f.speed.coefficients, j.servers, j.workers)
            gain = t_now - f.remaining * inverse_speed(f.speed.coefficients, s, w)
            if abs(gain) < max(HYSTERESIS_FACTOR * f.resize_cost, MIN_RELATIVE_GAIN * t_now):
                small.append((abs(gain), f))
        for _, f in sorted(small, key=lambda x: (x[0], x[1].job.app_id)):
            j = f.job
            keep = used - j.executor.scale(sum(planned[j.app_id])) + j.executor.scale(j.workers + j.servers)
            if keep.memory <= budget.memory and keep.vcores <= budget.vcores:
                out[j.app_id], used = (j.workers, j.servers), keep
        return out

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
    def _problem(sized: list[_Sized], budget: Resource, total: Resource) -> AllocationProblem:
        n = len(sized)
        least = np.array([least_shape(f.job) for f in sized], dtype=np.int64).reshape(n, 2)   # (workers, servers)
        most = np.array([(f.job.spec.max_workers, f.job.spec.max_servers) for f in sized], dtype=np.int64).reshape(n, 2)
        coef = np.array([f.speed.coefficients for f in sized], dtype=float).reshape(n, len(FEATURES))
        ex = np.array([[f.job.executor.memory, f.job.executor.vcores] for f in sized], dtype=float)
        cap = np.array([max(1, total.memory), max(1, total.vcores)], dtype=float)
        dominant = np.maximum((ex / cap).max(axis=1), 1e-12)
        return AllocationProblem(
            remaining=np.array([f.remaining for f in sized], dtype=float), coefficients=coef,
            servers=least[:, 1].copy(), workers=least[:, 0].copy(),
            max_servers=np.maximum(least[:, 1], most[:, 1]), max_workers=np.maximum(least[:, 0], most[:, 0]),
            executor=ex, dominant=dominant,
            factor=np.array([PRIORITY_FACTOR if f.early else 1.0 for f in sized]),
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
        views = {a.app_id: a for a in snapshot.apps}
        # A reshaped job's own executors are placed anew: their room is free. A job with no even
        # placement keeps its executors where they are (it only shrinks, in place), so its room is
        # taken back and the others placed again, until every job placed was placed on room that
        # is free (a job placed onto the room of one that then kept it over-committed the node).
        pending = list(changed)
        while True:
            mem = [n.capacity.memory - n.used.memory for n in running]
            vc = [n.capacity.vcores - n.used.vcores for n in running]
            for j in pending:
                for node_id, held in _executors_on(views[j.app_id], j.executor):
                    i = index.get(node_id)
                    if i is not None:
                        mem[i] += held.memory
                        vc[i] += held.vcores
            book = NodeBook([n.node_id for n in running], mem, vc)
            placed = place_jobs(book, [PlacementJob(j.app_id, *targets[j.app_id], j.executor.memory, j.executor.vcores)
                                       for j in pending])
            unplaced = {j.app_id for j in pending if placed[j.app_id] is None}
            if not unplaced:
                break
            pending = [j for j in pending if j.app_id not in unplaced]
        out: dict[str, JobDecision] = {}
        for j in changed:
            w, s = targets[j.app_id]
            where = placed.get(j.app_id)
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


__all__ = ["JobModel", "JobTraits", "KnownInputs", "OptimusPolicy", "OptimusState", "StoredJob", "job_traits", "loss_series", "observe", "observe_resize",
           "settled", "update_history"]

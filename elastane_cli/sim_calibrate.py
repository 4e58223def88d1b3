"""`elastane sim calibrate`: measure each app on testbed hosts and write the simulator's coefficients.

Where it measures (`CalibrationPlan`): the multi-host testbed (docs/testbed.md), `hosts` node hosts
each with a CPU budget shared out by vcore (NM `cpu_limit_cores`, YARN's strict CPU mode), so
every executor gets exactly `core_per_vcore` cores whatever else runs, and a master host without a
budget that runs the RM and, through the `am` node label, every AM: the budgets hold executors
only. The budgets together take at most `USABLE_SHARE` of the machine's cores, leaving the rest to
the master, the kernel's shaping and this command; a bigger shape gets more CPU because it has
more executors, never because it got more of an idle machine. The simulated cluster has no CPU
oversubscription, so the calibration must not carry any in.

What (issue 33, "calibration that holds"): every app's reference job (`REFERENCE_JOBS`: the `tiny`
preset at ten times its rows, a fixed number of epochs) at every shape of `SHAPES` -- 1 to 16
workers and 1 to 16 servers, the range the simulator's default trace uses (sim/workload.py: up to 4
workers x growth 4, 2 servers x 4, and the servers a move holds beside those) -- on hosts each
pinned to a CPU (`CalibrationPlan.pin_cpus`) -- `repeats` times (at least 3), the repeats interleaved (round
1 runs every app at every shape, then round 2, ...), so a slow spell of the machine falls on every
shape. Over every run's training (from its first report saying it started to its end) the
machine's busy share and load are measured (elastane_cli/machine_load.py) and kept with its
sample; a run while the machine was saturated
(`SaturationLimits.budgeted_hosts`: more than 90 % of the cores busy; the load is recorded, not
judged, since tasks waiting on their host's budget count in it) is refused, and a refused sample enters no fit (sim/calibration.py `fit_app`:
a shape needs `MIN_REPEATS` accepted samples; their median is its epoch time and their spread is
kept; some inner shapes are held out of the fit and its error on them is reported).

From each run, polling the RM's app record and the job report (`/apps/{id}/shape`):

- am_start_s: app submitted -> the AM's first report (allocated, launched, registered);
- startup_s: first report -> `started` (executors granted, launched, data loaded);
- the epoch time: the median of the epoch times the AM reports (the first, which warms up, left
  out): with the machine's load measured and saturated runs refused, the typical epoch, not a
  lucky one;
- finish_s: the rest of the JCT beyond the epochs' training times as the AM measured them
  (between-epoch work, the final evaluation and checkpoint, unregistering). The reports reach the
  RM once a second, so the split between am_start_s, startup_s and finish_s is approximate; their
  sum is the measured JCT minus the training time, the median over the accepted runs;
- the objective history (with the initial objective) of the run at the default shape (2 workers,
  1 server; `REFERENCE_EPOCHS` long, the other shapes `CALIBRATION_EPOCHS`), fitted to the Optimus
  loss curve (sim/convergence.py); clocks_per_epoch = iterations /
  epochs.

Then one MLR job is reshaped in place (EPS: +1 worker, then back) and one in elastic_mode "kill":
`reshape_s` / `restart_s` is the training time each change lost (the change's duration minus the
progress made meanwhile at the old speed), used when its run was not refused. A pause is not
measured (no AM pauses yet): pause_s is taken as half the restart. The same reshape costs are used
for all apps.
"""
from __future__ import annotations

import asyncio
import os
import platform
import re
import signal
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Awaitable, Callable, Literal, Optional

from protocol.errors import ConfigurationError
from protocol.job_report import JobReport
from protocol.json_types import JsonObject
from protocol.ps_status import PsStatus
from appmaster.ps.submission import build_ps_submission
from sim.calibration import (MIN_REPEATS, AppCalibration, Calibration, CalibrationFitError, CalibrationSample,
                             fit_app)
from sim.convergence import fit_curve

from .context import default_user
from .machine_load import MachineMeter, SaturationLimits
from .processes import unwind_on_sigterm
from .rm_rest_client import RmRestClient

if TYPE_CHECKING:
    from .testbed_cluster import TestbedCluster

FINAL_STATES = ("FINISHED", "FAILED", "KILLED")
EPOCHS_DONE = re.compile(r"after (\d+) epochs")
POLL_S = 0.2
AM_MEMORY_MB = 384
EXECUTOR_MEMORY_MB = 384
CALIBRATION_EPOCHS = 6
# Eleven shapes per app over the range the simulator's default trace uses (sim/workload.py: up to
# 16 workers and 8 servers); both roles vary (issue 25: a fit on few server counts is
# ill-determined), and the inner ones leave some to hold out (sim/calibration.py `holdout_shapes`).
# 8 x 16: a job that a policy moves to other nodes holds its new servers beside the old ones until
# the blocks have moved (the EPS planner adds, then removes), so on the default trace jobs train
# for a while at up to 16 servers (seeds 1-5, every policy); without it they ran on the fit's
# extrapolation (extrapolated_job_share 0.083).
SHAPES: tuple[tuple[int, int], ...] = ((1, 1), (2, 1), (4, 1), (2, 2), (4, 2), (8, 2), (8, 4), (16, 4), (12, 6),
                                       (16, 8), (8, 16))
REPEATS = 3
HOSTS = 4
USABLE_SHARE = 0.75          # of the machine's cores the hosts' budgets may take together
MAX_CORE_PER_VCORE = 1.0
REFERENCE_SHAPE = (2, 1)     # PSJobSpec's default shape: the loss curve is fitted on this run
# Runs at the reference shape go on this long at least: their objectives are the convergence
# history a simulated job's epoch count comes from (beyond it, the fitted curve's prediction).
REFERENCE_EPOCHS = 12


# Ten times the `tiny` rows, so an epoch is long enough (~1 s on a worker) to time, in at least 20
# input blocks, so the largest shape's 16 workers each get one (a job with more workers than blocks
# is refused at submission).
REFERENCE_DATA: dict[str, JsonObject] = {
    "mlr": {"num_samples": 20_000, "rows_per_block": 1000},
    "nmf": {"num_users": 6000, "rows_per_block": 250},
    "lda": {"num_docs": 3000, "rows_per_block": 125},
    "lasso": {"num_samples": 20_000, "rows_per_block": 1000},
}


def reference_job(app: str, epochs: int = CALIBRATION_EPOCHS) -> JsonObject:
    """The job each app is calibrated with: `tiny` data at ten times the rows, `epochs` epochs (a
    tiny threshold, so the run lasts the epochs and gives that many objectives), held-out scoring
    only at the end."""
    return {"app": app, "preset": "tiny", "data": dict(REFERENCE_DATA[app]), "executor_memory_mb": EXECUTOR_MEMORY_MB,
            "max_epochs": epochs, "convergence_threshold": 1e-9, "heldout_every_epochs": 0}


def reference_model_mb(app: str) -> float:
    """The parameter state (MB, float32) of `app`'s reference job: what resize costs scale from
    (sim/calibration.py `model_mb`). The app is built from the spec without data or a cluster."""
    from protocol.ps_job_spec import validate  # noqa: PLC0415
    from psruntime.apps.registry import create_job_app  # noqa: PLC0415 (imports the app classes)
    spec = validate({**reference_job(app), "workers": 1, "servers": 1})
    return round(create_job_app(spec).model_nbytes() / 2**20, 6)


class CalibrationArgsError(ConfigurationError, ValueError):
    """Arguments the calibration cannot run with (too few repeats, shapes the plan cannot hold)."""


@dataclass(frozen=True)
class CalibrationPlan:
    """The testbed the calibration measures on (module doc): `hosts` node hosts of `host_vcores`
    vcores, each vcore `core_per_vcore` cores, and the AMs on the master host."""

    hosts: int
    host_vcores: int
    core_per_vcore: float
    # Each node host pinned to one of the machine's CPUs, as a real host owns its cores: unpinned,
    # the same shape's epochs varied by up to 46 % between repeats (testbed_hosts.pin_assignment).
    pin_cpus: bool = True

    def __post_init__(self) -> None:
        if self.hosts < 1 or self.host_vcores < 1 or not self.core_per_vcore > 0:
            raise ValueError(f"a calibration plan needs hosts, vcores and a CPU share > 0, got {self}")

    @classmethod
    def for_machine(cls, shapes: tuple[tuple[int, int], ...], cores: Optional[int] = None, hosts: int = HOSTS,
                    usable_share: float = USABLE_SHARE) -> "CalibrationPlan":
        """Hosts that hold the biggest shape at one executor per vcore, their budgets together
        `usable_share` of the machine's `cores` (at most a core per vcore)."""
        if not shapes:
            raise ValueError("no shapes to calibrate")
        executors = max(w + s for w, s in shapes)
        host_vcores = -(-executors // hosts)
        n = cores or os.cpu_count() or 1
        return cls(hosts, host_vcores, round(min(MAX_CORE_PER_VCORE, n * usable_share / (hosts * host_vcores)), 4))

    @property
    def host_cpus(self) -> float:
        return round(self.host_vcores * self.core_per_vcore, 4)

    @property
    def node_memory_mb(self) -> int:
        return self.host_vcores * EXECUTOR_MEMORY_MB

    def fits(self, workers: int, servers: int) -> bool:
        return workers + servers <= self.hosts * self.host_vcores

    def cluster(self, base: Path, policy: str = "static", jobs_at_once: int = 1) -> TestbedCluster:
        """A TestbedCluster of this plan (not started), with room for `jobs_at_once` AMs on the master."""
        from .testbed_cluster import MASTER, TestbedCluster  # noqa: PLC0415 (needs root and namespaces: only a run does)
        # The budget is the node hosts' only: the master's NM gives each AM a core (cpu_limit_cores
        # 0). Inherited, the node hosts' budget shared out over `jobs_at_once` AM vcores gave sim
        # fidelity's 8 AMs 0.03 core each, and every job's AM took 17-18 s to report (1.6 s here).
        return TestbedCluster(base, workers=self.hosts, worker_cpus=self.host_cpus,
                              node_memory_mb=self.node_memory_mb, node_vcores=self.host_vcores,
                              nm_expiry_s=30, am_expiry_s=30, policy=policy, am_host=True,
                              am_host_memory_mb=(AM_MEMORY_MB + 64) * jobs_at_once, am_host_vcores=jobs_at_once,
                              nm_conf={"cpu_limit_cores": self.host_cpus},
                              node_conf={MASTER: {"cpu_limit_cores": 0}}, pin_cpus=self.pin_cpus)

    def describe(self) -> str:
        return (f"{self.hosts} testbed hosts x {self.host_vcores} vcores, {self.core_per_vcore:g} core per vcore "
                f"({self.host_cpus:g} cores a host, shared by vcore{', each pinned to a CPU' if self.pin_cpus else ''}), "
                f"AMs on the master")


@dataclass
class JobRun:
    """What one real job did, as seen by polling the RM (times: seconds since submission)."""

    name: str
    app_id: str = ""
    final_state: str = ""
    final_status: str = ""
    submitted: float = 0.0            # client monotonic time of the submission
    first_report: Optional[float] = None
    started: Optional[float] = None
    last_epoch_at: Optional[float] = None
    ended: Optional[float] = None
    jct_s: Optional[float] = None     # RM finishedTime - startedTime
    epochs: int = 0
    iterations: int = 0
    objectives: list[tuple[int, float]] = field(default_factory=list)   # (epochs done, objective)
    epoch_times: list[float] = field(default_factory=list)               # as the AM measured them
    shape: tuple[int, int] = (0, 0)          # as last reported
    requested: tuple[int, int] = (0, 0)      # as submitted
    reshape_lost_s: list[float] = field(default_factory=list)

    @property
    def training_s(self) -> float:
        """The epochs' training time as the AM measured it; epochs it trained after its last report
        reached the RM (the diagnostics count them) at the median epoch time."""
        if not self.epoch_times:
            return 0.0
        missing = max(0, self.epochs - len(self.epoch_times))
        return sum(self.epoch_times) + missing * statistics.median(self.epoch_times)

    def fill_from_status(self, status: PsStatus) -> None:
        """Take the epoch times and objectives from the AM's final status (its `status.json` on
        shared storage, written on exit), which has every epoch: the reports polled through the RM
        arrive once a second and can miss the last epochs of a short run, or all of them."""
        history = status.objective_history
        if not history:
            return
        self.epoch_times = [e.epoch_time_s for e in history]
        self.epochs = max(self.epochs, len(history))
        init = status.initial_objective
        self.objectives = ([(0, init)] if init is not None else []) + [
            (e.epoch + 1, e.objective) for e in history if e.objective is not None]

    def to_json(self) -> JsonObject:
        """What the calibration file keeps of the run (for refits without running it again)."""
        return {"shape": [*self.requested], "jct_s": self.jct_s, "first_report_s": self.first_report,
                "started_s": self.started, "epochs": self.epochs, "epoch_times": [*self.epoch_times]}

    @property
    def epoch_wall_s(self) -> Optional[float]:
        """The run's epoch time: the median of the AM's epoch times (the first epoch, which warms
        up, left out). Saturated runs are refused rather than corrected by taking fast epochs."""
        times = self.epoch_times[1:] or self.epoch_times
        return statistics.median(times) if times else None


# Called with each job report polled (the probe that reshapes a job while it trains).
Step = Callable[[RmRestClient, "JobRun", JobReport], Awaitable[None]]


async def run_job(client: RmRestClient, spec: JsonObject, name: str, at_s: float = 0.0, t0: float = 0.0,
                  on_report: Optional[Step] = None, timeout_s: float = 600.0) -> JobRun:
    """Submit `spec` at monotonic time t0 + at_s and follow it to its end."""
    loop = asyncio.get_running_loop()
    delay = t0 + at_s - loop.time()
    if delay > 0:
        await asyncio.sleep(delay)
    run = JobRun(name)
    run.app_id = await client.submit_new(
        lambda app_id: build_ps_submission(spec, name=name, am_memory=AM_MEMORY_MB, app_id=app_id))
    run.submitted = loop.time()
    deadline = run.submitted + timeout_s
    last_epoch = -1
    while True:
        now = loop.time() - run.submitted
        app = await client.app(run.app_id)
        shape = await client.app_shape(run.app_id)
        current = shape.get("current")
        if current:
            report = JobReport.decode(current)
            if run.first_report is None:
                run.first_report = now
            if report.started and run.started is None:
                run.started = now
            epoch = report.epoch
            if epoch is not None and epoch > last_epoch:
                last_epoch = epoch
                run.last_epoch_at = now
            run.epochs = (epoch + 1) if epoch is not None else 0
            run.iterations = report.iterations
            run.shape = (report.workers, report.servers)
            run.epoch_times = list(report.epoch_times)
            init = report.initial_objective
            run.objectives = ([(0, init)] if init is not None else []) + [
                (o.epoch + 1, o.objective) for o in report.objectives]
            if on_report is not None:
                await on_report(client, run, report)
        if app.get("state") in FINAL_STATES:
            run.ended = now
            run.final_state, run.final_status = str(app.get("state")), str(app.get("finalStatus"))
            # The last report seen may be epochs behind (AMs report once a second): the AM's final
            # diagnostics say how many epochs it trained ("final objective X after N epochs ...").
            done = EPOCHS_DONE.search(str(app.get("diagnostics") or ""))
            if done:
                run.epochs = int(done.group(1))
            started_ms, finished_ms = app.get("startedTime") or 0, app.get("finishedTime") or 0
            run.jct_s = (finished_ms - started_ms) / 1000.0 if started_ms and finished_ms else now
            return run
        if loop.time() > deadline:
            await client.kill(run.app_id)
            raise TimeoutError(f"{name} ({run.app_id}) did not finish within {timeout_s:.0f}s")
        await asyncio.sleep(POLL_S)


class ReshapeProbe:
    """Reshapes a job once it trains (+1 worker, then back) and measures the training time each
    change lost: its duration minus the iterations made meanwhile at the speed before it."""

    def __init__(self, after_epochs: int = 2):
        self.after_epochs = after_epochs
        self.steps = [+1, -1]
        self.pending: Optional[tuple[float, int, float, tuple[int, int]]] = None   # t, its, speed, target

    async def __call__(self, client: RmRestClient, run: JobRun, report: JobReport) -> None:
        now = asyncio.get_running_loop().time() - run.submitted
        shape = (report.workers, report.servers)
        if self.pending is not None:
            t, its, speed, target = self.pending
            if shape == target and not report.changing:
                made = (run.iterations - its) / speed if speed > 0 else 0.0
                run.reshape_lost_s.append(max(0.0, (now - t) - made))
                self.pending = None
            return
        if not self.steps or not report.started or run.epochs < self.after_epochs or report.changing:
            return
        step = self.steps.pop(0)
        target = (shape[0] + step, shape[1])
        speed = report.speed
        await client.put_shape(run.app_id, target[0], target[1], reason="sim calibrate: reshape probe")
        self.pending = (now, run.iterations, speed, target)
        self.after_epochs = run.epochs + 1


def split_costs(jct_s: float, training_s: float, first_report_s: Optional[float],
                started_s: Optional[float]) -> tuple[float, float, float]:
    """(am_start_s, startup_s, finish_s) of one run, adding up to its JCT less its training. The
    first report and `started` are seen when a report reaches the RM (once a second), so they may be
    late: where that would leave the finish negative, the AM start and startup give way."""
    fixed = max(0.0, jct_s - training_s)
    am_start = min(fixed, first_report_s if first_report_s is not None else fixed)
    startup = min(fixed - am_start, max(0.0, (started_s or 0.0) - (first_report_s or 0.0)))
    return am_start, startup, fixed - am_start - startup


def run_costs(runs: list[JobRun]) -> tuple[float, float, float]:
    """The costs of the accepted runs: each of (am_start_s, startup_s, finish_s) their median
    (defaults 2, 3, 1 s without a run)."""
    splits = [split_costs(float(r.jct_s or 0.0), r.training_s, r.first_report, r.started) for r in runs]
    if not splits:
        return (2.0, 3.0, 1.0)
    return (statistics.median(x[0] for x in splits), statistics.median(x[1] for x in splits),
            statistics.median(x[2] for x in splits))


@dataclass
class Measured:
    """One calibration run and the machine while it ran."""

    app: str
    run: JobRun
    sample: CalibrationSample


StatusReader = Callable[[str], PsStatus]


async def measure(client: RmRestClient, app: str, shape: tuple[int, int], repeat: int, epochs: int,
                  limits: SaturationLimits, log: Callable[[str], None],
                  final_status: Optional[StatusReader] = None) -> Measured:
    """One run of `app`'s reference job at `shape`, with the machine measured around it; its
    epochs from the AM's final status (`final_status(app_id)`) where that can be read."""
    w, s = shape
    if shape == REFERENCE_SHAPE:
        epochs = max(epochs, REFERENCE_EPOCHS)
    spec = {**reference_job(app, epochs), "workers": w, "servers": s}
    meter = MachineMeter().start()
    training = False

    async def at_training(_c: RmRestClient, _r: JobRun, report: JobReport) -> None:
        nonlocal training
        if report.started and not training:      # the machine over the epochs timed, not the job's start
            training = True
            meter.start()
    try:
        run = await run_job(client, spec, f"calibrate {app} {w}x{s} #{repeat + 1}",
                            t0=asyncio.get_running_loop().time(), on_report=at_training)
    except TimeoutError as e:
        load = meter.stop()
        return Measured(app, JobRun(str(e), requested=shape), CalibrationSample(
            workers=w, servers=s, repeat=repeat, busy_share=round(load.busy_share, 3),
            load_per_core=round(load.load_per_core, 3), refused=f"failed: {e}"))
    load = meter.stop()
    run.requested = shape
    if final_status is not None and run.app_id:
        run.fill_from_status(final_status(run.app_id))
    why = limits.refuse(load) or ("" if run.final_status == "SUCCEEDED" and run.epoch_wall_s
                                  else f"failed: {run.final_status or 'no epoch time'}")
    sample = CalibrationSample(workers=w, servers=s, epoch_s=None if run.epoch_wall_s is None else round(run.epoch_wall_s, 4),
                               repeat=repeat, busy_share=round(load.busy_share, 3),
                               load_per_core=round(load.load_per_core, 3), refused=why or "")
    log(f"{app} {w}x{s} #{repeat + 1}: {run.final_status}, jct {run.jct_s or 0:.1f}s, epochs {run.epochs}, "
        f"epoch {run.epoch_wall_s or 0:.2f}s, machine {load.busy_share:.0%} busy, load {load.load_per_core:.2f}/core"
        + (f": REFUSED ({why})" if why else ""))
    return Measured(app, run, sample)


def app_calibration(app: str, measured: list[Measured], epochs: int, log: Callable[[str], None]) -> Optional[AppCalibration]:
    """One app's coefficients from its runs (refused ones kept as samples, used for nothing)."""
    samples = [m.sample for m in measured]
    accepted = [m.run for m in measured if m.sample.accepted]
    try:
        fit = fit_app(samples)
    except CalibrationFitError as e:
        log(f"{app}: {e}; left out of the calibration")
        return None
    # Convergence per epoch depends on the shape a little (more workers, other mini-batch
    # interleavings): the curve is the one of the apps' default shape (2 workers, 1 server),
    # the pooled accepted runs' when that run is missing or too short.
    ref = [r for r in accepted if r.requested == REFERENCE_SHAPE and len(r.objectives) >= 4]
    history = ref[0].objectives if ref else [p for r in accepted for p in r.objectives]
    # The curve is a falling loss; an objective that rises (LDA's log-likelihood) is fitted negated.
    sign: Literal[1, -1] = -1 if history and statistics.fmean(v for _, v in history) < 0 else 1
    try:
        curve = fit_curve([(k, sign * v) for k, v in history])
    except ValueError as e:    # CurveError
        log(f"{app}: cannot fit its loss curve ({e}); left out of the calibration")
        return None
    am_start, startup, finish = run_costs(accepted)
    if fit.too_few:
        log(f"{app}: shapes with fewer than {MIN_REPEATS} accepted samples, not fitted: {fit.too_few}")
    log(f"{app}: theta {list(fit.theta)}, held out {[(h.workers, h.servers) for h in fit.held_out]}: error "
        f"{fit.holdout_error} (max {fit.holdout_error_max}), spread max {fit.spread_max:.3f}, {fit.refused} refused")
    return AppCalibration(
        theta=list(fit.theta), loss_curve=[curve.beta0, curve.beta1, curve.beta2],
        clocks_per_epoch=max(1.0, statistics.fmean(r.iterations / max(1, r.epochs) for r in accepted)),
        reference=reference_job(app, epochs),
        samples=[[st.workers, st.servers, round(st.median_s, 4)] for st in fit.fitted],
        holdout_samples=[[st.workers, st.servers, round(st.median_s, 4)] for st in fit.held_out],
        holdout_error=fit.holdout_error, holdout_error_max=fit.holdout_error_max,
        shape_spread=[[st.workers, st.servers, st.repeats, round(st.spread, 4)] for st in (*fit.fitted, *fit.held_out)],
        shape_samples=samples,
        initial_objective=history[0][1] if history and history[0][0] == 0 else None,
        histories=[[[k, v] for k, v in r.objectives] for r in accepted], runs=[r.to_json() for r in accepted],
        convergence_history=[v for k, v in ref[0].objectives if k >= 1] if ref else [],
        am_start_s=round(am_start, 3), startup_s=round(startup, 3), finish_s=round(finish, 3),
        max_epochs=max(epochs, REFERENCE_EPOCHS), objective_sign=sign, model_mb=reference_model_mb(app))


async def measure_reshape(client: RmRestClient, mode: str, limits: SaturationLimits,
                          log: Callable[[str], None]) -> Optional[float]:
    """The training time an MLR job's reshape (`mode` eps) or restart (kill) lost; None when the
    run was refused (saturated machine) or made no change."""
    spec = {**reference_job("mlr", 25), "workers": 2, "servers": 1, "max_workers": 3, "elastic_mode": mode}
    probe = ReshapeProbe()
    meter = MachineMeter().start()
    run = await run_job(client, spec, f"calibrate reshape ({mode})", t0=asyncio.get_running_loop().time(),
                        on_report=probe)
    why = limits.refuse(meter.stop())
    log(f"reshape ({mode}): lost {run.reshape_lost_s} s, {run.final_status}" + (f": REFUSED ({why})" if why else ""))
    return statistics.fmean(run.reshape_lost_s) if run.reshape_lost_s and not why else None


DEFAULT_TRACE_SEEDS = (1, 2, 3, 4, 5)


def trace_extrapolation(cal: Calibration, seeds: tuple[int, ...] = DEFAULT_TRACE_SEEDS) -> float:
    """The share of the default trace's jobs (sim.workload.cluster_trace, the seeds of the policy
    benches) whose largest allowed shape lies beyond their app's measured range. Not a bound of a
    policy's `SimResult.extrapolated_job_share`: a job a policy moves holds its new executors
    beside the old ones for a while (up to twice its maximum), which only a simulated run shows;
    bench/policies_sim.py reports the share the runs really had."""
    from protocol.records import Resource  # noqa: PLC0415
    from sim.workload import cluster_trace  # noqa: PLC0415 (imports the calibration module: not at import time)
    jobs = [j for seed in seeds
            for j in cluster_trace(cal, Resource(16 * 8192, 16 * 8), Resource(AM_MEMORY_MB, 1), seed).jobs]
    beyond = sum(cal.app(j.app).beyond_range(*j.shape_max) for j in jobs)
    return beyond / len(jobs) if jobs else 0.0


def check_specs(apps: list[str], shapes: tuple[tuple[int, int], ...], epochs: int = CALIBRATION_EPOCHS) -> None:
    """Every run's job spec validates (CalibrationArgsError naming the first that does not), so a
    calibration never stops at its 100th run on a shape the app's data cannot split into."""
    from protocol.ps_job_spec import JobSpecError, validate  # noqa: PLC0415
    for app in apps:
        for w, s in shapes:
            try:
                validate({**reference_job(app, epochs), "workers": w, "servers": s})
            except JobSpecError as e:
                raise CalibrationArgsError(f"{app} at {w}x{s}: {e}") from None


def calibrate(out_path: Path, apps: list[str], shapes: tuple[tuple[int, int], ...] = SHAPES,
              epochs: int = CALIBRATION_EPOCHS, log: Callable[[str], None] = print, repeats: int = REPEATS,
              plan: Optional[CalibrationPlan] = None, limits: Optional[SaturationLimits] = None) -> Calibration:
    """Measure every app at every shape `repeats` times (interleaved) on a fresh testbed of `plan`
    (default: sized for this machine and the shapes; removed afterwards), fit, write `out_path`."""
    limits = limits or SaturationLimits.budgeted_hosts()
    if repeats < MIN_REPEATS:
        raise CalibrationArgsError(f"repeats must be >= {MIN_REPEATS} (a shape needs that many accepted samples), got {repeats}")
    plan = plan or CalibrationPlan.for_machine(shapes)
    too_big = [sh for sh in shapes if not plan.fits(*sh)]
    if too_big:
        raise CalibrationArgsError(f"shapes {too_big} do not fit the plan's {plan.hosts} x {plan.host_vcores} vcores")
    check_specs(apps, shapes, epochs)
    from . import testbed_hosts  # noqa: PLC0415
    reason = testbed_hosts.unavailable_reason(sshd=True)
    if reason:
        raise RuntimeError(f"the calibration runs on the multi-host testbed (docs/testbed.md): {reason}")
    log(f"plan: {plan.describe()}; {len(apps)} apps x {len(shapes)} shapes x {repeats} repeats; refusing runs "
        f"{limits.describe()}")
    # SIGTERM unwinds like Ctrl-C, so the `finally` below stops the testbed: no RM, NM, AM or host
    # of it is left behind (it was, before this handler).
    previous = unwind_on_sigterm()
    with tempfile.TemporaryDirectory(prefix="elastane-calibrate-") as tmp:
        cluster = plan.cluster(Path(tmp)).start(timeout_s=180)
        try:
            async def go() -> Calibration:
                measured: dict[str, list[Measured]] = {a: [] for a in apps}
                async with RmRestClient(cluster.rm_url, default_user()) as client:
                    for rep in range(repeats):
                        for app in apps:
                            for shape in shapes:
                                measured[app].append(await measure(client, app, shape, rep, epochs, limits, log,
                                                                   cluster.final_status))
                    per_app = {a: c for a in apps if (c := app_calibration(a, measured[a], epochs, log)) is not None}
                    if not per_app:
                        refused = sum(not m.sample.accepted for ms in measured.values() for m in ms)
                        raise RuntimeError(f"no app could be calibrated ({refused} of "
                                           f"{sum(map(len, measured.values()))} samples refused)")
                    reshape = await measure_reshape(client, "eps", limits, log)
                    restart = await measure_reshape(client, "kill", limits, log)
                for a in per_app.values():
                    if reshape is not None:
                        a.reshape_s = round(reshape, 3)
                    if restart is not None:
                        a.restart_s = round(restart, 3)
                    a.pause_s = round(a.restart_s / 2, 3)
                return Calibration(apps=per_app, core_per_vcore=plan.core_per_vcore, pinned_hosts=plan.pin_cpus,
                                   measured_on=(
                    f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores; {plan.describe()}; "
                    f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"),
                    note=(f"elastane sim calibrate: {repeats} repeats per shape, samples of a saturated machine "
                          f"refused ({limits.describe()}), "
                          "the median per shape fitted to models.ps_iteration_time with inner shapes held out; "
                          "reshape_s / restart_s measured on mlr and used for every app; pause_s = restart_s / 2"))
            cal = asyncio.run(go())
        finally:
            cluster.stop()
            signal.signal(signal.SIGTERM, previous)
    from sim.calibration import save  # noqa: PLC0415
    save(cal, out_path)
    return cal


__all__ = ["CalibrationArgsError", "check_specs", "DEFAULT_TRACE_SEEDS", "trace_extrapolation", "CalibrationPlan", "JobRun", "Measured", "REPEATS", "ReshapeProbe", "SHAPES", "app_calibration", "calibrate",
           "measure", "reference_job", "run_job", "run_costs", "split_costs"]

"""`elastane sim calibrate`: measure each app on a local cluster and write the simulator's coefficients.

For every app (mlr, nmf, lda, lasso) it runs a short real job of the app's reference spec
(`REFERENCE_JOBS`: the `tiny` preset, a fixed number of epochs) at a few shapes, one job at a time,
on a LocalCluster whose NMs share this machine's cores out by vcore (YARN's strict CPU mode, as
bench/eps_multijob.py does: otherwise 8 declared vcores on 2 cores would make every shape equally
slow). From each run, polling the RM's app record and the job report (`/apps/{id}/shape`):

Costs are those of the run with the least time outside training and epoch times a lower quartile: the dev host is shared, and
other work only ever adds time, so these estimate the unloaded host (bench/sim_fidelity.py measures
how much slower the host is when it runs, with a probe job).

- am_start_s: app submitted -> the AM's first report (allocated, launched, registered);
- startup_s: first report -> `started` (executors granted, launched, data loaded);
- the epoch time: the lower quartile of the epoch times the AM reports (the first left out); the
  (workers, servers, epoch time) samples are fitted to models.ps_iteration_time's form (NNLS);
- finish_s: the rest of the JCT beyond the epochs' training times as the AM measured them
  (between-epoch work, the final evaluation and checkpoint, unregistering). The reports reach the RM once a second, so the split
  between am_start_s, startup_s and finish_s is approximate; their sum is the measured JCT minus
  the training time, taken from the run with the least of it.
- the objective history (with the initial objective), pooled over the runs, fitted to the Optimus
  loss curve (sim/convergence.py); clocks_per_epoch = iterations / epochs.

Then one MLR job is reshaped in place (EPS: +1 worker, then back) and one in elastic_mode "kill":
`reshape_s` / `restart_s` is the training time each change lost (the change's duration minus the
progress made meanwhile at the old speed). A pause is not measured (no AM pauses yet): pause_s is
taken as half the restart (a checkpoint and a release). The same reshape costs are used for all apps.
"""
from __future__ import annotations

import asyncio
import os
import platform
import re
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Optional

import msgspec

from appmaster.ps.submission import build_ps_submission
from models.ps_iteration_time import fit as fit_epoch_time
from sim.calibration import AppCalibration, Calibration
from sim.convergence import fit_curve

from .context import default_user
from .local_cluster import LocalCluster
from .rm_rest_client import RmRestClient

FINAL_STATES = ("FINISHED", "FAILED", "KILLED")
EPOCHS_DONE = re.compile(r"after (\d+) epochs")
POLL_S = 0.2
AM_MEMORY_MB = 384
EXECUTOR_MEMORY_MB = 384
CALIBRATION_EPOCHS = 10
# Eight shapes per app (issue 25: a speed function fitted on four points was ill-determined: the
# server term of models.ps_iteration_time had one sample with two servers). They span 1-4 workers
# and 1-3 servers and all fit the calibration cluster (2 nodes x 4 vcores, AM included).
SHAPES: tuple[tuple[int, int], ...] = ((1, 1), (2, 1), (4, 1), (2, 2), (1, 2), (3, 1), (3, 2), (2, 3))
REFERENCE_SHAPE = (2, 1)     # PSJobSpec's default shape: the loss curve is fitted on this run


# Ten times the `tiny` rows, so an epoch is long enough (~1 s on a worker) to time.
REFERENCE_DATA: dict[str, dict[str, Any]] = {
    "mlr": {"num_samples": 20_000, "rows_per_block": 1000},
    "nmf": {"num_users": 6000, "rows_per_block": 500},
    "lda": {"num_docs": 3000, "rows_per_block": 250},
    "lasso": {"num_samples": 20_000, "rows_per_block": 1000},
}


def reference_job(app: str, epochs: int = CALIBRATION_EPOCHS) -> dict[str, Any]:
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


@dataclass
class ClusterShape:
    """The local cluster the calibration (and bench/sim_fidelity.py) runs on."""

    nodes: int = 2
    node_vcores: int = 4
    node_memory_mb: int = 2048
    cpu_per_node: float = field(default_factory=lambda: (os.cpu_count() or 1) / 2)

    def start(self, base: Path, policy: str = "static") -> LocalCluster:
        cluster = LocalCluster(base, nodes=self.nodes, node_memory_mb=self.node_memory_mb,
                               node_vcores=self.node_vcores, heartbeat_interval_ms=250, policy=policy,
                               nm_expiry_s=30, am_expiry_s=30,
                               extra_nm_args=["--cpu-limit-cores", f"{self.cpu_per_node:.4f}"])
        cluster.start(timeout_s=90)
        return cluster


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

    def to_json(self) -> dict[str, Any]:
        """What the calibration file keeps of the run (for refits without running it again)."""
        return {"shape": list(self.requested), "jct_s": self.jct_s, "first_report_s": self.first_report,
                "started_s": self.started, "epochs": self.epochs, "epoch_times": self.epoch_times}

    @property
    def epoch_wall_s(self) -> Optional[float]:
        """The epoch's training time on an unloaded host: the lower quartile of the AM's epoch times
        (the first epoch, which warms up, left out). Other work on the host only ever slows an
        epoch down, so the faster epochs are the better estimate of what the shape itself costs."""
        times = sorted(self.epoch_times[1:] or self.epoch_times)
        return times[(len(times) - 1) // 4] if times else None


Step = Callable[[RmRestClient, "JobRun", dict[str, Any]], Any]


async def run_job(client: RmRestClient, spec: dict[str, Any], name: str, at_s: float = 0.0, t0: float = 0.0,
                  on_report: Optional[Step] = None, timeout_s: float = 600.0) -> JobRun:
    """Submit `spec` at monotonic time t0 + at_s and follow it to its end."""
    loop = asyncio.get_running_loop()
    delay = t0 + at_s - loop.time()
    if delay > 0:
        await asyncio.sleep(delay)
    run = JobRun(name)
    new = await client.new_application()
    run.app_id = str(new.get("application-id"))
    await client.submit(build_ps_submission(spec, name=name, am_memory=AM_MEMORY_MB, app_id=run.app_id))
    run.submitted = loop.time()
    deadline = run.submitted + timeout_s
    last_epoch = -1
    while True:
        now = loop.time() - run.submitted
        app = await client.app(run.app_id)
        shape = await client.app_shape(run.app_id)
        report = shape.get("current") or None
        if report is not None:
            if run.first_report is None:
                run.first_report = now
            if report.get("started") and run.started is None:
                run.started = now
            epoch = report.get("epoch")
            if epoch is not None and epoch > last_epoch:
                last_epoch = epoch
                run.last_epoch_at = now
            run.epochs = (epoch + 1) if epoch is not None else 0
            run.iterations = int(report.get("iterations") or 0)
            run.shape = (int(report.get("workers") or 0), int(report.get("servers") or 0))
            run.epoch_times = [float(t) for t in report.get("epoch_times") or []]
            init = report.get("initial_objective")
            run.objectives = ([(0, float(init))] if init is not None else []) + [
                (int(o["epoch"]) + 1, float(o["objective"])) for o in report.get("objectives") or []]
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

    async def __call__(self, client: RmRestClient, run: JobRun, report: dict[str, Any]) -> None:
        now = asyncio.get_running_loop().time() - run.submitted
        shape = (int(report.get("workers") or 0), int(report.get("servers") or 0))
        if self.pending is not None:
            t, its, speed, target = self.pending
            if shape == target and not report.get("changing"):
                made = (run.iterations - its) / speed if speed > 0 else 0.0
                run.reshape_lost_s.append(max(0.0, (now - t) - made))
                self.pending = None
            return
        if not self.steps or not report.get("started") or run.epochs < self.after_epochs or report.get("changing"):
            return
        step = self.steps.pop(0)
        target = (shape[0] + step, shape[1])
        speed = float(report.get("speed") or 0.0)
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
    """The costs of the run with the least time outside training: the host's other work only adds
    to it, so that run is the best estimate of the unloaded host."""
    splits = [split_costs(float(r.jct_s or 0.0), r.training_s, r.first_report, r.started) for r in runs]
    return min(splits, key=sum) if splits else (2.0, 3.0, 1.0)


async def calibrate_apps(client: RmRestClient, apps: list[str], shapes: tuple[tuple[int, int], ...],
                         epochs: int, log: Callable[[str], None]) -> tuple[dict[str, AppCalibration], list[JobRun]]:
    out: dict[str, AppCalibration] = {}
    runs_all: list[JobRun] = []
    for app in apps:
        runs: list[JobRun] = []
        for w, s in shapes:
            spec = {**reference_job(app, epochs), "workers": w, "servers": s}
            run = await run_job(client, spec, f"calibrate {app} {w}x{s}", t0=asyncio.get_running_loop().time())
            run.requested = (w, s)
            log(f"{app} {w}x{s}: {run.final_status}, jct {run.jct_s:.1f}s, epochs {run.epochs}, "
                f"epoch {run.epoch_wall_s or 0:.2f}s, start {run.started or 0:.1f}s")
            if run.final_status == "SUCCEEDED" and run.epoch_wall_s:
                runs.append(run)
        runs_all += runs
        if not runs:
            log(f"{app}: no run succeeded; left out of the calibration")
            continue
        samples = [(r.requested[0], r.requested[1], float(r.epoch_wall_s or 0.0)) for r in runs]
        # Convergence per epoch depends on the shape a little (more workers, other mini-batch
        # interleavings): the curve is the one of the apps' default shape (2 workers, 1 server),
        # the pooled runs' when that run is missing or too short.
        ref = [r for r in runs if r.requested == REFERENCE_SHAPE and len(r.objectives) >= 4]
        history = ref[0].objectives if ref else [p for r in runs for p in r.objectives]
        # The curve is a falling loss; an objective that rises (LDA's log-likelihood) is fitted negated.
        sign: Literal[1, -1] = -1 if history and statistics.fmean(v for _, v in history) < 0 else 1
        try:
            model = fit_epoch_time(samples)
            curve = fit_curve([(k, sign * v) for k, v in history])
        except ValueError as e:    # EpochTimeError, CurveError
            log(f"{app}: cannot fit its runs ({e}); left out of the calibration")
            continue
        am_start, startup, finish = run_costs(runs)
        out[app] = AppCalibration(
            theta=[round(t, 6) for t in model.theta], loss_curve=[curve.beta0, curve.beta1, curve.beta2],
            clocks_per_epoch=max(1.0, statistics.fmean(r.iterations / max(1, r.epochs) for r in runs)),
            reference=reference_job(app, epochs), samples=[[w, s, round(t, 4)] for w, s, t in samples],
            initial_objective=history[0][1] if history and history[0][0] == 0 else None,
            histories=[[[k, v] for k, v in r.objectives] for r in runs], runs=[r.to_json() for r in runs],
            convergence_history=[v for k, v in ref[0].objectives if k >= 1] if ref else [],
            am_start_s=round(am_start, 3), startup_s=round(startup, 3), finish_s=round(finish, 3),
            max_epochs=int(reference_job(app)["max_epochs"]), objective_sign=sign,
            model_mb=reference_model_mb(app))
        log(f"{app}: theta {out[app].theta}, curve {out[app].loss_curve}")
    return out, runs_all


async def measure_reshape(client: RmRestClient, mode: str, log: Callable[[str], None]) -> Optional[float]:
    spec = {**reference_job("mlr", 25), "workers": 2, "servers": 1, "max_workers": 3, "elastic_mode": mode}
    probe = ReshapeProbe()
    run = await run_job(client, spec, f"calibrate reshape ({mode})", t0=asyncio.get_running_loop().time(),
                        on_report=probe)
    log(f"reshape ({mode}): lost {run.reshape_lost_s} s, {run.final_status}")
    return statistics.fmean(run.reshape_lost_s) if run.reshape_lost_s else None


def merge_passes(passes: list[Calibration]) -> Calibration:
    """One calibration from several passes of the same command: per app and shape the fastest epoch
    time (refitted), the start / finish costs of the pass with the least of them, the last pass's
    reshape costs and curve.
    The host's other work only ever adds time, so the least of several passes is the best estimate
    of the unloaded host; passes at different load disagree by up to 2x on the 2-core dev host."""
    last = passes[-1]
    apps: dict[str, AppCalibration] = {}
    for name, app in last.apps.items():
        mine = [p.apps[name] for p in passes if name in p.apps]
        best: dict[tuple[int, int], float] = {}
        for a in mine:
            for w, s, t in a.samples:
                key = (int(w), int(s))
                best[key] = min(best.get(key, float("inf")), float(t))
        samples = sorted((w, s, t) for (w, s), t in best.items())
        cheapest = min(mine, key=lambda a: a.am_start_s + a.startup_s + a.finish_s)
        merged = msgspec.structs.replace(
            app, theta=[round(t, 6) for t in fit_epoch_time(samples).theta],
            samples=[[w, s, round(t, 4)] for w, s, t in samples],
            **{k: getattr(cheapest, k) for k in ("am_start_s", "startup_s", "finish_s")})
        apps[name] = merged
    return Calibration(apps=apps, measured_on=last.measured_on,
                       note=last.note + f"; {len(passes)} passes merged (fastest epoch per shape, least costs)")


def calibrate(out_path: Path, apps: list[str], shapes: tuple[tuple[int, int], ...] = SHAPES,
              epochs: int = CALIBRATION_EPOCHS, log: Callable[[str], None] = print,
              cluster_shape: Optional[ClusterShape] = None, passes: int = 1) -> Calibration:
    """Run the calibration `passes` times on a fresh local cluster (stopped afterwards), merge the
    passes (`merge_passes`) and write `out_path`."""
    done = [calibrate_pass(apps, shapes, epochs, log, cluster_shape) for _ in range(max(1, passes))]
    cal = merge_passes(done) if len(done) > 1 else done[0]
    from sim.calibration import save  # noqa: PLC0415
    save(cal, out_path)
    return cal


def calibrate_pass(apps: list[str], shapes: tuple[tuple[int, int], ...], epochs: int, log: Callable[[str], None],
                   cluster_shape: Optional[ClusterShape]) -> Calibration:
    """One pass: every app at every shape, then the reshape probes."""
    cs = cluster_shape or ClusterShape()
    with tempfile.TemporaryDirectory(prefix="elastane-calibrate-") as tmp:
        cluster = cs.start(Path(tmp))
        try:
            async def go() -> Calibration:
                async with RmRestClient(cluster.rm_url, default_user()) as client:
                    per_app, _ = await calibrate_apps(client, apps, shapes, epochs, log)
                    if not per_app:
                        raise RuntimeError("no app could be calibrated")
                    reshape = await measure_reshape(client, "eps", log)
                    restart = await measure_reshape(client, "kill", log)
                for a in per_app.values():
                    if reshape is not None:
                        a.reshape_s = round(reshape, 3)
                    if restart is not None:
                        a.restart_s = round(restart, 3)
                    a.pause_s = round(a.restart_s / 2, 3)
                return Calibration(apps=per_app, measured_on=(
                    f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores; local cluster of {cs.nodes} "
                    f"nodes x {cs.node_vcores} vcores, {cs.cpu_per_node:g} cores each (shared by vcore), "
                    f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"),
                    note="elastane sim calibrate: epoch times per shape fitted to models.ps_iteration_time; "
                         "reshape_s / restart_s measured on mlr and used for every app; pause_s = restart_s / 2")
            return asyncio.run(go())
        finally:
            cluster.stop()


__all__ = ["ClusterShape", "JobRun", "ReshapeProbe", "SHAPES", "calibrate", "merge_passes", "reference_job", "run_job"]

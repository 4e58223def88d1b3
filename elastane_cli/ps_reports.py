"""Plain-text reports of PS jobs for `elastane ps status` and `ps submit --wait`: the executor
table, Cruise plan history, the running report from the AM's status and the report of an ended job."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

import msgspec
from msgspec import UnsetType

from protocol import ps_job_spec
from protocol import shape_history as sh
from protocol.job_report import JobReport
from protocol.ps_status import HeldoutStatus, PsStatus
from protocol.yarn_views import AppView
from psruntime.apps.quality import check_quality

from .progress_bar import EpochPoint, EpochProgress, format_objective
from .tables import format_duration

if TYPE_CHECKING:
    from psruntime.apps.base import PSApp

    from .ps_commands import WatchResult

AM_ENDING_PHASES = ("FINISHING", "SUCCEEDED", "FAILED", "KILLED")
# The PS AM's final diagnostics: "final objective X after N epochs (...; held-out k v, k v)"; the
# metrics are the last "held-out" (the stop criterion and a divergence warning may name it before).
FINAL_DIAGNOSTICS = re.compile(r"final objective (?P<objective>\S+) after (?P<epochs>\d+) epochs"
                               r"(?:.*held-out (?P<metrics>[^)]*)\))?")
# ... and before them what ended training, and the final model against the true model's.
STOP_CRITERION = re.compile(r"after \d+ epochs \((?P<criterion>.*?); initial ")
VS_TRUE_MODEL = re.compile(r"; (?P<quality>\S+ \S+ vs true model \S+ \((?:meets|misses) [^)]*\))")


def max_epochs_of(spec_json: object, app: PSApp[msgspec.Struct, msgspec.Struct] | None = None) -> int:
    """The epoch limit a spec runs to: max_epochs, else hparams.max_epochs, else the app's default
    -- a built-in app's from its decoded hyper-parameters (`PSJobSpec.effective_max_epochs`), a
    user's from `app` (its class built with the spec's hyper-parameters, where this client has its
    code); 0 when unknown here. A `PSJobSpec` is taken as decoded; JSON is validated first."""
    own = getattr(getattr(app, "hparams", None), "max_epochs", None)
    if isinstance(own, int) and not isinstance(own, bool):
        return own
    try:
        spec = spec_json if isinstance(spec_json, ps_job_spec.PSJobSpec) else ps_job_spec.validate(spec_json)
        return spec.effective_max_epochs or 0
    except ps_job_spec.JobSpecError:
        return 0


def progress_from_status(status: PsStatus, max_epochs: int = 0) -> EpochProgress:
    """The progress bar's view of the AM's /status answer: the epoch limit is the one the AM's app
    trains to (a user's app included), else `max_epochs` as the client knew it."""
    history = [EpochPoint(h.epoch, h.objective, h.epoch_time_s, h.time)
               for h in status.objective_history if h.objective is not None]
    done = status.epoch or len(history)
    limit = status.max_epochs or max_epochs or max_epochs_of(status.spec) or done
    return EpochProgress(phase=status.state or "?", epochs_done=done, max_epochs=max(limit, done),
                         history=history, initial_objective=status.initial_objective,
                         converged=status.converged, heldout=heldout_short(status.heldout),
                         diverging=bool(status.heldout.warning))


def heldout_short(heldout: HeldoutStatus) -> str | None:
    """`cross_entropy 0.6456 (true 0.4944)`: the latest held-out score of the AM's status. A user's
    app that names no HELDOUT_METRIC: every metric its `evaluate` returned, by their own names."""
    if heldout.value is None:
        last = heldout.history[-1] if heldout.history else None
        return _metrics_text(last.metrics) if last is not None and last.metrics else None
    true = heldout.true_model_value
    return f"{heldout.metric} {heldout.value:.4g}" + (f" (true {true:.4g})" if true is not None else "")


def heldout_text(heldout: HeldoutStatus) -> str:
    """The held-out line of `ps status`: latest score, epoch, the true model's, the best so far."""
    short = heldout_short(heldout)
    if short is None:
        every = f" ({heldout.metric})" if heldout.metric else ""
        return f"not scored yet{every}"
    text = f"{short} after epoch {(heldout.epoch or 0) + 1}"
    best = heldout.best
    if best is not None and best.value is not None and best.epoch != heldout.epoch:
        text += f", best {best.value:.4g} after epoch {best.epoch + 1}"
    if heldout.early_stopping:
        text += f", early stopping after {_plural(heldout.early_stopping, 'epoch')} without improvement"
    return text


def quality_text(app: str | None, metrics: Mapping[str, float | None] | None) -> str | None:
    """The final model's held-out figure against the true model's and the target (generated data)."""
    if not app or not metrics:
        return None
    try:
        q = check_quality(app, {k: v for k, v in metrics.items() if v is not None})
    except (KeyError, TypeError, ValueError):
        return None
    return q.describe() if q else None


def _metrics_text(metrics: Mapping[str, float | None] | None) -> str:
    if not metrics:
        return "-"
    return ", ".join(f"{k} {v:.4g}" if isinstance(v, (int, float)) else f"{k} {v}" for k, v in metrics.items())


def _plural(n: object, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def final_from_diagnostics(diagnostics: str | None) -> tuple[str, str, str] | None:
    """(objective, epochs, held-out metrics text) from the PS AM's final diagnostics, if they are that."""
    m = FINAL_DIAGNOSTICS.search(diagnostics or "")
    if m is None:
        return None
    return m.group("objective"), m.group("epochs"), (m.group("metrics") or "").strip()


def final_report(result: WatchResult) -> list[tuple[str, object]]:
    """What `ps submit --wait` prints once the job has ended."""
    app, status = result.app, result.status or PsStatus()
    pairs: list[tuple[str, object]] = [("Application-Id", app.get("id")),
                                    ("Final-Status", f"{app.get('state')}/{app.get('finalStatus')}")]
    history = status.objective_history
    parsed = final_from_diagnostics(app.get("diagnostics"))
    initial = f" (initial {format_objective(status.initial_objective)})" \
        if status.initial_objective is not None else ""
    if status.state in AM_ENDING_PHASES and history:
        # The AM's own last word: the whole history, seen before it exited.
        pairs.append(("Final-Objective", f"{format_objective(history[-1].objective)} after "
                                         f"{_plural(len(history), 'epoch')}{initial}"))
    elif parsed is not None:   # the last status seen was older: the AM's final diagnostics say it
        pairs.append(("Final-Objective", f"{parsed[0]} after {_plural(int(parsed[1]), 'epoch')}{initial}"))
    elif history:
        pairs.append(("Last-Objective", f"{format_objective(history[-1].objective)} after "
                                        f"{_plural(len(history), 'epoch')}{initial}"))
    diagnostics = app.get("diagnostics") or ""
    stopped = STOP_CRITERION.search(diagnostics) if parsed is not None else None
    criterion = status.stop_criterion or (stopped.group("criterion") if stopped else None)
    if criterion:
        pairs.append(("Stopped-By", criterion))
    if status.final_metrics:
        pairs.append(("Held-Out-Metrics", _metrics_text(status.final_metrics)))
        quality = quality_text(status.app, status.final_metrics)
        if quality:
            pairs.append(("Vs-True-Model", quality))
    elif parsed is not None and parsed[2]:   # the last status seen was older: from the diagnostics
        pairs.append(("Held-Out-Metrics", parsed[2]))
        vs_true = VS_TRUE_MODEL.search(diagnostics)
        if vs_true:
            pairs.append(("Vs-True-Model", vs_true.group("quality")))
    warning = status.heldout.warning
    if warning:
        pairs.append(("Warning", warning))
    if app.get("diagnostics"):
        pairs.append(("Diagnostics", app["diagnostics"]))
    return pairs


def _blocks_text(blocks: list[int]) -> str:
    """[0, 1, 2, 3, 6] -> '0-3,6'."""
    runs: list[list[int]] = []
    for b in sorted(set(blocks)):
        if runs and runs[-1][1] == b - 1:
            runs[-1][1] = b
        else:
            runs.append([b, b])
    return ",".join(str(a) if a == z else f"{a}-{z}" for a, z in runs) or "-"


EXECUTOR_HEADERS = ["ID", "ROLE", "STATE", "NODE", "CONTAINER", "RSS-MB", "DATA-MB", "MODEL-MB", "BLOCKS"]


def executor_rows(status: PsStatus) -> list[list[object]]:
    return [[e.id, e.role, e.state, e.node or "-", e.container_id or "-", f"{e.rss_mb:.1f}", f"{e.data_mb:.3f}",
             f"{e.model_mb:.3f}", _blocks_text(e.blocks)]
            for e in (status.shape.executors if status.shape else [])]


PLAN_HEADERS = ["EPOCH", "TRIGGER", "FROM", "TO", "PREDICTED", "MEASURED", "PLAN-TIME", "OPS", "ERROR"]


def _secs(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}s"


@dataclass(frozen=True)
class ShapeChange:
    """One entry of the PS AM's shape history (`/status` "shape_history", protocol.shape_history)
    as `ps scale` shows it; None: that kind of change has no such figure."""

    op: str
    requested: int | None
    before: tuple[int, int] | None       # (workers, servers)
    after: tuple[int, int] | None
    seconds: float | None                # how long the change took
    lost_s: float | None                 # how long training waited for it
    moved: str                           # model blocks and input splits it moved
    containers: int                      # containers added minus released
    error: str

    @property
    def shape_text(self) -> str:
        def ws(shape: tuple[int, int] | None) -> str:
            return "?" if shape is None else f"{shape[0]}/{shape[1]}"
        if self.before is None and self.after is None:
            return "-"
        return ws(self.after) if self.before == self.after else f"{ws(self.before)} -> {ws(self.after)}"


def _shape_of(workers: int | None | UnsetType, servers: int | None | UnsetType) -> tuple[int, int] | None:
    return (workers, servers) if isinstance(workers, int) and isinstance(servers, int) else None


def _counts(c: sh.ExecutorCounts) -> tuple[int, int]:
    return (c.workers, c.servers)


def shape_change(rec: sh.ShapeChange) -> ShapeChange:
    """The AM's record of a change: the shape after it is the record's own workers / servers."""
    match rec:
        case sh.EpsChange():
            moved = [f"{n} {what}" for n, what in ((rec.blocks_moved, "model blocks"), (rec.splits_moved, "splits"),
                                                   (rec.splits_reactivated, "splits re-activated")) if n]
            return ShapeChange(op=rec.op, requested=rec.requested, before=_counts(rec.before),
                               after=_shape_of(rec.workers, rec.servers), seconds=rec.seconds, lost_s=rec.lost_s,
                               moved=", ".join(moved),
                               containers=len(rec.containers_added) - len(rec.containers_released), error=rec.error)
        case sh.KillRestartChange():
            return ShapeChange(op=rec.op, requested=rec.requested, before=_counts(rec.before),
                               after=(rec.workers, rec.servers), seconds=rec.seconds, lost_s=rec.lost_s, moved="",
                               containers=0, error=rec.error)
        case sh.SuspendChange():      # a pause names no shape; a resume the one it resumed with
            return ShapeChange(op=rec.op, requested=None, before=None, after=_shape_of(rec.workers, rec.servers),
                               seconds=rec.seconds, lost_s=None, moved="", containers=0, error="")
        case sh.RecoveryChange() | sh.ReplaceWorkerChange():
            return ShapeChange(op=rec.op, requested=None, before=_counts(rec.before),
                               after=(rec.workers, rec.servers), seconds=rec.seconds, lost_s=rec.lost_s, moved="",
                               containers=0, error=rec.error)


SHAPE_CHANGE_HEADERS = ["FUNCTION", "N", "WORKERS/SERVERS", "TOOK", "MOVED", "TRAINING-WAITED", "CONTAINERS"]


def shape_change_rows(records: list[sh.ShapeChange]) -> list[list[object]]:
    rows: list[list[object]] = []
    for c in map(shape_change, records):
        rows.append([c.op + (f" (failed: {c.error})" if c.error else ""),
                     "-" if c.requested is None else c.requested, c.shape_text,
                     "-" if c.seconds is None else f"{c.seconds:.2f}s", c.moved or "-",
                     "-" if c.lost_s is None else f"{c.lost_s:.3f}s", f"{c.containers:+d}"])
    return rows


def plan_history_rows(status: PsStatus) -> list[list[object]]:
    """Cruise's executed plans: shape before / after, predicted and measured epoch times."""
    plans = status.cruise.plan_history if status.cruise else []
    return [[p.epoch, p.trigger, "x".join(map(str, p.shape_before)) or "-",
             "x".join(map(str, p.shape_after or p.chosen_shape or [])) or "-",
             f"{_secs(p.predicted_epoch_before_s)} -> {_secs(p.predicted_epoch_after_s)}",
             f"{_secs(p.measured_epoch_before_s)} -> {_secs(p.measured_epoch_after_s)}",
             _secs(p.plan_s), p.ops, p.error or "-"]
            for p in plans]


def optimizer_text(status: PsStatus) -> str:
    cruise = status.cruise
    if not cruise:
        return str(status.optimizer or (status.spec.optimizer if status.spec else None) or "off")
    w, s = (str(cruise.shape[0]), str(cruise.shape[1])) if len(cruise.shape) >= 2 else ("?", "?")
    state = "reconfiguring" if cruise.running else (cruise.why_not_ready or "measuring")
    return f"cruise: {w} workers x {s} servers, {_plural(len(cruise.plan_history), 'plan')}; {state}"


def colocation_text(status: PsStatus) -> str | None:
    """Harmony's view of the job: its group (the latest directive's), whether it runs or is
    paused, and its input spill (alpha, MB on disk) when it spills; None when none applies."""
    group = status.directives[-1].group if status.directives else None
    sus = status.suspension
    spill = status.spill
    parts = []
    if group:
        parts.append(f"group {group}")
    if sus.state != "RUNNING" or sus.pauses:
        parts.append(f"{sus.state.lower()}, {_plural(sus.pauses, 'pause')} "
                     f"({format_duration(sus.paused_s)} paused)")
    if spill is not None:
        parts.append(f"spill alpha {spill.alpha:.2f}, {spill.spilled_mb:.1f} MB on disk")
    return "; ".join(parts) or None


def running_report(app: AppView, status: PsStatus) -> tuple[list[tuple[str, object]], EpochProgress]:
    spec = status.spec
    shape = status.shape
    p = progress_from_status(status)
    wall = p.wall_time_per_epoch_s()
    eta = p.eta_s()
    pairs: list[tuple[str, object]] = [
        ("Application-Id", app.get("id")), ("Name", app.get("name")), ("User", app.get("user")),
        ("State", f"{app.get('state')} (job phase {status.state})"),
        ("App", f"{status.app or (spec.app if spec else None)} (preset {spec.preset if spec else '-'}, data "
                f"{_or_dash(status.data_mb)} MB, model {_or_dash(status.model_mb)} MB)"),
        ("Shape", f"{_plural(shape.workers if shape else '?', 'worker')}, "
                  f"{_plural(shape.servers if shape else '?', 'server')}, "
                  f"{_plural('?' if status.num_blocks is None else status.num_blocks, 'block')}, "
                  f"sync {spec.sync if spec else '-'}"),
        ("Epoch", f"{p.epochs_done}/{p.max_epochs}" + (" (converged)" if p.converged else "")),
        ("Objective", f"{format_objective(p.objective)} (initial {format_objective(p.initial_objective)})"),
        ("Held-Out", heldout_text(status.heldout)),
        ("Epoch-Time", "-" if p.last_epoch_time_s is None else
         f"{p.last_epoch_time_s:.3f}s training, {wall:.3f}s wall per epoch" if wall else f"{p.last_epoch_time_s:.3f}s"),
        ("ETA", "-" if eta is None or p.converged else f"<= {format_duration(eta)}"),
        ("Tracking-URL", app.get("trackingUrl")),
    ]
    if status.cruise or (spec is not None and spec.optimizer != "off"):
        pairs.append(("Optimizer", optimizer_text(status)))
    colocation = colocation_text(status)
    if colocation:
        pairs.append(("Colocation", colocation))
    if status.heldout.warning:
        pairs.append(("Warning", status.heldout.warning))
    if status.final_metrics:
        pairs.append(("Held-Out-Metrics", _metrics_text(status.final_metrics)))
    if status.diagnostics:
        pairs.append(("Diagnostics", status.diagnostics))
    return pairs, p


def _or_dash(x: float | None) -> str:
    return "-" if x is None else str(x)


def ended_report(app: AppView) -> list[tuple[str, object]]:
    shape = app.get("shape")
    report = JobReport.decode(shape) if shape else None     # the AM's last report to the RM
    pairs: list[tuple[str, object]] = [
        ("Application-Id", app.get("id")), ("Name", app.get("name")), ("User", app.get("user")),
        ("State", app.get("state")), ("Final-Status", app.get("finalStatus")),
        ("Elapsed", format_duration((app.get("elapsedTime") or 0) / 1000))]
    if report is not None:
        pairs.append(("Last-Shape", f"{_plural(report.workers, 'worker')}, {_plural(report.servers, 'server')}"))
    parsed = final_from_diagnostics(app.get("diagnostics"))
    if parsed is not None:
        pairs.append(("Final-Objective", f"{parsed[0]} after {_plural(int(parsed[1]), 'epoch')}"))
        if parsed[2]:
            pairs.append(("Held-Out-Metrics", parsed[2]))
    elif report is not None and report.objective is not None:   # the last epoch the AM reported to the RM
        pairs.append(("Last-Epoch", f"{_plural((report.epoch or 0) + 1, 'epoch')}, objective "
                                    f"{format_objective(report.objective)}, epoch time "
                                    f"{report.epoch_time_s or 0:.3f}s"))
    pairs.append(("Diagnostics", app.get("diagnostics") or "-"))
    return pairs


# ----- commands --------------------------------------------------------------------------------

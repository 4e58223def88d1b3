"""The RM web UI's page for one application: `/cluster/app/{app_id}` as in YARN.

Shows the app's fields, and for elastic PS apps (ELASTANE_PS) its current shape from the AM's
latest job report, the policy's latest directive (with Harmony's group and run state), the shape
changes over time and charts of the job's speed, epoch time, objective and shape, with the shape
changes, directives and pauses marked on the time axis (from the RM's bounded ShapeHistory and
decision log). Every value is HTML-escaped: names, diagnostics and reports come from users and AMs.
"""
from __future__ import annotations

import urllib.parse
from typing import TYPE_CHECKING, Optional

from aiohttp import web

from protocol import ps_job_spec

from .. import rest_views as views
from ..decision_log import DecisionRecord
from ..model import App
from ..policies.snapshot import PSJobView
from ..shape_history import ShapeChange, ShapeHistory, ShapeSample
from .access import ui_page
from .format import fmt_time
from .layout import escape, html_table, live_chart, live_fields, note_until, page, static_fields
from .logs_page import app_log_links
from .svg_chart import Marker, Series, chart

if TYPE_CHECKING:
    from ..context import RmContext

APP_PAGE = "/cluster/app/{app_id}"

APP_FIELDS = (
    ("ID", "id", "text"), ("User", "user", "text"), ("Name", "name", "text"), ("Queue", "queue", "text"),
    ("Application type", "applicationType", "text"), ("State", "state", "state"),
    ("Final status", "finalStatus", "text"), ("Progress", "progress", "pct"),
    ("Running containers", "runningContainers", "int"), ("Allocated memory", "allocatedMB", "mb"),
    ("Allocated vcores", "allocatedVCores", "int"), ("Started", "startedTime", "time"),
    ("Finished", "finishedTime", "time"), ("Elapsed", "elapsedTime", "duration_ms"),
    ("Log aggregation", "logAggregationStatus", "text"), ("Diagnostics", "diagnostics", "text"),
)
# Paths under the shape endpoint's "shape" object. Fields a report lacks (e.g. Harmony's alpha
# before Harmony reports it) show N/A.
SHAPE_FIELDS = (
    ("Workers", "current.workers", "int"), ("Servers", "current.servers", "int"),
    ("Started", "current.started", "text"), ("Changing", "current.changing", "text"),
    ("Phase", "current.phase", "text"), ("Iterations", "current.iterations", "int"),
    ("Early feedback done", "current.early_feedback", "text"),
    ("Speed", "current.speed", "speed"), ("Speed measured over (iterations)", "current.speed_iterations", "int"),
    ("Epoch", "current.epoch", "int"), ("Last epoch time", "current.epoch_time_s", "seconds"),
    ("Objective", "current.objective", "num"), ("Initial objective", "current.initial_objective", "num"),
    ("Worker compute per mini-batch", "current.worker_times.compute_s", "measured_s"),
    ("Worker communication per mini-batch", "current.worker_times.comm_s", "measured_s"),
    ("Server service time per request", "current.server_times.service_s", "measured_s"),
    ("Memory in use", "current.memory_mb", "mb"), ("Spilled", "current.spilled_mb", "mb"),
    ("Alpha (Harmony)", "current.alpha", "num"),
    ("Executor memory", "current.executor_resource.memory", "mb"),
    ("Executor vcores", "current.executor_resource.vCores", "int"),
    ("Directive acted on", "current.directive_version", "int"),
    ("Directive refused, why", "current.directive_refused", "text"),
)
DIRECTIVE_FIELDS = (
    ("Policy", "policy", "text"), ("Version", "directive.version", "int"),
    ("Delivered to the AM", "directiveDelivered", "text"),
    ("Workers", "directive.workers", "int"), ("Servers", "directive.servers", "int"),
    ("Placement", "directive.placement", "placement"), ("Group (Harmony)", "directive.group", "text"),
    ("Run state", "directive.runState", "text"), ("Reason", "directive.reason", "text"),
)


def change_label(c: ShapeChange) -> str:
    """A shape change's tooltip (the script words it the same)."""
    w, s = c.after
    if c.before is None:
        return f"shape: {w} workers, {s} servers"
    return f"shape: {c.before[0]} \u2192 {w} workers, {c.before[1]} \u2192 {s} servers"


def decision_label(r: DecisionRecord) -> str:
    """A directive's tooltip (the script words it the same)."""
    d = r.directive
    return f"directive v{d.version}: {d.workers} workers, {d.servers} servers, {d.run_state.value}. {d.reason}"


def _markers(hist: ShapeHistory, decisions: list[DecisionRecord], t0: float) -> list[Marker]:
    out = [Marker(c.t - t0, change_label(c), "shape") for c in hist.changes]
    out += [Marker(r.t - t0, decision_label(r), "pause" if r.directive.run_state.value == "pause" else "directive")
            for r in decisions]
    return out


def _per_epoch(samples: list[ShapeSample]) -> list[ShapeSample]:
    """One sample per epoch: the report that first carried it."""
    seen: set[int] = set()
    out = []
    for s in samples:
        if s.epoch is not None and s.epoch not in seen:
            seen.add(s.epoch)
            out.append(s)
    return out


def _points(samples: list[ShapeSample], attr: str, t0: float) -> list[tuple[float, float]]:
    out = []
    for s in samples:
        v = getattr(s, attr)
        if v is not None:
            out.append((s.t - t0, float(v)))
    return out


# (css id suffix, title, y format, per epoch?, [(sample attribute, JSON key, label)])
CHARTS: tuple[tuple[str, str, str, bool, tuple[tuple[str, str, str], ...]], ...] = (
    ("speed", "Speed (iterations/s)", "num", False, (("speed", "speed", "speed"),)),
    ("epoch-time", "Epoch time (s)", "num", True, (("epoch_time_s", "epochTimeS", "epoch time"),)),
    ("objective", "Objective", "num", True, (("objective", "objective", "objective"),)),
    ("shape", "Workers and servers", "int", False, (("workers", "workers", "workers"),
                                                     ("servers", "servers", "servers"))),
)


def _charts(rm: "RmContext", app: App, t0: float) -> str:
    hist = app.shape_history
    samples = hist.samples
    markers = _markers(hist, rm.core.decisions.for_app(app.app_id), t0)
    src = f"/ws/v1/cluster/apps/{urllib.parse.quote(app.app_id, safe='')}/shape"
    out = []
    for suffix, title, y_fmt, per_epoch, keys in CHARTS:
        chosen = _per_epoch(samples) if per_epoch else samples
        series = [Series(label, _points(chosen, attr, t0)) for attr, _, label in keys]
        spec = {"title": title, "xFmt": "s", "yFmt": y_fmt, "t0": int(t0 * 1000), "perEpoch": per_epoch,
                "series": [{"path": ["shape", "samples"], "x": "time", "y": key, "label": label}
                           for _, key, label in keys],
                "markers": [{"path": ["shape", "history"], "type": "changes"},
                            {"path": ["shape", "decisions"], "type": "decisions"}]}
        out.append(live_chart(f"chart-{suffix}", src, spec,
                              chart(title, series, markers, y_fmt=y_fmt, css_class=f"chart {suffix}")))
    legend = ('<p class="legend">Dashed lines: <span style="color:#c0392b">shape change</span>, '
              '<span style="color:#7f8c8d">directive</span>, <span style="color:#e67e22">pause</span> '
              "(hover for details).</p>")
    return f'<div class="charts">{"".join(out)}</div>{legend}'


def _change_cell(before: Optional[int], after: Optional[int], first: bool) -> str:
    """"2 &rarr; 4" when the count changed, else just the count."""
    def text(v: Optional[int]) -> str:
        return "N/A" if v is None else str(v)
    return text(after) if first or before == after else f"{text(before)} &rarr; {text(after)}"


def _changes_table(hist: ShapeHistory, t0: float) -> str:
    rows = []
    for c in hist.changes:
        bw, bs = c.before if c.before is not None else (None, None)
        first = c.before is None
        rows.append([escape(fmt_time(c.t * 1000)), f"{c.t - t0:.0f}", _change_cell(bw, c.after[0], first),
                     _change_cell(bs, c.after[1], first)])
    return html_table(["Time", "Seconds since start", "Workers", "Servers"], rows)


def _tracking(app: App, j: dict[str, object]) -> str:
    # Tracking URLs come from AMs: only http(s) ones become links.
    if app.tracking_url.startswith(("http://", "https://")):
        return f'<a href="{escape(app.tracking_url)}">{escape(j["trackingUI"])}</a>'
    return escape(j["trackingUI"])


def _job_spec(ps: PSJobView) -> str:
    """What the job was submitted as, from the typed spec the RM keeps (App.ps)."""
    spec = ps.spec
    sync = "BSP" if ps.bsp else f"SSP (staleness {spec.ssp_staleness})"
    epochs = "none" if ps.max_epochs is None else str(ps.max_epochs)
    return static_fields([
        ("App", escape(spec.app)), ("Preset", escape(spec.preset)), ("Synchronisation", sync),
        ("Workers (min-max)", f"{ps.workers} ({ps.min_workers}-{ps.max_workers})"),
        ("Servers (min-max)", f"{ps.servers} ({ps.min_servers}-{ps.max_servers})"),
        ("Executor", f"{ps.executor.memory} MB, {ps.executor.vcores} vcores"),
        ("Epoch limit", epochs), ("Weight", f"{ps.weight:g}"),
        ("Elastic changes", escape(f"{spec.elastic_mode}, optimizer {spec.optimizer}")),
    ])


def render_app_page(rm: "RmContext", app: App, now_ms: Optional[float] = None) -> str:
    """The HTML page of one application."""
    now = rm.core.clock() * 1000 if now_ms is None else now_ms
    j = views.app_json(rm.core, app)
    quoted = urllib.parse.quote(app.app_id, safe="")
    body = (f"<h1>Application {escape(app.app_id)}</h1>"
            f'{live_fields("app", f"/ws/v1/cluster/apps/{quoted}", ["app"], APP_FIELDS, j, now)}'
            + static_fields([("Tracking URL", _tracking(app, j)),
                             ("Attempts", f"{len(app.attempts)} of at most {app.max_attempts}"),
                             ("Logs", app_log_links(rm, app, str(j["amContainerLogs"])))]))
    shape_src = f"/ws/v1/cluster/apps/{quoted}/shape"
    if app.app_type.upper() == ps_job_spec.APPLICATION_TYPE:
        t0 = app.start_time or app.submit_time
        sj = views.shape_json(rm.core, app)
        note = ("" if app.shape is not None else
                note_until(shape_src, ["shape", "current"], "The application master has not reported its shape yet."))
        directive = ("" if app.directive is not None else
                     note_until(shape_src, ["shape", "directive"], f"Policy {rm.cfg.policy} has sent no directive."))
        directive += live_fields("directive", shape_src, ["shape"], DIRECTIVE_FIELDS, sj, now)
        if app.ps is not None:
            body += f"<h2>Job spec</h2>{_job_spec(app.ps)}"
        body += (f"<h2>Current shape</h2>{note}"
                 f'{live_fields("shape", shape_src, ["shape"], SHAPE_FIELDS, sj, now)}'
                 f"<h2>Directive</h2>{directive}"
                 f"<h2>Training over time</h2>{_charts(rm, app, t0)}"
                 f"<h2>Shape changes</h2>{_changes_table(app.shape_history, t0)}")
    elif app.shape is not None:
        body += "<h2>Reported shape</h2>" + static_fields([(str(k), escape(v)) for k, v in app.shape.to_json().items()])
    return page(f"Application {app.app_id}", body, active="/cluster/apps")


def render_not_found(app_id: str) -> str:
    """The 404 page for an application the RM does not know."""
    return page("Application not found",
                f"<h1>Application not found</h1><p>The ResourceManager knows no application "
                f"<code>{escape(app_id)}</code>.</p>", active="/cluster/apps")


class AppPage:
    """`/cluster/app/{app_id}` handler."""

    def __init__(self, rm: "RmContext"):
        self.rm = rm

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get(APP_PAGE, ui_page(self.rm, self.app_page))   # 401 where the REST API would refuse

    async def app_page(self, request: web.Request) -> web.Response:
        app_id = request.match_info["app_id"]
        app = self.rm.core.apps.get(app_id)
        if app is None:
            return web.Response(status=404, text=render_not_found(app_id), content_type="text/html")
        return web.Response(text=render_app_page(self.rm, app), content_type="text/html")

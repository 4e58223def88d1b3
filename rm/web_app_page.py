"""The RM web UI's page for one application: `/cluster/app/{app_id}` as in YARN.

Shows the app's fields, and for elastic PS apps (ELASTANE_PS) its current shape from the AM's
latest shape report, the policy's latest directive, the shape changes over time and charts of
the job's speed, epoch time and objective (from the RM's bounded ShapeHistory). Every value is
HTML-escaped: names, diagnostics and reports come from users and AMs.
"""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Optional

from aiohttp import web

from protocol import ps_job_spec
from protocol.internal_api import RunState
from protocol.job_report import JobReport

from . import rest_views as views
from .model import App
from .shape_history import ShapeHistory
from .web_svg_chart import line_chart
from .web_ui import PAGE_CSS, escape, html_table

if TYPE_CHECKING:
    from .server import ResourceManagerServer

APP_PAGE = "/cluster/app/{app_id}"


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "N/A"


def _elapsed(ms: int) -> str:
    s = ms // 1000
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h {m}m {sec}s" if h else (f"{m}m {sec}s" if m else f"{sec}s")


def _page(title: str, body: str) -> str:
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>{escape(title)}</title>'
            f'<style>{PAGE_CSS}\n.nochart{{color:#666}}svg{{display:block;margin-bottom:1.5em}}</style>'
            f'</head><body><p><a href="/cluster">&larr; Cluster</a></p>{body}</body></html>')


def _fields(rows: list[tuple[str, str]]) -> str:
    """A two-column table of (label, already-escaped value)."""
    return "<table>" + "".join(f"<tr><th>{escape(k)}</th><td>{v}</td></tr>" for k, v in rows) + "</table>"


def _overview(rm: "ResourceManagerServer", app: App) -> str:
    j = views.app_json(rm.core, app)
    # Tracking URLs come from AMs: only http(s) ones become links.
    if app.tracking_url.startswith(("http://", "https://")):
        tracking = f'<a href="{escape(app.tracking_url)}">{escape(j["trackingUI"])}</a>'
    else:
        tracking = escape(j["trackingUI"])
    state = escape(app.state.value)
    return _fields([
        ("ID", escape(app.app_id)), ("User", escape(app.user)), ("Name", escape(app.name)),
        ("Queue", escape(app.queue)), ("Application type", escape(app.app_type)),
        ("State", f'<span class="{state}">{state}</span>'), ("Final status", escape(app.final_status.value)),
        ("Progress", f'{j["progress"]:.0f}%'), ("Tracking URL", tracking),
        ("Attempts", f"{len(app.attempts)} of at most {app.max_attempts}"),
        ("Running containers", str(j["runningContainers"])),
        ("Allocated", f'{j["allocatedMB"]} MB, {j["allocatedVCores"]} vcores'),
        ("Submitted", escape(_when(app.submit_time))), ("Started", escape(_when(app.start_time))),
        ("Finished", escape(_when(app.finish_time))), ("Elapsed", escape(_elapsed(j["elapsedTime"]))),
        ("Diagnostics", f'<pre>{escape(app.diagnostics)}</pre>' if app.diagnostics else ""),
    ])


def _opt(v: Any, fmt: str = "{}") -> str:
    return "N/A" if v is None else escape(fmt.format(v))


def _worker_times(rep: JobReport) -> str:
    t = rep.worker_times
    if t.workers == 0:
        return "N/A"
    return f"compute {t.compute_s * 1000:.3g} ms, communication {t.comm_s * 1000:.3g} ms per mini-batch"


def _server_times(rep: JobReport) -> str:
    t = rep.server_times
    return "N/A" if t.servers == 0 else f"{t.service_s * 1000:.3g} ms per request"


def _current_shape(rm: "ResourceManagerServer", app: App) -> str:
    rep = app.shape
    if rep is None:
        out = "<p>The application master has not reported its shape yet.</p>"
    else:
        ef = "done" if rep.early_feedback else f"not yet (after {rep.early_feedback_iterations} iterations)"
        res = rep.executor_resource
        out = _fields([
            ("Workers", str(rep.workers)), ("Servers", str(rep.servers)),
            ("Started", "yes" if rep.started else "no"),
            ("Changing", "yes (reconfiguration under way)" if rep.changing else "no"),
            ("Iterations", str(rep.iterations)), ("Early feedback", escape(ef)),
            ("Speed", f"{rep.speed:.3g} iterations/s over {rep.speed_iterations} iterations"),
            ("Phase", escape(rep.phase) or "N/A"), ("Epoch", _opt(rep.epoch)),
            ("Last epoch time", _opt(rep.epoch_time_s, "{} s")), ("Objective", _opt(rep.objective)),
            ("Initial objective", _opt(rep.initial_objective)),
            ("Worker times", _worker_times(rep)), ("Server service time", _server_times(rep)),
            ("Memory", f"{rep.memory_mb:.0f} MB in use, {rep.spilled_mb:.0f} MB spilled"),
            ("Executor", "N/A" if res is None else f"{res.memory} MB, {res.vcores} vcores"),
            ("Directive acted on", str(rep.directive_version)),
        ])
    d = app.directive
    if d is None:
        out += f"<p>Policy <b>{escape(rm.cfg.policy)}</b> has sent no directive.</p>"
    else:
        delivered = "delivered" if app.delivered_directive_version >= d.version else "not yet delivered"
        nodes = f" on {escape(', '.join(d.nodes))}" if d.nodes else ""
        group = f", group {escape(d.group)}" if d.group is not None else ""
        state = f", {escape(d.run_state.value)}" if d.run_state is not RunState.RUN else ""
        out += (f"<p>Policy <b>{escape(rm.cfg.policy)}</b> directive v{d.version} ({delivered}): "
                f"{d.workers} workers, {d.servers} servers{nodes}{group}{state}. {escape(d.reason)}</p>")
    return out


def _change_cell(before: Optional[int], after: Optional[int], first: bool) -> str:
    """"2 &rarr; 4" when the count changed, else just the count."""
    return _opt(after) if first or before == after else f"{_opt(before)} &rarr; {_opt(after)}"


def _changes_table(hist: ShapeHistory, t0: float) -> str:
    rows = []
    for c in hist.changes:
        bw, bs = c.before if c.before is not None else (None, None)
        first = c.before is None
        rows.append([escape(_when(c.t)), f"{c.t - t0:.0f}", _change_cell(bw, c.after[0], first),
                     _change_cell(bs, c.after[1], first)])
    return html_table(["Time", "Seconds since start", "Workers", "Servers"], rows)


def _charts(hist: ShapeHistory, t0: float) -> str:
    samples = hist.samples
    speed = [(s.t - t0, s.speed) for s in samples if s.speed is not None]
    # One point per epoch: the report that first carried it.
    epoch_time: list[tuple[float, float]] = []
    objective: list[tuple[float, float]] = []
    seen: set[int] = set()
    for s in samples:
        if s.epoch is None or s.epoch in seen:
            continue
        seen.add(s.epoch)
        if s.epoch_time_s is not None:
            epoch_time.append((s.t - t0, s.epoch_time_s))
        if s.objective is not None:
            objective.append((s.t - t0, s.objective))
    out = line_chart("Speed (iterations/s)", speed, css_class="chart speed")
    if epoch_time:
        out += line_chart("Epoch time (s)", epoch_time, css_class="chart epoch-time")
    if objective:
        out += line_chart("Objective", objective, css_class="chart objective")
    return out


def render_app_page(rm: "ResourceManagerServer", app: App) -> str:
    """The HTML page of one application."""
    body = f"<h1>Application {escape(app.app_id)}</h1>{_overview(rm, app)}"
    if app.app_type.upper() == ps_job_spec.APPLICATION_TYPE:
        t0 = app.start_time or app.submit_time
        hist = app.shape_history
        body += (f"<h2>Current shape</h2>{_current_shape(rm, app)}"
                 f"<h2>Shape changes</h2>{_changes_table(hist, t0)}"
                 f"<h2>Training over time</h2>{_charts(hist, t0)}")
    elif app.shape is not None:
        body += "<h2>Reported shape</h2>" + _fields([(str(k), escape(v)) for k, v in app.shape.to_json().items()])
    return _page(f"Application {app.app_id}", body)


def render_not_found(app_id: str) -> str:
    """The 404 page for an application the RM does not know."""
    return _page("Application not found",
                 f"<h1>Application not found</h1><p>The ResourceManager knows no application "
                 f"<code>{escape(app_id)}</code>.</p>")


class AppPage:
    """`/cluster/app/{app_id}` handler."""

    def __init__(self, rm: "ResourceManagerServer"):
        self.rm = rm

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get(APP_PAGE, self.app_page)

    async def app_page(self, request: web.Request) -> web.Response:
        app_id = request.match_info["app_id"]
        app = self.rm.core.apps.get(app_id)
        if app is None:
            return web.Response(status=404, text=render_not_found(app_id), content_type="text/html")
        return web.Response(text=render_app_page(self.rm, app), content_type="text/html")

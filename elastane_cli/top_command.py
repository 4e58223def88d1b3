"""`elastane top`: a live terminal view of the cluster, like `yarn top`.

A summary (nodes, apps by state, memory, vcores, containers), then the running and waiting apps
with their shape, speed, progress and resource use, sorted (memory by default), redrawn in place
every `--interval` seconds with ANSI escapes until Ctrl-C. `--once` prints one plain frame and
exits (for scripts and tests). Everything comes from the RM's REST API (an elastic PS app's shape
and speed from its job report in the app record).
"""
from __future__ import annotations

import argparse
import asyncio
import shutil
import time
from dataclasses import dataclass
from typing import Callable, TextIO

from protocol.json_types import JsonObject, JsonValue, json_float
from protocol.yarn_views import AppView

from .arg_types import positive_float
from .context import CliContext, common_parent
from .errors import EXIT_OK
from .rm_rest_client import RmRestClient
from .tables import format_duration, render_table

DEFAULT_INTERVAL_S = 3.0
APP_STATES = "RUNNING,ACCEPTED,SUBMITTED,NEW_SAVING,NEW"
HOME, CLEAR_LINE, CLEAR_BELOW = "\x1b[H", "\x1b[K", "\x1b[J"

APP_HEADERS = ["APPLICATIONID", "USER", "QUEUE", "STATE", "#CONT", "MEM", "VCORES", "WORKERS/SERVERS",
               "SPEED", "ITER", "EPOCH", "OBJECTIVE", "%PROG", "TIME", "NAME"]


def _num(v: JsonValue) -> float:
    try:
        return json_float(v)
    except (TypeError, ValueError):
        return 0.0


def _shape(app: AppView) -> JsonObject:
    """The app's last job report (JobReport.to_json), {} for an app without one."""
    shape = app.get("shape")
    return shape if isinstance(shape, dict) else {}


# Sort keys (largest first, except the id: newest first too).
SORTS: dict[str, Callable[[AppView], float | str]] = {
    "mem": lambda a: _num(a.get("allocatedMB")),
    "vcores": lambda a: _num(a.get("allocatedVCores")),
    "containers": lambda a: _num(a.get("runningContainers")),
    "speed": lambda a: _num(_shape(a).get("speed")),
    "time": lambda a: _num(a.get("elapsedTime")),
    "progress": lambda a: _num(a.get("progress")),
    "id": lambda a: str(a.get("id", "")),
}


def _gb(mb: JsonValue) -> str:
    return f"{_num(mb) / 1024:.3g}"


def _sig(v: JsonValue, suffix: str = "") -> str:
    if v is None:
        return "-"
    f = _num(v)
    return (f"{f:,.0f}" if abs(f) >= 1000 else f"{f:.3g}") + suffix


def app_row(app: AppView) -> list[str]:
    """One app's line: its resources, and for elastic PS apps its shape and training figures."""
    s = _shape(app)
    shape = f"{s['workers']}/{s['servers']}" if "workers" in s and "servers" in s else "-"
    if s.get("changing"):
        shape += "*"
    return [str(app.get("id", "")), str(app.get("user", "")), str(app.get("queue", "")),
            str(app.get("state", "")), str(int(_num(app.get("runningContainers")))), _gb(app.get("allocatedMB")) + "G",
            str(int(_num(app.get("allocatedVCores")))), shape,
            _sig(s.get("speed"), " it/s") if s else "-", _sig(s.get("iterations")) if s else "-",
            "-" if s.get("epoch") is None else str(s.get("epoch")), _sig(s.get("objective")),
            f"{_num(app.get('progress')):.0f}", format_duration(_num(app.get("elapsedTime")) / 1000),
            str(app.get("name", ""))]


@dataclass
class Snapshot:
    """What one frame shows: the RM's cluster info, metrics and the apps listed."""

    info: JsonObject
    metrics: JsonObject
    apps: list[AppView]


def render_frame(snap: Snapshot, now: float, sort: str = "mem", width: int = 0) -> str:
    """One frame of `elastane top` (lines cut to `width` columns when it is > 0)."""
    m, info = snap.metrics, snap.info
    started = _num(info.get("startedOn")) / 1000
    up = f", up {format_duration(now - started)}" if started > 0 else ""
    policy = f", policy {info['policy']}" if info.get("policy") else ""
    lines = [
        f"elastane top - {time.strftime('%H:%M:%S', time.localtime(now))}{up}{policy}",
        f"NodeManager(s): {m.get('totalNodes', 0)} total, {m.get('activeNodes', 0)} active, "
        f"{m.get('unhealthyNodes', 0)} unhealthy, {m.get('lostNodes', 0)} lost",
        f"Queue(s) Applications: {m.get('appsRunning', 0)} running, {m.get('appsSubmitted', 0)} submitted, "
        f"{m.get('appsPending', 0)} pending, {m.get('appsCompleted', 0)} completed, {m.get('appsKilled', 0)} killed, "
        f"{m.get('appsFailed', 0)} failed",
        f"Queue(s) Mem(GB): {_gb(m.get('availableMB'))} available, {_gb(m.get('allocatedMB'))} allocated, "
        f"{_gb(m.get('totalMB'))} total",
        f"Queue(s) VCores: {m.get('availableVirtualCores', 0)} available, {m.get('allocatedVirtualCores', 0)} "
        f"allocated, {m.get('totalVirtualCores', 0)} total",
        f"Queue(s) Containers: {m.get('containersAllocated', 0)} allocated, {m.get('containersPending', 0)} pending",
        "",
    ]
    key = SORTS[sort]
    apps = sorted(snap.apps, key=key, reverse=True)
    lines.extend(render_table(APP_HEADERS, [app_row(a) for a in apps]).split("\n"))
    if not apps:
        lines.append("(no running or waiting applications)")
    if width > 0:
        lines = [ln[:width] for ln in lines]
    return "\n".join(lines)


async def fetch_snapshot(client: RmRestClient) -> Snapshot:
    """The frame's data from the RM (three REST calls, concurrently)."""
    info, metrics, apps = await asyncio.gather(client.cluster_info(), client.cluster_metrics(),
                                               client.apps(states=APP_STATES))
    return Snapshot(info, metrics, apps)


def add_parser(sub: argparse._SubParsersAction, common: argparse.ArgumentParser | None = None) -> None:
    p = sub.add_parser("top", parents=[common or common_parent()],
                       help="live view of the cluster and its applications (like yarn top)",
                       description="The cluster's nodes, apps and resources, then the running and waiting "
                                   "apps with their shape, speed and resource use, refreshed in place.")
    p.add_argument("--interval", type=positive_float("--interval"), default=DEFAULT_INTERVAL_S, metavar="SECONDS",
                   help=f"seconds between refreshes (default {DEFAULT_INTERVAL_S:g})")
    p.add_argument("--once", action="store_true", help="print one frame and exit (no ANSI escapes)")
    p.add_argument("--sort", choices=sorted(SORTS), default="mem", help="order of the apps (largest first)")
    p.set_defaults(func=cmd_top)


async def pause(seconds: float) -> None:
    """The refresh period between frames (not a readiness wait)."""
    await asyncio.sleep(seconds)


def _draw(out: TextIO, frame: str) -> None:
    """Redraw the screen in place: home, each line cleared to its end, the rest cleared."""
    out.write(HOME + "".join(line + CLEAR_LINE + "\n" for line in frame.split("\n")) + CLEAR_BELOW)
    out.flush()


def cmd_top(args: argparse.Namespace, ctx: CliContext) -> int:
    async def go() -> None:
        async with RmRestClient(ctx.rm_url, ctx.user) as client:
            if args.once:
                ctx.out.write(render_frame(await fetch_snapshot(client), time.time(), args.sort) + "\n")
                return
            while True:
                snap = await fetch_snapshot(client)
                width = shutil.get_terminal_size().columns
                _draw(ctx.out, render_frame(snap, time.time(), args.sort, width))
                await pause(args.interval)

    try:
        asyncio.run(go())
    except KeyboardInterrupt:
        if not args.once:
            ctx.out.write("\n")
    return EXIT_OK

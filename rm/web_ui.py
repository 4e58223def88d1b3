"""The RM's small web UI: `/` redirects to `/cluster`, a self-contained HTML status page."""
from __future__ import annotations

import html
import time
from typing import TYPE_CHECKING

from aiohttp import web

from . import rest_views as views

if TYPE_CHECKING:
    from .server import ResourceManagerServer

_CSS = """body{font-family:sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;margin-bottom:2em}
th,td{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}th{background:#eef}
h1{font-size:20px}h2{font-size:16px}.FAILED,.KILLED,.LOST,.UNHEALTHY{color:#b00}.RUNNING,.FINISHED{color:#070}"""


def _e(x: object) -> str:
    return html.escape(str(x))


def _table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body or '<tr><td colspan=%d>none</td></tr>' % len(headers)}</table>"


def render_cluster_page(rm: "ResourceManagerServer") -> str:
    core = rm.core
    m = views.cluster_metrics(core)["clusterMetrics"]
    nodes = [[_e(n.node_id), _e(n.rack), f'<span class="{_e(n.state.value)}">{_e(n.state.value)}</span>',
              _e(n.http_address), str(len(n.containers)), f"{n.used.memory} / {n.capability.memory}",
              f"{n.used.vcores} / {n.capability.vcores}", _e(n.health_report)] for n in core.nodes]
    apps = []
    for app in sorted(core.apps.values(), key=lambda a: a.seq, reverse=True):
        j = views.app_json(core, app)
        # Tracking URLs come from AMs: only http(s) ones become links.
        link = (f'<a href="{_e(app.tracking_url)}">{_e(j["trackingUI"])}</a>'
                if app.tracking_url.startswith(("http://", "https://")) else _e(j["trackingUI"]))
        apps.append([_e(app.app_id), _e(app.user), _e(app.name), _e(app.queue),
                     f'<span class="{_e(app.state.value)}">{_e(app.state.value)}</span>',
                     _e(app.final_status.value), f'{j["progress"]:.0f}%', str(j["runningContainers"]),
                     str(j["allocatedMB"]), link, _e(app.diagnostics[:200])])
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(core.start_time))
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>Elastane ResourceManager</title>
<style>{_CSS}</style></head><body><h1>Elastane ResourceManager</h1>
<p>Started {_e(started)} &middot; policy <b>{_e(core.cfg.policy)}</b> &middot;
apps submitted {m["appsSubmitted"]}, running {m["appsRunning"]}, pending {m["appsPending"]} &middot;
memory {m["allocatedMB"]} / {m["totalMB"]} MB &middot; vcores {m["allocatedVirtualCores"]} / {m["totalVirtualCores"]}
&middot; nodes {m["activeNodes"]} active, {m["lostNodes"]} lost</p>
<h2>Nodes</h2>{_table(["Node", "Rack", "State", "HTTP address", "Containers", "Memory MB", "VCores", "Health"], nodes)}
<h2>Applications</h2>{_table(["ID", "User", "Name", "Queue", "State", "Final status", "Progress", "Containers",
                               "Allocated MB", "Tracking", "Diagnostics"], apps)}
</body></html>"""


class WebUi:
    """`/` and `/cluster` handlers."""

    def __init__(self, rm: "ResourceManagerServer"):
        self.rm = rm

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/", self.root)
        app.router.add_get("/cluster", self.cluster)

    async def root(self, request: web.Request) -> web.Response:
        raise web.HTTPFound("/cluster")

    async def cluster(self, request: web.Request) -> web.Response:
        return web.Response(text=render_cluster_page(self.rm), content_type="text/html")

"""The RM's small web UI: `/` redirects to `/cluster`, a self-contained HTML status page."""
from __future__ import annotations

import html
import time
from typing import TYPE_CHECKING

from aiohttp import web

from . import rest_views as views

if TYPE_CHECKING:
    from .server import ResourceManagerServer

PAGE_CSS = """body{font-family:sans-serif;margin:1.5em;color:#222}table{border-collapse:collapse;margin-bottom:2em}
th,td{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}th{background:#eef}
h1{font-size:20px}h2{font-size:16px}.FAILED,.KILLED,.LOST,.UNHEALTHY{color:#b00}.RUNNING,.FINISHED{color:#070}"""


def escape(x: object) -> str:
    """HTML-escape any value (names, diagnostics and URLs are user input)."""
    return html.escape(str(x))


def html_table(headers: list[str], rows: list[list[str]]) -> str:
    """A table of already-escaped cells under escaped headers ("none" when empty)."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body or '<tr><td colspan=%d>none</td></tr>' % len(headers)}</table>"


def app_link(app_id: str) -> str:
    """A link to one app's page (YARN's `/cluster/app/{id}`)."""
    return f'<a href="/cluster/app/{escape(app_id)}">{escape(app_id)}</a>'


def render_cluster_page(rm: "ResourceManagerServer") -> str:
    core = rm.core
    m = views.cluster_metrics(core)["clusterMetrics"]
    nodes = [[escape(n.node_id), escape(n.rack),
              f'<span class="{escape(n.state.value)}">{escape(n.state.value)}</span>',
              escape(n.http_address), str(len(n.containers)), f"{n.used.memory} / {n.capability.memory}",
              f"{n.used.vcores} / {n.capability.vcores}", escape(n.health_report)] for n in core.nodes]
    apps = []
    for app in sorted(core.apps.values(), key=lambda a: a.seq, reverse=True):
        j = views.app_json(core, app)
        # Tracking URLs come from AMs: only http(s) ones become links.
        link = (f'<a href="{escape(app.tracking_url)}">{escape(j["trackingUI"])}</a>'
                if app.tracking_url.startswith(("http://", "https://")) else escape(j["trackingUI"]))
        apps.append([app_link(app.app_id), escape(app.user), escape(app.name), escape(app.queue),
                     f'<span class="{escape(app.state.value)}">{escape(app.state.value)}</span>',
                     escape(app.final_status.value), f'{j["progress"]:.0f}%', str(j["runningContainers"]),
                     str(j["allocatedMB"]), link, escape(app.diagnostics[:200])])
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(core.start_time))
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>Elastane ResourceManager</title>
<style>{PAGE_CSS}</style></head><body><h1>Elastane ResourceManager</h1>
<p>Started {escape(started)} &middot; policy <b>{escape(core.cfg.policy)}</b> &middot;
apps submitted {m["appsSubmitted"]}, running {m["appsRunning"]}, pending {m["appsPending"]} &middot;
memory {m["allocatedMB"]} / {m["totalMB"]} MB &middot; vcores {m["allocatedVirtualCores"]} / {m["totalVirtualCores"]}
&middot; nodes {m["activeNodes"]} active, {m["lostNodes"]} lost</p>
<h2>Nodes</h2>{html_table(["Node", "Rack", "State", "HTTP address", "Containers", "Memory MB", "VCores",
                            "Health"], nodes)}
<h2>Applications</h2>{html_table(["ID", "User", "Name", "Queue", "State", "Final status", "Progress", "Containers",
                               "Allocated MB", "Tracking", "Diagnostics"], apps)}
</body></html>"""


class WebUi:
    """`/` and `/cluster` handlers (one app's page is rm/web_app_page.py)."""

    def __init__(self, rm: "ResourceManagerServer"):
        self.rm = rm

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get("/", self.root)
        app.router.add_get("/cluster", self.cluster)

    async def root(self, request: web.Request) -> web.Response:
        raise web.HTTPFound("/cluster")

    async def cluster(self, request: web.Request) -> web.Response:
        return web.Response(text=render_cluster_page(self.rm), content_type="text/html")

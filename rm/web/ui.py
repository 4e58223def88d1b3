"""The RM's web UI at YARN's paths: `/` redirects to `/cluster` (the overview), `/cluster/apps`
(and `/cluster/apps/{STATE}`), `/cluster/nodes`, `/cluster/node/{id}`, `/cluster/scheduler`
(one page per module: rm/web/*_page.py; one app's page is rm/web/app_page.py) and the script that
keeps them live, served from the package (rm/web/static/)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web

from .access import ui_page
from .apps_page import parse_state, render_apps_page
from .layout import SCRIPT, escape, page
from .logs_page import LogsPage
from .node_page import render_node_not_found, render_node_page
from .nodes_page import render_nodes_page
from .overview_page import render_overview_page
from .scheduler_page import render_scheduler_page

if TYPE_CHECKING:
    from ..context import RmContext

STATIC_DIR = Path(__file__).parent / "static"


def _html(text: str, status: int = 200) -> web.Response:
    return web.Response(status=status, text=text, content_type="text/html")


class WebUi:
    """The web UI's page handlers (all but one app's page) and its static script."""

    def __init__(self, rm: "RmContext"):
        self.rm = rm

    def add_routes(self, app: web.Application) -> None:
        r = app.router
        r.add_get("/", self.root)                # a redirect and the script show nothing: open
        for path, handler in (("/cluster", self.cluster), ("/cluster/", self.cluster), ("/cluster/apps", self.apps),
                              ("/cluster/apps/{state}", self.apps), ("/cluster/nodes", self.nodes),
                              ("/cluster/node/{node_id}", self.node), ("/cluster/scheduler", self.scheduler)):
            r.add_get(path, ui_page(self.rm, handler))   # 401 where the REST API would refuse the caller
        r.add_get(SCRIPT, self.script)
        LogsPage(self.rm).add_routes(app)        # /cluster/logs/...: aggregated container logs (checks its own callers)

    def _now_ms(self) -> float:
        return self.rm.core.clock() * 1000

    async def root(self, request: web.Request) -> web.Response:
        raise web.HTTPFound("/cluster")

    async def cluster(self, request: web.Request) -> web.Response:
        util = self.rm.core.utilization.to_json()
        return _html(render_overview_page(self.rm, self._now_ms(), util))

    async def apps(self, request: web.Request) -> web.Response:
        raw = request.match_info.get("state")
        state = None if raw is None else parse_state(raw)
        if raw is not None and state is None:
            return _html(page("No such state", f"<h1>No such application state</h1><p><code>{escape(raw)}</code> "
                                               "is not a YARN application state.</p>"), status=404)
        return _html(render_apps_page(self.rm, self._now_ms(), state))

    async def nodes(self, request: web.Request) -> web.Response:
        return _html(render_nodes_page(self.rm, self._now_ms()))

    async def node(self, request: web.Request) -> web.Response:
        node_id = request.match_info["node_id"]
        node = self.rm.core.nodes.get(node_id)
        if node is None:
            return _html(render_node_not_found(node_id), status=404)
        util = self.rm.core.utilization.to_json(None, node_id)
        return _html(render_node_page(self.rm, node, self._now_ms(), util))

    async def scheduler(self, request: web.Request) -> web.Response:
        return _html(render_scheduler_page(self.rm, self._now_ms()))

    async def script(self, request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC_DIR / "elastane-ui.js", headers={"Content-Type": "text/javascript",
                                                                         "Cache-Control": "no-cache"})

"""The RM as the cluster's log server: an app's aggregated container logs (cluster.toml's
remote_app_log_dir, protocol/aggregated_logs.py) at `/cluster/logs/{app_id}`, one container's at
`/cluster/logs/{app_id}/{container_id}` (the app view's amContainerLogs once the app is over) and
one log file at `/cluster/logs/{app_id}/{container_id}/{file}` (text, YARN's `start` to take a tail).

YARN's web links for finished apps go to its JobHistory server, which reads the same remote dir;
Elastane has no history server, so the RM serves them: it outlives the nodes. While an app runs,
the app page links its AM's node instead (the NM's own page, which falls back on these files).
Reads go to a worker thread: an object store's latency must not hold the RM's event loop.
"""
from __future__ import annotations

import asyncio
import urllib.parse
from typing import TYPE_CHECKING, Optional

from aiohttp import web

from protocol.aggregated_logs import (AggregatedLogError, LogStream, NodeLogs, RemoteLogDir, app_node_logs,
                                      iter_log)
from protocol.client_auth import check_log_reader, request_user
from protocol.ids import ApplicationId
from protocol.remote_exception import Forbidden, Unauthorized

from ..model import App
from .layout import escape, html_table, page

if TYPE_CHECKING:
    from ..context import RmContext

LOGS_PAGE = "/cluster/logs/{app_id}"
CONTAINER_LOGS_PAGE = "/cluster/logs/{app_id}/{container_id}"
LOG_FILE = "/cluster/logs/{app_id}/{container_id}/{file_name}"


def logs_url(app_id: str) -> str:
    return "/cluster/logs/" + urllib.parse.quote(app_id, safe="")


def container_logs_url(app_id: str, container_id: str) -> str:
    return logs_url(app_id) + "/" + urllib.parse.quote(container_id, safe="")


def app_log_links(rm: "RmContext", app: App, am_logs: str) -> str:
    """The app page's log links: the AM's node while the app runs (the NM page), the aggregated
    logs once it is over (or whenever aggregation is on: rolled uploads show while it runs)."""
    links = []
    if am_logs and not app.state.is_final:
        links.append(f'<a href="{escape(am_logs)}">AM container on its node</a>')
    if rm.cluster.remote_app_log_dir:
        links.append(f'<a href="{escape(logs_url(app.app_id))}">aggregated logs</a>')
    return " | ".join(links) if links else "N/A (finished logs stay on their nodes: log aggregation is off)"


def _node_rows(app_id: str, nodes: list[NodeLogs], container_id: Optional[str]) -> list[list[str]]:
    rows = []
    for node in nodes:
        kind = "final" if node.final else f"rolled ({len(node.files)} upload(s)), app running or node lost"
        for cid, files in sorted(node.containers().items()):
            if container_id is not None and cid != container_id:
                continue
            links = ", ".join(
                f'<a href="{escape(logs_url(app_id))}/{escape(urllib.parse.quote(cid))}/'
                f'{escape(urllib.parse.quote(name))}">{escape(name)}</a> ({size} B)'
                for name, size in sorted(files.items()))
            rows.append([escape(cid), escape(node.node_id), escape(kind), links])
    return rows


def render_logs_page(app_id: str, store: Optional[RemoteLogDir], nodes: list[NodeLogs],
                     container_id: Optional[str] = None) -> str:
    """The app's aggregated logs, or only `container_id`'s."""
    title = f"Logs of {container_id or app_id}"
    rows = _node_rows(app_id, nodes, container_id)
    if store is None:
        return page(title, f"<h1>{escape(title)}</h1><p>Log aggregation is off (cluster.toml's "
                           "remote_app_log_dir is empty): container logs stay on their nodes.</p>",
                    active="/cluster/apps")
    errors = [e for n in nodes for e in n.errors]
    body = (f"<h1>{escape(title)}</h1><p>Aggregated at <code>{escape(store.url)}</code>.</p>"
            + ("".join(f'<p class="error">{escape(e)}</p>' for e in errors))
            + (html_table(["Container", "Node", "Upload", "Files"], rows) if rows else
               "<p>No aggregated logs of this app (yet): its nodes upload them when it ends, and every "
               "roll interval while it runs where nm.toml's log_roll_interval_s is set.</p>"))
    return page(title, body, active="/cluster/apps")


class LogsPage:
    """The `/cluster/logs/...` handlers."""

    def __init__(self, rm: "RmContext"):
        self.rm = rm
        url = rm.cluster.remote_app_log_dir
        self.store = RemoteLogDir(url) if url else None

    def add_routes(self, app: web.Application) -> None:
        app.router.add_get(LOGS_PAGE, self.logs_page)
        app.router.add_get(CONTAINER_LOGS_PAGE, self.logs_page)
        app.router.add_get(LOG_FILE, self.log_file)

    @staticmethod
    def _app_id(request: web.Request) -> str:
        raw = request.match_info["app_id"]
        try:
            return str(ApplicationId.parse(raw))
        except ValueError as e:
            raise web.HTTPBadRequest(text=f"{e}\n") from None

    async def _nodes(self, app_id: str) -> list[NodeLogs]:
        if self.store is None:
            return []
        try:
            return await asyncio.to_thread(app_node_logs, self.store, app_id)
        except OSError as e:
            raise web.HTTPBadGateway(text=f"cannot read the aggregated logs at {self.store.url}: {e}\n") from None

    async def _readable_nodes(self, request: web.Request, app_id: str) -> list[NodeLogs]:
        """The app's aggregated logs, for a caller who may read them: under client_auth = "token",
        the app's owner or an admin only (protocol/client_auth.py). The caller is authenticated
        before the store is read (an unknown client must not make the RM read it), and authorised
        before it too while the RM knows the app's owner; once it forgot the app, the owner is the
        one its aggregated files name, so they are read first."""
        cluster = self.rm.cluster
        try:
            user = request_user(cluster, request)
        except Unauthorized as e:
            raise web.HTTPUnauthorized(text=f"{e}\n") from None
        app = self.rm.core.apps.get(app_id)
        if app is not None:
            self._check_reader(user, app.user, app_id)
            return await self._nodes(app_id)
        nodes = await self._nodes(app_id)
        self._check_reader(user, next((n.user for n in nodes if n.user), None), app_id)
        return nodes

    def _check_reader(self, user: str, owner: Optional[str], app_id: str) -> None:
        try:
            check_log_reader(self.rm.cluster, user, owner, app_id)
        except Forbidden as e:
            raise web.HTTPForbidden(text=f"{e}\n") from None

    async def logs_page(self, request: web.Request) -> web.Response:
        app_id = self._app_id(request)
        nodes = await self._readable_nodes(request, app_id)
        page = render_logs_page(app_id, self.store, nodes, request.match_info.get("container_id"))
        return web.Response(text=page, content_type="text/html")

    async def log_file(self, request: web.Request) -> web.StreamResponse:
        app_id = self._app_id(request)
        cid, name = request.match_info["container_id"], request.match_info["file_name"]
        try:
            start = int(request.query.get("start", "0"))
        except ValueError:
            raise web.HTTPBadRequest(text=f"start must be an integer, got {request.query.get('start')!r}\n") from None
        store = self.store
        nodes = await self._readable_nodes(request, app_id)
        node = next((n for n in nodes if name in n.containers().get(cid, {})), None)
        if store is None or node is None:
            raise web.HTTPNotFound(text=f"no aggregated log {name} of {cid} in {app_id}\n")
        # Streamed a piece at a time (a log may be many GB); what fails before the first byte is a 502.
        stream = LogStream(iter_log(store, app_id, node, cid, name, start))
        try:
            await stream.start()
        except (AggregatedLogError, OSError) as e:
            raise web.HTTPBadGateway(text=f"{e}\n") from None
        return await stream.respond(request)

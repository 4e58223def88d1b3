"""Who may see the web UI's pages: whoever the REST API answers (protocol/client_auth.py). Under
cluster.toml's `client_auth = "token"` a page asks for a known client token (`Authorization:
Bearer <token>`) and answers 401 without one, as `/ws/v1/cluster/...` does; under simple auth the
pages are open, as YARN's are. Any caller the REST API answers sees every app there (it has no view
ACL on apps), so the pages show every app to them too. The aggregated-log pages
(rm/web/logs_page.py) check their caller themselves, with the logs' own ACL (owner or admin)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Awaitable, Callable

from aiohttp import web

from protocol.client_auth import request_user
from protocol.remote_exception import Unauthorized

from .layout import escape, page

if TYPE_CHECKING:
    from ..context import RmContext

PageHandler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def unauthorized_page(e: Unauthorized) -> web.Response:
    """The 401 page: why, and what a client sends instead."""
    body = (f"<h1>Authentication required</h1><p>{escape(e)}</p><p>This cluster runs with "
            "<code>client_auth = \"token\"</code>: its pages, like its REST API, answer a client that "
            "sends <code>Authorization: Bearer &lt;client token&gt;</code>.</p>")
    return web.Response(status=401, text=page("Authentication required", body), content_type="text/html",
                        headers={"WWW-Authenticate": "Bearer"})


def ui_page(rm: "RmContext", handler: PageHandler) -> PageHandler:
    """`handler` behind the REST API's authentication: the 401 page for a caller it would refuse."""
    async def checked(request: web.Request) -> web.StreamResponse:
        try:
            request_user(rm.cluster, request)
        except Unauthorized as e:
            return unauthorized_page(e)
        return await handler(request)
    checked.__name__ = checked.__qualname__ = getattr(handler, "__name__", "page")
    checked.__doc__ = handler.__doc__
    return checked

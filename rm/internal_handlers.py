"""Internal API handlers (`/internal/v1/...`): NM register/heartbeat, AM register/allocate/finish.

Every call is authenticated with a token signed by the cluster secret (protocol.tokens); the
node or attempt a call acts for comes from the token, never from the body alone.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web

from protocol import internal_api as api
from protocol import tokens
from protocol.http_server import json_response, read_json, require_token
from protocol.json_types import JsonObject

if TYPE_CHECKING:
    from .context import RmContext


class InternalApi:
    """Handlers of the NM and AM protocols, bound to one RM server."""

    def __init__(self, rm: "RmContext"):
        self.rm = rm

    def add_routes(self, app: web.Application) -> None:
        r = app.router
        r.add_post(api.NODE_REGISTER, self.node_register)
        r.add_post(api.NODE_HEARTBEAT, self.node_heartbeat)
        r.add_post(api.AM_REGISTER, self.am_register)
        r.add_post(api.AM_ALLOCATE, self.am_allocate)
        r.add_post(api.AM_FINISH, self.am_finish)

    def _claims(self, request: web.Request, kind: str) -> JsonObject:
        return require_token(request, self.rm.cluster.secret, kind)

    async def node_register(self, request: web.Request) -> web.Response:
        claims = self._claims(request, tokens.NM)
        req = await read_json(request, api.NodeRegisterRequest)
        return json_response(self.rm.core.register_node(claims, req))

    async def node_heartbeat(self, request: web.Request) -> web.Response:
        claims = self._claims(request, tokens.NM)
        req = await read_json(request, api.NodeHeartbeatRequest)
        return json_response(self.rm.core.node_heartbeat(claims, req))

    async def am_register(self, request: web.Request) -> web.Response:
        claims = self._claims(request, tokens.AM)
        req = await read_json(request, api.AmRegisterRequest)
        return json_response(self.rm.core.am_register(claims, req))

    async def am_allocate(self, request: web.Request) -> web.Response:
        claims = self._claims(request, tokens.AM)
        req = await read_json(request, api.AllocateRequest)
        return json_response(self.rm.core.allocate(claims, req))

    async def am_finish(self, request: web.Request) -> web.Response:
        claims = self._claims(request, tokens.AM)
        req = await read_json(request, api.AmFinishRequest)
        return json_response(self.rm.core.am_finish(claims, req))

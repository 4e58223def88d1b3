"""The PS AM's HTTP endpoint (its YARN tracking URL): GET /status, POST /checkpoint, POST /scale.

GET / and GET /status answer the job status, a protocol.ps_status.PsStatus (appmaster.ps.runtime.status_view), as JSON;
POST /checkpoint writes a checkpoint of every server block at the next epoch boundary and answers
its protocol.ps_status.CheckpointInfo {"epoch", "dir", ...} once it is on disk (409 when the job
has no model to checkpoint).
POST /scale {"workers": +2, "servers": -1} (a protocol.ps_status.ScaleRequest) changes the running
job's shape relatively with EPS's functions (the controller's EPS planner,
appmaster.ps.controller.planners.eps) and answers {"changes": [...]} once done: one record per
function called (protocol.ps_status.EpsOpStatus: duration, containers added / released, blocks and
splits moved, training time lost; under elastic_mode "kill", the shape history's records of the
restart). 400 for an impossible change (above the job's maximum, below 1), 409 while another
change runs or the job is not training.
With a `ControlAuth` (the PS AM always gives one) POST /checkpoint and POST /scale act only for
`Authorization: Bearer <t>` with t an AM-control token signed with the job's secret
(protocol.tokens.am_control_token): 401 without one, 403 for a forged, expired or another
attempt's token, and nothing happens. GET /status stays readable without a token, as YARN's
tracking pages are: it shows progress and shape, never the secret. Users reach the control
actions through the RM (`PUT /ws/v1/cluster/apps/{id}/shape`, checked against the app ACL).
Errors use YARN's RemoteException body (protocol.http_server).
"""
from __future__ import annotations

import logging
from typing import Awaitable, Callable, Sequence

from aiohttp import web

from protocol import tokens
from protocol.http_server import JSON, json_response, make_app, read_json
from protocol.ps_status import CheckpointInfo, EpsOpStatus, PsStatus, ScaleRequest, encode_status
from protocol.shape_history import ShapeChange
from protocol.remote_exception import BadRequest, Forbidden, Unauthorized

log = logging.getLogger(__name__)

StatusFn = Callable[[], PsStatus]
CheckpointFn = Callable[[], Awaitable[CheckpointInfo]]
# the changes made: one EPS operation record per function called, or (elastic_mode "kill") the
# shape history's records of the restart
ScaleFn = Callable[[int, int], Awaitable[Sequence[EpsOpStatus] | Sequence[ShapeChange]]]


class ControlAuth:
    """Who may use the AM's control endpoints: holders of an AM-control token of this attempt,
    signed with the job's secret."""

    def __init__(self, job_secret: str, attempt_id: str) -> None:
        self._secret = job_secret
        self.attempt_id = attempt_id

    def check(self, request: web.Request) -> None:
        """Return if `request` carries a valid token; raise Unauthorized / Forbidden (logged) if not."""
        token = tokens.token_from_header(request.headers.get("Authorization"))
        peer = request.remote or "?"
        if token is None:
            log.warning("refused %s %s from %s: no bearer token", request.method, request.path, peer)
            raise Unauthorized(f"{request.path} needs the app's token (Authorization: Bearer); "
                               "users go through the RM: PUT /ws/v1/cluster/apps/{id}/shape")
        try:
            claims = tokens.verify(self._secret, token, tokens.AM_CONTROL)
        except tokens.TokenError as e:
            log.warning("refused %s %s from %s: %s", request.method, request.path, peer, e)
            raise Forbidden(f"bad token for {request.path}: {e}") from None
        if claims.get("attempt_id") != self.attempt_id:
            log.warning("refused %s %s from %s: a token of attempt %r", request.method, request.path, peer,
                        claims.get("attempt_id"))
            raise Forbidden(f"the token is for attempt {claims.get('attempt_id')!r}, not {self.attempt_id}")


class StatusServer:
    """Serves the AM's status and checkpoint requests on `host`:`port` (0 = ephemeral); with
    `control_auth`, the control endpoints only for the app's token (None: open, for unit tests)."""

    def __init__(self, status: StatusFn, checkpoint: CheckpointFn, host: str = "127.0.0.1", port: int = 0,
                 scale: ScaleFn | None = None, control_auth: ControlAuth | None = None) -> None:
        self._status = status
        self._checkpoint = checkpoint
        self._scale = scale
        self._control_auth = control_auth
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = make_app()
        app.router.add_get("/", self._get_status)
        app.router.add_get("/status", self._get_status)
        app.router.add_post("/checkpoint", self._post_checkpoint)
        if self._scale is not None:
            app.router.add_post("/scale", self._post_scale)
        return app

    async def start(self) -> str:
        """Start serving; returns the URL (http://host:port/)."""
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        addresses = self._runner.addresses      # the bound port, needed for port 0
        self.port = int(addresses[0][1]) if addresses else self.port
        return self.url

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _get_status(self, request: web.Request) -> web.Response:
        return web.Response(body=encode_status(self._status()), content_type=JSON)

    def _authorize(self, request: web.Request) -> None:
        if self._control_auth is not None:
            self._control_auth.check(request)

    async def _post_checkpoint(self, request: web.Request) -> web.Response:
        self._authorize(request)
        return json_response(await self._checkpoint())

    async def _post_scale(self, request: web.Request) -> web.Response:
        assert self._scale is not None
        self._authorize(request)
        body = await read_json(request, ScaleRequest)
        if body.workers == 0 and body.servers == 0:
            raise BadRequest("nothing to change: give \"workers\" and/or \"servers\" as +N or -N")
        return json_response({"changes": list(await self._scale(body.workers, body.servers))})

"""The PS AM's HTTP endpoint (its YARN tracking URL): GET /status, POST /checkpoint, POST /scale.

GET / and GET /status answer the job status as JSON (see `PSApplicationMaster.status`);
POST /checkpoint writes a checkpoint of every server block at the next epoch boundary and answers
{"epoch", "dir", ...} once it is on disk (409 when the job has no model to checkpoint).
POST /scale {"workers": +2, "servers": -1} changes the running job's shape relatively with EPS's
functions (appmaster.ps.elastic_ops) and answers {"changes": [...]} once done: one record per
function called (duration, containers added / released, blocks and splits moved, training time
lost). 400 for an impossible change (above the job's maximum, below 1), 409 while another change
runs or the job is not training.
Errors use YARN's RemoteException body (protocol.http_server).
"""
from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable

import msgspec
from aiohttp import web

from protocol.http_server import json_response, make_app, read_json
from protocol.remote_exception import BadRequest

log = logging.getLogger(__name__)

StatusFn = Callable[[], dict[str, Any]]
CheckpointFn = Callable[[], Awaitable[dict[str, Any]]]
ScaleFn = Callable[[int, int], Awaitable[list[dict[str, Any]]]]


class ScaleRequest(msgspec.Struct, forbid_unknown_fields=True):
    """Body of POST /scale: signed changes of each role (+N adds, -N removes)."""

    workers: int = 0
    servers: int = 0


class StatusServer:
    """Serves the AM's status and checkpoint requests on `host`:`port` (0 = ephemeral)."""

    def __init__(self, status: StatusFn, checkpoint: CheckpointFn, host: str = "127.0.0.1", port: int = 0,
                 scale: ScaleFn | None = None) -> None:
        self._status = status
        self._checkpoint = checkpoint
        self._scale = scale
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
        return json_response(self._status())

    async def _post_checkpoint(self, request: web.Request) -> web.Response:
        return json_response(await self._checkpoint())

    async def _post_scale(self, request: web.Request) -> web.Response:
        assert self._scale is not None
        body = await read_json(request, ScaleRequest)
        if body.workers == 0 and body.servers == 0:
            raise BadRequest("nothing to change: give \"workers\" and/or \"servers\" as +N or -N")
        return json_response({"changes": await self._scale(body.workers, body.servers)})

"""The PS AM's HTTP endpoint (its YARN tracking URL): GET /status, POST /checkpoint.

GET / and GET /status answer the job status as JSON (see `PSApplicationMaster.status`);
POST /checkpoint writes a checkpoint of every server block at the next epoch boundary and answers
{"epoch", "dir", ...} once it is on disk (409 when the job has no model to checkpoint).
Errors use YARN's RemoteException body (protocol.http_server).
"""
from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable

from aiohttp import web

from protocol.http_server import json_response, make_app

log = logging.getLogger(__name__)

StatusFn = Callable[[], dict[str, Any]]
CheckpointFn = Callable[[], Awaitable[dict[str, Any]]]


class StatusServer:
    """Serves the AM's status and checkpoint requests on `host`:`port` (0 = ephemeral)."""

    def __init__(self, status: StatusFn, checkpoint: CheckpointFn, host: str = "127.0.0.1", port: int = 0) -> None:
        self._status = status
        self._checkpoint = checkpoint
        self.host = host
        self.port = port
        self._runner: web.AppRunner | None = None

    def app(self) -> web.Application:
        app = make_app()
        app.router.add_get("/", self._get_status)
        app.router.add_get("/status", self._get_status)
        app.router.add_post("/checkpoint", self._post_checkpoint)
        return app

    async def start(self) -> str:
        """Start serving; returns the URL (http://host:port/)."""
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
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

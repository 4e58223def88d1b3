"""The CLI's submission through a failover between new-application and the submission
(elastane_cli/rm_rest_client.py `submit_new`), over real HTTP to two in-process RMs: the id the
first RM handed out is unknown to the second, which refuses it with its own exception
(ApplicationIdNotHandedOutException); the client asks the second RM for an id and submits once
more. Any other refusal is the user's to see, not retried."""
from __future__ import annotations

from typing import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from aiohttp.typedefs import Handler

from elastane_cli.errors import UsageError
from elastane_cli.rm_rest_client import RmRestClient
from protocol.config import ClusterConfig, RMConfig
from protocol.http_server import json_response
from protocol.json_types import JsonInObject
from protocol.remote_exception import ServiceUnavailable
from rm.server import ResourceManagerServer
from rm_testing import SECRET, FakeClock


class Rm:
    """One in-process RM; `stepped_down` makes it answer every submission 503, as an RM whose
    term ended does."""

    def __init__(self, state_dir: str) -> None:
        self.server = ResourceManagerServer(RMConfig(state_dir=state_dir), ClusterConfig(secret=SECRET, admins=["root"]),
                                            clock=FakeClock(), run_timers=False)
        self.stepped_down = False
        app = self.server.build_app()
        app.middlewares.insert(0, self._guard)
        self.http = TestServer(app, host="127.0.0.1")

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.stepped_down and request.method == "POST" and request.path == "/ws/v1/cluster/apps":
            err = ServiceUnavailable("this ResourceManager is no longer active")
            return json_response(err.body(), status=err.status)
        return await handler(request)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http.port}"


@pytest.fixture
async def rms(tmp_path) -> AsyncIterator[tuple[Rm, Rm]]:
    a, b = Rm(str(tmp_path / "a")), Rm(str(tmp_path / "b"))
    await a.http.start_server()
    await b.http.start_server()
    try:
        yield a, b
    finally:
        for rm in (a, b):
            await rm.server.stop()
            await rm.http.close()


def shell_submission(app_id: str, queue: str = "default") -> JsonInObject:
    return {"application-id": app_id, "application-name": "job", "queue": queue,
            "am-container-spec": {"commands": {"command": "python am.py"}},
            "resource": {"memory": 256, "vCores": 1}, "application-type": "YARN"}


async def test_an_id_from_the_rm_that_stepped_down_is_replaced_by_one_from_the_rm_that_took_over(rms):
    a, b = rms
    built: list[str] = []

    def build(app_id: str) -> JsonInObject:
        built.append(app_id)
        a.stepped_down = True       # between the id and the submission, the RM that gave it out goes
        return shell_submission(app_id)

    async with RmRestClient(f"{a.url},{b.url}", "alice") as client:
        app_id = await client.submit_new(build)
    assert len(built) == 2 and built[0] in a.server.core.reserved_ids      # a's id, never submitted
    assert app_id == built[1] and list(b.server.core.apps) == [app_id]
    assert b.server.core.apps[app_id].user == "alice" and a.server.core.apps == {}


async def test_any_other_refusal_is_not_retried(rms):
    a, _ = rms
    built: list[str] = []

    def build(app_id: str) -> JsonInObject:
        built.append(app_id)
        return shell_submission(app_id, queue="nope")

    async with RmRestClient(a.url, "alice") as client:
        with pytest.raises(UsageError, match="unknown queue"):
            await client.submit_new(build)
    assert len(built) == 1 and a.server.core.apps == {}

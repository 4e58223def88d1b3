"""An in-process RM (aiohttp TestServer, fake clock, no timers) for REST-path tests, and the one
call every submission test starts with."""
from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer

from protocol.config import ClusterConfig, RMConfig
from rm.server import ResourceManagerServer
from rm_testing import SECRET, FakeClock

BASE = "/ws/v1/cluster"


@asynccontextmanager
async def inprocess_rm(tmp_path: Any, cluster: ClusterConfig) -> AsyncIterator[tuple[ResourceManagerServer,
                                                                                     TestClient]]:
    """An RM with `cluster`'s settings and its state under `tmp_path`, and a client of it."""
    server = ResourceManagerServer(RMConfig(state_dir=str(tmp_path / "state")), cluster, clock=FakeClock(),
                                   run_timers=False)
    client = TestClient(TestServer(server.build_app()))
    await client.start_server()
    try:
        yield server, client
    finally:
        await server.stop()
        await client.close()


@pytest.fixture
async def rm(tmp_path: Any) -> AsyncIterator[tuple[ResourceManagerServer, TestClient]]:
    async with inprocess_rm(tmp_path, ClusterConfig(secret=SECRET, admins=["root"])) as env:
        yield env


async def new_application_id(client: TestClient) -> str:
    resp = await client.post(BASE + "/apps/new-application", params={"user.name": "alice"})
    assert resp.status == 200
    return str((await resp.json())["application-id"])

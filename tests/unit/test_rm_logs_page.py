"""The RM's aggregated-log pages (rm/web/logs_page.py), in process: what a node uploaded is listed
and served; bad ids, missing files and aggregation off are clear answers."""
from __future__ import annotations

from pathlib import Path
from typing import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer

from protocol.aggregated_logs import ChunkSource, LogFileWriter, RemoteLogDir, node_file_name, roll_file_name
from protocol.config import ClusterConfig, RMConfig
from protocol.records import Resource
from rm.model import AmSpec
from rm.server import ResourceManagerServer
from rm_testing import SECRET, FakeClock

NODE = "10.0.0.3:8042"


async def _client(tmp_path: Path, remote: str) -> AsyncIterator[tuple[ResourceManagerServer, TestClient]]:
    rm = ResourceManagerServer(RMConfig(state_dir=str(tmp_path / "state")),
                               ClusterConfig(secret=SECRET, remote_app_log_dir=remote), clock=FakeClock(),
                               run_timers=False)
    client = TestClient(TestServer(rm.build_app()))
    await client.start_server()
    try:
        yield rm, client
    finally:
        await rm.stop()
        await client.close()


def _submit(rm: ResourceManagerServer) -> str:
    app_id = rm.core.new_application()
    rm.core.submit(app_id, "alice", "job", "default", "YARN", AmSpec(["true"], {}, {}, Resource(1024, 1)), 2)
    rm.core.app_saved(app_id)
    return app_id


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[tuple[ResourceManagerServer, TestClient]]:
    async for e in _client(tmp_path, str(tmp_path / "remote")):
        yield e


async def test_the_rm_lists_and_serves_a_nodes_aggregated_logs(tmp_path: Path, env) -> None:
    rm, client = env
    app_id = _submit(rm)
    cid = app_id.replace("application_", "container_") + "_01_000002"
    local = tmp_path / "stdout"
    local.write_bytes(b"first line\n<b>second</b>\n")
    store = RemoteLogDir(str(tmp_path / "remote"))
    w = LogFileWriter(app_id, NODE, "roll", 1, 0, [ChunkSource(cid, "stdout", str(local), 0, 11)])
    store.write(app_id, roll_file_name(NODE, 1), w.pieces())

    page = await (await client.get(f"/cluster/app/{app_id}")).text()
    assert f'href="/cluster/logs/{app_id}">aggregated logs</a>' in page
    listing = await (await client.get(f"/cluster/logs/{app_id}")).text()
    assert f'href="/cluster/logs/{app_id}/{cid}/stdout"' in listing and "rolled (1 upload(s))" in listing
    assert NODE in listing
    r = await client.get(f"/cluster/logs/{app_id}/{cid}/stdout")
    assert r.status == 200 and await r.text() == "first line\n"
    # The final file replaces the rolls; a tail with start=-N.
    w = LogFileWriter(app_id, NODE, "final", 0, 0, [ChunkSource(cid, "stdout", str(local), 0, 25)])
    store.write(app_id, node_file_name(NODE), w.pieces())
    r = await client.get(f"/cluster/logs/{app_id}/{cid}/stdout?start=-14")
    assert await r.text() == "<b>second</b>\n" and r.content_type == "text/plain"

    assert (await client.get(f"/cluster/logs/{app_id}/{cid}/stderr")).status == 404
    assert (await client.get(f"/cluster/logs/{app_id}/{cid}/stdout?start=x")).status == 400
    bad = await client.get("/cluster/logs/not-an-app")
    assert bad.status == 400 and "not-an-app" in await bad.text()
    # A corrupt file is named on the page, not shown as a log.
    Path(store.path(app_id, node_file_name(NODE))).write_bytes(b"ELAGLOG1 cut")
    listing = await (await client.get(f"/cluster/logs/{app_id}")).text()
    assert "10.0.0.3_8042: " in listing and "too short" in listing


async def test_with_aggregation_off_the_pages_say_so(tmp_path: Path) -> None:
    async for rm, client in _client(tmp_path, ""):
        app_id = _submit(rm)
        page = await (await client.get(f"/cluster/app/{app_id}")).text()
        assert "log aggregation is off" in page
        assert "Log aggregation is off" in await (await client.get(f"/cluster/logs/{app_id}")).text()

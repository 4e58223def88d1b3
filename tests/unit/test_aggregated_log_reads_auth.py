"""The NM's log calls under client_auth = "token" (nodemanager/web_api.py): the caller is
authenticated before the aggregated logs' store is read -- an unknown client must not make the NM
read an object store on its behalf -- and a call reads the store once."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import pytest
from aiohttp.test_utils import TestClient, TestServer

from nm_harness import SECRET, new_ids
from nodemanager.container_manager import ContainerManager
from nodemanager.enforcement import Enforcement
from nodemanager.recovery_store import RecoveryStore
from nodemanager.web_api import NodeWebApi
from protocol.aggregated_logs import ChunkSource, LogFileWriter, RemoteLogDir, node_file_name
from protocol.config import ClusterConfig, NMConfig
from protocol.records import Resource

NODE = "127.0.0.1:1"
CLUSTER = ClusterConfig(secret=SECRET, client_auth="token", admins=["root"],
                        client_tokens={"t-alice": "alice", "t-bob": "bob", "t-root": "root"})


def _manager(tmp_path: Path) -> ContainerManager:
    cfg = NMConfig(local_dir=str(tmp_path / "local"), log_dir=str(tmp_path / "logs"),
                   recovery_dir=str(tmp_path / "rec"), keep_finished_logs_s=60.0)
    return ContainerManager(cfg, NODE, "127.0.0.1", 1, Resource(1024, 2), Enforcement(None),
                            RecoveryStore(cfg.recovery_dir), clock=lambda: 0.0)


def spy_on_store_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of RemoteLogDir's reads (a listing, an open), as they happen."""
    reads: list[str] = []

    def spy(name: str) -> None:
        real: Callable[..., Any] = getattr(RemoteLogDir, name)

        def read(self: RemoteLogDir, *args: Any) -> Any:
            reads.append(name)
            return real(self, *args)
        monkeypatch.setattr(RemoteLogDir, name, read)
    spy("names")
    spy("open")
    return reads


async def test_the_nms_log_calls_authenticate_before_reading_the_aggregated_logs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    m = _manager(tmp_path)
    app, _, cid = new_ids()                    # a container this NM does not hold: aggregated only
    local = tmp_path / "stdout"
    local.write_bytes(b"alice's secret\n")
    store = RemoteLogDir(str(tmp_path / "remote"))
    store.write(app, node_file_name("10.0.0.9:8042"), LogFileWriter(
        app, "10.0.0.9:8042", "final", 0, 0, [ChunkSource(cid, "stdout", str(local), 0, os.path.getsize(local))],
        user="alice").pieces())
    reads = spy_on_store_reads(monkeypatch)
    web = NodeWebApi(m, SECRET, NODE, lambda: f"http://{NODE}", lambda: {"id": NODE}, remote_logs=store,
                     cluster=CLUSTER)
    paths = (f"/ws/v1/node/containerlogs/{cid}/stdout", f"/ws/v1/node/containerlogs/{cid}",
             f"/ws/v1/node/containers/{cid}/logs", f"/node/containerlogs/{cid}/alice")
    async with TestClient(TestServer(web.app())) as cl:
        for path in paths:
            for headers in ({}, {"Authorization": "Bearer t-nobody"}):
                r = await cl.get(path, headers=headers)
                assert r.status == 401, (path, headers, await r.text())
        assert reads == []
        # The owner and an admin read them; another user is refused (the owner is in the files).
        for token, status in (("t-bob", 403), ("t-alice", 200), ("t-root", 200)):
            r = await cl.get(paths[0], headers={"Authorization": f"Bearer {token}"})
            assert r.status == status, (token, await r.text())
            assert (await r.text() == "alice's secret\n") == (status == 200)
        # One listing of the app's dir per call, not one to find the owner and another for the file.
        reads.clear()
        r = await cl.get(paths[0], headers={"Authorization": "Bearer t-alice"})
        assert r.status == 200 and reads.count("names") == 1, reads

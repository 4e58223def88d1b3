"""The NM's container log calls (`/ws/v1/node/containerlogs/{id}/{file}`, nodemanager/web_api.py)
stream a log a piece at a time: a reader of a log of many GB costs the NM a few MiB, not the log,
with the same bytes, status and headers as a whole read; so does the fallback on the aggregated logs."""
from __future__ import annotations

import hashlib
import os
import tracemalloc
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestClient, TestServer

from nodemanager.container import Container
from nodemanager.container_manager import ContainerManager
from nodemanager.container_state import ContainerEvent as E
from nodemanager.enforcement import Enforcement
from nodemanager.recovery_store import RecoveryStore
from nodemanager.web_api import NodeWebApi
from nm_harness import SECRET, new_ids
from protocol.aggregated_logs import ChunkSource, LogFileWriter, RemoteLogDir, node_file_name
from protocol.config import NMConfig
from protocol.records import Resource

NODE = "127.0.0.1:1"
BIG = bytes(range(256)) * (1 << 17)          # 32 MiB


def _manager(tmp_path: Path) -> ContainerManager:
    cfg = NMConfig(local_dir=str(tmp_path / "local"), log_dir=str(tmp_path / "logs"),
                   recovery_dir=str(tmp_path / "rec"), keep_finished_logs_s=60.0)
    return ContainerManager(cfg, NODE, "127.0.0.1", 1, Resource(1024, 2), Enforcement(None),
                            RecoveryStore(cfg.recovery_dir), clock=lambda: 0.0)


def _finished(m: ContainerManager, cid: str, app: str) -> Container:
    c = Container(cid, app, "", "alice", Resource(128, 1), 0.0, os.path.join(m.cfg.local_dir, app, cid),
                  os.path.join(m.cfg.log_dir, app, cid), m.store.exit_file(cid))
    for e in (E.LOCALIZED, E.LAUNCHED, E.EXITED_SUCCESS, E.CLEANED_UP):
        c.apply(e)
    c.exit_status, c.finished_at = 0, 0.0
    os.makedirs(c.log_dir)
    m.containers[cid] = c
    return c


def _web(m: ContainerManager, **kw: Any) -> NodeWebApi:
    return NodeWebApi(m, SECRET, NODE, lambda: f"http://{NODE}", lambda: {"id": NODE}, **kw)


async def _read_measured(cl: TestClient, path: str) -> tuple[aiohttp.ClientResponse, int, bytes, int]:
    """(response, bytes read, their SHA-256, peak traced memory) of a GET read through a piece at a time."""
    tracemalloc.start()
    try:
        r = await cl.get(path)
        h, n = hashlib.sha256(), 0
        async for piece in r.content.iter_chunked(64 << 10):
            h.update(piece)
            n += len(piece)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return r, n, h.digest(), peak


async def test_a_big_local_log_is_streamed_in_bounded_memory_with_the_same_bytes(tmp_path: Path) -> None:
    m = _manager(tmp_path)
    app, _, cid = new_ids()
    c = _finished(m, cid, app)
    Path(c.log_dir, "stdout").write_bytes(BIG)
    async with TestClient(TestServer(_web(m).app())) as cl:
        path = f"/ws/v1/node/containerlogs/{cid}/stdout"
        r, n, digest, peak = await _read_measured(cl, path)
        assert r.status == 200 and (r.content_type, r.charset) == ("text/plain", "utf-8")
        assert r.headers["Content-Length"] == str(len(BIG))
        assert n == len(BIG) and digest == hashlib.sha256(BIG).digest()
        assert peak < len(BIG) // 8, f"reading a {len(BIG)}-byte log took {peak} bytes"
        # YARN's start: an offset, a tail, past either end; the bytes a whole read gave.
        for start, want in [(0, BIG), (12345, BIG[12345:]), (-1000, BIG[-1000:]), (len(BIG) - 3, BIG[-3:]),
                            (len(BIG) + 5, b""), (-(len(BIG) + 5), BIG), (10 ** 20, b""), (-10 ** 20, BIG)]:
            r = await cl.get(path, params={"start": str(start)})
            body = await r.read()
            assert (r.status, r.headers["Content-Length"], body == want) == (200, str(len(want)), True), start
        # A log still being written is served to the size it had when the read began.
        Path(c.log_dir, "stderr").write_bytes(b"early\n")
        r = await cl.get(f"/ws/v1/node/containerlogs/{cid}/stderr")
        assert (r.status, await r.read()) == (200, b"early\n")
        r = await cl.head(path)
        assert r.status == 200 and r.headers["Content-Length"] == str(len(BIG)) and await r.read() == b""
        r = await cl.get(f"/ws/v1/node/containerlogs/{cid}/nope")
        assert r.status == 404


async def test_the_aggregated_fallback_is_streamed_in_bounded_memory_too(tmp_path: Path) -> None:
    """A container this NM does not hold: its aggregated log, a piece at a time (the NMs and the RM
    share protocol/aggregated_logs.py's iter_log)."""
    m = _manager(tmp_path)
    app, _, cid = new_ids()
    local = tmp_path / "stdout"
    local.write_bytes(BIG)
    store = RemoteLogDir(str(tmp_path / "remote"))
    store.write(app, node_file_name("10.0.0.9:8042"), LogFileWriter(
        app, "10.0.0.9:8042", "final", 0, 0, [ChunkSource(cid, "stdout", str(local), 0, len(BIG))],
        user="alice").pieces())
    async with TestClient(TestServer(_web(m, remote_logs=store).app())) as cl:
        path = f"/ws/v1/node/containerlogs/{cid}/stdout"
        r, n, digest, peak = await _read_measured(cl, path)
        assert r.status == 200 and (r.content_type, r.charset) == ("text/plain", "utf-8")
        assert n == len(BIG) and digest == hashlib.sha256(BIG).digest()
        assert peak < len(BIG) // 4, f"reading a {len(BIG)}-byte aggregated log took {peak} bytes"
        for start, want in [(-10, BIG[-10:]), (len(BIG) - 3, BIG[-3:]), (len(BIG) + 5, b"")]:
            r = await cl.get(path, params={"start": str(start)})
            assert (r.status, await r.read()) == (200, want), start
        r = await cl.get(f"/ws/v1/node/containerlogs/{cid}/stderr")
        assert r.status == 404 and "in the aggregated logs at" in (await r.json())["RemoteException"]["message"]

"""The RM's aggregated-log pages (rm/web/logs_page.py), in process: what a node uploaded is listed
and served (a piece at a time); bad ids, missing files, corrupt files and aggregation off are clear
answers."""
from __future__ import annotations

import hashlib
import tracemalloc
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from protocol.aggregated_logs import ChunkSource, LogFileWriter, RemoteLogDir, node_file_name, roll_file_name
from protocol.config import ClusterConfig, RMConfig
from protocol.records import Resource
from rm.model import AmSpec
from rm.server import ResourceManagerServer
from rm_testing import SECRET, FakeClock

NODE = "10.0.0.3:8042"


async def _client(tmp_path: Path, remote: str, **cluster: Any) -> AsyncIterator[tuple[ResourceManagerServer, TestClient]]:
    rm = ResourceManagerServer(RMConfig(state_dir=str(tmp_path / "state")),
                               ClusterConfig(secret=SECRET, remote_app_log_dir=remote, **cluster), clock=FakeClock(),
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


def _aggregate(tmp_path: Path, app_id: str, cid: str, data: bytes) -> RemoteLogDir:
    local = tmp_path / "big-stdout"
    local.write_bytes(data)
    store = RemoteLogDir(str(tmp_path / "remote"))
    store.write(app_id, node_file_name(NODE), LogFileWriter(
        app_id, NODE, "final", 0, 0, [ChunkSource(cid, "stdout", str(local), 0, len(data))], user="alice").pieces())
    return store


async def test_a_big_aggregated_log_is_streamed_in_bounded_memory_with_the_same_bytes(tmp_path: Path, env) -> None:
    """A log of many GB must not cost the RM its size per reader: the file page streams it a piece
    at a time (protocol/aggregated_logs.py iter_log), with the bytes a whole read gave."""
    rm, client = env
    app_id = _submit(rm)
    cid = app_id.replace("application_", "container_") + "_01_000001"
    big = bytes(range(256)) * (1 << 17)                 # 32 MiB
    _aggregate(tmp_path, app_id, cid, big)
    path = f"/cluster/logs/{app_id}/{cid}/stdout"
    tracemalloc.start()
    try:
        r = await client.get(path)
        h, n = hashlib.sha256(), 0
        async for piece in r.content.iter_chunked(64 << 10):
            h.update(piece)
            n += len(piece)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.status == 200 and (r.content_type, r.charset) == ("text/plain", "utf-8")
    assert n == len(big) and h.digest() == hashlib.sha256(big).digest()
    assert peak < len(big) // 4, f"reading a {len(big)}-byte log took {peak} bytes"
    for start, want in [(-10, big[-10:]), (12345, big[12345:]), (len(big) - 3, big[-3:]), (len(big) + 5, b""),
                        (-(len(big) + 5), big)]:
        r = await client.get(path, params={"start": str(start)})
        assert (r.status, await r.read() == want) == (200, True), start


async def test_a_corrupt_aggregated_log_is_a_502_or_an_answer_cut_short_never_a_whole_log(tmp_path: Path, env) -> None:
    """A chunk whose bytes do not match their CRC: one that fits a read piece is refused before
    anything is sent (502, as before); a longer one is found bad once its first pieces went out,
    so the answer says so and ends short (the client sees an incomplete body, not a log)."""
    rm, client = env
    app_id = _submit(rm)
    cid = app_id.replace("application_", "container_") + "_01_000001"
    for size in (1000, 3 << 20):
        data = b"x" * size
        store = _aggregate(tmp_path, app_id, cid, data)
        f = Path(store.path(app_id, node_file_name(NODE)))
        raw = bytearray(f.read_bytes())
        raw[8 + size - 10] ^= 0xFF                     # the chunk's data begins after the 8-byte magic
        f.write_bytes(bytes(raw))
        r = await client.get(f"/cluster/logs/{app_id}/{cid}/stdout")
        if size == 1000:
            assert r.status == 502 and "do not match their checksum" in await r.text()
            continue
        assert r.status == 200
        got = bytearray()
        with pytest.raises(aiohttp.ClientPayloadError):
            async for piece in r.content.iter_chunked(64 << 10):
                got += piece
        assert len(got) < size + 200 and b"could not be read to its end" in got and b"checksum" in got


async def test_under_token_auth_the_store_is_read_for_authenticated_callers_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """client_auth = "token": a caller without a known client token gets 401 and the RM reads
    nothing from the store (an unknown client must not make it read S3); a known caller who is not
    the owner of an app the RM knows gets 403, nothing read either. For an app the RM forgot, the
    owner is the one its files name, so an authenticated caller's request reads them."""
    reads: list[str] = []
    for method in ("names", "open"):
        real: Callable[..., Any] = getattr(RemoteLogDir, method)

        def read(self: RemoteLogDir, *args: Any, _real: Callable[..., Any] = real, _name: str = method) -> Any:
            reads.append(_name)
            return _real(self, *args)
        monkeypatch.setattr(RemoteLogDir, method, read)
    async for rm, client in _client(tmp_path, str(tmp_path / "remote"), client_auth="token",
                                    client_tokens={"t-alice": "alice", "t-bob": "bob"}):
        known = _submit(rm)
        forgotten = "application_1700000000000_0099"
        paths = []
        for app_id in (known, forgotten):
            cid = app_id.replace("application_", "container_") + "_01_000001"
            _aggregate(tmp_path, app_id, cid, b"alice's secret\n")
            paths += [f"/cluster/logs/{app_id}", f"/cluster/logs/{app_id}/{cid}", f"/cluster/logs/{app_id}/{cid}/stdout"]
        reads.clear()
        for path in paths:
            for headers in ({}, {"Authorization": "Bearer t-nobody"}):
                r = await client.get(path, headers=headers)
                assert r.status == 401, (path, headers, await r.text())
            if known in path:
                r = await client.get(path, headers={"Authorization": "Bearer t-bob"})
                assert r.status == 403, (path, await r.text())
        assert reads == []
        for path in paths:
            for token, status in (("t-bob", 403), ("t-alice", 200)):
                r = await client.get(path, headers={"Authorization": f"Bearer {token}"})
                assert r.status == status, (path, token, await r.text())
        r = await client.get(paths[-1], headers={"Authorization": "Bearer t-alice"})
        assert await r.text() == "alice's secret\n"

"""Authenticated data plane: executors with a job secret serve only connections that proved it.

Refused: a client without the secret, a wrong proof, a replayed answer recorded from an earlier
connection, a frame with a body before the handshake -- each with nothing served or changed (the
put is not applied, the ownership table keeps its version) and the refusal counted and logged. A
client with the secret works, peer-to-peer migration included, and refuses an impostor server.
Plus the AM's control endpoints: no token 401, a forged or another attempt's token 403.
"""
from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import aiohttp
import msgspec
import numpy as np
import pytest

from appmaster.ps.runtime.status_server import ControlAuth, StatusServer
from protocol import tokens
from protocol.ps_status import CheckpointInfo, EpsOpStatus, PsStatus
from psruntime.wire.dataplane import DataPlaneClient, DataPlaneConnection, DataPlaneServer, parse_address
from psruntime.wire.dataplane_auth import AuthError, ClientHandshake, secret_key
from psruntime.executor import Executor
from psruntime.wire.frame_codec import MAGIC, MAX_HEADER_BYTES, PREFIX, encode_frame, read_frame
from psruntime.store.migration_controller import MigrationController
from psruntime.store.ownership_table import OwnershipTable
from psruntime.store.store_client import StoreClient

NB = 4
SECRET = tokens.job_secret("cluster secret", "appattempt_1_0001_000001")
KEY = secret_key(SECRET)
assert KEY is not None


@asynccontextmanager
async def secured_executors() -> AsyncIterator[tuple[list[Executor], MigrationController, DataPlaneClient]]:
    """Two in-process executors with the job secret, a round-robin table broadcast over
    authenticated connections, and an authenticated client."""
    executors = [Executor(f"e{i}", NB, secret=KEY) for i in range(2)]
    addrs = {e.executor_id: await e.start() for e in executors}
    dp = DataPlaneClient(secret=KEY)
    ctl = MigrationController(OwnershipTable.round_robin(NB, list(addrs), addrs), dp)
    await ctl.broadcast()
    try:
        yield executors, ctl, dp
    finally:
        await ctl.close()
        await dp.close()
        for e in executors:
            await e.stop()


def key_of(table: OwnershipTable, owner: str) -> int:
    return next(k for k in range(100) if table.owner_of(k) == owner)


async def raw_connect(address: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = parse_address(address)
    return await asyncio.open_connection(host, port)


def send(writer: asyncio.StreamWriter, header: dict[str, Any], arrays: list[np.ndarray] | None = None) -> None:
    writer.writelines([bytes(p) for p in encode_frame(header, arrays or [])])


async def read_until_closed(reader: asyncio.StreamReader) -> list[dict[str, Any]]:
    """Every frame header the server sends until it closes the connection."""
    headers = []
    while True:
        try:
            headers.append((await asyncio.wait_for(read_frame(reader), 5)).header)
        except (asyncio.IncompleteReadError, ConnectionResetError):   # reset: it closed with our bytes unread
            return headers


async def assert_nothing_changed(executors: list[Executor], ctl: MigrationController, dp: DataPlaneClient,
                                 key: int, version: int) -> None:
    store = StoreClient(ctl.table, dp)
    assert await store.get(key) is None                      # the put was not applied
    assert all(e.service.table.version == version for e in executors)   # nor the table changed


async def test_authenticated_clients_and_peers_work_and_refuse_an_impostor() -> None:
    async with secured_executors() as (executors, ctl, dp):
        store = StoreClient(ctl.table, dp)
        keys = list(range(8))
        await store.put(keys, [np.full(3, k, np.float32) for k in keys])
        # Migration: the source executor opens its own authenticated connection to the destination.
        block = ctl.table.block_of(keys[0])
        src = ctl.table.owners[block]
        dst = next(e.executor_id for e in executors if e.executor_id != src)
        assert await ctl.move([block], src, dst) == 1
        got = await StoreClient(ctl.table, dp).pull(keys)
        for k in keys:
            np.testing.assert_array_equal(got[k], np.full(3, k, np.float32))
        assert all(e.server.refused == 0 for e in executors)

        # A server with another job's secret is refused by the client before anything is sent.
        impostor = DataPlaneServer(lambda f: ({"op": "ok"}, ()), secret=b"another job's secret")
        address = await impostor.start()
        try:
            with pytest.raises(AuthError):
                await DataPlaneConnection.open(address, secret=KEY)
            assert impostor.refused == 1     # (and the impostor refused us too: neither side learnt anything)
        finally:
            await impostor.stop()


async def test_a_client_without_the_secret_is_refused_and_changes_nothing(caplog: pytest.LogCaptureFixture
                                                                          ) -> None:
    async with secured_executors() as (executors, ctl, dp):
        e0 = executors[0]
        key, version = key_of(ctl.table, "e0"), ctl.table.version
        plain = DataPlaneClient()
        try:
            conn = await plain.connection(e0.address)     # the old client: it just sends its requests
            with caplog.at_level(logging.WARNING, logger="psruntime.wire.dataplane"):
                with pytest.raises(ConnectionError):
                    await conn.request({"op": "put", "keys": [key]}, [np.ones(3, np.float32)])
                with pytest.raises(ConnectionError):
                    await conn.request({"op": "set_ownership", "table": {**ctl.table.to_wire(), "version": 99}})
        finally:
            await plain.close()
        assert e0.server.refused == 1
        assert any("refused data-plane connection from 127.0.0.1:" in r.getMessage() for r in caplog.records)
        await assert_nothing_changed(executors, ctl, dp, key, version)


async def test_a_wrong_proof_is_refused_and_nothing_behind_it_is_served() -> None:
    async with secured_executors() as (executors, ctl, dp):
        e0 = executors[0]
        key, version = key_of(ctl.table, "e0"), ctl.table.version
        reader, writer = await raw_connect(e0.address)
        challenge = await read_frame(reader)
        assert challenge.header["op"] == "auth_challenge"
        # A proof made with the wrong key, and requests pipelined right behind it.
        send(writer, ClientHandshake(b"a guessed secret").answer(challenge))
        send(writer, {"op": "put", "keys": [key], "id": 1}, [np.ones(3, np.float32)])
        send(writer, {"op": "get", "keys": [key], "id": 2})
        replies = await read_until_closed(reader)
        writer.close()
        # Nothing but the refusal (which a reset may swallow): no reply to the put or the get.
        assert all(h["op"] == "error" and h["kind"] == "AuthError" for h in replies), replies
        assert e0.server.refused == 1
        await assert_nothing_changed(executors, ctl, dp, key, version)


async def test_a_replayed_handshake_is_refused() -> None:
    async with secured_executors() as (executors, ctl, dp):
        e0 = executors[0]
        key, version = key_of(ctl.table, "e0"), ctl.table.version
        # Record a valid handshake (as an eavesdropper would see it on the wire).
        reader, writer = await raw_connect(e0.address)
        recorded = ClientHandshake(KEY).answer(await read_frame(reader))
        send(writer, recorded)
        assert (await read_frame(reader)).header["op"] == "auth_ok"
        writer.close()
        # Replay it on a new connection: the server's nonce is new, so the old proof is wrong.
        reader, writer = await raw_connect(e0.address)
        second = await read_frame(reader)
        assert second.header["nonce"] != recorded["nonce"]
        send(writer, recorded)
        send(writer, {"op": "set_ownership", "id": 1, "table": {**ctl.table.to_wire(), "version": version + 5}})
        send(writer, {"op": "put", "keys": [key], "id": 2}, [np.ones(3, np.float32)])
        replies = await read_until_closed(reader)
        writer.close()
        assert all(h["op"] == "error" for h in replies), replies
        assert e0.server.refused == 1
        await assert_nothing_changed(executors, ctl, dp, key, version)


async def test_a_body_before_the_handshake_is_refused_unread() -> None:
    async with secured_executors() as (executors, ctl, dp):
        e0 = executors[0]
        key, version = key_of(ctl.table, "e0"), ctl.table.version
        reader, writer = await raw_connect(e0.address)
        await read_frame(reader)
        send(writer, {"op": "put", "keys": [key], "id": 1}, [np.ones(1 << 20, np.uint8)])
        replies = await read_until_closed(reader)
        writer.close()
        # Closed at the prefix: the 1 MiB body is never read (the error frame may be lost to the reset).
        assert all(h["op"] == "error" for h in replies) and e0.server.refused == 1
        await assert_nothing_changed(executors, ctl, dp, key, version)


async def test_a_large_header_before_the_handshake_is_refused_at_its_prefix() -> None:
    server = DataPlaneServer(lambda f: ({"op": "ok"}, ()), secret=KEY)
    address = await server.start()
    try:
        reader, writer = await raw_connect(address)
        assert (await read_frame(reader)).header["op"] == "auth_challenge"
        # Only a prefix declaring a 16 MiB header: dropped at once, nothing allocated for it
        # (the server used to grow its buffer to 16 MiB and wait for the header).
        writer.write(PREFIX.pack(MAGIC, MAX_HEADER_BYTES, 0))
        replies = await read_until_closed(reader)
        writer.close()
        assert all(h["op"] == "error" for h in replies), replies
        assert server.refused == 1 and server.connections == 0
    finally:
        await server.stop()


async def test_large_headers_flow_both_ways_once_authenticated() -> None:
    server = DataPlaneServer(lambda f: ({"op": "ok", "keys": f.header["keys"]}, ()), secret=KEY)
    address = await server.start()
    conn = await DataPlaneConnection.open(address, secret=KEY)
    try:
        keys = list(range(100_000))      # headers of about 600 KiB each way
        reply = await conn.request({"op": "echo", "keys": keys})
        assert reply.header["keys"] == keys and server.refused == 0
    finally:
        await conn.close()
        await server.stop()


async def test_a_client_drops_a_large_header_from_a_server_that_has_not_proved_the_secret() -> None:
    async def impostor(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(PREFIX.pack(MAGIC, MAX_HEADER_BYTES, 0))   # instead of a challenge
        await reader.read()                                     # until the client hangs up
        writer.close()

    server = await asyncio.start_server(impostor, "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    try:
        with pytest.raises(AuthError, match="closed the connection during the handshake"):
            await DataPlaneConnection.open(f"{host}:{port}", secret=KEY)
    finally:
        server.close()
        await server.wait_closed()


async def test_am_control_endpoints_need_the_apps_token() -> None:
    scaled: list[tuple[int, int]] = []

    change = EpsOpStatus(op="add_workers", requested=1, started=1.0)

    async def scale(workers: int, servers: int) -> list[EpsOpStatus]:
        scaled.append((workers, servers))
        return [change]

    async def checkpoint() -> CheckpointInfo:
        return CheckpointInfo(epoch=1, dir="/x/epoch-1")

    attempt = "appattempt_1_0001_000001"
    server = StatusServer(lambda: PsStatus(state="TRAINING"), checkpoint, scale=scale,
                          control_auth=ControlAuth(SECRET, attempt))
    url = await server.start()
    good = tokens.am_control_token(SECRET, attempt)
    cases = [({}, 401), (tokens.bearer(tokens.am_control_token("wrong secret", attempt)), 403),
             (tokens.bearer(tokens.am_control_token(SECRET, "appattempt_1_0001_000002")), 403),
             (tokens.bearer(tokens.am_control_token(SECRET, attempt, lifetime_s=-1)), 403),
             (tokens.bearer(tokens.sign(SECRET, tokens.AM, {"attempt_id": attempt}, 60)), 403)]
    try:
        async with aiohttp.ClientSession() as s:
            for headers, code in cases:
                for path in ("scale", "checkpoint"):
                    async with s.post(url + path, json={"workers": 1}, headers=headers) as r:
                        assert r.status == code, (path, headers, await r.text())
            assert scaled == []                                    # nothing acted on
            async with s.get(url + "status") as r:                 # the status stays readable
                assert r.status == 200
            async with s.post(url + "scale", json={"workers": 1}, headers=tokens.bearer(good)) as r:
                assert r.status == 200
                assert msgspec.convert((await r.json())["changes"], list[EpsOpStatus]) == [change]
            async with s.post(url + "checkpoint", headers=tokens.bearer(good)) as r:
                assert r.status == 200
        assert scaled == [(1, 0)]
    finally:
        await server.stop()


async def test_a_silent_peer_is_dropped_after_the_handshake_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("psruntime.wire.dataplane.HANDSHAKE_TIMEOUT_S", 0.05)
    server = DataPlaneServer(lambda f: ({"op": "ok"}, ()), secret=KEY)
    address = await server.start()
    try:
        reader, writer = await raw_connect(address)
        assert (await read_frame(reader)).header["op"] == "auth_challenge"
        assert [h["op"] for h in await read_until_closed(reader)] == ["error"]
        writer.close()
        assert server.refused == 1
    finally:
        await server.stop()


def test_executors_get_the_secret_in_their_environment_not_their_command() -> None:
    from appmaster.container_book import AmContainer
    from appmaster.ps.runtime.executor_pool import ExecutorPool, Role
    from protocol import container_env
    from protocol.records import Resource

    pool = ExecutorPool(num_blocks=4, am_address="h:1", job_secret=SECRET)
    rec = pool.add(Role.WORKER, AmContainer(container_id="container_1_0001_01_000002", node_id="n:1",
                                            node_http_address="n:1", resource=Resource(512, 1), token="t"))
    ctx = pool.launch_context(rec)
    assert ctx.environment[container_env.JOB_SECRET] == SECRET
    assert all(SECRET not in c for c in ctx.commands)


def test_job_secrets_differ_per_attempt_and_cluster() -> None:
    a1 = tokens.job_secret("s", "appattempt_1_0001_000001")
    assert a1 == tokens.job_secret("s", "appattempt_1_0001_000001") and len(a1) == 64
    assert a1 != tokens.job_secret("s", "appattempt_1_0001_000002") != tokens.job_secret("t", "appattempt_1_0001_000002")
    assert secret_key(None) is None and secret_key("") is None

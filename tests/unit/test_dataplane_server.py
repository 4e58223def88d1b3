"""Data-plane server and client on real localhost sockets: multiplexing, errors, bad peers."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from psruntime.wire.dataplane import DataPlaneClient, DataPlaneServer, RemoteError, RequestError, parse_address
from psruntime.wire.frame_codec import Frame


async def echo_server() -> DataPlaneServer:
    gate = asyncio.Event()

    def handler(frame: Frame):
        op = frame.header.get("op")
        if op == "echo":
            return {"op": "ok", "n": frame.header["n"]}, [a * 2 for a in frame.arrays]
        if op == "slow":  # answered only after a later "release": replies come back out of order
            async def later():
                await gate.wait()
                return {"op": "ok", "n": frame.header["n"]}, ()
            return later()
        if op == "release":
            gate.set()
            return {"op": "ok"}, ()
        if op == "boom":
            raise RequestError("field 'x' is bad")
        raise RequestError(f"unknown op {op!r}")

    server = DataPlaneServer(handler)
    await server.start()
    return server


async def test_many_requests_in_flight_on_one_connection() -> None:
    server = await echo_server()
    client = DataPlaneClient()
    try:
        conn = await client.connection(server.address)
        slow = conn.submit({"op": "slow", "n": -1})
        futs = [conn.submit({"op": "echo", "n": i}, [np.full(i + 1, i, np.float32)]) for i in range(50)]
        replies = await asyncio.gather(*futs)
        for i, r in enumerate(replies):
            assert r.header["n"] == i
            np.testing.assert_array_equal(r.arrays[0], np.full(i + 1, 2 * i, np.float32))
        assert not slow.done()
        await conn.request({"op": "release"})
        assert (await slow).header["n"] == -1
        assert await client.connection(server.address) is conn  # reused, not reopened
    finally:
        await client.close()
        await server.stop()


async def test_handler_error_becomes_remote_error_and_connection_survives() -> None:
    server = await echo_server()
    client = DataPlaneClient()
    try:
        with pytest.raises(RemoteError, match="field 'x' is bad") as info:
            await client.request(server.address, {"op": "boom"})
        assert info.value.kind == "RequestError"
        with pytest.raises(RemoteError, match="unknown op"):
            await client.request(server.address, {"op": "nope"})
        r = await client.request(server.address, {"op": "echo", "n": 1}, [np.ones(2)])
        np.testing.assert_array_equal(r.arrays[0], [2.0, 2.0])
    finally:
        await client.close()
        await server.stop()


async def test_garbage_peer_is_dropped_and_server_keeps_serving() -> None:
    server = await echo_server()
    host, port = parse_address(server.address)
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 5)  # server answers with an error frame, then closes
    assert b"magic" in data
    writer.close()
    client = DataPlaneClient()
    try:
        r = await client.request(server.address, {"op": "echo", "n": 3}, [np.ones(1)])
        assert r.header["n"] == 3
    finally:
        await client.close()
        await server.stop()


async def test_lost_server_fails_pending_requests_and_client_reconnects() -> None:
    server = await echo_server()
    address = server.address
    client = DataPlaneClient()
    conn = await client.connection(address)
    pending = conn.submit({"op": "slow", "n": 0})
    await server.stop()
    with pytest.raises(ConnectionError):
        await asyncio.wait_for(pending, 5)
    with pytest.raises(OSError):
        await client.request(address, {"op": "echo", "n": 0})
    await client.close()


def test_parse_address() -> None:
    assert parse_address("127.0.0.1:80") == ("127.0.0.1", 80)
    for bad in ["nope", ":80", "h:", "h:x"]:
        with pytest.raises(ValueError, match="host:port"):
            parse_address(bad)


async def test_large_frames_both_ways_with_many_in_flight_do_not_deadlock() -> None:
    server = await echo_server()
    client = DataPlaneClient()
    try:
        conn = await client.connection(server.address)
        big = np.arange(1 << 20, dtype=np.float32)  # 4 MiB each way per request, 40 MiB in flight
        futs = [conn.submit({"op": "echo", "n": i}, [big + i]) for i in range(10)]
        replies = await asyncio.wait_for(asyncio.gather(*futs), 60)
        for i, r in enumerate(replies):
            assert r.header["n"] == i
            np.testing.assert_array_equal(r.arrays[0], (big + i) * 2)
    finally:
        await client.close()
        await server.stop()

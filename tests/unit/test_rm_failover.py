"""The RM failover client (protocol/rm_failover.py) against real HTTP servers: a dead address, a
standby answering 503 StandbyException, and the active."""
from __future__ import annotations

import asyncio
import socket
import threading
from typing import Iterator

import msgspec
import pytest

from protocol.ha_config import HAConfig
from protocol.http_client import JsonHttpClient, RemoteError
from protocol.rm_failover import FailoverJsonClient, rm_client, rm_urls
from s3_server import free_ports
from threaded_http import serve_routes

STANDBY = (503, {"RemoteException": {"exception": "ServiceUnavailableException", "message": "rm1 is standby",
                                     "javaClassName": "org.apache.hadoop.ipc.StandbyException"}})


def active_route(calls):
    def route(method, path, query, body):
        calls.append((method, path, body))
        if path == "/bad":
            return 400, {"RemoteException": {"exception": "BadRequestException", "message": "no",
                                             "javaClassName": "x"}}
        return 200, {"served": "active", "body": body}
    return route


async def test_a_call_moves_past_a_dead_rm_and_a_standby_to_the_active_and_stays_there():
    dead = f"http://127.0.0.1:{free_ports(1)[0]}"
    standby_calls, active_calls = [], []

    def standby(method, path, query, body):
        standby_calls.append(path)
        return STANDBY

    with serve_routes(standby) as sb, serve_routes(active_route(active_calls)) as act:
        client = FailoverJsonClient([dead, f"http://{sb}", f"http://{act}"], timeout_s=5, max_attempts=5, sleep_s=0)
        try:
            assert await client.post("/internal/v1/node/heartbeat", {"n": 1}) == {"served": "active", "body": {"n": 1}}
            assert client.failovers == 2 and client.base_url == f"http://{act}"
            assert await client.get("/again") == {"served": "active", "body": None}
            assert client.failovers == 2 and standby_calls == ["/internal/v1/node/heartbeat"]
            # The active's own error is the answer: no failover.
            with pytest.raises(RemoteError) as e:
                await client.get("/bad")
            assert e.value.status == 400 and client.failovers == 2
        finally:
            await client.close()
    assert [p for _, p, _ in active_calls] == ["/internal/v1/node/heartbeat", "/again", "/bad"]


@pytest.fixture
def silent_rm() -> Iterator[str]:
    """The URL of a host that went silent: a listener whose accept queue is full (backlog 0, one
    connection never accepted), so the kernel drops every further SYN, as a dead host's link does."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    filler = socket.create_connection(srv.getsockname())
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        filler.close()
        srv.close()


@pytest.fixture
def mute_rm() -> Iterator[str]:
    """The URL of an RM whose host went silent after the connection was made: it accepts, takes
    the request and never answers (as a kept-alive connection to a dead host behaves)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return                       # the listener was closed: the test is over
            held.append(conn)
    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        srv.shutdown(socket.SHUT_RDWR)
        srv.close()
        thread.join(5)
        for conn in held:
            conn.close()


@pytest.mark.parametrize("rm,timeout", [("silent_rm", "connect_timeout_s"), ("mute_rm", "read_timeout_s")])
async def test_an_rm_that_went_silent_is_left_after_its_timeout_not_the_calls(rm, timeout, request):
    # A host that drops the SYNs is left after the connect timeout, one that never answers on an
    # open connection after the read timeout. The call's own timeout is the CLI's 30 s; the test
    # gives it 10 (the old client waited the 30).
    calls = []
    with serve_routes(active_route(calls)) as act:
        client = FailoverJsonClient([request.getfixturevalue(rm), f"http://{act}"], timeout_s=30, sleep_s=0,
                                    **{timeout: 0.3})
        try:
            async with asyncio.timeout(10):
                assert await client.get("/ws/v1/cluster/apps") == {"served": "active", "body": None}
            assert client.failovers == 1 and client.base_url == f"http://{act}"
        finally:
            await client.close()
    assert [p for _, p, _ in calls] == ["/ws/v1/cluster/apps"]


async def test_with_no_rm_serving_it_gives_up_after_the_bounded_moves():
    with serve_routes(lambda *a: STANDBY) as sb1, serve_routes(lambda *a: STANDBY) as sb2:
        client = FailoverJsonClient([f"http://{sb1}", f"http://{sb2}"], timeout_s=5, max_attempts=3, sleep_s=0)
        try:
            with pytest.raises(RemoteError) as e:
                await client.get("/ws/v1/cluster/apps")
            assert e.value.status == 503 and client.failovers == 3
        finally:
            await client.close()


def test_the_preferred_rm_goes_first_and_without_ha_there_is_no_failover():
    ha = HAConfig(enabled=True, rm_ids=["rm1", "rm2", "rm3"],
                  rm_addresses={"rm1": "http://a:1", "rm2": "http://b:2", "rm3": "http://c:3"},
                  etcd_endpoints=["http://e:2379"])
    assert rm_urls("http://b:2/", ha) == ["http://b:2", "http://a:1", "http://c:3"]
    assert rm_urls("http://z:9", ha) == ["http://a:1", "http://b:2", "http://c:3"]
    assert rm_urls("http://z:9", HAConfig()) == ["http://z:9"]
    assert type(rm_client("http://z:9", HAConfig())) is JsonHttpClient
    client = rm_client("http://c:3", ha)
    assert isinstance(client, FailoverJsonClient) and client.base_url == "http://c:3"
    assert client.max_attempts == ha.failover_max_attempts
    quick = rm_client("http://c:3", msgspec.structs.replace(ha, failover_connect_timeout_s=0.5), timeout_s=5)
    assert isinstance(quick, FailoverJsonClient)
    assert [c.connect_timeout_s for c in quick.clients] == [0.5] * 3
    assert [c.read_timeout_s for c in quick.clients] == [min(ha.failover_read_timeout_s, 5)] * 3   # never past the call's


@pytest.mark.parametrize("field", ["failover_connect_timeout_s", "failover_read_timeout_s"])
def test_a_failover_timeout_that_is_not_positive_is_refused(field):
    with pytest.raises(ValueError, match=field):
        HAConfig(enabled=True, rm_ids=["rm1"], rm_addresses={"rm1": "http://a:1"}, etcd_endpoints=["http://e:2379"],
                 **{field: 0})

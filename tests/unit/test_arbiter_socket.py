"""The arbiter behind its unix socket: grants over the wire in arrival order, pipelined requests,
yield / promote notices, a closed connection's slots reclaimed, refusals answered with ERROR."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from nodemanager.arbiter import overlapping_cpu_grants
from nodemanager.arbiter_server import MAX_UNIX_PATH, ArbiterServer, socket_path
from protocol.arbiter_wire import FRAME_SIZE, Frame, Op, Role, SlotKind, name_hash, unpack
from psruntime.arbiter_client import ArbiterClient, ArbiterRefused, ArbiterUnavailable


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


@pytest.fixture
async def server(tmp_path) -> AsyncIterator[ArbiterServer]:
    s = ArbiterServer(socket_path(str(tmp_path)), clock=Clock())
    await s.start()
    try:
        yield s
    finally:
        await s.stop()


async def client(server: ArbiterServer, job: str, executor: str) -> ArbiterClient:
    c = ArbiterClient(server.path, job, executor)
    await c.connect()
    return c


async def settle(cond, rounds: int = 200) -> None:
    """Let the event loop run until `cond()` (frames are in flight on a local socket)."""
    for _ in range(rounds):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


def test_frames_are_24_bytes_and_round_trip() -> None:
    f = Frame(Op.GRANT, Role.SECONDARY, 1, 0xFFFFFFFF, 2**64 - 1, 7)
    assert FRAME_SIZE == 24 and len(f.pack()) == 24 and unpack(f.pack()) == f
    assert name_hash("application_1_0001") == name_hash("application_1_0001") != name_hash("application_1_0002")


def test_socket_path_stays_short(tmp_path) -> None:
    assert socket_path("/x", "/run/a.sock") == "/run/a.sock"
    assert socket_path("/tmp/nm") == "/tmp/nm/arbiter.sock"
    long = "/tmp/" + "d" * 120
    p = socket_path(long)
    assert len(p) <= MAX_UNIX_PATH and p == socket_path(long)


async def test_grants_pass_between_jobs_in_arrival_order(server: ArbiterServer) -> None:
    a = await client(server, "app_a", "c_a")
    b = await client(server, "app_b", "c_b")
    ga = await a.acquire(SlotKind.CPU)
    assert ga.role is Role.CPU
    wait_b = asyncio.ensure_future(b.acquire(SlotKind.CPU))
    await settle(lambda: server.arbiter.waiting(SlotKind.CPU) == 1)
    wait_a = asyncio.ensure_future(a.acquire(SlotKind.CPU))      # A again, after B
    await settle(lambda: server.arbiter.waiting(SlotKind.CPU) == 2)
    a.release(ga)
    gb = await wait_b
    assert not wait_a.done()
    b.release(gb)
    a.release(await wait_a)
    await settle(lambda: server.arbiter.cpu_in_use == 0)
    jobs = [r.job for r in server.arbiter.records()]
    assert jobs == [name_hash("app_a"), name_hash("app_b"), name_hash("app_a")]
    assert overlapping_cpu_grants(server.arbiter.records()) == []
    await a.close()
    await b.close()


async def test_pipelined_requests_and_secondary_yield_over_the_wire(server: ArbiterServer) -> None:
    a = await client(server, "app_a", "c_a")
    b = await client(server, "app_b", "c_b")
    # One executor asks for CPU and network at once: both granted, matched by request id.
    cpu, comm = await asyncio.gather(a.acquire(SlotKind.CPU), a.acquire(SlotKind.COMM))
    assert (cpu.role, comm.role) == (Role.CPU, Role.PRIMARY)
    sec = await b.acquire(SlotKind.COMM)
    assert sec.role is Role.SECONDARY and sec.yielding
    turn = asyncio.ensure_future(sec.wait_turn())
    await asyncio.sleep(0)
    assert not turn.done()
    a.set_busy(comm, False)                 # the primary waits on servers: B goes on
    await asyncio.wait_for(turn, 5)
    assert not sec.yielding
    a.set_busy(comm, True)
    await settle(lambda: sec.yielding)
    a.release(comm)                         # B is promoted and yields no more
    await settle(lambda: sec.role is Role.PRIMARY and not sec.yielding)
    await a.close()
    await b.close()


async def test_a_closed_connection_has_its_slots_reclaimed(server: ArbiterServer) -> None:
    a = await client(server, "app_a", "c_a")
    b = await client(server, "app_b", "c_b")
    await a.acquire(SlotKind.CPU)
    await a.acquire(SlotKind.COMM)
    wait_cpu = asyncio.ensure_future(b.acquire(SlotKind.CPU))
    second = await b.acquire(SlotKind.COMM)
    assert second.role is Role.SECONDARY
    await a.close()                         # the executor crashed
    got = await asyncio.wait_for(wait_cpu, 5)
    assert got.role is Role.CPU
    await settle(lambda: second.role is Role.PRIMARY)
    reclaimed = {(r.role, r.job) for r in server.arbiter.records() if r.reclaimed}
    assert reclaimed == {("cpu", name_hash("app_a")), ("primary", name_hash("app_a"))}
    assert server.view()["connections"] == 1
    await b.close()


async def test_a_cancelled_wait_withdraws_the_request(server: ArbiterServer) -> None:
    a = await client(server, "app_a", "c_a")
    b = await client(server, "app_b", "c_b")
    held = await a.acquire(SlotKind.CPU)
    wait_b = asyncio.ensure_future(b.acquire(SlotKind.CPU))
    await settle(lambda: server.arbiter.waiting(SlotKind.CPU) == 1)
    wait_b.cancel()
    await settle(lambda: server.arbiter.waiting(SlotKind.CPU) == 0)
    a.release(held)
    await settle(lambda: server.arbiter.cpu_in_use == 0)
    await a.close()
    await b.close()


async def test_refusal_is_an_error_frame_and_the_connection_stays_usable(server: ArbiterServer) -> None:
    a = await client(server, "app_a", "c_a")
    with pytest.raises(ArbiterRefused):
        await a.acquire(7)                  # no such slot kind
    await a.ping()
    assert (await a.acquire(SlotKind.COMM)).role is Role.PRIMARY
    await a.close()


async def test_server_gone_fails_waiting_requests(tmp_path) -> None:
    s = ArbiterServer(socket_path(str(tmp_path)))
    await s.start()
    a = await client(s, "app_a", "c_a")
    b = await client(s, "app_b", "c_b")
    await a.acquire(SlotKind.CPU)
    wait_b = asyncio.ensure_future(b.acquire(SlotKind.CPU))
    await settle(lambda: s.arbiter.waiting(SlotKind.CPU) == 1)
    await s.stop()
    with pytest.raises(ArbiterUnavailable):
        await asyncio.wait_for(wait_b, 5)
    with pytest.raises(ArbiterUnavailable):
        await ArbiterClient(s.path, "x", "y").connect()
    await a.close()
    await b.close()


async def test_view_lists_holders_and_the_grant_log(server: ArbiterServer) -> None:
    a = await client(server, "app_a", "c_a")
    g = await a.acquire(SlotKind.CPU)
    v = server.view()
    assert v["cpu"] == [{"job": f"{name_hash('app_a'):016x}", "executor": f"{name_hash('c_a'):016x}",
                         "request_id": g.request_id, "threads": 1}]
    assert (v["cpu_pool"], v["cpu_in_use"]) == (1, 1)
    assert [r["role"] for r in v["grantLog"]] == ["cpu"] and v["grantLog"][0]["released_at"] is None
    assert server.view(limit=0)["grantLog"] == []
    # Named by the NM's containers where it knows them, counted whatever the log still holds.
    named = server.view(names={name_hash("app_a"): "app_a"})
    assert named["cpu_grants_by_app"] == {"app_a": 1} and named["grantLog"][0]["app_id"] == "app_a"
    assert named["cpu_grants_by_job"] == {f"{name_hash('app_a'):016x}": 1}
    await a.close()


async def test_comps_ask_for_threads_of_the_cpu_pool_over_the_wire(tmp_path) -> None:
    s = ArbiterServer(socket_path(str(tmp_path)), clock=Clock(), cpu_pool=3)
    await s.start()
    try:
        a = await client(s, "app_a", "c_a")
        b = await client(s, "app_b", "c_b")
        ga = await a.acquire(SlotKind.CPU, threads=2)
        assert (ga.role, ga.threads) == (Role.CPU, 2)
        wait_b = asyncio.ensure_future(b.acquire(SlotKind.CPU, threads=2))     # 2 + 2 > 3: waits
        await settle(lambda: s.arbiter.waiting(SlotKind.CPU) == 1)
        a.release(ga)
        gb = await asyncio.wait_for(wait_b, 5)
        assert gb.threads == 2 and s.arbiter.cpu_in_use == 2
        b.release(gb)
        whole = await a.acquire(SlotKind.CPU, threads=9)          # more than the pool: the whole pool
        assert whole.threads == 3
        with pytest.raises(ValueError, match="threads must be"):
            await a.acquire(SlotKind.CPU, threads=0)
        a.release(whole)
        await settle(lambda: s.arbiter.cpu_in_use == 0)
        await a.close()
        await b.close()
    finally:
        await s.stop()


async def test_only_the_nm_user_may_connect() -> None:
    """The socket is the NM user's (0600): containers run as that user; another local user's
    process cannot hold the node's slots (as root, checked from a child that drops to nobody)."""
    import os, shutil, socket, stat, tempfile  # noqa: E401, PLC0415
    d = tempfile.mkdtemp(prefix="arbiter-perm-")
    os.chmod(d, 0o755)     # a dir others may enter, so only the socket's own mode can refuse them
    s = ArbiterServer(socket_path(d), clock=Clock())
    await s.start()
    try:
        assert stat.S_IMODE(os.stat(s.path).st_mode) == 0o600
        if os.geteuid() != 0:
            pytest.skip("dropping to another user needs root")
        pid = os.fork()
        if pid == 0:        # the child: nobody's connect, its outcome as the exit code
            code = 3
            try:
                os.setuid(65534)
                socket.socket(socket.AF_UNIX).connect(s.path)
                code = 0
            except PermissionError:
                code = 1
            finally:
                os._exit(code)
        _, status = await asyncio.to_thread(os.waitpid, pid, 0)
        assert os.waitstatus_to_exitcode(status) == 1       # refused, where 0666 let it connect
        mine = ArbiterClient(s.path, "application_1_0001", "e1")      # the NM's user connects
        await mine.connect()
        await mine.close()
    finally:
        await s.stop()
        shutil.rmtree(d)

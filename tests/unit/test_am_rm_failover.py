"""The AM library through an RM restart on the same state store (what an HA failover does too: the
next RM recovers from the store), over real HTTP: two in-process RMs on their own ports, the AM
given both. The AM's call to the dead RM fails over to the new one, which kept the attempt and
answers ApplicationMasterNotRegistered; the AM registers again and resends its whole ask table and
the release it made meanwhile; the node's registration re-adopts the containers still running and
cleans up the released one; new container ids carry the new RM's epoch."""
from __future__ import annotations

from typing import Any, AsyncIterator

import msgspec
import pytest
from aiohttp.test_utils import TestServer

from appmaster.am_client import ApplicationMaster
from appmaster.am_events import ContainersAllocated, ContainersCompleted
from appmaster.rm_client import AmIdentity
from fakes import FakeSignedNM
from protocol import codec, container_env, tokens
from protocol import internal_api as api
from protocol.config import ClusterConfig, RMConfig
from protocol.http_client import JsonHttpClient
from protocol.ids import ContainerId
from protocol.records import ExitStatus, FinalStatus, Resource
from rm.server import ResourceManagerServer
from rm_testing import SECRET, FakeClock
from s3_server import free_ports

NODE = "n1:1"
R = Resource(512, 1)


class Rm:
    """One in-process RM serving on a fixed port."""

    def __init__(self, state_dir: str, port: int, urls: list[str], nm_address: str):
        cfg = RMConfig(state_dir=state_dir, am_expiry_s=600.0)
        self.server = ResourceManagerServer(cfg, ClusterConfig(secret=SECRET, admins=["root"]), clock=FakeClock(),
                                            run_timers=False)
        self.server.rm_urls = urls
        self.http = TestServer(self.server.build_app(), host="127.0.0.1", port=port)
        self.url = f"http://127.0.0.1:{port}"
        self.nm_address = nm_address

    async def start(self) -> None:
        await self.http.start_server()
        self.server.attach_launcher(self.url)

    async def stop(self) -> None:
        await self.server.stop()
        await self.http.close()

    async def register_node(self, containers: list[api.ContainerStatus]) -> None:
        client = JsonHttpClient(self.url, token=tokens.sign(SECRET, tokens.NM, {"node_id": NODE}, 3600))
        try:
            await client.post(api.NODE_REGISTER, msgspec.to_builtins(api.NodeRegisterRequest(
                node_id=NODE, http_address=self.nm_address, capability=Resource(8192, 8), containers=containers)))
        finally:
            await client.close()

    async def heartbeat(self, statuses: list[api.ContainerStatus]) -> api.NodeHeartbeatResponse:
        client = JsonHttpClient(self.url, token=tokens.sign(SECRET, tokens.NM, {"node_id": NODE}, 3600))
        try:
            out = await client.post(api.NODE_HEARTBEAT, msgspec.to_builtins(api.NodeHeartbeatRequest(
                node_id=NODE, response_id=0, used=Resource(0, 0), container_statuses=statuses)))
        finally:
            await client.close()
        return codec.decode_as(out, api.NodeHeartbeatResponse)


@pytest.fixture
async def nm() -> AsyncIterator[tuple[FakeSignedNM, str]]:
    fake = FakeSignedNM()
    server = TestServer(fake.app(), host="127.0.0.1")
    await server.start_server()
    try:
        yield fake, f"127.0.0.1:{server.port}"
    finally:
        await server.close()


def running(cid: str, resource: Resource, role: str) -> api.ContainerStatus:
    return api.ContainerStatus(container_id=cid, state="RUNNING", resource=resource, role=role)


async def drain(am: ApplicationMaster) -> list[Any]:
    out = []
    while (ev := await am.next_event(timeout_s=0)) is not None:
        out.append(ev)
    return out


async def submit_and_launch(rm: Rm, fake_nm: FakeSignedNM) -> tuple[str, str, dict[str, str]]:
    """Submit an app to `rm` and let it launch the AM on the fake NM: (app id, AM container id, the
    AM's environment)."""
    client = JsonHttpClient(rm.url, user="alice")
    try:
        new = await client.post("/ws/v1/cluster/apps/new-application")
        assert isinstance(new, dict)
        app_id = str(new["application-id"])
        await client.post("/ws/v1/cluster/apps", {
            "application-id": app_id, "application-name": "job", "application-type": "YARN",
            "am-container-spec": {"commands": {"command": "python am.py"}},
            "resource": {"memory": 512, "vCores": 1}})
    finally:
        await client.close()
    assert rm.server.launcher is not None
    await rm.server.launcher.drain()
    claims, start = fake_nm.started[-1]
    return app_id, str(claims["container_id"]), dict(start.launch_context.environment)


async def test_the_am_fails_over_registers_again_and_resends_its_asks_and_releases(tmp_path, nm):
    fake_nm, nm_address = nm
    ports = free_ports(2)
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    state = str(tmp_path / "state")
    rm1: Rm | None = Rm(state, ports[0], urls, nm_address)
    assert rm1 is not None
    await rm1.start()
    am = None
    try:
        await rm1.register_node([])
        app_id, am_cid, env = await submit_and_launch(rm1, fake_nm)
        assert env[container_env.RM_ADDRESSES] == ",".join(urls)    # the AM is told every RM
        am = ApplicationMaster(AmIdentity.from_env(env))
        await am.register("amhost", 1, "http://amhost:1/", start_heartbeats=False)
        am.add_ask(2, R, tag="worker")
        await am.heartbeat_once()
        (ev,) = await drain(am)
        assert isinstance(ev, ContainersAllocated)
        kept, released = ev.containers
        attempt_id = rm1.server.core.apps[app_id].current_attempt

        await rm1.stop()                        # the RM dies; a new one takes over from its store
        rm1 = None
        rm2 = Rm(state, ports[1], urls, nm_address)
        await rm2.start()
        try:
            am.release(released)                # while no RM knows the containers
            am.add_ask(1, R, tag="server")
            await am.heartbeat_once()           # fails over, is told to register again, does
            assert am.resyncs == 1 and am.rm.rm_url == rm2.url
            core = rm2.server.core
            assert core.apps[app_id].attempts == [attempt_id] and core.attempts[attempt_id].registered
            await am.heartbeat_once()           # the whole ask table and the release, resent
            assert core.attempts[attempt_id].pending_release == {released.container_id}

            await rm2.register_node([running(am_cid, Resource(512, 1), "am"),
                                     running(kept.container_id, R, "worker"),
                                     running(released.container_id, R, "worker")])
            # Re-adopted, but not the released one; the resent ask is granted at once (a new id).
            assert {am_cid, kept.container_id} <= set(core.containers) and len(core.containers) == 3
            assert released.container_id not in core.containers
            assert core.containers[kept.container_id].tag == "worker"
            assert (await rm2.heartbeat([])).containers_to_cleanup == [released.container_id]
            resp = await am.heartbeat_once()
            assert resp is not None
            events = await drain(am)
            granted = [c for e in events if isinstance(e, ContainersAllocated) for c in e.containers]
            done = [c for e in events if isinstance(e, ContainersCompleted) for c in e.containers]
            assert [c.tag for c in granted] == ["server"]
            assert ContainerId.parse(granted[0].container_id).epoch == 1      # the store's second RM start
            assert granted[0].container_id not in (am_cid, kept.container_id, released.container_id)
            # The RM confirms the release (the AM had already counted the container done).
            assert [(c.container_id, c.exit_status) for c in resp.completed] == [(released.container_id,
                                                                                 ExitStatus.ABORTED)]
            assert done == [] and released.done
            assert await am.finish("SUCCEEDED")
            assert core.apps[app_id].state.value == "FINISHED" and core.apps[app_id].attempts == [attempt_id]
        finally:
            await rm2.stop()
    finally:
        if am is not None:
            await am.close()
        if rm1 is not None:
            await rm1.stop()


async def test_an_am_that_finishes_right_after_the_failover_registers_again_first(tmp_path, nm):
    fake_nm, nm_address = nm
    ports = free_ports(2)
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    rm1 = Rm(str(tmp_path / "state"), ports[0], urls, nm_address)
    await rm1.start()
    am = None
    try:
        await rm1.register_node([])
        app_id, am_cid, env = await submit_and_launch(rm1, fake_nm)
        am = ApplicationMaster(AmIdentity.from_env(env))
        await am.register("amhost", 1, "http://amhost:1/", start_heartbeats=False)
    finally:
        await rm1.stop()
    rm2 = Rm(str(tmp_path / "state"), ports[1], urls, nm_address)
    await rm2.start()
    try:
        await rm2.register_node([running(am_cid, Resource(512, 1), "am")])
        # Its first call to the new RM is its finish: refused as not registered, it registers and
        # finishes, in the attempt it had.
        assert await am.finish(FinalStatus.SUCCEEDED, "done")
        app = rm2.server.core.apps[app_id]
        assert app.state.value == "FINISHED" and len(app.attempts) == 1 and am.resyncs == 1
    finally:
        if am is not None:
            await am.close()
        await rm2.stop()

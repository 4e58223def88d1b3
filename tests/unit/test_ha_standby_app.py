"""What a standby RM serves (rm/ha/ha_http.py), in process over real HTTP: cluster info with its HA
fields, redirects to the active with the query kept, 503 StandbyException to NMs and AMs and when
no active is known, and the admin-only switch under both client auth modes."""
from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from protocol.config import ClusterConfig
from rm.ha.ha_http import HaEndpoints, StandbyApp
from rm.ha.role import HAEvent, HaRole


class World:
    def __init__(self, cluster: ClusterConfig):
        self.role = HaRole("rm2", 5.0, now=10.0)
        self.role.start(10.0)
        self.active = ("", "")
        self.switches: list[str] = []
        self.endpoints = HaEndpoints(cluster, "rm2", lambda: self.role, lambda: self.active, lambda: "",
                                     self.switch)

    async def switch(self, reason: str) -> None:
        self.switches.append(reason)
        self.role.fire(HAEvent.TRANSITION_TO_STANDBY, 11.0, reason)


async def client_for(world: World) -> TestClient[Any, Any]:
    client = TestClient(TestServer(StandbyApp(world.endpoints, lambda: 1234).build()))
    await client.start_server()
    return client


async def test_info_redirects_and_refusals():
    world = World(ClusterConfig(secret="s"))
    client = await client_for(world)
    try:
        info = (await (await client.get("/ws/v1/cluster/info")).json())["clusterInfo"]
        assert info["haState"] == "STANDBY" and info["haRmId"] == "rm2" and info["haActiveRmId"] == ""
        assert info["startedOn"] == 1234 and info["haZooKeeperConnectionState"] == "etcd: CONNECTED"

        resp = await client.get("/ws/v1/cluster/apps?states=RUNNING", allow_redirects=False)
        assert resp.status == 503 and "no active ResourceManager is known" in (await resp.json())["RemoteException"]["message"]

        world.active = ("rm1", "http://rm1:8088")
        resp = await client.put("/ws/v1/cluster/apps/application_1_0001/state?user.name=bob", json={"state": "KILLED"},
                                allow_redirects=False)
        assert resp.status == 307
        assert resp.headers["Location"] == "http://rm1:8088/ws/v1/cluster/apps/application_1_0001/state?user.name=bob"
        resp = await client.get("/cluster/apps", allow_redirects=False)
        assert resp.status == 307 and resp.headers["Location"] == "http://rm1:8088/cluster/apps"

        resp = await client.post("/internal/v1/am/allocate", json={})
        body = await resp.json()
        assert resp.status == 503 and body["RemoteException"]["javaClassName"] == "org.apache.hadoop.ipc.StandbyException"
        assert "the active is rm1 at http://rm1:8088" in body["RemoteException"]["message"]
    finally:
        await client.close()


async def test_the_switch_is_for_admins_and_token_auth_is_required_when_configured():
    world = World(ClusterConfig(secret="s", client_auth="token", client_tokens={"t-root": "root", "t-bob": "bob"},
                                admins=["root"]))
    client = await client_for(world)
    try:
        assert (await client.get("/ws/v1/cluster/info")).status == 401
        resp = await client.post("/ws/v1/cluster/ha/transition-to-standby", headers={"Authorization": "Bearer t-bob"})
        assert resp.status == 403 and world.switches == []
        resp = await client.post("/ws/v1/cluster/ha/transition-to-standby", headers={"Authorization": "Bearer t-root"})
        ha = (await resp.json())["ha"]
        assert resp.status == 200 and world.switches == ["transition-to-standby by root"]
        assert ha["state"] == "STANDBY" and ha["reason"] == "transition-to-standby by root"
        assert [h["event"] for h in ha["history"]] == ["START", "TRANSITION_TO_STANDBY"]
    finally:
        await client.close()


async def test_the_switch_on_an_rm_outside_the_election_is_refused_with_409():
    world = World(ClusterConfig(secret="s"))
    world.role = HaRole("rm2", 5.0, now=10.0)      # INITIALIZING: not in the election yet
    client = await client_for(world)
    try:
        for stop in (False, True):
            if stop:
                world.role.fire(HAEvent.STOP, 12.0, "the ResourceManager is stopping")
            resp = await client.post("/ws/v1/cluster/ha/transition-to-standby?user.name=root")
            body = (await resp.json())["RemoteException"]
            assert resp.status == 409 and body["javaClassName"] == "org.apache.hadoop.yarn.exceptions.YarnException"
            state = "STOPPED" if stop else "INITIALIZING"
            assert f"ResourceManager rm2 is {state}" in body["message"] and "nothing to switch" in body["message"]
        assert world.switches == []
    finally:
        await client.close()

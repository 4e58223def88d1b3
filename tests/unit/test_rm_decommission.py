"""Graceful decommission (YARN's): an admin takes a node out; nothing new is placed on it, its
containers run on (or are killed after the timeout, their AMs hearing ABORTED), then it is
DECOMMISSIONED and its NM is told to stop; recommission brings it back. Core and REST."""
from __future__ import annotations

import pytest

from protocol import internal_api as api
from protocol.records import ExitStatus, NodeState, Resource
from protocol.remote_exception import BadRequest, NotFound
from rm_testing import FakeClock, ask, heartbeat, launch_and_register, make_core, register, submit
from test_rm_api import BASE, Env, close_env, make_env


def test_a_decommissioning_node_gets_nothing_new_and_stops_once_its_containers_end() -> None:
    clock = FakeClock()
    core = make_core(clock)
    register(core, "n1:1", mem=2048, vcores=2)
    app_id = submit(core)
    claims = launch_and_register(core, app_id)
    am_cid = core.attempts[claims["attempt_id"]].am_container_id
    core.decommission_node("n1:1", None)
    n1 = core.nodes.get("n1:1")
    assert n1.state == NodeState.DECOMMISSIONING and core.nodes.total == Resource(1024, 1)   # what it still runs
    core.allocate(claims, api.AllocateRequest(response_id=1, asks=[ask(1, 1, mem=512)]))
    hb = heartbeat(core, "n1:1")
    assert hb.action == "NORMAL" and core.nodes.get("n1:1").containers == {am_cid}   # nothing new placed
    hb = heartbeat(core, "n1:1", [api.ContainerStatus(container_id=am_cid, state="COMPLETE", exit_status=0)])
    assert hb.action == "SHUTDOWN" and "decommissioned" in hb.diagnostics
    assert n1.state == NodeState.DECOMMISSIONED
    assert heartbeat(core, "n1:1").action == "SHUTDOWN"
    clock.advance(60.0)
    core.tick()
    assert n1.state == NodeState.DECOMMISSIONED          # silent, but not LOST: it was told to stop
    again = core.register_node({"node_id": "n1:1"}, api.NodeRegisterRequest(
        node_id="n1:1", http_address="n1:1", capability=Resource(2048, 2)))
    assert again.action == "SHUTDOWN" and "recommission" in again.diagnostics
    core.recommission_node("n1:1")                       # forgotten: it may register again
    assert core.nodes.get("n1:1") is None
    register(core, "n1:1")
    assert core.nodes.get("n1:1").state == NodeState.RUNNING


def test_past_its_timeout_the_nodes_containers_are_killed_and_their_am_hears_aborted() -> None:
    clock = FakeClock()
    core = make_core(clock, am_expiry_s=1000)
    register(core, "am:1")
    app_id = submit(core)
    claims = launch_and_register(core, app_id)
    register(core, "w:1")
    (granted,) = core.allocate(claims, api.AllocateRequest(response_id=0, asks=[
        ask(1, 1, 1024, nodes=["w:1"], relax_locality=False)])).allocated
    assert granted.node_id == "w:1"
    core.decommission_node("w:1", 30.0)
    clock.advance(10.0)
    assert heartbeat(core, "w:1").containers_to_cleanup == []         # within the timeout: runs on
    clock.advance(25.0)
    hb = heartbeat(core, "w:1")
    assert hb.containers_to_cleanup == [granted.container_id] and hb.action == "NORMAL"
    [done] = core.allocate(claims, api.AllocateRequest(response_id=1)).completed
    assert done.container_id == granted.container_id and done.exit_status == ExitStatus.ABORTED
    assert "decommissioned" in done.diagnostics
    hb = heartbeat(core, "w:1", [api.ContainerStatus(container_id=granted.container_id, state="COMPLETE",
                                                     exit_status=-105)])
    assert hb.action == "SHUTDOWN" and core.nodes.get("w:1").state == NodeState.DECOMMISSIONED
    assert not core.apps[app_id].state.is_final                       # the app lives on, its AM on am:1


def test_recommission_brings_a_draining_node_back_and_bad_requests_change_nothing() -> None:
    core = make_core()
    register(core, "n1:1")
    register(core, "n2:1")
    core.decommission_node("n1:1", None)       # empty: decommissioned at once
    assert core.nodes.get("n1:1").state == NodeState.DECOMMISSIONED
    app_id = submit(core)
    launch_and_register(core, app_id)
    core.decommission_node("n2:1", None)       # the AM runs there: draining
    assert core.nodes.get("n2:1").state == NodeState.DECOMMISSIONING
    core.recommission_node("n2:1")
    assert core.nodes.get("n2:1").state == NodeState.RUNNING and core.nodes.total == Resource(8192, 8)
    with pytest.raises(NotFound, match="nX:1"):
        core.decommission_node("nX:1", None)
    with pytest.raises(BadRequest, match="RUNNING"):
        core.recommission_node("n2:1")
    with pytest.raises(BadRequest, match="decommissionTimeout"):
        core.decommission_node("n2:1", -5.0)
    with pytest.raises(BadRequest, match="DECOMMISSIONED"):
        core.decommission_node("n1:1", None)
    assert core.nodes.get("n2:1").state == NodeState.RUNNING


@pytest.fixture
async def env(tmp_path):
    e = await make_env(tmp_path)
    yield e
    await close_env(e)


async def test_the_rest_call_is_an_admins_and_says_what_is_wrong(env: Env) -> None:
    await env.register_node("n1:1")
    path = f"{BASE}/nodes/n1:1/state"
    out = await env.call("PUT", path, {"state": "DECOMMISSIONING", "decommissionTimeout": 600}, **{"user.name": "root"})
    assert out["node"]["state"] == "DECOMMISSIONED"       # nothing ran there
    metrics = (await env.call("GET", f"{BASE}/metrics"))["clusterMetrics"]
    assert metrics["decommissionedNodes"] == 1
    err = await env.call("PUT", path, {"state": "RUNNING"}, status=403, **{"user.name": "alice"})
    assert err["RemoteException"]["exception"] == "ForbiddenException"
    err = await env.call("PUT", path, {"state": "LOST"}, status=400, **{"user.name": "root"})
    assert "DECOMMISSIONING or RUNNING" in err["RemoteException"]["message"]
    err = await env.call("PUT", path, {"state": "RUNNING", "bogus": 1}, status=400, **{"user.name": "root"})
    assert "bogus" in err["RemoteException"]["message"]
    await env.call("PUT", f"{BASE}/nodes/nX:1/state", {"state": "RUNNING"}, status=404, **{"user.name": "root"})
    assert env.rm.core.nodes.get("n1:1").state == NodeState.DECOMMISSIONED     # nothing changed
    out = await env.call("PUT", path, {"state": "RUNNING"}, **{"user.name": "root"})
    assert out["node"]["state"] == "SHUTDOWN" and env.rm.core.nodes.get("n1:1") is None

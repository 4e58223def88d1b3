"""Graceful decommission (YARN's): an admin takes a node out; nothing new is placed on it, its
containers run on (or are killed after the timeout, their AMs hearing ABORTED), then it is
DECOMMISSIONED and its NM is told to stop; recommission brings it back. Core and REST."""
from __future__ import annotations

import pytest

from protocol import internal_api as api
from protocol.job_report import JobReport
from protocol.records import ExitStatus, NodeState, Resource
from protocol.remote_exception import BadRequest, NotFound
from protocol.config import ClusterConfig, RMConfig
from rm import policies
from rm.model import AmSpec
from rm.policy_runner import run_policy
from rm.server import ResourceManagerServer
from rm.store import SqliteStateStore
from rm_testing import SECRET, FakeClock, ask, heartbeat, launch_and_register, make_core, ps_spec, register, submit
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


# ----- elastic PS jobs move off a draining node (rm/policies/node_drain.py) -----------------------
def _ps_job(core, workers: int, servers: int, **extra: int) -> str:
    app_id = core.new_application()
    spec = {"app": "mlr", "workers": workers, "servers": servers, "executor_memory_mb": 1024, "executor_vcores": 1,
            **extra}
    core.submit(app_id, "alice", "ps", "default", "ELASTANE_PS", AmSpec(["true"], {}, {}, Resource(1024, 1)), 1,
                ps_job=ps_spec(spec))
    core.app_saved(app_id)
    return app_id


def _shape(workers: int, servers: int, changing: bool = False) -> JobReport:
    return JobReport(workers=workers, servers=servers, started=True, iterations=150, speed=1.0, speed_iterations=50,
                     executor_resource=Resource(1024, 1), changing=changing)


def test_a_ps_jobs_executors_on_a_draining_node_are_moved_to_nodes_with_room_live() -> None:
    core = make_core(am_expiry_s=1000, gang_admission=False)      # its AM first, on am:1
    register(core, "am:1", mem=2048, vcores=2)   # room for one executor beside the AM
    app_id = _ps_job(core, 2, 2)
    claims = launch_and_register(core, app_id)
    for node in ("w1:1", "w2:1", "w3:1"):
        register(core, node, mem=4096, vcores=4)
    r = core.allocate(claims, api.AllocateRequest(response_id=0, asks=[
        ask(1, 1, 1024, nodes=["w1:1"], relax_locality=False, tag="worker"),
        ask(2, 1, 1024, nodes=["w2:1"], relax_locality=False, tag="worker"),
        ask(3, 1, 1024, nodes=["w1:1"], relax_locality=False, tag="server"),
        ask(4, 1, 1024, nodes=["w2:1"], relax_locality=False, tag="server")]))
    assert sorted(c.node_id for c in r.allocated) == ["w1:1", "w1:1", "w2:1", "w2:1"]
    core.allocate(claims, api.AllocateRequest(response_id=1, shape=_shape(2, 2)))
    static = policies.create("static")
    assert run_policy(core, static) == 0                  # nothing drains: nothing to do
    core.decommission_node("w2:1", None)
    core.allocate(claims, api.AllocateRequest(response_id=2, shape=_shape(2, 2, changing=True)))
    assert run_policy(core, static) == 0                  # mid-change: it waits
    core.allocate(claims, api.AllocateRequest(response_id=3, shape=_shape(2, 2)))
    assert run_policy(core, static) == 1
    d = core.apps[app_id].directive
    assert d is not None and (d.workers, d.servers) == (2, 2) and "w2:1 decommissioning" in d.reason
    where = {p.node: (p.workers, p.servers) for p in d.placement}
    assert "w2:1" not in where and where["w1:1"] == (1, 1) and where["w3:1"] == (1, 1)   # w3 has the most room
    assert run_policy(core, static) == 0                  # told once: no churn while it moves
    heartbeat(core, "w2:1")
    assert core.nodes.get("w2:1").state == NodeState.DECOMMISSIONING


def test_executors_that_fit_nowhere_are_given_up_down_to_the_jobs_minimums() -> None:
    core = make_core(am_expiry_s=1000, gang_admission=False)      # its AM first, on am:1
    register(core, "am:1", mem=1024, vcores=1)   # the AM and nothing else
    app_id = _ps_job(core, 3, 1, min_workers=2)
    claims = launch_and_register(core, app_id)
    register(core, "w1:1", mem=1024, vcores=1)            # room for one executor, no more
    register(core, "w2:1", mem=4096, vcores=4)
    r = core.allocate(claims, api.AllocateRequest(response_id=0, asks=[
        ask(1, 3, 1024, nodes=["w2:1"], relax_locality=False, tag="worker"),
        ask(2, 1, 1024, nodes=["w2:1"], relax_locality=False, tag="server")]))
    assert len(r.allocated) == 4
    core.allocate(claims, api.AllocateRequest(response_id=1, shape=_shape(3, 1)))
    core.decommission_node("w2:1", 600.0)
    assert run_policy(core, policies.create("static")) == 1
    d = core.apps[app_id].directive
    where = {p.node: (p.workers, p.servers) for p in d.placement}
    # One executor fits on w1 (a worker, placed first); the other two workers are given up down to
    # min_workers 2, so one stays on w2 until the timeout; the server (minimum 1) stays there too.
    assert (d.workers, d.servers) == (2, 1) and where == {"w1:1": (1, 0), "w2:1": (1, 1)}
    assert "given up" in d.reason


def test_decommissions_survive_an_rm_restart_on_its_store(tmp_path) -> None:
    """As YARN keeps its exclude list: a restarted RM lists a DECOMMISSIONED node as such and tells
    its NM to stop; a DECOMMISSIONING one drains on, with its deadline, once its NM registers again."""
    clock = FakeClock()
    cfg = RMConfig(state_dir=str(tmp_path), am_expiry_s=1000)
    rm = ResourceManagerServer(cfg, ClusterConfig(secret=SECRET), clock=clock, store=SqliteStateStore(tmp_path),
                               run_timers=False)
    register(rm.core, "n1:1")
    register(rm.core, "n2:1")
    app_id = submit(rm.core)
    launch_and_register(rm.core, app_id)
    am_node = rm.core.containers[rm.core.attempts[rm.core.apps[app_id].current_attempt].am_container_id].node_id
    idle = "n1:1" if am_node == "n2:1" else "n2:1"
    rm.core.decommission_node(idle, None)               # nothing there: DECOMMISSIONED at once
    rm.core.decommission_node(am_node, 600.0)           # its AM runs there: draining
    deadline = rm.core.nodes.get(am_node).decommission_deadline
    rm.flush()
    rm.store.close()

    rm2 = ResourceManagerServer(cfg, ClusterConfig(secret=SECRET), clock=clock, store=SqliteStateStore(tmp_path),
                                run_timers=False)
    assert rm2.core.nodes.get(idle).state == NodeState.DECOMMISSIONED
    back = rm2.core.register_node({"node_id": idle}, api.NodeRegisterRequest(
        node_id=idle, http_address=idle, capability=Resource(8192, 8)))
    assert back.action == "SHUTDOWN"
    before = rm2.store.load_decommissions().nodes[am_node]
    assert before.http_address == am_node and before.capability == Resource(8192, 8)
    rm2.core.recommission_node(idle)     # a save while the draining node has not registered again
    rm2.flush()
    assert rm2.store.load_decommissions().nodes == {am_node: before}     # kept whole, not blanked
    register(rm2.core, am_node)
    n = rm2.core.nodes.get(am_node)
    assert n.state == NodeState.DECOMMISSIONING and n.decommission_deadline == deadline
    assert rm2.core.nodes.total == n.used                # only what it still runs (nothing, yet)
    rm2.flush()
    assert set(rm2.store.load_decommissions().nodes) == {am_node}
    rm2.store.close()


def _draining_node_that_goes_lost(clock: FakeClock):
    """n2:1 runs an executor, is DECOMMISSIONING (an hour to go), then goes silent and LOST; n1:1
    runs the AM and lives. Returns (core, claims)."""
    core = make_core(clock, nm_expiry_s=10.0, am_expiry_s=10**6)
    register(core, "n1:1", mem=1024, vcores=1)
    claims = launch_and_register(core, submit(core))
    register(core, "n2:1")
    (w,) = core.allocate(claims, api.AllocateRequest(response_id=0, asks=[ask(1, 1)])).allocated
    assert w.node_id == "n2:1"
    core.decommission_node("n2:1", 3600.0)
    core.decommissions_dirty = False                     # the server stored it
    clock.advance(11.0)
    heartbeat(core, "n1:1")
    core.tick()
    assert core.nodes.get("n2:1").state == NodeState.LOST
    return core, claims


def test_a_draining_node_that_goes_lost_is_decommissioning_again_when_it_registers() -> None:
    clock = FakeClock()
    deadline = clock() + 3600.0
    core, claims = _draining_node_that_goes_lost(clock)
    assert core.decommissions_dirty
    assert [(n.node_id, n.state, d) for n, d in core.decommissions()] == [("n2:1", NodeState.DECOMMISSIONING, deadline)]
    register(core, "n2:1")
    n2 = core.nodes.get("n2:1")
    assert n2.state == NodeState.DECOMMISSIONING and n2.decommission_deadline == deadline and not n2.schedulable
    r = core.allocate(claims, api.AllocateRequest(response_id=1, asks=[ask(2, 1)]))
    assert r.allocated == [] and not n2.containers       # nothing new placed on it
    hb = heartbeat(core, "n2:1")                         # it runs nothing: decommissioned
    assert hb.action == "SHUTDOWN" and n2.state == NodeState.DECOMMISSIONED


def test_a_draining_node_that_went_lost_can_be_recommissioned() -> None:
    clock = FakeClock()
    core, _ = _draining_node_that_goes_lost(clock)
    core.decommissions_dirty = False
    assert core.recommission_node("n2:1").state == NodeState.LOST
    assert core.decommissions() == [] and core.decommissions_dirty
    register(core, "n2:1")
    assert core.nodes.get("n2:1").state == NodeState.RUNNING

"""Released containers stay charged to their node until the NM confirms they are gone (pure core, fake clock)."""
from __future__ import annotations

from protocol import internal_api as api
from protocol.records import Resource
from rm_testing import FakeClock, ask, heartbeat, launch_and_register, make_core, register, submit

NODE = "n1:1"


def _running(*cids: str) -> list[api.ContainerStatus]:
    return [api.ContainerStatus(container_id=c, state="RUNNING") for c in cids]


def _complete(*cids: str) -> list[api.ContainerStatus]:
    return [api.ContainerStatus(container_id=c, state="COMPLETE", exit_status=-106) for c in cids]


def _full_node_app(core):
    """One app whose AM and one 3 GB worker fill a 4 GB node; returns (app_id, claims, am_cid, worker_cid)."""
    register(core, NODE, mem=4096, vcores=4)
    app_id = submit(core)
    claims = launch_and_register(core, app_id)
    (w,) = core.allocate(claims, api.AllocateRequest(response_id=0, asks=[ask(1, 1, mem=3072)])).allocated
    am_cid = core.attempts[claims["attempt_id"]].am_container_id
    heartbeat(core, NODE, _running(am_cid, w.container_id))
    return app_id, claims, am_cid, w.container_id


def test_killed_apps_resources_are_reused_only_after_the_nm_reports_complete():
    core = make_core(FakeClock())
    a, _, am_cid, wid = _full_node_app(core)
    core.kill(a)
    node = core.nodes.get(NODE)
    # Queue accounting gives the resources back at once (as YARN); the node does not.
    assert core.scheduler.queues["default"].used == Resource(0, 0)
    assert node.used == Resource(4096, 2)
    b = submit(core)
    assert not any(c.app_id == b for c in core.containers.values())
    # The NM is asked to clean both up; while it kills them it still reports them running.
    hb = heartbeat(core, NODE, _running(am_cid, wid))
    assert set(hb.containers_to_cleanup) == {am_cid, wid}
    hb = heartbeat(core, NODE, _running(am_cid, wid))
    assert hb.containers_to_cleanup == []           # asked once: no repeat while the kill is under way
    assert node.used == Resource(4096, 2) and not any(c.app_id == b for c in core.containers.values())
    # The AM container is gone: 1 GB is free again and B's AM takes it in the same heartbeat.
    heartbeat(core, NODE, _complete(am_cid) + _running(wid))
    assert node.used == Resource(3072 + 1024, 2)
    assert any(c.app_id == b and c.is_am for c in core.containers.values())
    heartbeat(core, NODE, _complete(wid))
    assert node.used == Resource(1024, 1) and not node.releasing


def test_never_launched_container_is_freed_when_the_nm_shows_it_does_not_have_it():
    core = make_core(FakeClock())
    register(core, NODE, mem=4096, vcores=4)
    app_id = submit(core)
    claims = launch_and_register(core, app_id)
    (w,) = core.allocate(claims, api.AllocateRequest(response_id=0, asks=[ask(1, 1, mem=2048)])).allocated
    core.allocate(claims, api.AllocateRequest(response_id=1, releases=[w.container_id]))   # never started
    node = core.nodes.get(NODE)
    assert node.used == Resource(1024 + 2048, 2)
    # A heartbeat sent before the NM saw the cleanup request proves nothing.
    hb = heartbeat(core, NODE)
    assert hb.containers_to_cleanup == [w.container_id] and node.used == Resource(3072, 2)
    heartbeat(core, NODE, response_id=hb.response_id - 1)
    assert node.used == Resource(3072, 2)
    # The NM answered the response that asked for the cleanup and does not list it: freed.
    heartbeat(core, NODE, response_id=hb.response_id)
    assert node.used == Resource(1024, 1) and not node.releasing


def test_cleanup_is_asked_again_when_the_nm_missed_the_response():
    core = make_core(FakeClock())
    a, _, am_cid, wid = _full_node_app(core)
    core.kill(a)
    hb = heartbeat(core, NODE, _running(am_cid, wid))
    assert set(hb.containers_to_cleanup) == {am_cid, wid}
    # That response was lost: the NM heartbeats again with the previous response id.
    hb2 = heartbeat(core, NODE, _running(am_cid, wid), response_id=hb.response_id - 1)
    assert set(hb2.containers_to_cleanup) == {am_cid, wid}


def test_lost_node_drops_pending_releases():
    clock = FakeClock()
    core = make_core(clock, nm_expiry_s=10.0, am_expiry_s=10**6)
    a, _, am_cid, wid = _full_node_app(core)
    core.kill(a)
    clock.advance(11)
    core.tick()
    node = core.nodes.get(NODE)
    assert node.state.value == "LOST" and node.used == Resource(0, 0) and not node.releasing


def test_nm_restart_frees_what_it_no_longer_runs_and_asks_again_for_the_rest():
    core = make_core(FakeClock())
    a, _, am_cid, wid = _full_node_app(core)
    core.kill(a)
    heartbeat(core, NODE, _running(am_cid, wid))
    resp = core.register_node({"node_id": NODE}, api.NodeRegisterRequest(
        node_id=NODE, http_address=NODE, capability=Resource(4096, 4), containers=_running(wid)))
    assert resp.node_id == NODE
    node = core.nodes.get(NODE)
    assert node.used == Resource(3072, 1) and set(node.releasing) == {wid}
    hb = heartbeat(core, NODE, _running(wid))
    assert wid in hb.containers_to_cleanup


def test_finished_apps_executors_and_am_are_held_until_reported():
    core = make_core(FakeClock())
    a, claims, am_cid, wid = _full_node_app(core)
    core.am_finish(claims, api.AmFinishRequest(final_status="SUCCEEDED"))
    node = core.nodes.get(NODE)
    assert node.used == Resource(4096, 2)
    hb = heartbeat(core, NODE, _running(am_cid, wid))
    assert hb.containers_to_cleanup == [wid] and a in hb.apps_to_cleanup
    heartbeat(core, NODE, _complete(am_cid, wid))
    assert node.used == Resource(0, 0) and not node.releasing


def test_expired_unlaunched_container_waits_for_the_nm_too():
    clock = FakeClock()
    core = make_core(clock, am_expiry_s=10**6, nm_expiry_s=10**6)
    core.launch_expiry_s = 60
    register(core, NODE, mem=4096, vcores=4)
    app_id = submit(core)
    claims = launch_and_register(core, app_id)
    am_cid = core.attempts[claims["attempt_id"]].am_container_id
    (w,) = core.allocate(claims, api.AllocateRequest(response_id=0, asks=[ask(1, 1)])).allocated
    heartbeat(core, NODE, _running(am_cid))
    clock.advance(61)
    core.tick()
    node = core.nodes.get(NODE)
    assert w.container_id not in core.containers and node.used == Resource(2048, 2)
    heartbeat(core, NODE, _running(am_cid))
    heartbeat(core, NODE, _running(am_cid))
    assert node.used == Resource(1024, 1)


def test_apps_to_cleanup_are_sent_again_until_the_nm_got_the_response():
    core = make_core(FakeClock())
    a, _, am_cid, wid = _full_node_app(core)
    core.kill(a)
    hb = heartbeat(core, NODE, _running(am_cid, wid))
    assert hb.apps_to_cleanup == [a]
    # That response was lost: the NM heartbeats again with the previous response id.
    hb2 = heartbeat(core, NODE, _running(am_cid, wid), response_id=hb.response_id - 1)
    assert hb2.apps_to_cleanup == [a]
    # It got this one (its response id says so): the app is not sent again.
    hb3 = heartbeat(core, NODE, _complete(am_cid, wid), response_id=hb2.response_id)
    assert hb3.apps_to_cleanup == [] and heartbeat(core, NODE).apps_to_cleanup == []


def test_a_container_lost_before_its_am_heard_of_it_is_not_reported_and_is_asked_for_again():
    core = make_core(FakeClock())
    register(core, NODE, mem=1024, vcores=1)            # room for the AM only
    app_id = submit(core)
    claims = launch_and_register(core, app_id)
    row = ask(1, 1, priority=3, nodes=["n2:1"], relax_locality=False)
    r = core.allocate(claims, api.AllocateRequest(response_id=0, asks=[row]))
    assert r.allocated == []
    register(core, "n2:1")                               # room: allocated there, not delivered yet
    (lost,) = [c.container_id for c in core.attempts[claims["attempt_id"]].to_deliver]
    # n2's NM restarts (never having launched it) and comes back too small for the ask.
    register(core, "n2:1", mem=512, vcores=1)
    assert lost not in core.containers
    sched = core.scheduler.apps[app_id].asks[1]
    assert (sched.count, sched.priority, sched.nodes, sched.relax_locality) == (1, 3, ("n2:1",), False)
    # The AM, which never heard of it, asks for its one container again: not cut to nothing.
    r = core.allocate(claims, api.AllocateRequest(response_id=r.response_id, asks=[row]))
    assert r.allocated == [] and r.completed == []
    assert core.scheduler.apps[app_id].asks[1].count == 1
    register(core, "n2:1")
    r = core.allocate(claims, api.AllocateRequest(response_id=r.response_id, asks=[row]))
    assert [c.node_id for c in r.allocated] == ["n2:1"] and r.allocated[0].container_id != lost
    assert r.completed == [] and 1 not in core.scheduler.apps[app_id].asks


def test_a_preempted_container_its_am_never_got_is_asked_for_again_not_reported():
    core = make_core(FakeClock())
    register(core, NODE, mem=1024, vcores=1)
    app_id = submit(core)
    claims = launch_and_register(core, app_id)
    r = core.allocate(claims, api.AllocateRequest(response_id=0, asks=[ask(1, 1)]))
    register(core, "n2:1")
    (cid,) = [c.container_id for c in core.attempts[claims["attempt_id"]].to_deliver]
    assert core.preempt_containers(app_id, [cid], "for another queue") == [cid]
    r = core.allocate(claims, api.AllocateRequest(response_id=r.response_id))
    assert r.completed == [] and [c.container_id for c in r.allocated] != [cid] and len(r.allocated) == 1

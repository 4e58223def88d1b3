"""RM core (pure, fake clock): submit flow, node liveness, AM liveness, releases, kill, recovery."""
from __future__ import annotations

import pytest

from protocol import internal_api as api
from protocol import tokens
from protocol.records import AppState, AttemptState, ExitStatus, FinalStatus, NodeState, Resource
from protocol.remote_exception import BadRequest, Unauthorized
from rm.model import AmSpec
from rm.store import app_from_record, app_to_record, attempt_from_record, attempt_to_record
from rm_testing import (SECRET, FakeClock, am_claims, ask, heartbeat, launch_and_register, make_core,
                        register, submit)


def test_submit_allocates_am_and_launch_effect_carries_signed_tokens():
    core = make_core()
    register(core, "n1:1")
    app_id = submit(core)
    app = core.apps[app_id]
    assert app.state == AppState.ACCEPTED
    effects = core.take_effects()
    assert len(effects) == 1
    eff = effects[0]
    assert eff.container.is_am and eff.container.node_id == "n1:1"
    assert eff.container.container_id.endswith("_01_000001")
    claims = tokens.verify(SECRET, eff.container.token, tokens.CONTAINER)
    assert claims["node_id"] == "n1:1" and claims["app_id"] == app_id
    am = tokens.verify(SECRET, eff.am_token, tokens.AM)
    assert am["attempt_id"] == app.current_attempt and am["user"] == "alice"
    assert core.attempts[app.current_attempt].state == AttemptState.ALLOCATED
    core.am_launched(eff.attempt_id)
    core.am_register(am, api.AmRegisterRequest(tracking_url="http://am:9"))
    assert app.state == AppState.RUNNING and app.tracking_url == "http://am:9"


def test_am_waits_until_a_node_registers_and_memory_is_normalised():
    core = make_core(minimum_allocation_mb=512)
    app_id = submit(core, mem=700)
    assert core.take_effects() == []
    register(core, "n1:1")
    (eff,) = core.take_effects()
    assert eff.container.resource == Resource(1024, 1)
    assert core.nodes.get("n1:1").used == Resource(1024, 1)
    assert core.apps[app_id].state == AppState.ACCEPTED


def test_submission_checks_change_nothing():
    core = make_core()
    with pytest.raises(BadRequest, match="not handed out"):
        core.submit("application_1_0001", "u", "n", "default", "", AmSpec(["x"], {}, {}, Resource(1, 1)), 1)
    app_id = core.new_application()
    with pytest.raises(BadRequest, match="queue"):
        core.submit(app_id, "u", "n", "nope", "", AmSpec(["x"], {}, {}, Resource(1, 1)), 1)
    with pytest.raises(BadRequest, match="maximum allocation"):
        core.submit(app_id, "u", "n", "default", "", AmSpec(["x"], {}, {}, Resource(10**9, 1)), 1)
    assert core.apps == {} and app_id in core.reserved_ids


def test_allocate_delivers_containers_and_completions():
    clock = FakeClock()
    core = make_core(clock)
    register(core, "n1:1")
    app_id = submit(core)
    claims = launch_and_register(core, app_id)
    r = core.allocate(claims, api.AllocateRequest(response_id=0, asks=[ask(1, 2, 2048, tag="worker")]))
    assert len(r.allocated) == 2 and {c.tag for c in r.allocated} == {"worker"}
    assert r.num_cluster_nodes == 1
    cid = r.allocated[0].container_id
    # Re-sending the same ask must not allocate again (count is what is still wanted).
    r2 = core.allocate(claims, api.AllocateRequest(response_id=1, asks=[ask(1, 0, 2048)]))
    assert r2.allocated == []
    heartbeat(core, "n1:1", [api.ContainerStatus(container_id=cid, state="COMPLETE", exit_status=3)])
    r3 = core.allocate(claims, api.AllocateRequest(response_id=2))
    assert [(c.container_id, c.exit_status) for c in r3.completed] == [(cid, 3)]
    assert core.nodes.get("n1:1").used == Resource(1024 + 2048, 2)


def test_ask_bigger_than_maximum_is_rejected_and_changes_nothing():
    core = make_core()
    register(core, "n1:1")
    app_id = submit(core)
    claims = launch_and_register(core, app_id)
    with pytest.raises(BadRequest, match=r"asks\[1\].resource.*maximum"):
        core.allocate(claims, api.AllocateRequest(response_id=0, asks=[ask(1, 1), ask(2, 1, 10**7)]))
    assert core.scheduler.apps[app_id].asks == {}


def test_node_lost_reports_aborted_and_resync():
    clock = FakeClock()
    core = make_core(clock, nm_expiry_s=10, am_expiry_s=1000)
    register(core, "am:1")
    app_id = submit(core)
    claims = launch_and_register(core, app_id)
    register(core, "w:1")
    r = core.allocate(claims, api.AllocateRequest(response_id=0, asks=[ask(1, 1, 4096, nodes=["w:1"],
                                                                            relax_locality=False)]))
    (c,) = r.allocated
    assert c.node_id == "w:1"
    for _ in range(3):
        clock.advance(5)
        heartbeat(core, "am:1")
        core.tick()
    assert core.nodes.get("w:1").state == NodeState.LOST
    assert core.nodes.total == Resource(8192, 8)
    r = core.allocate(claims, api.AllocateRequest(response_id=1))
    assert [(s.container_id, s.exit_status) for s in r.completed] == [(c.container_id, ExitStatus.ABORTED)]
    assert [n.state for n in r.updated_nodes] == ["LOST"]
    assert heartbeat(core, "w:1").action == "RESYNC"
    register(core, "w:1")
    assert core.nodes.get("w:1").state == NodeState.RUNNING


def test_am_expiry_makes_new_attempt_then_fails_app():
    clock = FakeClock()
    core = make_core(clock, am_expiry_s=5, nm_expiry_s=1000, max_app_attempts=2)
    register(core, "n1:1")
    app_id = submit(core, max_attempts=5)  # capped to the cluster's 2
    first = launch_and_register(core, app_id)
    clock.advance(6)
    heartbeat(core, "n1:1")     # the AM's node lives: its AM itself stopped, which counts
    core.tick()
    app = core.apps[app_id]
    assert core.attempts[first["attempt_id"]].state == AttemptState.FAILED
    assert app.state == AppState.ACCEPTED and len(app.attempts) == 2
    # The old attempt's token is told to shut down; its AM container is cleaned up on the NM.
    assert core.allocate(first, api.AllocateRequest(response_id=5)).action == "SHUTDOWN"
    hb = heartbeat(core, "n1:1")
    assert core.attempts[first["attempt_id"]].am_container_id in hb.containers_to_cleanup
    with pytest.raises(Unauthorized):
        core.am_register(first, api.AmRegisterRequest())
    launch_and_register(core, app_id)
    clock.advance(6)
    heartbeat(core, "n1:1")
    core.tick()
    assert app.state == AppState.FAILED and app.final_status == FinalStatus.FAILED
    assert "failed 2 times" in app.diagnostics and "timed out" in app.diagnostics


def test_am_container_exit_without_finish_fails_attempt():
    core = make_core(max_app_attempts=1)
    register(core, "n1:1")
    app_id = submit(core, max_attempts=1)
    claims = launch_and_register(core, app_id)
    am_cid = core.attempts[claims["attempt_id"]].am_container_id
    heartbeat(core, "n1:1", [api.ContainerStatus(container_id=am_cid, state="COMPLETE", exit_status=1)])
    app = core.apps[app_id]
    assert app.state == AppState.FAILED and "exitCode: 1" in app.diagnostics


def test_finish_then_am_exit_and_cleanup():
    core = make_core()
    register(core, "n1:1")
    app_id = submit(core)
    claims = launch_and_register(core, app_id)
    r = core.allocate(claims, api.AllocateRequest(response_id=0, asks=[ask(1, 1)]))
    wid = r.allocated[0].container_id
    core.am_finish(claims, api.AmFinishRequest(final_status="SUCCEEDED", diagnostics="ok"))
    app = core.apps[app_id]
    assert app.state == AppState.FINISHED and app.final_status == FinalStatus.SUCCEEDED and app.progress == 1.0
    assert core.am_finish(claims, api.AmFinishRequest(final_status="SUCCEEDED")).unregistered
    hb = heartbeat(core, "n1:1")
    assert wid in hb.containers_to_cleanup and app_id in hb.apps_to_cleanup
    at = core.attempts[claims["attempt_id"]]
    heartbeat(core, "n1:1", [api.ContainerStatus(container_id=at.am_container_id, state="COMPLETE", exit_status=0)])
    assert at.state == AttemptState.FINISHED
    assert core.nodes.get("n1:1").used == Resource(0, 0)


def test_kill_cleans_up_and_old_token_gets_shutdown():
    core = make_core()
    register(core, "n1:1")
    app_id = submit(core)
    claims = launch_and_register(core, app_id)
    core.kill(app_id)
    app = core.apps[app_id]
    assert app.state == AppState.KILLED and app.final_status == FinalStatus.KILLED
    assert core.allocate(claims, api.AllocateRequest(response_id=1)).action == "SHUTDOWN"
    assert core.kill(app_id).state == AppState.KILLED   # idempotent
    # The AM container stays charged to its node until the NM reports it gone.
    am_cid = core.attempts[claims["attempt_id"]].am_container_id
    assert heartbeat(core, "n1:1").containers_to_cleanup == [am_cid]
    assert core.nodes.get("n1:1").used == Resource(1024, 1)
    heartbeat(core, "n1:1", [api.ContainerStatus(container_id=am_cid, state="COMPLETE", exit_status=-106)])
    assert core.nodes.get("n1:1").used == Resource(0, 0)


def test_release_and_unknown_running_container_cleanup():
    core = make_core()
    register(core, "n1:1")
    app_id = submit(core)
    claims = launch_and_register(core, app_id)
    (c,) = core.allocate(claims, api.AllocateRequest(response_id=0, asks=[ask(1, 1)])).allocated
    r = core.allocate(claims, api.AllocateRequest(response_id=1, releases=[c.container_id]))
    assert [s.diagnostics for s in r.completed] == ["Container released by application"]
    hb = heartbeat(core, "n1:1", [api.ContainerStatus(container_id="container_1_0001_01_000099", state="RUNNING")])
    assert set(hb.containers_to_cleanup) == {c.container_id, "container_1_0001_01_000099"}


def test_unlaunched_container_is_reclaimed():
    clock = FakeClock()
    core = make_core(clock, am_expiry_s=10**6, nm_expiry_s=10**6)
    core.launch_expiry_s = 60
    register(core, "n1:1")
    app_id = submit(core)
    claims = launch_and_register(core, app_id)
    (c,) = core.allocate(claims, api.AllocateRequest(response_id=0, asks=[ask(1, 1)])).allocated
    clock.advance(61)
    heartbeat(core, "n1:1")
    core.tick()
    r = core.allocate(claims, api.AllocateRequest(response_id=1))
    assert [s.diagnostics for s in r.completed] == ["Container expired since it was unused"]


def test_nm_token_must_match_body():
    core = make_core()
    with pytest.raises(Unauthorized):
        core.register_node({"node_id": "other:1"}, api.NodeRegisterRequest(
            node_id="n1:1", http_address="n1:1", capability=Resource(1024, 1)))
    assert core.nodes.nodes == {}


def test_recovery_roundtrip_keeps_the_running_attempt_until_its_node_comes_back_without_it():
    clock = FakeClock()
    core = make_core(clock)
    register(core, "n1:1")
    done = submit(core)
    c1 = launch_and_register(core, done)
    core.am_finish(c1, api.AmFinishRequest(final_status="SUCCEEDED"))
    running = submit(core, max_attempts=1)
    launch_and_register(core, running)
    saved = [(app_to_record(a), [attempt_to_record(core.attempts[x]) for x in a.attempts]) for a in core.apps.values()]
    clock.advance(100)
    core2 = make_core(clock)
    for rec, ats in saved:
        core2.recover(app_from_record(rec, core2.scheduler.min_mb), [attempt_from_record(x) for x in ats])
    assert core2.apps[done].state == AppState.FINISHED
    app = core2.apps[running]
    assert app.state == AppState.RUNNING and len(app.attempts) == 1    # kept (tests/unit/test_rm_work_preserving.py)
    register(core2, "n1:1")             # the node restarted too: the AM is gone
    assert app.state == AppState.ACCEPTED and len(app.attempts) == 2   # restart does not count as a failure
    assert len(core2.take_effects()) == 1


def test_retried_allocate_gets_the_same_answer():
    core = make_core()
    register(core, "n1:1")
    app_id = submit(core)
    claims = launch_and_register(core, app_id)
    first = core.allocate(claims, api.AllocateRequest(response_id=0, asks=[ask(1, 2)]))
    again = core.allocate(claims, api.AllocateRequest(response_id=0, asks=[ask(1, 2)]))
    assert again is first and len(first.allocated) == 2
    nxt = core.allocate(claims, api.AllocateRequest(response_id=first.response_id, asks=[ask(1, 0)]))
    assert nxt.response_id == first.response_id + 1 and nxt.allocated == []
    assert len(core.containers) == 3


def test_register_before_am_allocation_is_refused():
    core = make_core()
    app_id = submit(core)          # no node yet: the AM container is not allocated
    with pytest.raises(BadRequest, match="cannot register"):
        core.am_register(am_claims(core, app_id), api.AmRegisterRequest())
    assert core.apps[app_id].state == AppState.ACCEPTED


def test_a_verified_token_is_checked_again_for_kind_and_expiry_and_its_claims_are_a_copy():
    # Verified tokens are cached (protocol.tokens): the cache must change no answer.
    tok = tokens.sign(SECRET, tokens.NM, {"node_id": "n1:1"}, 60, now=1000.0)
    claims = tokens.verify(SECRET, tok, tokens.NM, now=1000.0)
    claims["node_id"] = "tampered"
    assert tokens.verify(SECRET, tok, tokens.NM, now=1000.0)["node_id"] == "n1:1"
    with pytest.raises(tokens.TokenError, match="expired"):
        tokens.verify(SECRET, tok, tokens.NM, now=1061.0)
    with pytest.raises(tokens.TokenError, match="expected a am token"):
        tokens.verify(SECRET, tok, tokens.AM, now=1000.0)
    with pytest.raises(tokens.TokenError, match="does not match"):
        tokens.verify("another-secret", tok, tokens.NM, now=1000.0)
    encoded, mac = tok.split(".")
    forged = encoded + "." + ("A" if mac[0] != "A" else "B") + mac[1:]
    for _ in range(2):          # a failure is not cached as a success
        with pytest.raises(tokens.TokenError):
            tokens.verify(SECRET, forged, tokens.NM, now=1000.0)


def test_new_application_ids_held_are_bounded_the_oldest_going_first(monkeypatch) -> None:
    from rm import core as core_mod      # noqa: PLC0415
    monkeypatch.setattr(core_mod, "MAX_RESERVED_IDS", 3)
    core = make_core()
    ids = [core.new_application() for _ in range(5)]
    assert list(core.reserved_ids) == ids[2:]          # a client that never submits cannot grow the RM
    with pytest.raises(BadRequest, match="new-application"):
        core.check_submission(ids[0], "default", Resource(256, 1))
    core.check_submission(ids[4], "default", Resource(256, 1))


def test_a_launch_error_after_the_am_registered_is_ignored():
    core = make_core(FakeClock())
    register(core, "n1:1")
    app_id = submit(core, max_attempts=1)
    (eff,) = core.take_effects()
    # The NM started the AM, which registered before the launcher's start_container call failed
    # on the wire (a timeout): the attempt is healthy.
    core.am_register(am_claims(core, app_id), api.AmRegisterRequest(tracking_url="http://am:1"))
    core.am_launch_failed(eff.attempt_id, "TimeoutError: ")
    assert core.apps[app_id].state == AppState.RUNNING
    assert core.attempts[eff.attempt_id].state == AttemptState.RUNNING
    # Before the AM registered, the same error fails the attempt.
    other = submit(core, max_attempts=1)
    (eff2,) = core.take_effects()
    core.am_launch_failed(eff2.attempt_id, "ConnectionRefusedError: ")
    assert core.attempts[eff2.attempt_id].state == AttemptState.FAILED
    assert core.apps[other].state == AppState.FAILED


def test_an_attempt_finishing_when_the_rm_restarted_is_recovered_finished():
    clock = FakeClock()
    core = make_core(clock)
    register(core, "n1:1")
    app_id = submit(core)
    claims = launch_and_register(core, app_id)
    core.am_finish(claims, api.AmFinishRequest(final_status="SUCCEEDED"))
    assert core.attempts[claims["attempt_id"]].state == AttemptState.FINISHING    # its AM container runs on
    app = core.apps[app_id]
    saved = (app_to_record(app), [attempt_to_record(core.attempts[x]) for x in app.attempts])
    clock.advance(100)
    core2 = make_core(clock)
    core2.recover(app_from_record(saved[0], core2.scheduler.min_mb), [attempt_from_record(x) for x in saved[1]])
    core2.recovered()
    at = core2.attempts[claims["attempt_id"]]
    assert core2.apps[app_id].state == AppState.FINISHED
    assert at.state == AttemptState.FINISHED and at.finish_time == clock()
    assert app_id in core2.dirty

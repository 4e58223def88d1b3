"""keep-containers-across-application-attempts in the RM core (pure, fake clock): a failed
attempt's launched containers pass to the next attempt, which gets them in its register reply
(with tokens of its own) and owns their completions and releases; what was never launched, the
AM container, an app that does not keep containers and an app out of attempts are cleaned up as
before; the hand-over survives an RM restart (store records, NM re-registration)."""
from __future__ import annotations

from typing import Any

from protocol import internal_api as api
from protocol import tokens
from protocol.records import AppState, AttemptState, ContainerState, ExitStatus, Resource
from rm.core import ResourceManagerCore
from rm.model import AmSpec
from rm.store import app_from_record, app_to_record, attempt_from_record, attempt_to_record
from rm_testing import SECRET, FakeClock, am_claims, ask, heartbeat, launch_and_register, make_core, nm_claims, \
    ps_spec, register


def submit_keeping(core: ResourceManagerCore, keep: bool = True, max_attempts: int = 2) -> str:
    app_id = core.new_application()
    core.submit(app_id, "alice", "job", "default", "ELASTANE_PS" if keep else "YARN",
                AmSpec(["true"], {}, {}, Resource(1024, 1)), max_attempts, keep_containers=keep)
    core.app_saved(app_id)
    return app_id


def running(cids: list[str]) -> list[api.ContainerStatus]:
    return [api.ContainerStatus(container_id=c, state=ContainerState.RUNNING.value, resource=Resource(1024, 1))
            for c in cids]


def job_with_executors(core: ResourceManagerCore, keep: bool = True,
                       max_attempts: int = 2) -> tuple[str, dict[str, Any], list[str], str]:
    """An app whose AM holds 2 launched executor containers and 1 it has not launched yet."""
    register(core, "n1:1", mem=16384, vcores=16)
    app_id = submit_keeping(core, keep, max_attempts)
    claims = launch_and_register(core, app_id)
    got = core.allocate(claims, api.AllocateRequest(response_id=0, asks=[ask(1, 3, tag="worker")])).allocated
    launched, unlaunched = [c.container_id for c in got[:2]], got[2].container_id
    heartbeat(core, "n1:1", running(launched))
    return app_id, claims, launched, unlaunched


def fail_am(core: ResourceManagerCore, claims: dict[str, Any], launched: list[str]) -> set[str]:
    """The AM's container ends (exit 137: SIGKILL); the containers the node is told to clean up
    in that heartbeat's reply and the next."""
    am_cid = core.attempts[claims["attempt_id"]].am_container_id
    hb = heartbeat(core, "n1:1", running(launched) + [api.ContainerStatus(container_id=am_cid, state="COMPLETE",
                                                                          exit_status=137)])
    return set(hb.containers_to_cleanup) | set(heartbeat(core, "n1:1", running(launched)).containers_to_cleanup)


def test_a_failed_attempts_launched_containers_pass_to_the_next_attempt() -> None:
    core = make_core(FakeClock())
    app_id, first, launched, unlaunched = job_with_executors(core)
    used_before = core.nodes.get("n1:1").used
    cleaned = fail_am(core, first, launched)
    app = core.apps[app_id]
    assert core.attempts[first["attempt_id"]].state == AttemptState.FAILED and len(app.attempts) == 2
    # Only the unlaunched one is cleaned up on the node (the AM container has ended already).
    assert cleaned == {unlaunched}
    assert core.counters["containers_kept_across_attempts"] == 2
    # The kept containers stay charged (the new AM container comes on top, the two gone come off).
    assert core.nodes.get("n1:1").used.memory >= used_before.memory - 2 * 1024

    second = launch_and_register(core, app_id)
    reg = core.am_register(second, api.AmRegisterRequest())
    assert sorted(c.container_id for c in reg.containers_from_previous_attempts) == sorted(launched)
    for c in reg.containers_from_previous_attempts:
        claims = tokens.verify(SECRET, c.container_token, tokens.CONTAINER)
        assert claims["attempt_id"] == second["attempt_id"] and claims["container_id"] == c.container_id
        assert c.node_id == "n1:1" and c.tag == "worker"

    # Their completions go to the new attempt, and it may release them.
    heartbeat(core, "n1:1", [api.ContainerStatus(container_id=launched[0], state="COMPLETE", exit_status=1),
                             *running(launched[1:])])
    r = core.allocate(second, api.AllocateRequest(response_id=0))
    assert [(s.container_id, s.exit_status) for s in r.completed] == [(launched[0], 1)]
    r = core.allocate(second, api.AllocateRequest(response_id=1, releases=[launched[1]]))
    assert [s.container_id for s in r.completed] == [launched[1]]
    assert launched[1] in heartbeat(core, "n1:1", running(launched[1:])).containers_to_cleanup
    # The register reply lists only what still runs.
    assert core.am_register(second, api.AmRegisterRequest()).containers_from_previous_attempts == []


def test_an_app_that_does_not_keep_containers_loses_them_with_its_attempt() -> None:
    core = make_core(FakeClock())
    app_id, first, launched, unlaunched = job_with_executors(core, keep=False)
    cleaned = fail_am(core, first, launched)
    assert len(core.apps[app_id].attempts) == 2
    assert cleaned == {*launched, unlaunched}
    second = launch_and_register(core, app_id)
    assert core.am_register(second, api.AmRegisterRequest()).containers_from_previous_attempts == []


def test_the_last_attempt_keeps_nothing() -> None:
    core = make_core(FakeClock(), max_app_attempts=1)
    app_id, first, launched, unlaunched = job_with_executors(core, max_attempts=1)
    cleaned = fail_am(core, first, launched)
    app = core.apps[app_id]
    assert app.state == AppState.FAILED
    assert cleaned >= {*launched, unlaunched}
    assert core.counters["containers_kept_across_attempts"] == 0


def test_kept_containers_survive_an_rm_restart_with_the_attempt_that_took_them() -> None:
    clock = FakeClock()
    core = make_core(clock, am_expiry_s=60)
    core.container_epoch = 1
    app_id, first, launched, _ = job_with_executors(core)
    fail_am(core, first, launched)
    second = launch_and_register(core, app_id)
    am2 = core.attempts[second["attempt_id"]].am_container_id
    saved = [(app_to_record(a), [attempt_to_record(core.attempts[x]) for x in a.attempts]) for a in core.apps.values()]
    clock.advance(5)
    new = make_core(clock, am_expiry_s=60)
    new.container_epoch = 2
    for rec, ats in saved:
        new.recover(app_from_record(rec, new.scheduler.min_mb), [attempt_from_record(x) for x in ats])
    app = new.apps[app_id]
    assert app.keep_containers and new.attempts[second["attempt_id"]].previous_containers == launched
    statuses = running(launched) + [api.ContainerStatus(container_id=am2, state=ContainerState.RUNNING.value,
                                                        resource=Resource(1024, 1), role="am")]
    resp = new.register_node(nm_claims("n1:1"), api.NodeRegisterRequest(
        node_id="n1:1", http_address="n1:1", capability=Resource(16384, 16), containers=statuses))
    assert resp is not None
    # Re-adopted into the attempt that took them over (their ids name the first attempt).
    assert set(launched) <= new.attempts[second["attempt_id"]].containers
    assert not set(launched) & set(heartbeat(new, "n1:1", statuses).containers_to_cleanup)
    claims = am_claims(new, app_id)
    new.am_register(claims, api.AmRegisterRequest())
    r = new.allocate(claims, api.AllocateRequest(response_id=0, releases=[launched[0]]))
    assert [(s.container_id, s.exit_status) for s in r.completed] == [(launched[0], ExitStatus.ABORTED)]


def test_the_next_am_needs_room_only_for_the_gang_executors_it_is_not_handed() -> None:
    """Gang admission of attempt 2 counts the executors it is handed: with its AM's node lost,
    the 3 executors left are the job's, and room for the 4th and an AM is all it needs (it waited
    for ever for 4 new ones before, with its own 3 in the way)."""
    core = make_core(FakeClock(), gang_shape="minimum", max_app_attempts=2)
    for n in ("n1:1", "n2:1"):
        register(core, n, mem=8192, vcores=3)
    app_id = core.new_application()
    core.submit(app_id, "alice", "ps", "default", "ELASTANE_PS", AmSpec(["true"], {}, {}, Resource(1024, 1)), 2,
                ps_job=ps_spec({"app": "mlr", "workers": 2, "servers": 2, "min_workers": 2, "min_servers": 2,
                                "executor_memory_mb": 1024, "executor_vcores": 1}), keep_containers=True)
    core.app_saved(app_id)
    first = launch_and_register(core, app_id)
    got = core.allocate(first, api.AllocateRequest(response_id=0, asks=[ask(1, 4, tag="worker")])).allocated
    assert len(got) == 4
    for n in ("n1:1", "n2:1"):
        heartbeat(core, n, running([c.container_id for c in got if c.node_id == n]))
    am_node = core.attempts[first["attempt_id"]].am_node_id
    lost_node = am_node
    kept = [c.container_id for c in got if c.node_id != lost_node]
    # The AM's container fails on its node; one executor there fails with it.
    on_lost = [c.container_id for c in got if c.node_id == lost_node]
    am_cid = core.attempts[first["attempt_id"]].am_container_id
    heartbeat(core, lost_node, [api.ContainerStatus(container_id=c, state="COMPLETE", exit_status=-100)
                                for c in on_lost] + [api.ContainerStatus(container_id=am_cid, state="COMPLETE",
                                                                         exit_status=-100)])
    app = core.apps[app_id]
    assert len(app.attempts) == 2
    assert core.scheduler.apps[app_id].gang_held == len(kept)
    for n in ("n1:1", "n2:1"):
        heartbeat(core, n, running([c for c in kept if core.containers[c].node_id == n]))
    second = core.attempts[app.attempts[1]]
    assert second.am_container_id, core.apps[app_id].diagnostics      # admitted: 4 - kept executors fit

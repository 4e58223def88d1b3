"""Work-preserving RM restart and failover in the RM core (pure, fake clock): a running attempt is
kept; its AM is told it is not registered, registers again and goes on; its containers are
re-adopted from the NMs' registrations (app, queue and node accounting as before, ids never
issued twice); containers of ended or unknown attempts are cleaned up; an AM that never comes back
(or whose container its node no longer runs) gives way to a new attempt, not counted."""
from __future__ import annotations

from typing import Any

import pytest

from protocol import internal_api as api
from protocol.ids import ContainerId
from protocol.records import ZERO, AppState, AttemptState, ContainerState, ExitStatus, Resource
from protocol.remote_exception import ApplicationMasterNotRegistered
from rm.core import ResourceManagerCore
from rm.store import SqliteStateStore, app_from_record, app_to_record, attempt_from_record, attempt_to_record
from rm_testing import FakeClock, ask, heartbeat, launch_and_register, make_core, nm_claims, register, submit

AM_EXPIRY_S = 60.0


def running_job(clock: FakeClock, executors: int = 2) -> tuple[ResourceManagerCore, str, dict[str, Any]]:
    """An RM of epoch 1 with one node and an app whose registered AM holds `executors` launched
    containers of 1024 MB."""
    core = make_core(clock, am_expiry_s=AM_EXPIRY_S)
    core.container_epoch = 1
    register(core, "n1:1")
    app_id = submit(core)
    claims = launch_and_register(core, app_id)
    resp = core.allocate(claims, api.AllocateRequest(response_id=0, asks=[ask(1, executors, tag="worker")]))
    assert len(resp.allocated) == executors
    heartbeat(core, "n1:1", running_statuses(core))         # the NM launched them
    return core, app_id, claims


def running_statuses(core: ResourceManagerCore, with_role: bool = False) -> list[api.ContainerStatus]:
    """What the node reports of every container the RM placed there, as an NM does at registration."""
    return [api.ContainerStatus(container_id=c.container_id, state=ContainerState.RUNNING.value,
                                resource=c.resource, role=(c.tag if not c.is_am else "am") if with_role else "")
            for c in core.containers.values()]


def fail_over(clock: FakeClock, old: ResourceManagerCore, epoch: int = 2) -> ResourceManagerCore:
    """A new RM (the next epoch) recovering from what the old one stored."""
    saved = [(app_to_record(a), [attempt_to_record(old.attempts[x]) for x in a.attempts]) for a in old.apps.values()]
    clock.advance(5)
    new = make_core(clock, am_expiry_s=AM_EXPIRY_S)
    new.container_epoch = epoch
    for rec, ats in saved:
        new.recover(app_from_record(rec, new.scheduler.min_mb), [attempt_from_record(x) for x in ats])
    return new


def reregister(core: ResourceManagerCore, node_id: str, statuses: list[api.ContainerStatus]) -> None:
    core.register_node(nm_claims(node_id), api.NodeRegisterRequest(
        node_id=node_id, http_address=node_id, capability=Resource(8192, 8), containers=statuses))


def test_the_kept_attempt_resyncs_and_its_containers_are_readopted_with_their_accounting():
    clock = FakeClock()
    old, app_id, claims = running_job(clock)
    attempt_id = old.apps[app_id].current_attempt
    reported = running_statuses(old, with_role=True)
    used_before = old.nodes.get("n1:1").used
    queue_before = old.scheduler.queues["default"].used
    am_gate_before = old.scheduler.queues["default"].am.used

    new = fail_over(clock, old)
    app = new.apps[app_id]
    assert app.state == AppState.RUNNING and app.attempts == [attempt_id]
    assert new.attempts[attempt_id].state == AttemptState.RUNNING
    assert new.take_effects() == []                     # no new AM: the old one still runs
    with pytest.raises(ApplicationMasterNotRegistered, match="register again"):
        new.allocate(claims, api.AllocateRequest(response_id=7))

    reregister(new, "n1:1", reported)
    assert set(new.containers) == {s.container_id for s in reported}
    assert new.nodes.get("n1:1").used == used_before
    assert new.scheduler.queues["default"].used == queue_before
    assert new.scheduler.queues["default"].am.used == am_gate_before
    assert new.scheduler.apps[app_id].used == queue_before
    assert sorted(c.tag for c in new.containers.values()) == ["AM", "worker", "worker"]
    assert new.counters["containers_recovered"] == 3
    assert heartbeat(new, "n1:1", reported).containers_to_cleanup == []

    # The AM registers again (the same attempt, no transition) and resends its ask table.
    new.am_register(claims, api.AmRegisterRequest(tracking_url="http://am:1"))
    assert app.state == AppState.RUNNING and app.attempts == [attempt_id]
    resp = new.allocate(claims, api.AllocateRequest(response_id=0, asks=[ask(1, 1, tag="worker")]))
    (fresh,) = resp.allocated
    assert ContainerId.parse(fresh.container_id).epoch == 2
    assert fresh.container_id not in {s.container_id for s in reported}     # never issued twice
    assert new.nodes.get("n1:1").used == used_before + Resource(1024, 1)


def test_an_am_that_never_registers_again_gives_way_to_a_new_attempt_not_counted():
    clock = FakeClock()
    old, app_id, _ = running_job(clock)
    attempt_id = old.apps[app_id].current_attempt
    reported = running_statuses(old)
    new = fail_over(clock, old)
    reregister(new, "n1:1", reported)       # the node is back with everything running...
    clock.advance(AM_EXPIRY_S - 1)
    heartbeat(new, "n1:1", reported)
    new.tick()
    assert new.apps[app_id].attempts == [attempt_id]     # ...and the wait is not over yet
    clock.advance(2)
    heartbeat(new, "n1:1", reported)
    new.tick()
    at = new.attempts[attempt_id]
    assert at.state == AttemptState.FAILED and not at.counts_as_failure
    assert "did not register again" in at.diagnostics
    app = new.apps[app_id]
    assert len(app.attempts) == 2 and app.state == AppState.ACCEPTED
    # Its containers are released and the NM told to clean them up; the new AM is launched.
    assert sorted(heartbeat(new, "n1:1", reported).containers_to_cleanup) == sorted(s.container_id for s in reported)
    (eff,) = new.take_effects()
    assert eff.attempt_id == app.current_attempt


def test_a_node_back_without_the_kept_am_container_fails_the_attempt_and_cleans_up_the_rest():
    clock = FakeClock()
    old, app_id, _ = running_job(clock)
    attempt_id = old.apps[app_id].current_attempt
    executors = [s for s in running_statuses(old) if s.container_id != old.attempts[attempt_id].am_container_id]
    new = fail_over(clock, old)
    reregister(new, "n1:1", executors)      # the AM died while no RM was active
    at = new.attempts[attempt_id]
    assert at.state == AttemptState.FAILED and not at.counts_as_failure
    assert len(new.apps[app_id].attempts) == 2
    assert sorted(heartbeat(new, "n1:1", executors).containers_to_cleanup) == sorted(s.container_id for s in executors)
    (eff,) = new.take_effects()         # the new attempt's AM
    # The old executors stay charged to the node until its NM reports them gone.
    assert new.nodes.get("n1:1").used == Resource(3072, 3)
    heartbeat(new, "n1:1", [api.ContainerStatus(container_id=s.container_id, state="COMPLETE", exit_status=-105)
                            for s in executors])
    assert new.nodes.get("n1:1").used == eff.container.resource


def test_containers_of_ended_or_unknown_attempts_are_cleaned_up_and_completions_reach_the_am():
    clock = FakeClock()
    old, app_id, claims = running_job(clock)
    statuses = running_statuses(old)
    am_cid = old.attempts[old.apps[app_id].current_attempt].am_container_id
    done_exec = next(s for s in statuses if s.container_id != am_cid)
    finished = api.ContainerStatus(container_id=done_exec.container_id, state=ContainerState.COMPLETE.value,
                                   exit_status=0, resource=done_exec.resource)
    stranger = api.ContainerStatus(container_id="container_e01_1_0099_01_000002", state="RUNNING",
                                   resource=Resource(1024, 1))
    new = fail_over(clock, old)
    others = [s for s in statuses if s.container_id != done_exec.container_id]
    reregister(new, "n1:1", others + [finished, stranger])
    assert stranger.container_id not in new.containers and done_exec.container_id not in new.containers
    assert heartbeat(new, "n1:1", others).containers_to_cleanup == [stranger.container_id]
    new.am_register(claims, api.AmRegisterRequest())
    resp = new.allocate(claims, api.AllocateRequest(response_id=0))
    assert [(s.container_id, s.exit_status) for s in resp.completed] == [(done_exec.container_id, 0)]


def test_a_release_sent_before_the_node_reregisters_is_cleaned_up_when_it_does():
    clock = FakeClock()
    old, app_id, claims = running_job(clock)
    statuses = running_statuses(old)
    am_cid = old.attempts[old.apps[app_id].current_attempt].am_container_id
    victim = next(s.container_id for s in statuses if s.container_id != am_cid)
    new = fail_over(clock, old)
    new.am_register(claims, api.AmRegisterRequest())
    new.allocate(claims, api.AllocateRequest(response_id=0, releases=[victim]))
    reregister(new, "n1:1", statuses)
    assert victim not in new.containers
    assert heartbeat(new, "n1:1", statuses).containers_to_cleanup == [victim]
    resp = new.allocate(claims, api.AllocateRequest(response_id=1))
    assert [(s.container_id, s.exit_status) for s in resp.completed] == [(victim, ExitStatus.ABORTED)]
    # The node keeps it charged until the NM reports it gone, then it is free again.
    gone = [s for s in statuses if s.container_id != victim]
    heartbeat(new, "n1:1", gone + [api.ContainerStatus(container_id=victim, state="COMPLETE", exit_status=-105)])
    assert new.nodes.get("n1:1").used == Resource(2048, 2)


def test_an_attempt_without_an_am_container_yet_is_replaced_and_own_epoch_strangers_are_not_adopted():
    clock = FakeClock()
    old = make_core(clock, am_expiry_s=AM_EXPIRY_S)
    old.container_epoch = 1
    app_id = submit(old)                # no node: the AM container is not allocated
    new = fail_over(clock, old)
    app = new.apps[app_id]
    assert app.state == AppState.ACCEPTED and len(app.attempts) == 2
    assert new.attempts[app.attempts[0]].state == AttemptState.FAILED
    register(new, "n1:1")
    (eff,) = new.take_effects()
    # A container of the new RM's own epoch that it does not know was ended here (e.g. on a node
    # it lost): cleaned up, not adopted, even for the current attempt.
    own = api.ContainerStatus(container_id=str(ContainerId(ContainerId.parse(eff.container.container_id).attempt, 7, 2)),
                              state="RUNNING", resource=Resource(1024, 1))
    reregister(new, "n1:1", [api.ContainerStatus(container_id=eff.container.container_id, state="RUNNING",
                                                 resource=eff.container.resource), own])
    assert own.container_id not in new.containers
    assert own.container_id in heartbeat(new, "n1:1").containers_to_cleanup


def test_the_am_of_a_kept_attempt_may_finish_after_registering_again():
    clock = FakeClock()
    old, app_id, claims = running_job(clock)
    reported = running_statuses(old)
    new = fail_over(clock, old)
    reregister(new, "n1:1", reported)
    with pytest.raises(ApplicationMasterNotRegistered):
        new.am_finish(claims, api.AmFinishRequest(final_status="SUCCEEDED"))
    new.am_register(claims, api.AmRegisterRequest())
    new.am_finish(claims, api.AmFinishRequest(final_status="SUCCEEDED"))
    assert new.apps[app_id].state == AppState.FINISHED
    assert new.scheduler.queues["default"].used != ZERO      # the AM container until it exits


def test_the_sqlite_store_gives_each_rm_start_the_next_epoch(tmp_path):
    epochs = []
    for _ in range(3):
        store = SqliteStateStore(tmp_path)
        epochs.append(store.next_epoch())
        store.close()
    assert epochs == [0, 1, 2]

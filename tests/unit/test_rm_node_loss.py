"""RM core (pure, fake clock): a lost host is processed completely whatever it held, and an attempt
lost with its node does not count toward max-app-attempts (YARN's shouldCountTowardsMaxAttemptRetry)."""
from __future__ import annotations

from collections import Counter
from typing import Any

from protocol import internal_api as api
from protocol.records import ZERO, AppState, AttemptState, ExitStatus, FinalStatus, NodeState
from rm.core import ResourceManagerCore
from rm.state_machines import counts_toward_max_attempts
from rm_testing import FakeClock, am_claims, ask, heartbeat, launch_and_register, make_core, register, submit


def _executors(core: ResourceManagerCore, claims: dict[str, Any], node: str, n: int,
               response_id: int = 0) -> list[str]:
    r = core.allocate(claims, api.AllocateRequest(response_id=response_id, asks=[
        ask(1, n, 1024, nodes=[node], relax_locality=False)]))
    assert [c.node_id for c in r.allocated] == [node] * n
    return [c.container_id for c in r.allocated]


def _live(core: ResourceManagerCore, clock: FakeClock, seconds: float, nodes: list[str], step: float = 1.0) -> None:
    """Let `seconds` pass in `step`s, `nodes` heartbeating and the RM ticking."""
    t = 0.0
    while t < seconds:
        clock.advance(step)
        t += step
        for n in nodes:
            heartbeat(core, n)
        core.tick()


def _am_container(core: ResourceManagerCore, app_id: str) -> str:
    return core.attempts[core.apps[app_id].current_attempt or ""].am_container_id


def _queue_used_matches_containers(core: ResourceManagerCore) -> bool:
    held = ZERO
    for c in core.containers.values():
        held = held + c.resource
    return core.scheduler.queues["default"].used == held


def test_counting_rule_mirrors_yarn() -> None:
    for status in (ExitStatus.ABORTED, ExitStatus.PREEMPTED, ExitStatus.DISKS_FAILED,
                   ExitStatus.KILLED_BY_RESOURCEMANAGER):
        assert not counts_toward_max_attempts(status)
    for status in (1, 0, ExitStatus.INVALID, ExitStatus.KILLED_EXCEEDED_PMEM, ExitStatus.KILLED_BY_APPMASTER):
        assert counts_toward_max_attempts(status)


def test_a_lost_node_holding_an_am_its_executors_and_another_apps_containers_is_processed_completely() -> None:
    clock = FakeClock()
    core = make_core(clock, nm_expiry_s=10, am_expiry_s=1000)
    # h2 has room for B's AM only, so A's AM goes to h1 (the scheduler takes the first node that fits).
    register(core, "h2:1", mem=1024, vcores=1)
    b = submit(core, user="bob")
    b_claims = launch_and_register(core, b)
    register(core, "h1:1")
    a = submit(core)
    a_claims = launch_and_register(core, a)
    a_first = a_claims["attempt_id"]
    assert core.containers[_am_container(core, a)].node_id == "h1:1"
    a_execs = _executors(core, a_claims, "h1:1", 2)
    b_execs = _executors(core, b_claims, "h1:1", 2)
    register(core, "h3:1")

    _live(core, clock, 11, ["h2:1", "h3:1"])        # h1 goes silent: A's AM and its executors go with it

    assert core.nodes.get("h1:1").state == NodeState.LOST and not core.nodes.get("h1:1").containers
    assert not any(c.node_id == "h1:1" for c in core.containers.values())
    # B's AM hears of each of its containers there once, ABORTED, and of the lost node.
    r = core.allocate(b_claims, api.AllocateRequest(response_id=2))
    assert Counter((s.container_id, s.exit_status) for s in r.completed) == Counter(
        {(cid, ExitStatus.ABORTED): 1 for cid in b_execs})
    assert [(n.node_id, n.state) for n in r.updated_nodes] == [("h1:1", "LOST")]
    # A's attempt failed with its node; its executors there were completed once each before it ended.
    first = core.attempts[a_first]
    assert first.state == AttemptState.FAILED and not first.counts_as_failure
    assert Counter((s.container_id, s.exit_status) for s in first.completed) == Counter(
        {(cid, ExitStatus.ABORTED): 1 for cid in a_execs})
    # A new attempt, its AM placed on a live node.
    assert core.apps[a].state == AppState.ACCEPTED and len(core.apps[a].attempts) == 2
    heartbeat(core, "h3:1")
    assert core.containers[_am_container(core, a)].node_id == "h3:1"
    assert _queue_used_matches_containers(core)


def test_two_nodes_expiring_in_one_tick_are_both_processed() -> None:
    clock = FakeClock()
    core = make_core(clock, nm_expiry_s=10, am_expiry_s=1000)
    register(core, "h1:1", mem=3072, vcores=3)
    a = submit(core)
    a_claims = launch_and_register(core, a)
    _executors(core, a_claims, "h1:1", 2)           # A's AM and two executors fill h1
    register(core, "h2:1")
    b = submit(core, user="bob")
    b_claims = launch_and_register(core, b)
    assert core.containers[_am_container(core, b)].node_id == "h2:1"
    _executors(core, b_claims, "h2:1", 2)
    _executors(core, a_claims, "h2:1", 1, response_id=1)    # and one of A's on B's node
    register(core, "h3:1")

    _live(core, clock, 11, ["h3:1"], step=11)       # one tick finds both silent

    for node in ("h1:1", "h2:1"):
        assert core.nodes.get(node).state == NodeState.LOST and not core.nodes.get(node).containers
    assert not any(c.node_id in ("h1:1", "h2:1") for c in core.containers.values())
    for app_id in (a, b):
        app = core.apps[app_id]
        assert len(app.attempts) == 2 and app.state == AppState.ACCEPTED
        first = core.attempts[app.attempts[0]]
        assert first.state == AttemptState.FAILED and not first.counts_as_failure
        assert "lost with its node" in first.diagnostics
    assert _queue_used_matches_containers(core)
    heartbeat(core, "h3:1")
    assert {core.containers[_am_container(core, x)].node_id for x in (a, b)} == {"h3:1"}


def test_an_nm_that_reregisters_without_its_am_and_executors_loses_them_all() -> None:
    core = make_core()
    register(core, "h1:1")
    a = submit(core)
    claims = launch_and_register(core, a)
    _executors(core, claims, "h1:1", 2)
    register(core, "h1:1")          # restarted without recovery: reports none of them
    first = core.attempts[claims["attempt_id"]]
    assert first.state == AttemptState.FAILED and not first.counts_as_failure
    assert "not counted" in first.diagnostics
    assert len(core.apps[a].attempts) == 2
    assert _queue_used_matches_containers(core)


def _fail_current_by_node_loss(core: ResourceManagerCore, clock: FakeClock, app_id: str, doomed: str,
                               alive: list[str]) -> None:
    """Place the current attempt's AM on `doomed` (the next node to heartbeat), then lose that node."""
    heartbeat(core, doomed)
    launch_and_register(core, app_id)
    assert core.containers[_am_container(core, app_id)].node_id == doomed
    _live(core, clock, 11, alive)
    assert core.nodes.get(doomed).state == NodeState.LOST


def test_node_losses_do_not_use_up_attempts_but_am_failures_do() -> None:
    clock = FakeClock()
    core = make_core(clock, nm_expiry_s=10, am_expiry_s=10, max_app_attempts=2)
    app_id = submit(core, max_attempts=2)
    for n in ("h1:1", "h2:1", "h3:1"):
        register(core, n)
    core.take_effects()
    app = core.apps[app_id]
    assert core.containers[_am_container(core, app_id)].node_id == "h1:1"

    launch_and_register(core, app_id)
    _live(core, clock, 11, ["h2:1", "h3:1"])
    _fail_current_by_node_loss(core, clock, app_id, "h2:1", ["h3:1"])
    assert len(app.attempts) == 3 and app.state == AppState.ACCEPTED   # two losses, a third attempt
    for aid in app.attempts[:2]:
        at = core.attempts[aid]
        assert at.state == AttemptState.FAILED and not at.counts_as_failure
        assert "lost with its node" in at.diagnostics and "not counted" in at.diagnostics

    # A real AM failure counts: two of them end the app.
    for _ in range(2):
        heartbeat(core, "h3:1")
        launch_and_register(core, app_id)
        am_cid = _am_container(core, app_id)
        heartbeat(core, "h3:1", [api.ContainerStatus(container_id=am_cid, state="COMPLETE", exit_status=1)])
    assert [core.attempts[a].counts_as_failure for a in app.attempts] == [False, False, True, True]
    assert app.state == AppState.FAILED and app.final_status == FinalStatus.FAILED
    assert "failed 2 times" in app.diagnostics and "exitCode: 1" in app.diagnostics


def test_an_am_expiring_just_before_its_silent_node_is_lost_with_the_node() -> None:
    clock = FakeClock()
    core = make_core(clock, nm_expiry_s=10, am_expiry_s=10, max_app_attempts=1)
    register(core, "h1:1")
    app_id = submit(core, max_attempts=1)
    register(core, "h2:1")
    claims = launch_and_register(core, app_id)
    first = core.attempts[claims["attempt_id"]]
    clock.advance(1)
    heartbeat(core, "h1:1")         # the NM's last word comes after the AM's
    heartbeat(core, "h2:1")
    clock.advance(9.5)              # the AM is past its expiry, the NM not yet past its own
    heartbeat(core, "h2:1")
    core.tick()
    assert core.nodes.get("h1:1").state == NodeState.RUNNING
    assert first.state == AttemptState.RUNNING      # the node's verdict decides
    clock.advance(1)
    heartbeat(core, "h2:1")
    core.tick()
    assert core.nodes.get("h1:1").state == NodeState.LOST
    assert first.state == AttemptState.FAILED and not first.counts_as_failure
    assert "lost with its node h1:1" in first.diagnostics
    app = core.apps[app_id]
    assert app.state == AppState.ACCEPTED and len(app.attempts) == 2   # even with max attempts 1
    heartbeat(core, "h2:1")
    assert core.containers[_am_container(core, app_id)].node_id == "h2:1"


def test_an_expired_am_whose_silent_node_comes_back_counts() -> None:
    clock = FakeClock()
    core = make_core(clock, nm_expiry_s=10, am_expiry_s=10, max_app_attempts=1)
    register(core, "h1:1")
    app_id = submit(core, max_attempts=1)
    claims = launch_and_register(core, app_id)
    clock.advance(1)
    heartbeat(core, "h1:1")
    clock.advance(9.5)
    core.tick()
    first = core.attempts[claims["attempt_id"]]
    assert first.state == AttemptState.RUNNING
    clock.advance(0.25)
    heartbeat(core, "h1:1")         # the node lives after all: the AM itself stopped
    core.tick()
    assert first.state == AttemptState.FAILED and first.counts_as_failure and "timed out" in first.diagnostics
    assert core.apps[app_id].state == AppState.FAILED


def test_an_expired_am_that_calls_again_while_its_node_is_silent_lives_on() -> None:
    clock = FakeClock()
    core = make_core(clock, nm_expiry_s=10, am_expiry_s=10)
    register(core, "h1:1")
    app_id = submit(core)
    launch_and_register(core, app_id)
    clock.advance(1)
    heartbeat(core, "h1:1")
    clock.advance(9.5)
    core.tick()
    claims = am_claims(core, app_id)
    assert core.allocate(claims, api.AllocateRequest(response_id=0)).action != "SHUTDOWN"
    clock.advance(0.25)
    heartbeat(core, "h1:1")
    core.tick()
    assert core.attempts[claims["attempt_id"]].state == AttemptState.RUNNING

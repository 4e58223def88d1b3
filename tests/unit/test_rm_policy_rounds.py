"""Policies off the RM's event loop (rm/policy_runner.py, rm/server.py): a Decision taken on a
snapshot is applied only if the core has not moved past it; decide runs in a worker thread on a
copy of the policy, which becomes the live policy only with an applied Decision."""
from __future__ import annotations

import asyncio
import threading
from typing import Any

from protocol import internal_api as api
from protocol.config import ClusterConfig, RMConfig
from protocol.job_report import JobReport
from rm.policies import ClusterSnapshot, Decision, JobDecision
from rm.policy_runner import decide_on_copy, finish_round, is_stale, start_round
from rm.server import ResourceManagerServer
from rm_testing import SECRET, FakeClock, heartbeat, launch_and_register, make_core, register, submit

from polling import async_wait_until


class Grow:
    """Asks every app for 3 workers and 1 server; counts its decides (its own state)."""

    name = "grow"

    def __init__(self) -> None:
        self.rounds = 0

    def decide(self, snapshot: ClusterSnapshot) -> Decision:
        self.rounds += 1
        return Decision({a.app_id: JobDecision(workers=3, servers=1, reason="grow") for a in snapshot.apps})


def running_app(core: Any) -> tuple[str, dict[str, Any]]:
    register(core, "n1:1")
    app_id = submit(core)
    claims = launch_and_register(core, app_id)
    core.allocate(claims, api.AllocateRequest(response_id=0, shape=JobReport(workers=1, servers=1, started=True)))
    return app_id, claims


def test_a_decision_on_an_unchanged_core_is_applied() -> None:
    core = make_core()
    app_id, _ = running_app(core)
    rnd = start_round(core)
    assert finish_round(core, rnd, Grow().decide(rnd.snapshot)) == 1
    assert (core.apps[app_id].directive.workers, core.apps[app_id].directive.servers) == (3, 1)


def test_a_state_change_between_snapshot_and_decision_drops_it() -> None:
    core = make_core()
    app_id, _ = running_app(core)
    rnd = start_round(core)
    submit(core, user="bob")                    # a new app arrives while the policy decides
    assert finish_round(core, rnd, Grow().decide(rnd.snapshot)) is None
    assert core.apps[app_id].directive is None  # nothing applied


def test_a_changed_shape_report_makes_the_snapshot_stale_but_progress_alone_does_not() -> None:
    core = make_core()
    app_id, claims = running_app(core)
    rnd = start_round(core)
    core.allocate(claims, api.AllocateRequest(response_id=1, shape=JobReport(
        workers=1, servers=1, started=True, iterations=50, epoch=2, speed=3.0)))
    assert finish_round(core, rnd, Grow().decide(rnd.snapshot)) == 1

    rnd = start_round(core)
    core.allocate(claims, api.AllocateRequest(response_id=2, shape=JobReport(workers=2, servers=1, started=True)))
    assert finish_round(core, rnd, Decision({app_id: JobDecision(workers=4, servers=2)})) is None
    assert core.apps[app_id].directive.workers == 3


def test_a_quiet_heartbeat_keeps_the_snapshot_current_and_a_health_flip_does_not() -> None:
    core = make_core()
    app_id, _ = running_app(core)
    rnd = start_round(core)
    heartbeat(core, "n1:1")
    assert not is_stale(core, rnd)
    heartbeat(core, "n1:1", healthy=False)
    assert finish_round(core, rnd, Grow().decide(rnd.snapshot)) is None


def test_an_applied_directive_moves_the_core_so_a_second_decision_on_the_old_snapshot_is_dropped() -> None:
    core = make_core()
    app_id, _ = running_app(core)
    rnd = start_round(core)
    assert finish_round(core, rnd, Grow().decide(rnd.snapshot)) == 1
    assert finish_round(core, rnd, Decision({app_id: JobDecision(workers=1, servers=1)})) is None


def test_decide_on_copy_leaves_the_live_policy_as_it_was() -> None:
    core = make_core()
    running_app(core)
    live = Grow()
    decided = decide_on_copy(live, start_round(core).snapshot)
    assert live.rounds == 0 and isinstance(decided.policy, Grow) and decided.policy.rounds == 1
    assert len(decided.decision.jobs) == 1


def test_every_registered_policy_can_decide_on_a_copy() -> None:
    from rm import policies
    core = make_core()
    running_app(core)
    for name in policies.known():
        p = policies.create(name)
        snap = start_round(core).snapshot

        def state(policy: object) -> tuple[object, object]:
            return policies.export_state(policy), policies.describe(policy)

        live_before = state(p)
        first = decide_on_copy(p, snap)
        assert first.policy is not p and state(p) == live_before, name      # the live one untouched
        assert decide_on_copy(p, snap).decision == first.decision, name    # so a retry decides alike
        after_first = state(first.policy)
        again = decide_on_copy(first.policy, snap)     # the copy's state copies too
        assert again.policy is not first.policy and state(first.policy) == after_first, name
        assert isinstance(again.decision, Decision), name


class Gated(Grow):
    """Blocks its first decide until the test opens the gate (a slow solve, e.g. Dorm's MILP)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.gate = threading.Event()

    def decide(self, snapshot: ClusterSnapshot) -> Decision:
        if self.rounds == 0:
            self.entered.set()
            assert self.gate.wait(30), "the test never opened the gate"
        return super().decide(snapshot)

    def __deepcopy__(self, memo: dict[int, Any]) -> "Gated":
        return self      # the test's gate must reach the thread; the rounds count shows the copy's use


def make_server(tmp_path: Any) -> ResourceManagerServer:
    return ResourceManagerServer(RMConfig(state_dir=str(tmp_path / "state")), ClusterConfig(secret=SECRET, admins=["root"]),
                                 clock=FakeClock(), run_timers=False)


async def test_the_loop_serves_heartbeats_while_the_policy_decides(tmp_path) -> None:
    server = make_server(tmp_path)
    try:
        app_id, _ = running_app(server.core)
        policy = server.policy = Gated()
        task = asyncio.create_task(server.policy_round())
        await async_wait_until(policy.entered.is_set, what="decide started in the worker thread")
        # The decide is blocked, yet the loop runs: a heartbeat is answered meanwhile.
        assert heartbeat(server.core, "n1:1").response_id > 0
        await asyncio.sleep(0)
        assert not task.done()
        policy.gate.set()
        assert await task == 1
        assert server.core.apps[app_id].directive.workers == 3 and server.policy_rounds["applied"] == 1
    finally:
        await server.stop()


async def test_a_round_whose_core_moved_is_dropped_and_decided_again_on_a_fresh_snapshot(tmp_path) -> None:
    server = make_server(tmp_path)
    try:
        running_app(server.core)
        policy = server.policy = Gated()
        task = asyncio.create_task(server.policy_round())
        await async_wait_until(policy.entered.is_set, what="decide started in the worker thread")
        late = submit(server.core, user="bob")       # arrives while the policy decides
        policy.gate.set()
        assert await task == 2                       # the retry saw both apps
        assert server.policy_rounds == {"applied": 1, "dropped": 1} and policy.rounds == 2
        assert server.core.apps[late].directive is not None
    finally:
        await server.stop()


async def test_a_round_that_stays_stale_gives_up_without_applying(tmp_path) -> None:
    server = make_server(tmp_path)
    try:
        app_id, _ = running_app(server.core)
        core = server.core

        class Churn(Grow):
            def decide(self, snapshot: ClusterSnapshot) -> Decision:
                core.policy_changed()        # the core moves during every decide
                return super().decide(snapshot)

        server.policy = Churn()
        assert await server.policy_round(retries=2) is None
        assert server.policy_rounds == {"applied": 0, "dropped": 3} and core.apps[app_id].directive is None
    finally:
        await server.stop()

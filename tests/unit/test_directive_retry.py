"""A directive its job acted on and came short of goes out again, with a backoff (rm/directive_retry.py)."""
from __future__ import annotations

from protocol import internal_api as api
from protocol.internal_api import NodePlacement, RunState, ShapeDirective
from protocol.job_report import JobReport
from protocol.records import Resource
from rm.directive_retry import FIRST_RETRY_S, MAX_RETRY_S, SENT_AGAIN, DirectiveRetries, has_room, lacking, short_of
from rm.model import AmSpec
from rm.policies import Decision, JobDecision
from rm.policy_runner import apply_decision
from rm_testing import FakeClock, launch_and_register, make_core, ps_spec, register


def d(version: int, workers: int = 4, servers: int = 2, **kw: object) -> ShapeDirective:
    return ShapeDirective(workers=workers, servers=servers, version=version, **kw)  # type: ignore[arg-type]


def report(version: int, workers: int, servers: int = 2, changing: bool = False) -> JobReport:
    return JobReport(workers=workers, servers=servers, directive_version=version, changing=changing)


def test_short_of_needs_the_directive_acted_on_and_a_different_shape():
    assert short_of(d(3), report(3, 2))
    assert short_of(d(3), report(4, 2))                 # acted on a later one (the RM's count is behind)
    assert not short_of(d(3), report(3, 4))             # reached
    assert not short_of(d(3), report(2, 2))             # not acted on yet
    assert not short_of(d(3), report(3, 2, changing=True))
    assert not short_of(d(3, run_state=RunState.PAUSE), report(3, 2))
    assert not short_of(None, report(3, 2)) and not short_of(d(3), None)


def test_backoff_doubles_while_the_retries_come_short_and_starts_over_once_reached():
    r = DirectiveRetries()
    t, version = 100.0, 1
    assert not r.due("a", d(version), report(version, 2), t)          # settled short: the wait starts
    assert not r.due("a", d(version), report(version, 2), t + FIRST_RETRY_S - 1)
    waits = []
    for _ in range(6):
        start = t
        while not r.due("a", d(version), report(version, 2), t):
            t += 1.0
        waits.append(t - start)
        version += 1                                                   # the RM numbers it anew
        r.renumbered("a", version)
        assert not r.due("a", d(version), report(version - 1, 2), t)   # not acted on yet
        assert not r.due("a", d(version), report(version - 1, 2, changing=True), t + 1)
        t += 2.0
        assert not r.due("a", d(version), report(version, 2), t)       # short again: the next wait starts
    assert waits == [FIRST_RETRY_S, 2 * FIRST_RETRY_S, 4 * FIRST_RETRY_S, 8 * FIRST_RETRY_S, MAX_RETRY_S, MAX_RETRY_S]
    assert not r.due("a", d(version), report(version, 4), t)          # reached: forgotten
    assert "a" not in r.apps
    assert not r.due("a", d(version), report(version, 2), t + 1)      # short once more: from the first wait
    assert not r.due("a", d(version), report(version, 2), t + FIRST_RETRY_S)
    assert r.due("a", d(version), report(version, 2), t + 1 + FIRST_RETRY_S)


def test_a_new_directive_from_the_policy_starts_the_count_over():
    r = DirectiveRetries()
    assert not r.due("a", d(1), report(1, 2), 0.0)
    assert r.due("a", d(1), report(1, 2), FIRST_RETRY_S)
    r.renumbered("a", 2)
    assert not r.due("a", d(2), report(2, 2), FIRST_RETRY_S + 1)
    # the policy decides another shape (version 3, not one the retry numbered): the first wait again
    assert not r.due("a", d(3, workers=6), report(3, 3), 500.0)
    assert not r.due("a", d(3, workers=6), report(3, 3), 500.0 + FIRST_RETRY_S - 1)
    assert r.due("a", d(3, workers=6), report(3, 3), 500.0 + FIRST_RETRY_S)


def test_what_the_job_lacks_and_whether_the_nodes_hold_it():
    ex = Resource(1024, 1)
    anywhere = d(1, workers=4, servers=2)
    assert lacking(anywhere, report(1, 3, 1), ()) == {"": 2}
    placed = d(1, workers=4, servers=2, placement=[NodePlacement("a", 2, 1), NodePlacement("b", 2, 1)])
    held = (NodePlacement("a", 2, 1), NodePlacement("b", 1, 0))
    assert lacking(placed, report(1, 3, 1), held) == {"b": 2}
    free = {"a": Resource(4096, 4), "b": Resource(1024, 8)}
    assert not has_room({"b": 2}, ex, free)                 # b has the vcores, not the memory
    assert has_room({"b": 1}, ex, free)
    assert has_room({"": 5}, ex, free) and not has_room({"": 6}, ex, free)   # 4 on a, 1 on b
    assert not has_room({"c": 1}, ex, free)                 # a node not running holds nothing


def test_a_due_retry_waits_for_room_uncounted():
    r = DirectiveRetries()
    assert not r.due("a", d(1), report(1, 2), 0.0)
    asked: list[float] = []

    def no_room() -> bool:
        asked.append(1.0)
        return False
    assert not r.due("a", d(1), report(1, 2), 1.0, room=no_room)
    assert asked == []                                       # not due yet: the nodes are not looked at
    assert not r.due("a", d(1), report(1, 2), 10 * FIRST_RETRY_S, room=no_room)
    assert asked and r.apps["a"].retries == 0
    assert r.due("a", d(1), report(1, 2), 10 * FIRST_RETRY_S + 1)


def submit_ps(core) -> str:
    app_id = core.new_application()
    core.submit(app_id, "alice", "job", "default", "ELASTANE_PS", AmSpec(["true"], {}, {}, Resource(1024, 1)), 1,
                ps_job=ps_spec({"app": "mlr", "workers": 1, "servers": 1, "executor_memory_mb": 1024,
                                "executor_vcores": 1, "max_workers": 8, "max_servers": 4}))
    core.app_saved(app_id)
    return app_id


def test_the_rm_sends_the_same_directive_again_under_a_new_version():
    clock = FakeClock()
    core = make_core(clock)
    register(core, "n1:1")                                 # 8 GB, 8 vcores; the AM holds 1 GB, 1 vcore
    app_id = submit_ps(core)
    claims = launch_and_register(core, app_id)
    app = core.apps[app_id]
    grow = Decision({app_id: JobDecision(workers=4, servers=2, reason="grow")})
    assert apply_decision(core, grow) == 1 and app.directive.version == 1
    # the AM acted on version 1 and came short: 3 workers
    core.allocate(claims, api.AllocateRequest(response_id=0, shape=report(1, 3)))
    assert apply_decision(core, grow) == 0                 # the same decision: nothing new yet
    clock.advance(FIRST_RETRY_S - 1)
    assert apply_decision(core, Decision()) == 0
    # due now, but another app's containers fill the node: the retry waits for room
    node = core.nodes.nodes["n1:1"]
    saved, node.used = node.used, node.capability
    clock.advance(1)
    assert apply_decision(core, Decision()) == 0 and app.directive.version == 1
    node.used = saved
    assert apply_decision(core, Decision()) == 1           # no decision names it: the RM's own retry
    again = core.allocate(claims, api.AllocateRequest(response_id=1, shape=report(1, 3))).shape_directive
    assert again is not None and (again.workers, again.servers, again.version) == (4, 2, 2)
    assert "came short" in again.reason and again.reason.startswith("grow")
    # came short again: the next retry's reason is the policy's with one "sent again", not two
    core.allocate(claims, api.AllocateRequest(response_id=2, shape=report(2, 3)))
    assert apply_decision(core, Decision()) == 0
    clock.advance(2 * FIRST_RETRY_S)
    assert apply_decision(core, Decision()) == 1 and app.directive.version == 3
    assert app.directive.reason == f"grow; {SENT_AGAIN} (retry 2)"
    assert app_id in core.dirty                            # stored with its new version
    # reached on the retry: nothing more goes out, however long
    core.allocate(claims, api.AllocateRequest(response_id=3, shape=report(3, 4)))
    clock.advance(10 * MAX_RETRY_S)
    assert apply_decision(core, Decision()) == 0 and app.directive.version == 3

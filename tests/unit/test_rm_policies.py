"""Policy slot: registry, the static policy, snapshot, typed Decisions and directive delivery."""
from __future__ import annotations

import pytest

from protocol import codec
from protocol import internal_api as api
from protocol.internal_api import NodePlacement, RunState
from protocol.job_report import JobReport
from rm import policies
from rm.policies import Decision, DecisionError, JobDecision
from rm.policy_runner import apply_decision, build_snapshot, run_policy
from rm_testing import heartbeat, launch_and_register, make_core, register, submit


def test_registry_and_static_policy():
    assert "static" in policies.known()
    p = policies.create("static")
    core = make_core()
    assert p.decide(build_snapshot(core)) == Decision()
    with pytest.raises(KeyError, match="known policies"):
        policies.create("nope")


def test_snapshot_and_directive_delivered_once():
    core = make_core()
    register(core, "n1:1")
    app_id = submit(core)
    claims = launch_and_register(core, app_id)
    core.allocate(claims, api.AllocateRequest(response_id=0, shape=JobReport(workers=1, servers=1)))
    snap = build_snapshot(core)
    (view,) = snap.apps
    assert view.app_id == app_id and view.shape == JobReport(workers=1, servers=1)
    assert snap.total.memory == 8192 and snap.used.memory == 1024 and len(snap.nodes) == 1

    class Grow:
        name = "grow"

        def decide(self, snapshot):
            return Decision({a.app_id: JobDecision(workers=4, servers=2, reason="test") for a in snapshot.apps})

    assert run_policy(core, Grow()) == 1
    assert run_policy(core, Grow()) == 0          # unchanged directive is not re-issued
    r = core.allocate(claims, api.AllocateRequest(response_id=1))
    assert (r.shape_directive.workers, r.shape_directive.servers, r.shape_directive.version) == (4, 2, 1)
    assert core.allocate(claims, api.AllocateRequest(response_id=2)).shape_directive is None
    assert apply_decision(core, Decision({"application_1_9999": JobDecision(workers=1, servers=1)})) == 0
    heartbeat(core, "n1:1")


def test_a_decision_with_placement_becomes_a_directive_with_placement_and_nodes():
    jd = JobDecision(workers=3, servers=2, placement=(NodePlacement("n2:1", workers=2, servers=1),
                                                      NodePlacement("n1:1", workers=1, servers=1)),
                     group="g1", run_state=RunState.RESUME, reason="co-locate")
    d = jd.directive(7)
    assert (d.workers, d.servers, d.version, d.group, d.run_state, d.reason) == (3, 2, 7, "g1", RunState.RESUME,
                                                                                  "co-locate")
    assert d.placement == [NodePlacement("n2:1", 2, 1), NodePlacement("n1:1", 1, 1)]
    assert d.nodes == ["n2:1", "n1:1"]          # the union of the placement's nodes, for older readers
    # The wire form round-trips (the AM decodes it from the allocate response).
    wire = codec.decode_as(codec.dumps(api.AllocateResponse(response_id=1, shape_directive=d)), api.AllocateResponse)
    assert wire.shape_directive == d
    assert codec.loads(codec.dumps(d))["run_state"] == "resume"
    # No placement: anywhere, running, no group.
    plain = JobDecision(workers=1, servers=1).directive(1)
    assert (plain.placement, plain.nodes, plain.group, plain.run_state) == ([], [], None, RunState.RUN)


def test_a_placement_must_add_up_to_the_shape():
    with pytest.raises(DecisionError, match="placement holds"):
        JobDecision(workers=3, servers=1, placement=(NodePlacement("n1:1", workers=2, servers=1),))
    with pytest.raises(DecisionError, match="twice"):
        JobDecision(workers=2, servers=0, placement=(NodePlacement("n1:1", 1), NodePlacement("n1:1", 1)))
    with pytest.raises(DecisionError, match="negative"):
        JobDecision(workers=-1, servers=1)


def test_versions_bump_only_when_the_decision_changes_the_directive():
    core = make_core()
    register(core, "n1:1")
    register(core, "n2:1")
    app_id = submit(core)
    launch_and_register(core, app_id)
    app = core.apps[app_id]

    def apply(jd: JobDecision) -> int:
        return apply_decision(core, Decision({app_id: jd}))

    here = (NodePlacement("n1:1", 2, 1),)
    assert apply(JobDecision(2, 1, reason="first")) == 1 and app.directive.version == 1
    assert apply(JobDecision(2, 1, reason="same shape, new words")) == 0 and app.directive.reason == "first"
    assert apply(JobDecision(2, 1, placement=here)) == 1 and app.directive.nodes == ["n1:1"]
    assert apply(JobDecision(2, 1, placement=here)) == 0
    assert apply(JobDecision(2, 1, placement=(NodePlacement("n2:1", 2, 1),))) == 1      # moved
    assert apply(JobDecision(2, 1, placement=(NodePlacement("n2:1", 2, 1),), group="g")) == 1
    assert apply(JobDecision(2, 1, placement=(NodePlacement("n2:1", 2, 1),), group="g",
                             run_state=RunState.PAUSE)) == 1
    assert apply(JobDecision(3, 1)) == 1
    assert (app.directive.version, app.directive_version, app.directive.run_state) == (6, 6, RunState.RUN)
    assert app.directive.placement == [] and app.directive.group is None

"""Policy slot: registry, the static policy, snapshot and directive delivery."""
from __future__ import annotations

import pytest

from protocol import internal_api as api
from rm import policies
from rm.policy_runner import apply_directives, build_snapshot, run_policy
from rm.testing import heartbeat, launch_and_register, make_core, register, submit


def test_registry_and_static_policy():
    assert "static" in policies.known()
    p = policies.create("static")
    core = make_core()
    assert p.decide(build_snapshot(core)) == {}
    with pytest.raises(KeyError, match="known policies"):
        policies.create("nope")


def test_snapshot_and_directive_delivered_once():
    core = make_core()
    register(core, "n1:1")
    app_id = submit(core)
    claims = launch_and_register(core, app_id)
    core.allocate(claims, api.AllocateRequest(response_id=0, shape={"workers": 1, "servers": 1}))
    snap = build_snapshot(core)
    (view,) = snap.apps
    assert view.app_id == app_id and view.shape == {"workers": 1, "servers": 1}
    assert snap.total.memory == 8192 and snap.used.memory == 1024 and len(snap.nodes) == 1

    class Grow:
        name = "grow"

        def decide(self, snapshot):
            return {a.app_id: api.ShapeDirective(workers=4, servers=2, reason="test") for a in snapshot.apps}

    assert run_policy(core, Grow()) == 1
    assert run_policy(core, Grow()) == 0          # unchanged directive is not re-issued
    r = core.allocate(claims, api.AllocateRequest(response_id=1))
    assert (r.shape_directive.workers, r.shape_directive.servers, r.shape_directive.version) == (4, 2, 1)
    assert core.allocate(claims, api.AllocateRequest(response_id=2)).shape_directive is None
    assert apply_directives(core, {"application_1_9999": api.ShapeDirective(workers=1, servers=1)}) == 0
    heartbeat(core, "n1:1")

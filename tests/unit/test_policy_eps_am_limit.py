"""The EPS H-scheduler and the queue AM resource limit: an app whose AM the limit holds back waits in
the queue (no growth of running jobs) but nothing is shrunk for it. Also the known limitation of
counting free resources cluster-wide when they are fragmented over nodes."""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from protocol import internal_api as api
from protocol.job_report import JobReport
from protocol.internal_api import ShapeDirective
from protocol.records import ZERO, Resource
from rm.model import AmSpec
from rm.policies import AppView, ClusterSnapshot, Decision, EpsPolicy, NodeView, PSJobView, ps_job_view
from rm.policies.eps_jobs import classify
from rm.policy_runner import build_snapshot, run_policy
from rm_testing import ask, launch_and_register, make_core, ps_spec, register

E = Resource(1024, 1)          # one executor
AM = Resource(1024, 1)         # one AM container


def report(w: int, s: int, speed_its: int = 20) -> JobReport:
    return JobReport(workers=w, servers=s, started=True, iterations=200, early_feedback=True,
                              early_feedback_iterations=100, speed=2.0, speed_iterations=speed_its,
                              executor_resource=E)


def raw_spec(w: int, s: int, max_w: Optional[int] = None, max_s: Optional[int] = None) -> dict:
    out = {"app": "mlr", "workers": w, "servers": s, "executor_memory_mb": E.memory, "executor_vcores": E.vcores}
    if max_w is not None:
        out["max_workers"], out["max_servers"] = max_w, max_s
    return out


def spec(w: int, s: int, max_w: Optional[int] = None, max_s: Optional[int] = None) -> Optional[PSJobView]:
    return ps_job_view(raw_spec(w, s, max_w, max_s))


def running(app_id: str, t: float, w: int, s: int, max_w: Optional[int] = None,
            max_s: Optional[int] = None) -> AppView:
    return AppView(app_id, "default", "alice", "RUNNING", t, AM + E.scale(w + s), report(w, s),
                   spec(w, s, max_w, max_s), am_resource=AM)


def waiting(app_id: str, t: float, w: int, s: int, am_limited: bool) -> AppView:
    """A PS job in ACCEPTED: its AM asked for, not allocated; `am_limited` if the AM limit holds it."""
    return AppView(app_id, "default", "alice", "ACCEPTED", t, ZERO, None, spec(w, s), am_resource=AM,
                   pending=AM, am_limited=am_limited)


def snap(apps: list[AppView], total_units: int, now: float = 1000.0,
         nodes: tuple[NodeView, ...] = ()) -> ClusterSnapshot:
    used = sum((a.resources for a in apps), ZERO)
    return ClusterSnapshot(now=now, total=E.scale(total_units), used=used, nodes=nodes, apps=tuple(apps))


def shapes(decision: Decision) -> dict[str, tuple[int, int]]:
    return {a: (d.workers, d.servers) for a, d in decision.jobs.items()}


def full_cluster() -> list[AppView]:
    # A: 1 AM + 4w + 2s, B: 1 AM + 3w + 3s: 13 units, all of the cluster.
    return [running("app_A", 1, 4, 2), running("app_B", 2, 3, 3)]


# ----- synthetic snapshots -------------------------------------------------------------------------

def test_job_held_by_the_am_limit_shrinks_nobody_but_the_same_job_admitted_does():
    held = waiting("app_D", 10, 2, 2, am_limited=True)
    assert EpsPolicy().decide(snap(full_cluster() + [held], total_units=13)).jobs == {}
    # The flag is what makes the difference: admitted, D makes A and B give up 5 executors' worth.
    out = shapes(EpsPolicy().decide(snap(full_cluster() + [replace(held, am_limited=False)], total_units=13)))
    assert out == {"app_A": (2, 1), "app_B": (2, 2)}


def test_held_job_is_classified_as_held_not_incoming():
    view = classify(snap(full_cluster() + [waiting("app_D", 10, 2, 2, am_limited=True)], total_units=13))
    assert view.incoming == () and view.other_queued == () and view.held == ("app_D",)
    assert view.queued and not view.startable_waiting


def test_held_job_waits_in_the_queue_so_running_jobs_do_not_grow():
    apps = [running("app_A", 1, 2, 1, max_w=4, max_s=3), running("app_B", 2, 2, 2, max_w=4, max_s=3)]
    # With 10 units free and nobody waiting, both jobs get a worker and a server on trial.
    assert shapes(EpsPolicy().decide(snap(apps, total_units=20))) == {"app_A": (3, 2), "app_B": (3, 3)}
    # A held job is a submitted job waiting in the queue (EPS §4): running-job scheduling does not run.
    held = waiting("app_D", 10, 1, 1, am_limited=True)
    assert EpsPolicy().decide(snap(apps + [held], total_units=20)).jobs == {}


def test_held_non_ps_app_blocks_growth_and_shrinks_nobody():
    apps = [running("app_A", 1, 2, 1, max_w=4, max_s=3)]
    yarn_app = AppView("app_Y", "default", "bob", "ACCEPTED", 5, ZERO, pending=AM, am_limited=True)
    assert EpsPolicy().decide(snap(apps + [yarn_app], total_units=20)).jobs == {}
    assert classify(snap(apps + [yarn_app], total_units=20)).held == ("app_Y",)


def test_addition_on_trial_is_not_taken_back_for_a_held_job():
    policy = EpsPolicy()
    a = running("app_A", 1, 2, 1, max_w=4, max_s=3)
    assert shapes(policy.decide(snap([a], total_units=7, now=0))) == {"app_A": (3, 2)}
    grown = replace(a, directive=ShapeDirective(workers=3, servers=2, version=1), shape=report(3, 2, speed_its=0),
                    resources=AM + E.scale(5))
    held = waiting("app_D", 10, 1, 1, am_limited=True)
    # Freeing the trial's executors could not start D: the trial stays, no directive changes.
    assert policy.decide(snap([grown, held], total_units=6, now=5)).jobs == {}
    # Once the limit admits D, the addition on trial is the first thing given back.
    out = shapes(policy.decide(snap([grown, replace(held, am_limited=False)], total_units=6, now=6)))
    assert out == {"app_A": (1, 1)}


def test_held_job_does_not_block_an_admitted_job_behind_it():
    # D (older) is held; E (behind it, e.g. in another queue or with a smaller AM) is admitted.
    apps = full_cluster() + [waiting("app_D", 10, 4, 4, am_limited=True), waiting("app_E", 11, 1, 1, am_limited=False)]
    out = EpsPolicy().decide(snap(apps, total_units=13))
    # E lacks its AM + 1 worker + 1 server: 3 executors' worth, freed for E alone.
    removed = sum(6 - w - s for w, s in shapes(out).values())
    assert removed == 3 and all("app_E" in d.reason for d in out.jobs.values())


def test_fragmented_free_resources_are_counted_cluster_wide():
    """Known limitation (module doc of rm/policies/eps.py): 3 units are free cluster-wide but only
    half a unit per node, so no node can take D's AM or an executor. The policy, counting cluster-wide
    like the paper's H-scheduler, sees D as fitting and shrinks nobody; D waits for a node to free up."""
    half = Resource(512, 1)
    nodes = tuple(NodeView(f"n{i}:1", "/r", "RUNNING", E.scale(4), E.scale(4) - half) for i in range(6))
    apps = [running("app_A", 1, 6, 5), running("app_B", 2, 5, 5)]     # 21 of 24 units held
    d = waiting("app_D", 10, 1, 1, am_limited=False)
    total = E.scale(24)
    snapshot = ClusterSnapshot(now=1000.0, total=total, used=total - half.scale(6), nodes=nodes,
                               apps=tuple(apps + [d]))
    assert EpsPolicy().decide(snapshot).jobs == {}


# ----- in the ResourceManager ----------------------------------------------------------------------

def submit_ps(core, workers: int, servers: int, name: str) -> str:
    app_id = core.new_application()
    core.submit(app_id, "alice", name, "default", "ELASTANE_PS", AmSpec(["true"], {}, {}, AM), 1,
                ps_job=ps_spec(raw_spec(workers, servers)))
    core.app_saved(app_id)
    return app_id


def test_snapshot_marks_the_app_the_am_limit_holds_back_and_eps_leaves_the_running_job_alone():
    # AM limit: 10% of 6 GB rounds to 640 MB, under one AM: the queue runs one AM at a time.
    core = make_core(policy="eps", max_am_resource_percent=0.1)
    register(core, "n1:1", mem=6 * 1024, vcores=6)
    a = submit_ps(core, 3, 2, "A")
    claims = launch_and_register(core, a)
    r = core.allocate(claims, api.AllocateRequest(response_id=0, asks=[ask(1, 3, tag="worker"),
                                                                       ask(2, 2, tag="server")]))
    assert len(r.allocated) == 5
    core.allocate(claims, api.AllocateRequest(response_id=r.response_id, shape=report(3, 2)))

    b = submit_ps(core, 1, 1, "B")
    assert core.apps[b].state.value == "ACCEPTED" and "AM resource limit" in core.apps[b].diagnostics
    views = {v.app_id: v for v in build_snapshot(core).apps}
    assert views[b].am_limited and not views[a].am_limited
    policy = EpsPolicy()
    assert run_policy(core, policy) == 0 and core.apps[a].directive is None
    # Without the flag the same snapshot would shrink A for B (the bug this guards against).
    unflagged = replace(build_snapshot(core), apps=tuple(replace(v, am_limited=False)
                                                         for v in build_snapshot(core).apps))
    assert shapes(EpsPolicy().decide(unflagged)) == {a: (1, 1)}

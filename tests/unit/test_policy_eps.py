"""The EPS H-scheduler (rm/policies/eps.py) on synthetic cluster snapshots."""
from __future__ import annotations

import random
from dataclasses import replace
from typing import Optional

import msgspec

from protocol.job_report import JobReport
from protocol.internal_api import ShapeDirective
from protocol.records import ZERO, Resource
from rm import policies
from rm.policies import AppView, ClusterSnapshot, Decision, EpsPolicy, ps_job_view

E = Resource(1024, 1)          # one executor
AM = Resource(1024, 1)         # one AM container


def report(w: int, s: int, ef: bool = True, speed: float = 2.0, speed_its: int = 20, started: bool = True,
           changing: bool = False) -> JobReport:
    return JobReport(workers=w, servers=s, started=started, changing=changing, iterations=200,
                              early_feedback=ef, early_feedback_iterations=100, speed=speed,
                              speed_iterations=speed_its, executor_resource=E)


def ps_app(app_id: str, t: float, w: int, s: int, *, state: str = "RUNNING", max_w: Optional[int] = None,
           max_s: Optional[int] = None, shape: Optional[JobReport] = None, held: Optional[Resource] = None,
           directive: Optional[tuple[int, int]] = None, ef: bool = True, speed: float = 2.0) -> AppView:
    spec = {"app": "mlr", "workers": w, "servers": s, "executor_memory_mb": E.memory, "executor_vcores": E.vcores}
    if max_w is not None:
        spec["max_workers"] = max_w
    if max_s is not None:
        spec["max_servers"] = max_s
    if state == "RUNNING" and shape is None:
        shape = report(w, s, ef=ef, speed=speed)
    if held is None:
        held = AM + E.scale(w + s) if state == "RUNNING" else ZERO
    d = None if directive is None else ShapeDirective(workers=directive[0], servers=directive[1], version=1)
    return AppView(app_id, "default", "alice", state, t, held, shape, ps_job_view(spec), am_resource=AM,
                   directive=d)


def incoming(app_id: str, t: float, w: int, s: int) -> AppView:
    return ps_app(app_id, t, w, s, state="ACCEPTED")


def snap(apps: list[AppView], total_units: int, now: float = 1000.0) -> ClusterSnapshot:
    used = sum((a.resources for a in apps), ZERO)
    return ClusterSnapshot(now=now, total=E.scale(total_units), used=used, apps=tuple(apps))


def shapes(decision: Decision) -> dict[str, tuple[int, int]]:
    return {a: (d.workers, d.servers) for a, d in decision.jobs.items()}


def full_cluster() -> list[AppView]:
    # A: 1 AM + 4w + 2s, B: 1 AM + 3w + 3s, C (still in its early-feedback phase): 1 AM + 4w + 4s.
    return [ps_app("app_A", 1, 4, 2), ps_app("app_B", 2, 3, 3), ps_app("app_C", 3, 4, 4, ef=False)]


# ----- incoming-job scheduling -------------------------------------------------------------------

def test_full_cluster_shrinks_jobs_with_early_feedback_round_robin_just_enough():
    apps = full_cluster() + [incoming("app_D", 10, 2, 2)]
    # D lacks its AM + 2 workers + 2 servers = 5 executors' worth, and nothing is free.
    out = EpsPolicy().decide(snap(apps, total_units=23))
    # Workers: 2 for D + 1 for its AM, most workers first (A 4, B 3): A, B, A.
    # Servers: 2, most servers first (B 3, A 2): B, A. C has no early feedback: untouched.
    assert shapes(out) == {"app_A": (2, 1), "app_B": (2, 2)}
    assert all("app_D" in d.reason for d in out.jobs.values())


def test_free_resources_count_so_only_the_shortfall_is_removed():
    apps = full_cluster() + [incoming("app_D", 10, 2, 2)]
    out = EpsPolicy().decide(snap(apps, total_units=25))   # 2 executors' worth free
    removed = sum(4 + 2 - w - s for w, s in [shapes(out).get("app_A", (4, 2))]) + \
        sum(3 + 3 - w - s for w, s in [shapes(out).get("app_B", (3, 3))])
    assert removed == 3          # 5 needed - 2 free
    assert "app_C" not in out.jobs


def test_jobs_with_one_worker_or_server_keep_it():
    apps = [ps_app("app_A", 1, 1, 3), ps_app("app_B", 2, 1, 1), ps_app("app_C", 3, 3, 1),
            incoming("app_D", 10, 1, 1)]
    # D lacks AM + 1w + 1s = 3; the worker split is 1 (+1 for its AM) and the server split 1.
    out = EpsPolicy().decide(snap(apps, total_units=sum(1 + w + s for w, s in [(1, 3), (1, 1), (3, 1)])))
    assert shapes(out) == {"app_A": (1, 2), "app_C": (1, 1)}
    assert "app_B" not in out.jobs


def test_jobs_keep_their_spec_minimums():
    a = ps_app("app_A", 1, 3, 3)
    assert a.ps is not None
    a = replace(a, ps=replace(a.ps, min_workers=3, min_servers=2))
    apps = [a, ps_app("app_B", 2, 3, 3), incoming("app_D", 10, 1, 1)]
    out = EpsPolicy().decide(snap(apps, total_units=14))    # D lacks AM + 1w + 1s = 3
    assert shapes(out).get("app_A", (3, 3))[0] == 3 and shapes(out).get("app_A", (3, 3))[1] >= 2
    assert shapes(out)["app_B"][0] < 3                      # the workers come from B


def test_job_fitting_in_free_resources_shrinks_nothing():
    apps = full_cluster() + [incoming("app_D", 10, 2, 2)]
    assert EpsPolicy().decide(snap(apps, total_units=23 + 5)).jobs == {}


def test_job_that_cannot_fit_even_after_shrinking_shrinks_nothing():
    apps = full_cluster() + [incoming("app_D", 10, 8, 8)]
    assert EpsPolicy().decide(snap(apps, total_units=23)).jobs == {}
    # ... and a smaller job behind it waits too (FIFO), while nothing grows.
    apps.append(incoming("app_E", 11, 1, 1))
    assert EpsPolicy().decide(snap(apps, total_units=23)).jobs == {}


def test_shrink_in_flight_is_not_asked_for_twice():
    apps = full_cluster() + [incoming("app_D", 10, 2, 2)]
    policy = EpsPolicy()
    first = shapes(policy.decide(snap(apps, total_units=23)))
    # The RM now holds those directives; the AMs have not released anything yet.
    apps2 = [replace(a, directive=ShapeDirective(workers=first[a.app_id][0], servers=first[a.app_id][1], version=1))
             if a.app_id in first else a for a in apps]
    assert policy.decide(snap(apps2, total_units=23)).jobs == {}
    # Half-way: A released its containers (it reports and holds 2w + 1s); still nothing more.
    apps3 = [replace(a, shape=report(2, 1), resources=AM + E.scale(3)) if a.app_id == "app_A" else a for a in apps2]
    assert policy.decide(snap(apps3, total_units=23)).jobs == {}


def test_two_incoming_jobs_are_served_in_submission_order():
    apps = full_cluster() + [incoming("app_E", 11, 1, 1), incoming("app_D", 10, 1, 1)]
    out = shapes(EpsPolicy().decide(snap(apps, total_units=23)))
    removed = (6 - sum(out.get("app_A", (4, 2)))) + (6 - sum(out.get("app_B", (3, 3))))
    assert removed == 6          # 3 for D, then 3 for E


# ----- running-job scheduling --------------------------------------------------------------------

def test_free_resources_add_one_worker_and_server_per_training_job_capped_by_max():
    apps = [ps_app("app_A", 1, 2, 1, max_w=4, max_s=3), ps_app("app_B", 2, 1, 1, max_w=2, max_s=1),
            ps_app("app_C", 3, 1, 1, max_w=5, max_s=5, ef=False), ps_app("app_D", 4, 2, 2)]   # D: no max
    out = EpsPolicy().decide(snap(apps, total_units=40))
    assert shapes(out) == {"app_A": (3, 2), "app_B": (2, 1)}
    assert "trial" in out.jobs["app_A"].reason


def test_growth_is_round_robin_fewest_first_within_the_free_resources():
    apps = [ps_app("app_A", 1, 3, 1, max_w=9, max_s=9), ps_app("app_B", 2, 1, 2, max_w=9, max_s=9),
            ps_app("app_C", 3, 2, 3, max_w=9, max_s=9)]
    used = sum(1 + w + s for w, s in [(3, 1), (1, 2), (2, 3)])
    # Cluster ratio 6 workers : 6 servers; 2 executors free -> one worker, one server.
    out = EpsPolicy().decide(snap(apps, total_units=used + 2))
    assert shapes(out) == {"app_B": (2, 2), "app_A": (3, 2)}


def test_no_growth_while_any_job_is_queued():
    apps = [ps_app("app_A", 1, 2, 1, max_w=4, max_s=3)]
    other = AppView("app_X", "default", "bob", "ACCEPTED", 5, ZERO, pending=Resource(1024, 1))
    assert EpsPolicy().decide(snap(apps + [other], total_units=40)).jobs == {}


def test_jobs_without_measured_speed_or_mid_change_do_not_grow():
    apps = [ps_app("app_A", 1, 2, 1, max_w=4, max_s=3, shape=report(2, 1, speed_its=0)),
            ps_app("app_B", 2, 2, 1, max_w=4, max_s=3, shape=report(2, 1, changing=True))]
    assert EpsPolicy().decide(snap(apps, total_units=40)).jobs == {}


def _trial_sequence(policy: EpsPolicy, speed_after: float) -> list[dict[str, tuple[int, int]]]:
    """A grows (2,1)->(3,2), applies it, then reports `speed_after` (it ran at 2.0 before)."""
    out = []
    a = ps_app("app_A", 1, 2, 1, max_w=4, max_s=3, speed=2.0)
    out.append(shapes(policy.decide(snap([a], total_units=40, now=0))))
    grown = replace(a, directive=ShapeDirective(workers=3, servers=2, version=1))
    moving = replace(grown, shape=report(2, 1, changing=True))
    out.append(shapes(policy.decide(snap([moving], total_units=40, now=5))))
    applied = replace(grown, shape=report(3, 2, speed=0.0, speed_its=0), resources=AM + E.scale(5))
    out.append(shapes(policy.decide(snap([applied], total_units=40, now=10))))
    measured = replace(applied, shape=report(3, 2, speed=speed_after, speed_its=20))
    out.append(shapes(policy.decide(snap([measured], total_units=40, now=60))))
    return out


def test_speed_drop_after_an_addition_takes_it_back_and_caps_the_job():
    policy = EpsPolicy()
    seq = _trial_sequence(policy, speed_after=1.5)
    assert seq == [{"app_A": (3, 2)}, {}, {}, {"app_A": (2, 1)}]
    # Back at (2, 1) with plenty free: it is not grown again.
    a = ps_app("app_A", 1, 2, 1, max_w=4, max_s=3, directive=(2, 1))
    assert policy.decide(snap([a], total_units=40, now=120)).jobs == {}


def test_speed_kept_after_an_addition_keeps_it_and_growth_continues():
    policy = EpsPolicy()
    # Kept: the job is settled with a trusted speed, so the next round grows it again (a new trial).
    assert _trial_sequence(policy, speed_after=2.5) == [{"app_A": (3, 2)}, {}, {}, {"app_A": (4, 3)}]


def test_addition_never_applied_is_taken_back_after_the_settle_timeout():
    policy = EpsPolicy()
    a = ps_app("app_A", 1, 2, 1, max_w=4, max_s=3)
    assert shapes(policy.decide(snap([a], total_units=40, now=0))) == {"app_A": (3, 2)}
    stuck = replace(a, directive=ShapeDirective(workers=3, servers=2, version=1))
    assert policy.decide(snap([stuck], total_units=40, now=60)).jobs == {}
    out = policy.decide(snap([stuck], total_units=40, now=policy.cfg.settle_timeout_s + 1))
    assert shapes(out) == {"app_A": (2, 1)} and "taking it back" in out.jobs["app_A"].reason
    # It is not tried again until another settle timeout has passed.
    back = replace(a, directive=ShapeDirective(workers=2, servers=1, version=2))
    assert policy.decide(snap([back], total_units=40, now=policy.cfg.settle_timeout_s + 2)).jobs == {}
    assert shapes(policy.decide(snap([back], total_units=40, now=2 * policy.cfg.settle_timeout_s + 2))) == \
        {"app_A": (3, 2)}


def test_incoming_job_takes_back_additions_on_trial_first():
    policy = EpsPolicy()
    a = ps_app("app_A", 1, 2, 1, max_w=4, max_s=3)
    policy.decide(snap([a], total_units=4, now=0))
    grown = replace(a, directive=ShapeDirective(workers=3, servers=2, version=1), shape=report(3, 2, speed_its=0),
                    resources=AM + E.scale(5))
    # The cluster is full; D needs 3 executors' worth. Taking the trial back frees 2; one more goes.
    d = incoming("app_D", 10, 1, 1)
    out = shapes(policy.decide(snap([grown, d], total_units=6, now=5)))
    assert out == {"app_A": (1, 1)}


# ----- determinism and the static policy ---------------------------------------------------------

def test_decisions_are_deterministic_and_ignore_snapshot_order():
    apps = full_cluster() + [incoming("app_D", 10, 2, 2), incoming("app_E", 12, 1, 1)]
    expected = EpsPolicy().decide(snap(apps, total_units=23))
    rng = random.Random(7)
    for _ in range(5):
        shuffled = apps[:]
        rng.shuffle(shuffled)
        assert EpsPolicy().decide(snap(shuffled, total_units=23)) == expected


def test_static_policy_gives_no_directives_and_eps_is_registered():
    apps = full_cluster() + [incoming("app_D", 10, 2, 2)]
    assert policies.create("static").decide(snap(apps, total_units=23)).jobs == {}
    assert isinstance(policies.create("eps"), EpsPolicy)


def test_non_ps_apps_and_jobs_without_a_report_are_left_alone():
    yarn_app = AppView("app_Y", "default", "bob", "RUNNING", 1, Resource(4096, 4),
                       shape=JobReport(workers=3, servers=1))
    silent = replace(ps_app("app_B", 2, 2, 2), shape=None)       # holds all it asked for, never reported
    assert EpsPolicy().decide(snap([yarn_app, silent], total_units=40)).jobs == {}


def test_running_ps_job_without_started_report_blocks_nothing_once_it_holds_everything():
    old_am = ps_app("app_O", 1, 2, 1, shape=JobReport(workers=2, servers=1, epoch=1))   # pre-EPS AM
    a = ps_app("app_A", 2, 2, 1, max_w=3, max_s=2)
    assert shapes(EpsPolicy().decide(snap([old_am, a], total_units=40))) == {"app_A": (3, 2)}
    starving = replace(old_am, resources=AM + E)                                          # still gathering
    assert EpsPolicy().decide(snap([starving, a], total_units=40)).jobs == {}


def test_bigger_executors_are_counted_in_resources():
    big = Resource(2048, 2)
    a = ps_app("app_A", 1, 4, 2)
    a = replace(a, shape=msgspec.structs.replace(report(4, 2), executor_resource=big), resources=AM + big.scale(6))
    d = incoming("app_D", 10, 2, 2)            # needs AM + 4 small executors = 5 units
    out = shapes(EpsPolicy().decide(snap([a, d], total_units=13)))
    # Workers: 2 small + the AM = 3 units -> two big workers; servers: 2 units -> one big server.
    assert out == {"app_A": (2, 1)}

"""Policies keep the queues' promise (rm/policies/queue_guard.py): no Decision grows a job into
capacity another queue is owed, none grows a job the reclaim shrank lately; and, over rounds with
`optimus` and `dorm` deciding, the reclaim and the policy do not undo each other."""
from __future__ import annotations

from typing import Optional

import pytest

from protocol.internal_api import NodePlacement, RunState, ShapeDirective
from protocol.job_report import EpochObjective, JobReport
from protocol.records import ZERO, AppState, NodeState, Resource
from rm.policies import AppView, ClusterSnapshot, Decision, DormPolicy, JobDecision, NodeView, OptimusPolicy, Policy
from rm.policies import ps_job_view
from rm.policies.queue_guard import guard_decision
from rm.policies.queue_reclaim import (ContainerView, QueueView, ReclaimBook, ReclaimInputs, ReclaimSettings,
                                       check_book, queue_demands, reclaim_round)
from rm.policies.queue_shares import QueueShare, ideal_shares

E = Resource(1024, 1)
AM = Resource(1024, 1)
NODES = ("n0:1", "n1:1")
QUEUES = (QueueView("a", 0.5, 1.0), QueueView("b", 0.5, 1.0))


def report(w: int, s: int, epochs: int = 10, epoch_time: float = 2.0, b0: float = 0.3) -> JobReport:
    """A training job's report with a loss curve and speed the policies can fit."""
    losses = [1.0 / (b0 * (e + 1) + 1.0) + 0.05 for e in range(epochs)]
    return JobReport(workers=w, servers=s, started=True, iterations=epochs * 10, early_feedback=True,
                     early_feedback_iterations=10, speed=1.0, speed_iterations=10, executor_resource=E,
                     phase="TRAINING", epoch=epochs - 1, epoch_time_s=epoch_time, epoch_times=[epoch_time] * epochs,
                     initial_objective=1.05, objectives=[EpochObjective(e, o) for e, o in enumerate(losses)])


def job(app_id: str, queue: str, t: float, shape: tuple[int, int], *, started: bool = True,
        submitted: Optional[tuple[int, int]] = None, directive: Optional[ShapeDirective] = None) -> AppView:
    w, s = shape
    sw, ss = submitted or (max(1, w), max(1, s))
    spec = {"app": "mlr", "workers": sw, "servers": ss, "max_workers": 8, "max_servers": 4, "min_workers": 1,
            "min_servers": 1, "executor_memory_mb": 1024, "executor_vcores": 1, "max_epochs": 500,
            "convergence_threshold": 0.001}
    n = w + s
    # Executors fill n0 first, then n1 (the AMs sit on n0 too).
    first = min(n, 7)
    on = [(NODES[0], first)] + ([(NODES[1], n - first)] if n > first else [])
    wf = min(w, first)
    placement = tuple(NodePlacement(node=node, workers=wf if i == 0 else w - wf, servers=k - (wf if i == 0 else w - wf))
                      for i, (node, k) in enumerate(on) if k)
    return AppView(app_id, queue, "u", AppState.RUNNING if started else AppState.ACCEPTED, t,
                   E.scale(n) + (AM if started else ZERO), report(w, s) if started else None, ps_job_view(spec),
                   am_resource=AM, pending=ZERO if started else AM, directive=directive,
                   executors=placement if started else (),
                   executors_on=tuple((node, E.scale(k)) for node, k in on if k) if started else (),
                   am_node=NODES[0] if started else None)


def snapshot(apps: list[AppView]) -> ClusterSnapshot:
    used = {n: ZERO for n in NODES}
    for a in apps:
        for node, r in a.executors_on:
            used[node] = used[node] + r
        if a.am_node:
            used[a.am_node] = used[a.am_node] + a.am_resource
    views = tuple(NodeView(n, "/r", NodeState.RUNNING, Resource(8192, 8), used[n]) for n in NODES)
    return ClusterSnapshot(now=100.0, total=Resource(16384, 16), used=sum(used.values(), ZERO), nodes=views,
                           apps=tuple(apps))


def shares(snap: ClusterSnapshot) -> dict[str, QueueShare]:
    return ideal_shares(snap.total, queue_demands(ReclaimInputs(snap, QUEUES)))


def test_growth_into_capacity_another_queue_is_owed_is_cut() -> None:
    # a1 holds 3 + its AM; b's job waits for its AM and 8 executors: b is owed 9 of the 12 free.
    snap = snapshot([job("a1", "a", 1.0, (2, 1)), job("b1", "b", 2.0, (0, 0), started=False, submitted=(6, 2))])
    sh = shares(snap)
    assert sh["b"].owed == Resource(9216, 9)
    guarded, cuts = guard_decision(Decision({"a1": JobDecision(8, 4)}), snap, sh)
    # 3 executors fit in what nobody is owed: the decision's additions (6 workers, 3 servers) are
    # trimmed from the role it adds more of, one at a time.
    assert (guarded.jobs["a1"].workers, guarded.jobs["a1"].servers) == (3, 3)
    assert [(c.app_id, c.granted) for c in cuts] == [("a1", (3, 3))]


def test_shrinks_in_the_same_queue_pay_for_its_growth_only_where_the_queue_is_not_reclaimed() -> None:
    # a within its ideal share, the 8 free all owed to b: a1 may grow only by what a2 gives back.
    snap = snapshot([job("a1", "a", 1.0, (2, 1)), job("a2", "a", 1.5, (2, 1)),
                     job("b1", "b", 2.0, (0, 0), started=False, submitted=(6, 2))])
    sh = shares(snap)
    assert sh["a"].reclaim == ZERO and sh["b"].owed.vcores == 8
    grow = JobDecision.spread(4, 2, list(NODES))
    guarded, cuts = guard_decision(Decision({"a2": JobDecision(1, 1), "a1": grow}), snap, sh)
    assert guarded.jobs["a2"] == JobDecision(1, 1)
    g = guarded.jobs["a1"]
    assert g.workers + g.servers == 4 and sum(p.workers + p.servers for p in g.placement) == 4
    assert [c.app_id for c in cuts] == ["a1"]
    # Growth the shrink pays for in full passes untouched.
    fits = JobDecision.spread(3, 1, list(NODES))
    assert guard_decision(Decision({"a2": JobDecision(1, 1), "a1": fits}), snap, sh)[0].jobs["a1"] == fits
    # a over its ideal share (a2 holds 4 + 2): what a2 gives back is owed to b, so a1 does not grow.
    snap = snapshot([job("a1", "a", 1.0, (2, 1)), job("a2", "a", 1.5, (4, 2)),
                     job("b1", "b", 2.0, (0, 0), started=False, submitted=(6, 2))])
    sh = shares(snap)
    assert sh["a"].reclaim != ZERO
    guarded, cuts = guard_decision(Decision({"a2": JobDecision(1, 1), "a1": grow}), snap, sh)
    assert guarded.jobs == {"a2": JobDecision(1, 1)}
    assert [(c.app_id, c.granted) for c in cuts] == [("a1", None)] and "only gives back" in cuts[0].reason


def test_a_job_in_a_queue_being_reclaimed_only_gives_back_by_removal() -> None:
    """A move (new containers first) would keep the job `changing` -- in a full cluster until its AM's
    launch timeout -- and the reclaim's live shrink waits for that; so while its queue is over its
    share and another is owed, a job is neither moved nor grown, and a shrink only removes."""
    a1 = job("a1", "a", 1.0, (8, 4), directive=ShapeDirective(workers=8, servers=4, version=1))
    assert a1.executors == (NodePlacement(node=NODES[0], workers=7, servers=0),
                            NodePlacement(node=NODES[1], workers=1, servers=4))
    snap = snapshot([a1, job("b1", "b", 2.0, (0, 0), started=False, submitted=(6, 2))])
    sh = shares(snap)
    assert sh["a"].reclaim != ZERO and sh["b"].owed != ZERO
    move = JobDecision.spread(8, 4, list(NODES))
    guarded, cuts = guard_decision(Decision({"a1": move}), snap, sh)
    assert guarded.jobs == {} and [(c.app_id, c.granted) for c in cuts] == [("a1", None)]
    # A shrink that would put a server on n0 (full of a1's workers): the same counts, removed where they are.
    moving_shrink = JobDecision(6, 2, (NodePlacement(node=NODES[0], workers=3, servers=1),
                                       NodePlacement(node=NODES[1], workers=3, servers=1)))
    guarded, cuts = guard_decision(Decision({"a1": moving_shrink}), snap, sh)
    assert guarded.jobs["a1"] == JobDecision(6, 2, (NodePlacement(node=NODES[0], workers=5, servers=0),
                                                    NodePlacement(node=NODES[1], workers=1, servers=2)))
    assert [(c.app_id, c.granted) for c in cuts] == [("a1", (6, 2))]
    # A shrink that moves nothing passes untouched; so does a pause.
    for d in (JobDecision(4, 2), JobDecision(0, 0, run_state=RunState.PAUSE)):
        assert guard_decision(Decision({"a1": d}), snap, sh) == (Decision({"a1": d}), [])
    # With nobody owed anything, the move passes.
    alone = snapshot([a1])
    assert guard_decision(Decision({"a1": move}), alone, shares(alone)) == (Decision({"a1": move}), [])


def test_nothing_owed_nothing_cut_and_a_held_job_is_not_grown() -> None:
    snap = snapshot([job("a1", "a", 1.0, (2, 1))])
    sh = shares(snap)
    d = Decision({"a1": JobDecision(8, 4)})
    assert guard_decision(d, snap, sh)[0] == d
    held, cuts = guard_decision(d, snap, sh, held=lambda app_id: True)
    assert (held.jobs["a1"].workers, held.jobs["a1"].servers) == (2, 1) and cuts[0].reason.startswith("held")


def test_a_held_jobs_move_that_adds_nothing_passes() -> None:
    d0 = ShapeDirective(workers=2, servers=1, version=1)
    snap = snapshot([job("a1", "a", 1.0, (2, 1), directive=d0)])
    move = JobDecision.spread(2, 1, [NODES[1]])
    guarded, cuts = guard_decision(Decision({"a1": move}), snap, shares(snap), held=lambda app_id: True)
    assert guarded.jobs["a1"] == move and cuts == []


@pytest.mark.parametrize("make", [OptimusPolicy, DormPolicy], ids=["optimus", "dorm"])
def test_reclaim_and_policy_do_not_undo_each_other(make: type) -> None:
    """Queue a's job grew into the cluster; queue b's job arrives. Round after round the policy
    decides, the reclaim runs and the guard filters, and the jobs do what was decided at once:
    b's job starts, a's job is shrunk once and never regrown while it is held, nothing in b is
    reclaimed, and the book's invariants hold every round."""
    policy: Policy = make()
    settings = ReclaimSettings(natural_termination_factor=1.0, hold_rounds=20)
    a_shape, a_dir = (8, 4), ShapeDirective(workers=8, servers=4, version=1)
    b_started, b_fits = False, 0
    book = ReclaimBook()
    history = []
    for rnd in range(12):
        apps = [job("a1", "a", 1.0, a_shape, directive=a_dir),
                job("b1", "b", 2.0, (2, 1) if b_started else (0, 0), started=b_started, submitted=(2, 1))]
        snap = snapshot(apps)
        containers = {"a1": tuple(ContainerView(f"a1_c{i}", E, float(i), "server" if i >= a_shape[0] else "worker")
                                  for i in range(sum(a_shape)))}
        inputs = ReclaimInputs(snap, QUEUES, containers)
        out = reclaim_round(book, inputs, settings, now=100.0 + rnd)
        assert check_book(out.book, inputs) == []
        assert "b1" not in out.book.targets and out.kills == {}
        book = out.book
        guarded, _ = guard_decision(policy.decide(snap), snap, out.shares, book.held)
        jobs = {**guarded.jobs, **out.shrinks}
        if "a1" in jobs:
            jd = jobs["a1"]
            a_shape = (jd.workers, jd.servers)
            a_dir = ShapeDirective(workers=jd.workers, servers=jd.servers, version=a_dir.version + 1)
        history.append(sum(a_shape))
        # b's job starts two rounds after its AM and gang fit (the NMs confirm the released
        # containers gone, its AM starts and asks): meanwhile the room shows free to the policy.
        free = 16 - (sum(a_shape) + 1) - ((3 + 1) if b_started else 0)
        b_fits = b_fits + 1 if free >= 4 else 0
        b_started = b_started or b_fits > 2
    assert b_started, history
    # Shrunk once, to what b needs (its AM + 3 executors), then never grown back.
    assert history[0] <= 11
    assert all(later <= earlier for earlier, later in zip(history, history[1:])), history
    assert min(history) >= 2                # never below the minimum shape

"""The capacity reclaim's rounds (rm/policies/queue_reclaim.py), pure: victims in YARN's order,
shrink before kill, the grace period, the opt-out, the hold, and the book's invariants."""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

import pytest

from protocol.internal_api import NodePlacement, ShapeDirective
from protocol.job_report import JobReport
from protocol.records import ZERO, AppState, Resource
from rm.policies import AppView, ClusterSnapshot, ps_job_view
from rm.policies.queue_reclaim import (TRANSITIONS, ContainerView, QueueView, ReclaimBook, ReclaimEvent,
                                       ReclaimInputs, ReclaimOutcome, ReclaimSettings, ReclaimState,
                                       ReclaimTransitionError, app_pending, check_book, reclaim_round,
                                       trim_placement)

E = Resource(1024, 1)
TOTAL = Resource(8192, 8)
QUEUES = (QueueView("a", 0.5, 1.0), QueueView("b", 0.5, 1.0))
FULL = ReclaimSettings(natural_termination_factor=1.0, max_wait_before_kill_s=15.0, hold_rounds=3)


def ps_app(app_id: str, queue: str, t: float, workers: int, servers: int, *, started: bool = True,
           min_workers: int = 1, min_servers: int = 1, submitted: tuple[int, int] = (2, 1)) -> AppView:
    spec = {"app": "mlr", "workers": submitted[0], "servers": submitted[1], "min_workers": min_workers,
            "min_servers": min_servers, "max_workers": 8, "max_servers": 4,
            "executor_memory_mb": E.memory, "executor_vcores": E.vcores}
    report = JobReport(workers=workers, servers=servers, started=True) if started else None
    n = workers + servers
    return AppView(app_id, queue, "u", AppState.RUNNING if started else AppState.ACCEPTED, t, E.scale(n), shape=report,
                   ps=ps_job_view(spec), executors=(NodePlacement(node="n1", workers=workers, servers=servers),)
                   if n else (), executors_on=(("n1", E.scale(n)),) if n else (),
                   am_node="am" if started else None)


def plain_app(app_id: str, queue: str, t: float, n: int) -> AppView:
    return AppView(app_id, queue, "u", AppState.RUNNING, t, E.scale(n), executors=(NodePlacement(node="n1", workers=n),),
                   executors_on=(("n1", E.scale(n)),), am_node="am")


def containers(app: AppView, t0: float = 0.0) -> tuple[ContainerView, ...]:
    """The app's executors as containers, workers allocated before servers, one second apart."""
    w = sum(p.workers for p in app.executors)
    s = sum(p.servers for p in app.executors)
    out = [ContainerView(f"{app.app_id}_c{i}", E, t0 + i, "server" if i >= w else "worker") for i in range(w + s)]
    return tuple(out)


def inputs(*apps: AppView, queues: tuple[QueueView, ...] = QUEUES,
           held: Optional[dict[str, tuple[ContainerView, ...]]] = None) -> ReclaimInputs:
    snap = ClusterSnapshot(now=0.0, total=TOTAL, used=ZERO, apps=tuple(apps))
    return ReclaimInputs(snap, queues, held if held is not None else {a.app_id: containers(a) for a in apps})


def run(book: ReclaimBook, inp: ReclaimInputs, now: float, settings: ReclaimSettings = FULL) -> ReclaimOutcome:
    out = reclaim_round(book, inp, settings, now)
    assert check_book(out.book, inp) == []
    return out


B_JOB = ps_app("b1", "b", 30.0, 0, 0, started=False, submitted=(3, 1))    # wants 4 executors: half the cluster


def test_elastic_jobs_shrink_latest_first_toward_their_minimum() -> None:
    a1 = ps_app("a1", "a", 1.0, 3, 1)
    a2 = ps_app("a2", "a", 2.0, 3, 1)
    out = run(ReclaimBook(), inputs(a1, a2, B_JOB), now=100.0)
    assert out.shares["a"].ideal == Resource(4096, 4) and out.shares["b"].ideal == Resource(4096, 4)
    # The latest-submitted job gives back first, workers before servers, not below its minimum.
    assert {k: (d.workers, d.servers) for k, d in out.shrinks.items()} == {"a2": (1, 1), "a1": (1, 1)}
    assert out.kills == {} and out.warnings == {}
    assert out.book.targets["a2"].state == ReclaimState.SHRINKING
    assert out.book.held("a1") and out.book.held("a2")


def test_the_natural_termination_factor_paces_a_round() -> None:
    a1 = ps_app("a1", "a", 1.0, 3, 1)
    a2 = ps_app("a2", "a", 2.0, 3, 1)
    out = run(ReclaimBook(), inputs(a1, a2, B_JOB), now=100.0, settings=ReclaimSettings())
    # 0.2 of the 4 executors over: one executor, from the latest job.
    assert {k: (d.workers, d.servers) for k, d in out.shrinks.items()} == {"a2": (2, 1)}
    # The next round counts what is already being given back: nothing new while a2 shrinks.
    again = run(out.book, inputs(a1, a2, B_JOB), now=101.0, settings=ReclaimSettings())
    assert again.shrinks == {} and again.book.targets["a2"].state == ReclaimState.SHRINKING


def test_a_shrink_carried_out_is_done_and_counted() -> None:
    a1, a2 = ps_app("a1", "a", 1.0, 3, 1), ps_app("a2", "a", 2.0, 3, 1)
    out = run(ReclaimBook(), inputs(a1, a2, B_JOB), now=100.0)
    # a2 shrank; a1 did not (yet).
    out2 = run(out.book, inputs(a1, ps_app("a2", "a", 2.0, 1, 1), B_JOB), now=101.0)
    assert [(d.app_id, d.how, d.containers, d.resources) for d in out2.done] == [("a2", "shrink", 2, E.scale(2))]
    assert "a2" not in out2.book.targets and out2.book.targets["a1"].state == ReclaimState.SHRINKING


def test_a_job_that_ignores_its_shrink_is_warned_then_killed_after_the_grace_period() -> None:
    a1, a2 = ps_app("a1", "a", 1.0, 3, 1), ps_app("a2", "a", 0.5, 1, 1)     # a1 is the latest
    out = run(ReclaimBook(), inputs(a1, a2, B_JOB), now=100.0)
    assert set(out.shrinks) == {"a1"}
    still = inputs(a1, a2, B_JOB)
    assert run(out.book, still, now=114.0).book.targets["a1"].state == ReclaimState.SHRINKING   # grace not over
    warned = run(out.book, still, now=115.0)
    t = warned.book.targets["a1"]
    assert t.state == ReclaimState.WARNED and t.deadline == 130.0
    # The two executors over the target, latest first; never the server it keeps, never an AM.
    assert t.containers == ("a1_c2", "a1_c1")
    assert [c.container_id for c in warned.warnings["a1"].containers] == ["a1_c2", "a1_c1"]
    assert warned.kills == {}
    killed = run(warned.book, still, now=130.0)
    assert killed.kills == {"a1": ("a1_c2", "a1_c1")}
    assert [(d.how, d.containers) for d in killed.done] == [("killed", 2)]
    assert "a1" not in killed.book.targets


def test_a_shrink_carried_out_after_the_warning_with_other_executors_kills_nothing() -> None:
    """Warned for the executor over its target, the job finishes its shrink late and removes
    another than the named one (EPS picks its own) while its queue is still over its share (the
    round's step was a fifth of the excess): the target is met, so nothing is killed -- the named
    executor it kept was killed before, taking the job below its target, reclaimed twice."""
    paced = ReclaimSettings()
    a1, a2 = ps_app("a1", "a", 1.0, 3, 1), ps_app("a2", "a", 2.0, 3, 1)
    out = run(ReclaimBook(), inputs(a1, a2, B_JOB), now=100.0, settings=paced)
    assert {k: (d.workers, d.servers) for k, d in out.shrinks.items()} == {"a2": (2, 1)}
    warned = run(out.book, inputs(a1, a2, B_JOB), now=100.0 + paced.max_wait_before_kill_s, settings=paced)
    assert warned.book.targets["a2"].containers == ("a2_c2",)
    shrunk = ps_app("a2", "a", 2.0, 2, 1)
    kept = tuple(c for c in containers(a2) if c.container_id != "a2_c0")        # it removed c0
    late = run(warned.book, inputs(a1, shrunk, B_JOB, held={"a1": containers(a1), "a2": kept}),
               now=100.0 + 2 * paced.max_wait_before_kill_s, settings=paced)
    assert "a2" not in late.kills
    assert [(d.app_id, d.how, d.containers) for d in late.done if d.app_id == "a2"] == [("a2", "shrink", 1)]
    # The queue is still over: the next step is a new shrink from what the job holds now.
    assert late.book.targets["a2"].state == ReclaimState.SHRINKING and late.book.targets["a2"].from_shape == (2, 1)


def test_a_plain_app_is_warned_and_what_its_am_gives_back_is_not_killed() -> None:
    p = plain_app("p1", "a", 5.0, 8)
    out = run(ReclaimBook(), inputs(p, B_JOB), now=10.0)
    assert out.shrinks == {}
    # Half the cluster, its latest containers.
    assert out.book.targets["p1"].containers == ("p1_c7", "p1_c6", "p1_c5", "p1_c4")
    assert out.warnings["p1"].deadline == 25.0
    # Its AM releases them before the deadline.
    rest = {"p1": containers(p)[:4]}
    done = run(out.book, inputs(plain_app("p1", "a", 5.0, 4), B_JOB, held=rest), now=12.0)
    assert [(d.how, d.containers) for d in done.done] == [("released", 4)] and done.kills == {}


def test_a_job_at_its_minimum_is_killed_not_shrunk() -> None:
    a1 = ps_app("a1", "a", 1.0, 4, 4, min_workers=4, min_servers=4)
    out = run(ReclaimBook(), inputs(a1, B_JOB), now=0.0)
    assert out.shrinks == {} and out.book.targets["a1"].state == ReclaimState.WARNED


def test_kill_mode_is_yarns_way_even_for_elastic_jobs() -> None:
    a1 = ps_app("a1", "a", 1.0, 6, 2)
    out = run(ReclaimBook(), inputs(a1, B_JOB), now=0.0, settings=replace(FULL, mode="kill"))
    assert out.shrinks == {} and len(out.book.targets["a1"].containers) == 4


def test_off_mode_and_an_opted_out_queue_reclaim_nothing() -> None:
    a1 = ps_app("a1", "a", 1.0, 6, 2)
    assert run(ReclaimBook(), inputs(a1, B_JOB), now=0.0, settings=replace(FULL, mode="off")).book.targets == {}
    opted = (QueueView("a", 0.5, 1.0, disable_preemption=True), QueueView("b", 0.5, 1.0))
    out = run(ReclaimBook(), inputs(a1, B_JOB, queues=opted), now=0.0)
    assert out.book.targets == {} and out.shares["a"].reclaim == ZERO


def test_within_the_dead_zone_nothing_moves() -> None:
    a1 = ps_app("a1", "a", 1.0, 3, 1)          # exactly its guarantee
    b = ps_app("b1", "b", 3.0, 2, 1)
    out = run(ReclaimBook(), inputs(a1, b, replace(B_JOB, app_id="b2")), now=0.0)
    assert out.book.targets == {}


def test_a_jobs_not_started_or_reshaping_are_left_for_a_later_round() -> None:
    a1 = ps_app("a1", "a", 1.0, 6, 2)
    busy = replace(a1, shape=JobReport(workers=6, servers=2, started=True, changing=True))
    out = run(ReclaimBook(), inputs(busy, B_JOB), now=0.0)
    assert out.book.targets == {} and out.kills == {}


def test_a_job_reshaping_through_the_grace_period_is_warned_as_one_that_ignores_its_shrink() -> None:
    """A job whose own change does not end (a relocation waiting for room in a full cluster holds it
    `changing` until its AM's launch timeout) is passed over for the grace period only; then its
    executors over the shrink's target are named and killed after a second grace, as for a job
    that did not carry its shrink out -- the owed queue does not wait on the job's own change."""
    busy = replace(ps_app("a1", "a", 1.0, 6, 2), shape=JobReport(workers=6, servers=2, started=True, changing=True))
    first = run(ReclaimBook(), inputs(busy, B_JOB), now=100.0)
    assert first.book.targets == {} and first.book.stalled == {"a1": 100.0}
    assert run(first.book, inputs(busy, B_JOB), now=114.0).book.targets == {}
    warned = run(run(first.book, inputs(busy, B_JOB), now=114.0).book, inputs(busy, B_JOB), now=115.0)
    t = warned.book.targets["a1"]
    # b is owed 4 executors: the shrink would take 6 + 2 to 2 + 2, so the 4 latest workers are named.
    assert t.state == ReclaimState.WARNED and t.deadline == 130.0 and "a1" not in warned.book.stalled
    assert t.containers == ("a1_c5", "a1_c4", "a1_c3", "a1_c2") and warned.shrinks == {}
    assert [c.container_id for c in warned.warnings["a1"].containers] == list(t.containers)
    assert run(warned.book, inputs(busy, B_JOB), now=130.0).kills == {"a1": t.containers}
    # A job whose change ends within the grace gets the live shrink, and its stall is forgotten.
    settled = run(first.book, inputs(ps_app("a1", "a", 1.0, 6, 2), B_JOB), now=110.0)
    assert settled.shrinks["a1"].workers == 2 and settled.book.stalled == {}
    # So is a stall that is no longer needed: the clock starts again when it is.
    gone = run(first.book, inputs(busy), now=110.0)
    assert gone.book.stalled == {} and run(gone.book, inputs(busy, B_JOB), now=116.0).book.targets == {}


def test_a_warning_no_longer_needed_is_cancelled() -> None:
    p = plain_app("p1", "a", 5.0, 8)
    out = run(ReclaimBook(), inputs(p, B_JOB), now=10.0)
    # B's job went away: queue a is no longer over its share.
    gone = run(out.book, inputs(p), now=30.0)
    assert gone.kills == {} and gone.book.targets == {} and gone.warnings == {}


def test_a_target_whose_app_moved_to_another_queue_is_cancelled_and_its_old_queue_owes_afresh() -> None:
    p1, p2 = plain_app("p1", "a", 1.0, 6), plain_app("p2", "a", 5.0, 2)
    b_small = ps_app("b1", "b", 30.0, 0, 0, started=False, submitted=(1, 1))     # wants 2 executors
    out = run(ReclaimBook(), inputs(p1, p2, b_small), now=10.0)
    assert set(out.book.targets) == {"p2"} and out.book.targets["p2"].state == ReclaimState.WARNED
    # p2 moved to queue b (rm/core.py move_app) before its grace ran out. Queue a is still over its
    # share, but p2 is no longer a's to give: its target is cancelled, nothing of it is killed for
    # a's debt, and a's debt is taken from what a holds now (p1).
    moved = run(out.book, inputs(p1, replace(p2, queue="b"), b_small), now=30.0)
    assert moved.kills == {} and "p2" not in moved.book.targets and "p2" not in moved.warnings
    assert moved.book.targets["p1"].queue == "a" and "p1" in moved.warnings


def test_the_hold_lasts_the_configured_rounds() -> None:
    a1 = ps_app("a1", "a", 1.0, 3, 1)
    a2 = ps_app("a2", "a", 2.0, 3, 1)
    book = run(ReclaimBook(), inputs(a1, a2, B_JOB), now=0.0).book
    shrunk = inputs(ps_app("a1", "a", 1.0, 1, 1), ps_app("a2", "a", 2.0, 1, 1), B_JOB)
    held = []
    for i in range(5):
        book = run(book, shrunk, now=1.0 + i).book
        held.append(book.held("a2"))
    assert held == [True, True, True, False, False]


def test_the_transition_table_refuses_what_it_does_not_list() -> None:
    assert TRANSITIONS.next(ReclaimState.WARNED, ReclaimEvent.GRACE_EXPIRED) == ReclaimState.KILLED
    with pytest.raises(ReclaimTransitionError):
        TRANSITIONS.next(ReclaimState.DONE, ReclaimEvent.SHRUNK)


def test_the_invariant_checker_names_a_target_in_an_opted_out_queue() -> None:
    a1 = ps_app("a1", "a", 1.0, 3, 1)
    book = run(ReclaimBook(), inputs(a1, ps_app("a2", "a", 2.0, 3, 1), B_JOB), now=0.0).book
    opted = (QueueView("a", 0.5, 1.0, disable_preemption=True), QueueView("b", 0.5, 1.0))
    problems = check_book(book, inputs(a1, queues=opted))
    assert problems and all("opted out" in p for p in problems)


def test_trim_placement_takes_from_the_fullest_node() -> None:
    p = (NodePlacement(node="x", workers=3, servers=1), NodePlacement(node="y", workers=1, servers=1))
    assert trim_placement(p, 2, 1) == (NodePlacement(node="x", workers=1, servers=1), NodePlacement(node="y", workers=1))
    with pytest.raises(ValueError):
        trim_placement(p, 5, 0)


def test_a_running_jobs_demand_is_its_asks_even_where_the_snapshot_hides_its_am() -> None:
    # With AMs on a labelled partition the snapshot clears am_node: a RUNNING job waits for no gang.
    running = replace(ps_app("a1", "a", 1.0, 3, 1), am_node=None)
    assert app_pending(running) == ZERO
    assert app_pending(B_JOB) == E.scale(4)          # not running yet: its AM's gang
    assert app_pending(replace(B_JOB, am_limited=True)) == ZERO


def shrunk_to(app: AppView, shape: tuple[int, int], reason: str = "queue reclaim: for b") -> AppView:
    """`app` after carrying its shrink directive out."""
    w, s = shape
    return replace(app, directive=ShapeDirective(workers=w, servers=s, version=2, reason=reason),
                   executors=(NodePlacement(node="n1", workers=w, servers=s),), executors_on=(("n1", E.scale(w + s)),),
                   shape=JobReport(workers=w, servers=s, started=True), resources=E.scale(w + s))


def test_a_shrunk_job_gets_its_shape_back_once_no_queue_waits_and_its_hold_is_over() -> None:
    a1 = ps_app("a1", "a", 1.0, 6, 2)
    out = run(ReclaimBook(), inputs(a1, B_JOB), now=0.0)        # hold_rounds = 3
    assert out.book.restore == {"a1": (6, 2)}
    (to,) = [(d.workers, d.servers) for d in out.shrinks.values()]
    small = shrunk_to(a1, to)
    book = out.book
    # B's job runs: a1 waits (b is at its share, nothing free).
    book = run(book, inputs(small, replace(ps_app("b1", "b", 30.0, 3, 1))), now=1.0).book
    assert book.restore == {"a1": (6, 2)}
    # B's job is gone: still held for its hold rounds, then given back.
    got = []
    for i in range(4):
        o = run(book, inputs(small), now=2.0 + i)
        book = o.book
        got.append({k: (d.workers, d.servers, d.reason.split(":")[0]) for k, d in o.restores.items()})
    assert got == [{}, {}, {"a1": (6, 2, "queue restore")}, {}], got
    assert book.restore == {}


def test_no_restore_while_a_queue_is_owed_or_after_a_policy_set_the_shape() -> None:
    a1 = ps_app("a1", "a", 1.0, 6, 2)
    book = run(ReclaimBook(), inputs(a1, B_JOB), now=0.0, settings=replace(FULL, hold_rounds=0)).book
    small = shrunk_to(a1, (2, 2))
    # B's job still waits for its AM and gang: no restore.
    o = run(book, inputs(small, B_JOB), now=1.0, settings=replace(FULL, hold_rounds=0))
    assert o.restores == {}
    # A policy gave a1 a directive of its own: the reclaim forgets what it took.
    mine = shrunk_to(a1, (3, 2), reason="optimus: ...")
    o = run(o.book, inputs(mine), now=2.0, settings=replace(FULL, hold_rounds=0))
    assert o.restores == {} and o.book.restore == {}


def test_a_reclaim_shrink_of_a_job_on_a_draining_node_is_carried_out_before_the_move() -> None:
    """The reclaim shrinks a job from 3 + 1 to 2 + 1 while its node drains: the move off the node
    keeps the shrink (a worker given up on the draining node first, the rest moved) and its reason,
    where the move at the job's full shape overwrote it -- the shrink never sent, its grace ran
    out, and the executors were killed."""
    from rm.policies.decision import Decision, JobDecision  # noqa: PLC0415
    from rm.policies.node_drain import drain_moves  # noqa: PLC0415
    from rm.policies.snapshot import NodeView  # noqa: PLC0415

    a1 = ps_app("a1", "a", 1.0, 3, 1)
    nodes = (NodeView("n1", "/r", "DECOMMISSIONING", Resource(4096, 4), E.scale(4)),
             NodeView("n2", "/r", "RUNNING", Resource(8192, 8), ZERO))
    snap = ClusterSnapshot(now=0.0, total=TOTAL, used=E.scale(4), nodes=nodes, apps=(a1,))
    shrink = Decision({"a1": JobDecision(2, 1, reason="queue reclaim: queue a over its share")})
    out = drain_moves(snap, shrink, {"a1": {"n1": (3, 1)}}).jobs["a1"]
    assert (out.workers, out.servers) == (2, 1)
    assert {p.node: (p.workers, p.servers) for p in out.placement} == {"n2": (2, 1)}
    assert out.reason.startswith("queue reclaim") and "n1 decommissioning" in out.reason
    # Without a shrink the job moves whole.
    whole = drain_moves(snap, Decision({}), {"a1": {"n1": (3, 1)}}).jobs["a1"]
    assert (whole.workers, whole.servers) == (3, 1) and whole.reason.startswith("node n1 decommissioning")
    # A pause this round is left as it is (its executors leave every node): not taken for a shrink
    # to 0 + 0 that runs on, nor overwritten by a move.
    from protocol.internal_api import RunState  # noqa: PLC0415
    pause = JobDecision(0, 0, run_state=RunState.PAUSE, group="g1", reason="harmony: pending")
    assert drain_moves(snap, Decision({"a1": pause}), {"a1": {"n1": (3, 1)}}).jobs["a1"] == pause


def test_a_stalled_victim_on_an_integer_clock_is_passed_over_not_a_crash() -> None:
    """The round's time as an int (a caller's clock may give one): a victim mid-change is recorded
    stalled as on a float clock -- the int was taken for a target and the round raised."""
    busy = replace(ps_app("a1", "a", 1.0, 6, 2), shape=JobReport(workers=6, servers=2, started=True, changing=True))
    first = run(ReclaimBook(), inputs(busy, B_JOB), now=100)      # type: ignore[arg-type]
    assert first.book.targets == {} and first.book.stalled == {"a1": 100.0}

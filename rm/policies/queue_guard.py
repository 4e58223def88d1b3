"""Policies keep the queues' promise: no Decision grows a job into capacity another queue is owed.

Pure: `guard_decision(decision, snapshot, shares, held)` returns the Decision with every job
growth cut to the room its queue may take -- the cluster's free room less what the other queues
are owed (their ideal share above their use, rm/policies/queue_shares.py), plus whatever the same
Decision frees in that queue (while no other queue is owed anything, growth is left to the
scheduler's limits) -- and without any growth of a job the reclaim shrank lately (`held`:
rm/policies/queue_reclaim.py's hold, so the reclaim and the policy do not undo each other). Shrinks
and moves that add nothing pass untouched; a job's growth that is cut is trimmed (workers first,
servers, one at a time from the role it adds more of; from the nodes holding most), or dropped when trimming cannot bring it
within its room (the job keeps its current directive).

A job in a queue the reclaim takes from (its `reclaim` positive) while another queue is owed only
gives back: no growth, no move. A shrink that also moves executors becomes the same shrink done
by removal alone (its placement: the executors it holds, less those removed), and a move that
frees nothing is dropped. A move needs new containers first, and in a full cluster it waits for
room -- up to the AM's launch timeout, minutes -- with the job `changing` all along, which the
reclaim's live shrink has to wait for (measured in the simulator with optimus, docs/preemption.md).

It runs after every policy's decide (rm/reclaim_runner.py), so no policy needs to know queues.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional

from protocol.internal_api import RunState
from protocol.records import ZERO, Resource

from .decision import Decision, JobDecision
from .eps_jobs import units
from .queue_reclaim import executor_size, held_shape, trim_placement
from .queue_shares import QueueShare, owed_to_others
from .snapshot import AppView, ClusterSnapshot


@dataclass(frozen=True)
class GuardCut:
    """A job decision the guard cut: what the policy asked, what goes out (None: dropped), why."""

    app_id: str
    asked: tuple[int, int]
    granted: Optional[tuple[int, int]]
    reason: str


def current_shape(app: AppView) -> tuple[int, int]:
    """What the job is meant to have now: the shape of the directive it heads to (none while
    paused), else the larger of what it holds and what it was submitted with (those executors are
    already asked for)."""
    d = app.heading_to
    if d is not None:
        return (0, 0) if d.run_state == RunState.PAUSE else (d.workers, d.servers)
    w, s = held_shape(app)
    if app.ps is not None:
        return (max(w, app.ps.workers), max(s, app.ps.servers))
    return (w, s)


def _target(jd: JobDecision) -> tuple[int, int]:
    return (0, 0) if jd.run_state == RunState.PAUSE else (jd.workers, jd.servers)


def _trim(jd: JobDecision, cur: tuple[int, int], by: int) -> Optional[JobDecision]:
    """`jd` with `by` fewer executors, taken one at a time from the role it adds more of over
    `cur` (workers on a tie), so the shape keeps the decision's mix; None if it does not add that many."""
    add_w, add_s = max(0, jd.workers - cur[0]), max(0, jd.servers - cur[1])
    if by > add_w + add_s:
        return None
    rw = rs = 0
    for _ in range(by):
        if add_w - rw >= add_s - rs:
            rw += 1
        else:
            rs += 1
    placement = jd.placement
    if placement:
        try:
            placement = trim_placement(placement, rw, rs)
        except ValueError:
            return None
    return JobDecision(jd.workers - rw, jd.servers - rs, placement, jd.group, jd.run_state, jd.reason,
                       jd.executor_resource)


def removal_only(app: AppView, jd: JobDecision) -> Optional[JobDecision]:
    """`jd` carried out by removing executors only: itself when it moves nothing (no placement, or
    one within what each node holds now), else the same counts placed where the job's executors
    are, less those removed (from the nodes holding most); None when it adds to a role."""
    w, s = held_shape(app)
    if jd.run_state == RunState.PAUSE:
        return jd
    if jd.workers > w or jd.servers > s:
        return None
    holds = {p.node: (p.workers, p.servers) for p in app.executors}
    if all(p.workers <= holds.get(p.node, (0, 0))[0] and p.servers <= holds.get(p.node, (0, 0))[1]
           for p in jd.placement):
        return jd
    try:
        placement = trim_placement(app.executors, w - jd.workers, s - jd.servers)
    except ValueError:
        return None
    return JobDecision(jd.workers, jd.servers, placement, jd.group, jd.run_state, jd.reason, jd.executor_resource)


def guard_decision(decision: Decision, snapshot: ClusterSnapshot, shares: Mapping[str, QueueShare],
                   held: Callable[[str], bool] = lambda app_id: False) -> tuple[Decision, list[GuardCut]]:
    """The Decision with growth into owed capacity (and growth of held jobs) cut; and the cuts."""
    if not shares:
        return decision, []
    apps = {a.app_id: a for a in snapshot.apps}
    used = sum((s.used for s in shares.values()), ZERO)
    free = Resource(max(0, snapshot.total.memory - used.memory), max(0, snapshot.total.vcores - used.vcores))
    freed: dict[str, Resource] = {}         # per queue: what this Decision's shrinks give back
    grows: list[tuple[AppView, JobDecision, tuple[int, int], Resource]] = []
    out: dict[str, JobDecision] = {}
    cuts: list[GuardCut] = []
    for app_id, jd in decision.jobs.items():
        app = apps.get(app_id)
        if app is None or app.ps is None or app.queue not in shares:
            out[app_id] = jd
            continue
        cur = current_shape(app)
        net = sum(_target(jd)) - sum(cur)
        e = jd.executor_resource or executor_size(app)
        share = shares[app.queue]
        if (share.reclaim.memory > 0 or share.reclaim.vcores > 0) and owed_to_others(shares, app.queue) != ZERO:
            # Its queue is being reclaimed from: the job only gives back (see the module docstring).
            removal = removal_only(app, jd)
            if removal is None or sum(_target(removal)) >= sum(held_shape(app)):
                if not jd.same_as(app.directive):
                    cuts.append(GuardCut(app_id, (jd.workers, jd.servers), None,
                                         "its queue is over its share while another queue is owed: it only gives back"))
                continue
            if removal is not jd:
                cuts.append(GuardCut(app_id, (jd.workers, jd.servers), (removal.workers, removal.servers),
                                     "its queue is over its share while another queue is owed: by removal only"))
            out[app_id] = removal
            continue
        if net <= 0:
            out[app_id] = jd
            if net < 0:
                freed[app.queue] = freed.get(app.queue, ZERO) + e.scale(-net)
            continue
        grows.append((app, jd, cur, e))
    taken = ZERO        # of `free`, granted to growths so far
    for app, jd, cur, e in sorted(grows, key=lambda g: (g[0].submit_time, g[0].app_id)):
        net = sum(_target(jd)) - sum(cur)
        owed = owed_to_others(shares, app.queue)
        if held(app.app_id):
            allowed, why = 0, "held: shrunk for another queue lately"
        elif owed == ZERO:
            allowed, why = net, ""      # nobody is owed anything: the scheduler's limits are enough
        else:
            room_free = Resource(max(0, free.memory - taken.memory - owed.memory),
                                 max(0, free.vcores - taken.vcores - owed.vcores))
            pool = freed.get(app.queue, ZERO)
            allowed = units(room_free + pool, e)
            why = "the room left is owed to other queues"
        if allowed >= net:
            granted_jd: Optional[JobDecision] = jd
        else:
            granted_jd = _trim(jd, cur, net - allowed) if jd.run_state != RunState.RESUME or allowed > 0 else None
            cuts.append(GuardCut(app.app_id, (jd.workers, jd.servers),
                                 None if granted_jd is None else (granted_jd.workers, granted_jd.servers), why))
        if granted_jd is None:
            continue
        got = e.scale(max(0, sum(_target(granted_jd)) - sum(cur)))
        pool = freed.get(app.queue, ZERO)
        from_pool = Resource(min(pool.memory, got.memory), min(pool.vcores, got.vcores))
        freed[app.queue] = pool - from_pool
        taken = taken + (got - from_pool)
        if granted_jd.same_as(app.directive):
            continue
        out[app.app_id] = granted_jd
    return Decision(out), cuts


__all__ = ["GuardCut", "current_shape", "guard_decision", "removal_only"]

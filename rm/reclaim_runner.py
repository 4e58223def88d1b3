"""Runs capacity preemption on the RM core after every policy round (pure, like the core).

`reclaim_and_guard(core, snapshot, decision)` runs one round of the reclaim
(rm/policies/queue_reclaim.py) on the policy's snapshot -- the same snapshot the policy decided
on, so both see one cluster -- and applies what it says: it kills the containers whose grace ran
out, keeps each warned app's preemption message for its AM's next allocate responses, counts what
was taken per app and per queue with a note in the app's diagnostics; then it returns the policy's
Decision guarded (rm/policies/queue_guard.py: no growth into capacity another queue is owed, none
for a job shrunk lately) with the round's shrink directives laid over it, for the policy runner
to turn into directives -- and, once no queue waits, a shrunk job's shape given back. The RM server and the simulator both go through it
(rm/policy_runner.py `run_policy` / `finish_round`); an operator's `PUT .../shape` does not.
"""
from __future__ import annotations

from protocol import internal_api as api
from protocol.records import ZERO, Resource

from .core import ResourceManagerCore
from .policies import ClusterSnapshot, Decision
from .policies.queue_guard import guard_decision
from .policies.queue_reclaim import (ContainerView, QueueView, ReclaimDone, ReclaimInputs, ReclaimSettings,
                                     queue_demands, reclaim_round)
from .policies.queue_shares import ideal_shares

PREEMPTED_DIAGNOSTICS = "Container preempted by scheduler"


def reclaim_inputs(core: ResourceManagerCore, snapshot: ClusterSnapshot, with_containers: bool = True) -> ReclaimInputs:
    """The reclaim's view: the snapshot, the queues' settings, every app's non-AM containers
    (`with_containers` False: none -- a round with nothing to reclaim and no target open needs
    none, and a busy cluster's container walk is then skipped)."""
    disabled = {q.name for q in core.cfg.queues if q.disable_preemption}
    queues = tuple(QueueView(q.name, q.capacity / 100.0, q.max_capacity / 100.0, q.name in disabled)
                   for q in core.scheduler.queues.values())
    if not with_containers:
        return ReclaimInputs(snapshot, queues)
    containers: dict[str, list[ContainerView]] = {}
    for c in core.containers.values():
        if not c.is_am:
            containers.setdefault(c.app_id, []).append(ContainerView(c.container_id, c.resource, c.allocated_at, c.tag))
    return ReclaimInputs(snapshot, queues, {a: tuple(cs) for a, cs in containers.items()})


def _fmt(r: Resource) -> str:
    return f"<memory:{r.memory}, vCores:{r.vcores}>"


def _record(core: ResourceManagerCore, d: ReclaimDone) -> None:
    app = core.apps.get(d.app_id)
    if app is None:
        return
    app.preemption.add(d.how, d.resources, d.containers)
    core.queue_preemption.setdefault(d.queue, type(app.preemption)()).add(d.how, d.resources, d.containers)
    if d.how == "shrink":
        assert d.from_shape is not None and d.to_shape is not None
        text = (f"shrunk from {d.from_shape[0]} workers + {d.from_shape[1]} servers to {d.to_shape[0]} + "
                f"{d.to_shape[1]}, giving back {_fmt(d.resources)} live (no restart): {d.reason}")
    elif d.how == "released":
        text = f"gave back {d.containers} containers ({_fmt(d.resources)}) named for preemption: {d.reason}"
    else:
        text = f"{d.containers} containers ({_fmt(d.resources)}) killed for another queue: {d.reason}"
    app.preemption.note(d.at, text)
    core.dirty.add(d.app_id)


def reclaim_and_guard(core: ResourceManagerCore, snapshot: ClusterSnapshot, decision: Decision) -> Decision:
    """One reclaim round applied to `core`, and `decision` guarded with the round's shrinks over it."""
    settings = ReclaimSettings.of(core.cfg)
    if settings.mode == "off":
        core.preemption_notices = {}
        return decision
    now = core.clock()
    light = reclaim_inputs(core, snapshot, with_containers=False)
    needed = bool(core.reclaim_book.targets) or any(
        s.reclaim != ZERO for s in ideal_shares(snapshot.total, queue_demands(light),
                                                max_ignored_over_capacity=settings.max_ignored_over_capacity,
                                                natural_termination_factor=settings.natural_termination_factor).values())
    out = reclaim_round(core.reclaim_book, reclaim_inputs(core, snapshot) if needed else light, settings, now)
    core.reclaim_book = out.book
    core.queue_shares = dict(out.shares)
    for app_id, cids in out.kills.items():
        core.preempt_containers(app_id, cids, PREEMPTED_DIAGNOSTICS)
    for d in out.done:
        _record(core, d)
    told_before = core.preemption_notices
    core.preemption_notices = {
        app_id: api.PreemptionMessage(
            containers=[api.PreemptionContainer(container_id=c.container_id, resource=c.resource) for c in w.containers],
            deadline_ms=int(w.deadline * 1000), reason=w.reason)
        for app_id, w in out.warnings.items()}
    for app_id, w in out.warnings.items():
        app = core.apps.get(app_id)
        if app is not None and app_id not in told_before:
            app.preemption.note(now, f"told to give back {len(w.containers)} containers "
                                     f"({_fmt(sum((c.resource for c in w.containers), ZERO))}) within "
                                     f"{w.deadline - now:g} s, else they are killed: {w.reason}")
    for app_id, jd in out.shrinks.items():
        app = core.apps.get(app_id)
        t = core.reclaim_book.targets.get(app_id)
        if app is not None and t is not None and t.from_shape is not None:
            app.preemption.note(now, f"asked to shrink from {t.from_shape[0]} workers + {t.from_shape[1]} servers "
                                     f"to {jd.workers} + {jd.servers} ({_fmt(t.amount)}): {t.reason}")
    guarded, _cuts = guard_decision(decision, snapshot, out.shares, out.book.held)
    jobs = dict(guarded.jobs)
    jobs.update(out.shrinks)
    for app_id, jd in out.restores.items():
        app = core.apps.get(app_id)
        if app_id in jobs or app is None:
            continue        # the policy decided the job this round: its word stands
        jobs[app_id] = jd
        app.preemption.note(now, f"given back its shape, {jd.workers} workers + {jd.servers} servers: "
                                 f"no queue waits for what it gave")
    return Decision(jobs)


__all__ = ["PREEMPTED_DIAGNOSTICS", "reclaim_and_guard", "reclaim_inputs"]

"""Capacity preemption by elastic shrink: who gives back what a queue holds over its ideal share.

Pure: `reclaim_round(book, inputs, settings, now)` takes the last round's `ReclaimBook`, the
policy snapshot (plus each app's non-AM containers) and the time, and returns the next book and
what to do -- directives that shrink elastic jobs (and later give their shape back), preemption
messages to AMs, containers to kill.
The RM applies them (rm/reclaim_runner.py); the simulator runs the same code through it.

Each round (YARN's ProportionalCapacityPreemptionPolicy, with the shrink in front):
  1. Targets already under way move on (`TRANSITIONS`): a shrink the job carried out is DONE; a
     shrink not carried out within `max_wait_before_kill` falls back to a preemption message naming
     containers (WARNED); named containers the AM gave back itself are DONE, those still held at
     the next deadline are KILLED; a warning whose queue is no longer over its share is CANCELLED.
  2. Every queue's ideal share (rm/policies/queue_shares.py). From each queue with something to
     reclaim (most over its share first), less what is already being reclaimed from it, victims in
     YARN's order: latest-submitted apps first, never an AM container. An elastic PS job that has
     started and is above its minimum shape gets a directive to shrink toward that minimum (EPS
     removes workers first, then servers, live); anything that cannot shrink -- a plain YARN app,
     a PS job at its minimum, every job in "kill" mode -- has its latest containers named in a
     preemption message and killed after the grace period unless the AM gives them back. A PS job
     that cannot take a directive now (starting, reshaping, paused) is passed over for up to
     `max_wait_before_kill` -- its own change may end first -- and then treated as a job that
     did not carry its shrink out: its executors over the shrink's target are named.
  3. A job shrunk here is held: no policy grows it for `hold_rounds` rounds (queue_guard.py).
     After that, once no queue is over its share or owed anything and the free room holds it, the
     job gets the shape it had before back (a directive, as YARN's AMs ask again for what was
     preempted) -- unless a policy or an operator has set its shape since.

`check_book` is the invariant checker (as nodemanager/arbiter.py's): what must never hold of a book.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, Optional, Sequence

from protocol.config import RMConfig
from protocol.internal_api import NodePlacement, RunState
from protocol.records import ZERO, AppState, Resource
from protocol.state_machine import InvalidTransition, TransitionTable

from .decision import JobDecision
from .queue_shares import QueueDemand, QueueShare, ideal_shares
from .snapshot import AppView, ClusterSnapshot


RECLAIM_REASON = "queue reclaim"        # how a shrink directive's reason starts
RESTORE_REASON = "queue restore"        # and the directive giving the shape back


class ReclaimState(str, enum.Enum):
    """Where taking resources back from one app stands."""

    SHRINKING = "SHRINKING"     # a shrink directive was sent; the job has until the deadline
    WARNED = "WARNED"           # named containers will be killed at the deadline unless given back
    DONE = "DONE"               # given back by the job (final)
    KILLED = "KILLED"           # the named containers still held were killed (final)
    CANCELLED = "CANCELLED"     # no longer needed, or the app ended (final)


class ReclaimEvent(str, enum.Enum):
    SHRUNK = "SHRUNK"                   # the job holds no more than the shrink's target
    GRACE_EXPIRED = "GRACE_EXPIRED"     # the deadline passed with the resources still held
    RELEASED = "RELEASED"               # the AM gave back every named container
    CANCEL = "CANCEL"                   # the queue is no longer over its share / the app ended


class ReclaimTransitionError(InvalidTransition):
    """An event a reclaim target's state does not allow (protocol.state_machine.InvalidTransition, its
    own class so a reader of a traceback sees whose machine refused)."""


TRANSITIONS: TransitionTable[ReclaimState, ReclaimEvent, ReclaimState] = TransitionTable({
    (ReclaimState.SHRINKING, ReclaimEvent.SHRUNK): ReclaimState.DONE,
    (ReclaimState.SHRINKING, ReclaimEvent.GRACE_EXPIRED): ReclaimState.WARNED,
    (ReclaimState.SHRINKING, ReclaimEvent.CANCEL): ReclaimState.CANCELLED,
    (ReclaimState.WARNED, ReclaimEvent.RELEASED): ReclaimState.DONE,
    (ReclaimState.WARNED, ReclaimEvent.SHRUNK): ReclaimState.DONE,      # the shrink, carried out late
    (ReclaimState.WARNED, ReclaimEvent.GRACE_EXPIRED): ReclaimState.KILLED,
    (ReclaimState.WARNED, ReclaimEvent.CANCEL): ReclaimState.CANCELLED,
}, lambda s, e: ReclaimTransitionError(f"reclaim: event {e.value} not allowed in state {s.value}", s, e))


@dataclass(frozen=True)
class ReclaimSettings:
    """The RM's preemption settings (protocol.config.RMConfig `preemption*`)."""

    mode: str = "shrink"                # off | kill | shrink
    max_ignored_over_capacity: float = 0.1
    natural_termination_factor: float = 0.2
    max_wait_before_kill_s: float = 15.0
    hold_rounds: int = 30

    @classmethod
    def of(cls, cfg: RMConfig) -> "ReclaimSettings":
        return cls(cfg.preemption, cfg.preemption_max_ignored_over_capacity,
                   cfg.preemption_natural_termination_factor, cfg.preemption_max_wait_before_kill_s,
                   cfg.preemption_hold_rounds)


@dataclass(frozen=True)
class QueueView:
    """A leaf queue's settings as the reclaim reads them (capacities as fractions)."""

    name: str
    capacity: float
    max_capacity: float
    disable_preemption: bool = False


@dataclass(frozen=True)
class ContainerView:
    """One of an app's non-AM containers (the RM never names an AM container for preemption)."""

    container_id: str
    resource: Resource
    allocated_at: float
    tag: str = ""


@dataclass(frozen=True)
class ReclaimInputs:
    """What a round looks at: the policy's snapshot, the queues, each app's non-AM containers."""

    snapshot: ClusterSnapshot
    queues: tuple[QueueView, ...]
    containers: Mapping[str, tuple[ContainerView, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class ReclaimTarget:
    """Resources being taken back from one app."""

    app_id: str
    queue: str
    state: ReclaimState
    since: float                    # when this target was opened
    deadline: float                 # when the current step's grace ends
    amount: Resource                # what it should give back
    reason: str
    from_shape: Optional[tuple[int, int]] = None    # shrink: (workers, servers) before and after
    to_shape: Optional[tuple[int, int]] = None
    containers: tuple[str, ...] = ()               # WARNED: the containers named in the message


@dataclass(frozen=True)
class ReclaimDone:
    """A finished target, for the app's counters and diagnostics: `how` is "shrink" (given back
    live by the job), "released" (named containers given back by the AM) or "killed"."""

    app_id: str
    queue: str
    how: str
    at: float
    resources: Resource
    containers: int
    reason: str
    from_shape: Optional[tuple[int, int]] = None
    to_shape: Optional[tuple[int, int]] = None


@dataclass(frozen=True)
class PreemptionWarning:
    """A preemption message for one app: these containers are killed at `deadline`."""

    containers: tuple[ContainerView, ...]
    deadline: float
    reason: str


@dataclass(frozen=True)
class ReclaimBook:
    """The reclaim's state between rounds: open targets, the rounds until which shrunk jobs are
    held, and the shapes to give shrunk jobs back."""

    round: int = 0
    targets: Mapping[str, ReclaimTarget] = field(default_factory=dict)
    held_until: Mapping[str, int] = field(default_factory=dict)
    # The shape each shrunk job had before its first shrink: given back once no queue waits.
    restore: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    # Since when each victim has been passed over, round after round, as unable to shrink now
    # (a change of its own running: a relocation waiting for room in a full cluster can hold a
    # job `changing` until its AM's launch timeout, minutes). Past the grace it is warned instead.
    stalled: Mapping[str, float] = field(default_factory=dict)

    def held(self, app_id: str) -> bool:
        """No policy may grow this job this round (it was shrunk for another queue lately)."""
        return self.held_until.get(app_id, -1) >= self.round

    def being_reclaimed(self, queue: str) -> Resource:
        """What open targets in `queue` still have to give back."""
        return sum((t.amount for t in self.targets.values() if t.queue == queue), ZERO)


@dataclass(frozen=True)
class ReclaimOutcome:
    """One round's result: the next book and what the RM must do."""

    book: ReclaimBook
    shares: Mapping[str, QueueShare]
    shrinks: Mapping[str, JobDecision]              # app -> its shrink directive (new this round)
    warnings: Mapping[str, PreemptionWarning]                # app -> the preemption message it gets now
    kills: Mapping[str, tuple[str, ...]]            # app -> containers to kill now
    done: tuple[ReclaimDone, ...]
    restores: Mapping[str, JobDecision] = field(default_factory=dict)   # app -> its shape given back


# ----- helpers ----------------------------------------------------------------------------------

def held_shape(app: AppView) -> tuple[int, int]:
    """The (workers, servers) the app's executors hold now."""
    return (sum(p.workers for p in app.executors), sum(p.servers for p in app.executors))


def executor_size(app: AppView) -> Resource:
    """One executor's resource: what its containers hold on average, else the job spec's."""
    n = sum(held_shape(app))
    held = sum((r for _, r in app.executors_on), ZERO)
    if n > 0 and held != ZERO:
        return Resource(-(-held.memory // n), -(-held.vcores // n))
    if app.directive is not None and app.directive.executor_resource is not None:
        return app.directive.executor_resource
    return app.ps.executor if app.ps is not None else ZERO


def app_used(app: AppView) -> Resource:
    """What the app holds in the snapshot's partition: its executors, and its AM where it runs there."""
    execs = sum((r for _, r in app.executors_on), ZERO)
    return execs + (app.am_resource if app.am_node is not None else ZERO)


def app_pending(app: AppView) -> Resource:
    """What the app waits for: its open asks and AM request, and for a PS job whose AM does not
    run yet the executors gang admission waits for (they are not asked for until the AM runs, yet
    it is them the queue must get back). An app held at its AM limit waits on that, not
    on room: its demand does not count (as YARN counts only active apps' pending)."""
    if app.state.is_final or app.am_limited:
        return ZERO
    pending = app.pending
    # Not yet RUNNING: its AM has not registered, so its executors are not asked for yet (am_node
    # cannot tell: the snapshot clears it where AMs live on a labelled partition of their own).
    if app.ps is not None and app.state != AppState.RUNNING:
        pending = pending + app.ps.executor.scale(app.ps.workers + app.ps.servers)
    return pending


def queue_demands(inputs: ReclaimInputs) -> list[QueueDemand]:
    """Each queue's use and pending demand, from the snapshot's apps."""
    used: dict[str, Resource] = {q.name: ZERO for q in inputs.queues}
    pending: dict[str, Resource] = {q.name: ZERO for q in inputs.queues}
    for app in inputs.snapshot.apps:
        if app.queue not in used or app.state.is_final:
            continue
        used[app.queue] = used[app.queue] + app_used(app)
        pending[app.queue] = pending[app.queue] + app_pending(app)
    return [QueueDemand(q.name, q.capacity, q.max_capacity, used[q.name], pending[q.name],
                        preemptable=not q.disable_preemption) for q in inputs.queues]


def _positive(r: Resource) -> bool:
    return r.memory > 0 or r.vcores > 0


def _less(r: Resource, by: Resource) -> Resource:
    """r - by, each dimension floored at 0."""
    return Resource(max(0, r.memory - by.memory), max(0, r.vcores - by.vcores))


def executors_to_cover(need: Resource, e: Resource) -> int:
    """How many executors of size `e` free at least `need` in every dimension `need` asks for."""
    k = 0
    if need.memory > 0 and e.memory > 0:
        k = max(k, math.ceil(need.memory / e.memory))
    if need.vcores > 0 and e.vcores > 0:
        k = max(k, math.ceil(need.vcores / e.vcores))
    return k


def trim_placement(placement: Sequence[NodePlacement], workers: int, servers: int) -> tuple[NodePlacement, ...]:
    """`placement` less `workers` workers and `servers` servers, each taken from the node holding
    most of that role (ties: the last node in order), nodes left empty dropped."""
    counts = {p.node: [p.workers, p.servers] for p in placement}
    order = [p.node for p in placement]
    for role, n in ((0, workers), (1, servers)):
        for _ in range(n):
            node = max(reversed(order), key=lambda x: counts[x][role])
            if counts[node][role] <= 0:
                raise ValueError("placement holds fewer executors than are to be removed")
            counts[node][role] -= 1
    return tuple(NodePlacement(node=x, workers=counts[x][0], servers=counts[x][1]) for x in order
                 if counts[x][0] or counts[x][1])


def shrink_decision(app: AppView, to: tuple[int, int], reason: str) -> JobDecision:
    """The directive shrinking `app` to `to`: its current directive (group, run state, executor
    size) with the counts lowered. A job placed per node gets the placement its executors have now,
    less the ones to remove (from the nodes holding most): a shrink only removes, it never moves an
    executor -- the policy's placement may name nodes the job has not reached yet, and carrying
    that out first would hold the shrink up. Without a placement the AM picks what to remove."""
    d = app.directive
    group = d.group if d is not None else None
    size = d.executor_resource if d is not None else None
    run_state = d.run_state if d is not None else RunState.RUN
    if d is None or not d.placement:
        return JobDecision(to[0], to[1], group=group, run_state=run_state, reason=reason, executor_resource=size)
    held = held_shape(app)
    try:
        placement = trim_placement(app.executors, max(0, held[0] - to[0]), max(0, held[1] - to[1]))
    except ValueError:
        placement = ()
    if (sum(p.workers for p in placement), sum(p.servers for p in placement)) != to:
        placement = ()
    return JobDecision(to[0], to[1], placement, group=group, run_state=run_state, reason=reason,
                       executor_resource=size)


def _shrinkable(app: AppView) -> bool:
    """An elastic PS job that trains and is not reshaping: it can give executors back live."""
    return (app.ps is not None and app.state == AppState.RUNNING and app.shape is not None
            and app.shape.started and not app.shape.changing and not app.shape.paused)


def _fmt(r: Resource) -> str:
    return f"<memory:{r.memory}, vCores:{r.vcores}>"


def _name_over(containers: Iterable[ContainerView], workers: int, servers: int) -> list[ContainerView]:
    """The latest `workers` worker and `servers` server containers (by tag), latest allocated first."""
    over = {"worker": workers, "server": servers}
    named: list[ContainerView] = []
    for c in sorted(containers, key=lambda c: (-c.allocated_at, c.container_id)):
        role = "server" if c.tag == "server" else "worker"
        if over[role] > 0:
            over[role] -= 1
            named.append(c)
    return named


def _shrink_target(app: AppView, need: Resource) -> Optional[tuple[tuple[int, int], tuple[int, int], Resource]]:
    """(from, to, what it frees): `app` shrunk toward its minimum shape, workers first, by as many
    executors as cover `need`; None when it is at its minimum already."""
    assert app.ps is not None
    w, s = held_shape(app)
    removable = (max(0, w - app.ps.min_workers), max(0, s - app.ps.min_servers))
    if removable == (0, 0):
        return None
    e = executor_size(app)
    k = min(max(1, executors_to_cover(need, e)), removable[0] + removable[1])
    rw = min(k, removable[0])
    return (w, s), (w - rw, s - (k - rw)), e.scale(k)


# ----- the round --------------------------------------------------------------------------------

def _advance(t: ReclaimTarget, app: Optional[AppView], inputs: ReclaimInputs, shares: Mapping[str, QueueShare],
             settings: ReclaimSettings, now: float, warnings: dict[str, PreemptionWarning], kills: dict[str, tuple[str, ...]],
             done: list[ReclaimDone]) -> Optional[ReclaimTarget]:
    """Move an open target on by what the snapshot shows; the target still open, or None."""
    if app is None or app.state.is_final or app.queue != t.queue:
        # Gone, or moved to another queue (rm/core.py move_app): what its old queue still owes is
        # taken afresh from the apps there now.
        TRANSITIONS.next(t.state, ReclaimEvent.CANCEL)
        return None
    held = {c.container_id: c for c in inputs.containers.get(t.app_id, ())}
    if t.state == ReclaimState.SHRINKING:
        assert t.to_shape is not None and t.from_shape is not None
        if _shrunk(t, app, now, done):
            return None
        w, s = held_shape(app)
        if now < t.deadline:
            return t
        # The job did not carry the shrink out in time: name the executors over the target.
        state = TRANSITIONS.next(t.state, ReclaimEvent.GRACE_EXPIRED)
        named = _name_over(held.values(), max(0, w - t.to_shape[0]), max(0, s - t.to_shape[1]))
        reason = f"{t.reason}; the shrink directive was not carried out within {settings.max_wait_before_kill_s:g} s"
        if not named:
            TRANSITIONS.next(state, ReclaimEvent.RELEASED)
            return None
        warned = replace(t, state=state, deadline=now + settings.max_wait_before_kill_s, reason=reason,
                         containers=tuple(c.container_id for c in named),
                         amount=sum((c.resource for c in named), ZERO))
        warnings[t.app_id] = PreemptionWarning(tuple(named), warned.deadline, reason)
        return warned
    # WARNED. A job that carries its shrink out after all, late and with other executors than
    # the ones named (EPS removes its own choice), has given the room back: nothing is killed --
    # the named ones it kept would take it below the target, reclaimed twice.
    if _shrunk(t, app, now, done):
        return None
    still = [held[c] for c in t.containers if c in held]
    if not still:
        TRANSITIONS.next(t.state, ReclaimEvent.RELEASED)
        done.append(ReclaimDone(t.app_id, t.queue, "released", now, t.amount, len(t.containers), t.reason))
        return None
    share = shares.get(t.queue)
    if share is None or not _positive(share.over):
        TRANSITIONS.next(t.state, ReclaimEvent.CANCEL)
        return None
    if now < t.deadline:
        warnings[t.app_id] = PreemptionWarning(tuple(still), t.deadline, t.reason)
        return t
    TRANSITIONS.next(t.state, ReclaimEvent.GRACE_EXPIRED)
    kills[t.app_id] = tuple(c.container_id for c in still)
    given_back = len(t.containers) - len(still)
    done.append(ReclaimDone(t.app_id, t.queue, "killed", now, sum((c.resource for c in still), ZERO), len(still),
                            t.reason + (f" ({given_back} given back before the deadline)" if given_back else "")))
    return None


def _shrunk(t: ReclaimTarget, app: AppView, now: float, done: list[ReclaimDone]) -> bool:
    """Whether the job of a shrink target holds no more than its target now; if so the target is
    closed (SHRUNK) and recorded done. False for a target that is no shrink (a plain kill)."""
    if t.to_shape is None or t.from_shape is None:
        return False
    w, s = held_shape(app)
    if w > t.to_shape[0] or s > t.to_shape[1]:
        return False
    TRANSITIONS.next(t.state, ReclaimEvent.SHRUNK)
    n = sum(t.from_shape) - sum(t.to_shape)
    done.append(ReclaimDone(t.app_id, t.queue, "shrink", now, t.amount, n, t.reason, t.from_shape, t.to_shape))
    return True


def reclaim_round(book: ReclaimBook, inputs: ReclaimInputs, settings: ReclaimSettings, now: float) -> ReclaimOutcome:
    """One reclaim round (see the module docstring)."""
    rnd = book.round + 1
    shares = ideal_shares(inputs.snapshot.total, queue_demands(inputs),
                          max_ignored_over_capacity=settings.max_ignored_over_capacity,
                          natural_termination_factor=settings.natural_termination_factor)
    apps = {a.app_id: a for a in inputs.snapshot.apps}
    held_until = {a: r for a, r in book.held_until.items() if r >= rnd and a in apps}
    stalled: dict[str, float] = {}      # victims passed over this round (kept only while they are)
    restore = dict(book.restore)
    warnings: dict[str, PreemptionWarning] = {}
    kills: dict[str, tuple[str, ...]] = {}
    shrinks: dict[str, JobDecision] = {}
    done: list[ReclaimDone] = []
    targets: dict[str, ReclaimTarget] = {}
    for app_id, t in sorted(book.targets.items()):
        nt = _advance(t, apps.get(app_id), inputs, shares, settings, now, warnings, kills, done)
        if nt is not None:
            targets[app_id] = nt
    if settings.mode != "off":
        def over_key(s: QueueShare) -> tuple[float, str]:
            return (-s.over.dominant_share(inputs.snapshot.total), s.name)
        for share in sorted(shares.values(), key=over_key):
            need = _less(share.reclaim, sum((t.amount for t in targets.values() if t.queue == share.name), ZERO))
            if not _positive(need):
                continue
            victims = sorted((a for a in inputs.snapshot.apps if a.queue == share.name and a.app_id not in targets
                              and a.app_id not in kills and a.state == AppState.RUNNING),
                             key=lambda a: (-a.submit_time, a.app_id))
            for app in victims:
                if not _positive(need):
                    break
                why = (f"queue {share.name} holds {_fmt(share.used)}, over its ideal share {_fmt(share.ideal)} "
                       f"(guaranteed {_fmt(share.guaranteed)}), while other queues wait for their guarantee")
                opened = _open(app, need, share.name, why, settings, inputs, now, book.stalled.get(app.app_id))
                if opened is None:
                    continue
                if not isinstance(opened, ReclaimTarget):   # stalled since then (an int clock too)
                    stalled[app.app_id] = float(opened)
                    continue
                targets[app.app_id] = opened
                need = _less(need, opened.amount)
                if opened.state == ReclaimState.SHRINKING:
                    assert opened.to_shape is not None and opened.from_shape is not None
                    shrinks[app.app_id] = shrink_decision(app, opened.to_shape, f"{RECLAIM_REASON}: {why}")
                    held_until[app.app_id] = rnd + settings.hold_rounds
                    restore.setdefault(app.app_id, current_or(app, opened.from_shape))
                else:
                    by_id = {c.container_id: c for c in inputs.containers.get(app.app_id, ())}
                    warnings[app.app_id] = PreemptionWarning(tuple(by_id[c] for c in opened.containers),
                                                             opened.deadline, opened.reason)
    restores = _restores(restore, apps, targets, held_until, shares, inputs, rnd) if settings.mode != "off" else {}
    return ReclaimOutcome(ReclaimBook(rnd, targets, held_until, restore, stalled), shares, shrinks, warnings, kills,
                          tuple(done), restores)


def current_or(app: AppView, held: tuple[int, int]) -> tuple[int, int]:
    """The shape the job is meant to have: the directive's it heads to (`AppView.heading_to`), else
    what it holds."""
    d = app.heading_to
    return (d.workers, d.servers) if d is not None and d.run_state == RunState.RUN else held


def _restores(restore: dict[str, tuple[int, int]], apps: Mapping[str, AppView], targets: Mapping[str, ReclaimTarget],
              held_until: Mapping[str, int], shares: Mapping[str, QueueShare], inputs: ReclaimInputs,
              rnd: int) -> dict[str, JobDecision]:
    """Shrunk jobs given their shape back (YARN's AMs ask again for what was preempted): once the
    hold is over, no queue is over its share nor owed anything, and the cluster's free room holds
    the growth. An entry is dropped when the job ends or something else (a policy, an operator)
    has set its shape since. Updates `restore` in place."""
    out: dict[str, JobDecision] = {}
    used = sum((s.used for s in shares.values()), ZERO)
    free = _less(inputs.snapshot.total, used)
    for app_id, shape in sorted(restore.items()):
        app = apps.get(app_id)
        if app is not None and app_id in targets:
            continue        # its shrink is under way (the snapshot may not show the directive yet)
        d = app.directive if app is not None else None
        if app is None or app.state.is_final or d is None or not d.reason.startswith(RECLAIM_REASON):
            del restore[app_id]
            continue
        if held_until.get(app_id, -1) >= rnd or app.state != AppState.RUNNING:
            continue
        if any(_positive(s.reclaim) or _positive(s.owed) for s in shares.values()):
            continue
        grow = max(0, sum(shape) - d.workers - d.servers)
        need = executor_size(app).scale(grow)
        if not need.fits_in(free):
            continue
        free = free - need
        del restore[app_id]
        out[app_id] = JobDecision(shape[0], shape[1], group=d.group, run_state=d.run_state,
                                  executor_resource=d.executor_resource,
                                  reason=f"{RESTORE_REASON}: no queue waits for the executors it gave back")
    return out


def _open(app: AppView, need: Resource, queue: str, why: str, settings: ReclaimSettings, inputs: ReclaimInputs,
          now: float, stalled_since: Optional[float] = None) -> Optional[ReclaimTarget] | float:
    """A new target taking up to `need` from `app`: a shrink where it can, else named containers.
    A float: the job cannot take a shrink now and has been passed over since then (no target yet)."""
    deadline = now + settings.max_wait_before_kill_s
    if settings.mode == "shrink" and app.ps is not None:
        shrink = _shrink_target(app, need)
        if shrink is not None:
            frm, to, amount = shrink
            if _shrinkable(app):
                return ReclaimTarget(app.app_id, queue, ReclaimState.SHRINKING, now, deadline, amount, why, frm, to)
            since = now if stalled_since is None else stalled_since
            if now - since < settings.max_wait_before_kill_s:
                return since    # starting, reshaping or paused: its own change may end first
            # Passed over for the whole grace (YARN bounds how long an owed queue waits): as a job
            # that did not carry its shrink out, its executors over the shrink's target are named.
            named_over = _name_over(inputs.containers.get(app.app_id, ()), frm[0] - to[0], frm[1] - to[1])
            if not named_over:
                return None
            return ReclaimTarget(app.app_id, queue, ReclaimState.WARNED, now, deadline,
                                 sum((c.resource for c in named_over), ZERO),
                                 f"{why}; it could not take a shrink directive (reshaping, starting or paused) "
                                 f"for {now - since:g} s", containers=tuple(c.container_id for c in named_over))
        # At its minimum: only a kill takes more from it.
    named: list[ContainerView] = []
    got = ZERO
    for c in sorted(inputs.containers.get(app.app_id, ()), key=lambda c: (-c.allocated_at, c.container_id)):
        if not _positive(_less(need, got)):
            break
        named.append(c)
        got = got + c.resource
    if not named:
        return None
    return ReclaimTarget(app.app_id, queue, ReclaimState.WARNED, now, deadline, got, why,
                         containers=tuple(c.container_id for c in named))


# ----- invariants -------------------------------------------------------------------------------

def check_book(book: ReclaimBook, inputs: ReclaimInputs) -> list[str]:
    """What must never hold of a book after a round: a target in a queue that opted out, one in a
    final state, a named container that is not one of the app's non-AM containers when named, a
    shrink below the job's minimum shape or not below where it started, a deadline before its
    start. Empty when every invariant holds."""
    out: list[str] = []
    queues = {q.name: q for q in inputs.queues}
    apps = {a.app_id: a for a in inputs.snapshot.apps}
    for app_id, t in book.targets.items():
        q = queues.get(t.queue)
        if q is not None and q.disable_preemption:
            out.append(f"{app_id}: reclaimed from queue {t.queue}, which opted out")
        if t.state not in (ReclaimState.SHRINKING, ReclaimState.WARNED):
            out.append(f"{app_id}: open target in final state {t.state.value}")
        if t.deadline < t.since:
            out.append(f"{app_id}: deadline {t.deadline} before the target opened at {t.since}")
        app = apps.get(app_id)
        if t.state == ReclaimState.SHRINKING and t.to_shape is not None and t.from_shape is not None:
            if t.to_shape[0] > t.from_shape[0] or t.to_shape[1] > t.from_shape[1] or t.to_shape == t.from_shape:
                out.append(f"{app_id}: shrink {t.from_shape} -> {t.to_shape} is no shrink")
            if app is not None and app.ps is not None and (t.to_shape[0] < app.ps.min_workers
                                                           or t.to_shape[1] < app.ps.min_servers):
                out.append(f"{app_id}: shrink to {t.to_shape} below the minimum shape")
        if t.state == ReclaimState.WARNED and not t.containers:
            out.append(f"{app_id}: warned with no container named")
    return out


def am_named(warnings: Iterable[PreemptionWarning], am_containers: Iterable[str]) -> list[str]:
    """AM containers named in preemption messages: what must never happen."""
    ams = set(am_containers)
    return sorted(c.container_id for w in warnings for c in w.containers if c.container_id in ams)


__all__ = ["ContainerView", "QueueView", "ReclaimBook", "ReclaimDone", "ReclaimEvent", "ReclaimInputs",
           "ReclaimOutcome", "ReclaimSettings", "ReclaimState", "ReclaimTarget", "TRANSITIONS", "PreemptionWarning",
           "RECLAIM_REASON", "RESTORE_REASON", "am_named", "app_pending", "current_or", "app_used", "check_book", "executor_size", "held_shape",
           "queue_demands", "reclaim_round", "shrink_decision", "trim_placement"]

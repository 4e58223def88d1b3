"""EPS's four elastic functions as a planner (EPS §3.2-3.3): add or remove workers or servers of
a training job, live, with no progress lost. What each part issues, stage by stage:

    add_servers      StartExecutors -> JoinExecutors (barrier 1) -> MoveModelBlocks: the new
                     servers get a balanced share of the blocks (eps_decisions.balance_onto)
                     alongside the running epoch (barrier 4: the epoch's end waits for it)
    remove_servers   MoveModelBlocks drains the leaving servers (eps_decisions.drain) and drops
                     them from the server lists -> WaitClockBoundary (no request on its way to
                     them) -> RetireExecutors (barrier 3)
    add_workers      StartExecutors -> JoinExecutors -> StageSplits (their input data, alongside
                     training) -> CommitSplits at the next clock boundary, the senders keeping
                     inactive copies; the new workers train from the next clock
    remove_workers   StageSplits (what no remaining worker keeps inactively) -> CommitSplits at a
                     boundary (re-activations carry only state) -> RetireExecutors

A change is made of parts in groups: a /scale or a shape directive removes first (both roles
concurrently: that frees resources), then adds; a directive with a per-node placement adds the
executors each node lacks first, then removes the surplus (a job moving every executor keeps
training throughout); a directive with `nodes` relocates executors elsewhere (add, then remove).
A move adds first only as far as the role's maximum allows (`adds_first`): a job at its maximum
removes first and adds after, so it never trains above its maximum while additions wait on
containers (one newcomer goes first when every executor of a role leaves).
Rollback: an addition that fails retires the new executors that took nothing over and discards
staged splits; a removal that fails keeps whoever still holds something. When additions that run
before removals (a placement, a relocation) fail in part, the removals do not run and the
additions that succeeded are given back (their newcomers drained like EPS's remove), so a failed
change never leaves the job above its old shape (or its maximum). Additions that run after the
removals (what did not fit under the maximum) and fail leave the job where the removals put it
plus what was added before them: between its old shape and the directive's, within its maximum.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from protocol.internal_api import ShapeDirective
from protocol.ps_job_spec import PSJobSpec

from ...eps_decisions import DecisionError, Transfer, balance_onto, drain, pick_leaving, pick_leaving_off, placement_moves
from ..events import StepDone, StepFailed
from ..instructions import (CommitSplits, DiscardStaged, Instruction, JoinExecutors, MoveModelBlocks,
                            RetireExecutors, StageSplits, StartExecutors, WaitClockBoundary)
from ..records import Move, Role, Target
from ..state import Change, ChangeKind, JobState, Origin
from .base import BasePlanner, fail_change, issue


def target_of(d: ShapeDirective, spec: PSJobSpec) -> Target:
    """The shape a directive asks for within the job's [min, max] (at least one of each role:
    EPS's rule 2), where, and at what executor size."""
    w = max(1, spec.min_workers, d.workers if spec.max_workers is None else min(d.workers, spec.max_workers))
    s = max(1, spec.min_servers, d.servers if spec.max_servers is None else min(d.servers, spec.max_servers))
    res = d.executor_resource
    return Target(workers=w, servers=s, nodes=list(d.nodes) if not d.placement else [],
                  placement=[(p.node, p.workers, p.servers) for p in d.placement],
                  memory_mb=res.memory if res is not None else None,
                  vcores=res.vcores if res is not None else None)


@dataclass
class Part:
    """One of EPS's functions within a change: its own stages and outstanding steps."""

    op: str                         # add_servers | remove_servers | add_workers | remove_workers
    role: Role
    n: int
    group: int
    nodes: list[str] = field(default_factory=list)
    per_node: dict[str, int] = field(default_factory=dict)
    leaving: list[str] = field(default_factory=list)
    stage: str = "pending"
    steps: set[int] = field(default_factory=set)
    new: list[str] = field(default_factory=list)
    moves: list[Move] = field(default_factory=list)
    error: str = ""
    rollback: bool = False          # gives back what a failed change's additions started


def _moves(ts: list[Transfer]) -> list[Move]:
    return [Move(t.item, t.src, t.dst, t.reactivate) for t in ts]


def limits(job: JobState) -> tuple[int, int]:
    """The most workers / servers the job can have: its max_workers / max_servers, never more
    workers than input splits or servers than model blocks."""
    spec = job.spec
    splits = sum(len(s) for s in job.holdings.splits.values())
    workers = min(spec.max_workers or splits, splits) if splits else (spec.max_workers or spec.workers)
    servers = min(spec.max_servers or spec.num_blocks, spec.num_blocks)
    return workers, servers


def adds_first(n_add: int, leaving: int, current: int, cap: int) -> int:
    """How many of a move's `n_add` additions run before its removals: those that fit under the
    role's maximum `cap` beside its `current` executors. A move adds first so the job trains
    throughout, but the additions wait on containers (up to the launch timeout, 120 s), and what
    started meanwhile trains beside the leaving executors: a DRF move of 5 workers of a job at its
    maximum of 12 held it at 17 for two minutes in the simulator. At the maximum the removals go
    first, then the additions -- except one, when every executor of the role leaves (a role is
    never empty)."""
    fit = max(0, min(n_add, cap - current))
    if fit == 0 and n_add > 0 and leaving >= current:
        fit = 1
    return fit


def split_counts(per_node: dict[str, int], first: int) -> tuple[dict[str, int], dict[str, int]]:
    """`per_node` counts cut in two: `first` of them (taken node by node, in order) and the rest."""
    now: dict[str, int] = {}
    later: dict[str, int] = {}
    left = first
    for node, n in per_node.items():
        take = min(n, left)
        left -= take
        if take:
            now[node] = take
        if n - take:
            later[node] = n - take
    return now, later


class EpsPlanner(BasePlanner):
    """EPS add / remove / place / relocate (module doc)."""

    kind = ChangeKind.EPS

    # -- what the change is ----------------------------------------------------------------------
    def invalid(self, job: JobState, change: Change) -> str:
        dw, ds = change.delta
        if change.origin is Origin.SCALE:
            for name, d in (("workers", dw), ("servers", ds)):
                if not isinstance(d, int) or isinstance(d, bool):
                    return f"{name} must be a signed integer change, got {d!r}"
            if dw == 0 and ds == 0:
                return "nothing to change: give workers and/or servers as +N or -N"
        if job.spec.sync != "bsp":
            return "elastic changes need BSP training; this job runs SSP"
        assert change.target is not None
        return shape_problem(job, change.target.workers, change.target.servers)

    def needed(self, job: JobState, change: Change) -> bool:
        return bool(self._parts(job, change))

    def _parts(self, job: JobState, change: Change) -> list[Part]:
        t = change.target
        assert t is not None
        if t.placement:
            return self._place(job, t)
        w, s = job.shape
        parts: list[Part] = []
        nodes = list(t.nodes)
        if t.servers < s:
            parts.append(Part("remove_servers", Role.SERVER, s - t.servers, 0,
                              leaving=self._leaving(job, Role.SERVER, s - t.servers, nodes)))
        if t.workers < w:
            parts.append(Part("remove_workers", Role.WORKER, w - t.workers, 0,
                              leaving=self._leaving(job, Role.WORKER, w - t.workers, nodes)))
        if t.servers > s:
            parts.append(Part("add_servers", Role.SERVER, t.servers - s, 1, nodes=nodes))
        if t.workers > w:
            parts.append(Part("add_workers", Role.WORKER, t.workers - w, 1, nodes=nodes))
        if nodes:           # relocate what runs elsewhere: add on the nodes (group 2), then remove (3)
            allowed = set(nodes)
            gone = {x for p in parts for x in p.leaving}
            caps = dict(zip((Role.WORKER, Role.SERVER), limits(job)))
            for role in (Role.SERVER, Role.WORKER):
                away = [e for e in job.ids(role) if job.node_of(e) not in allowed and e not in gone]
                if role is Role.SERVER and t.servers < s or role is Role.WORKER and t.workers < w:
                    continue      # a removal of this role already takes the ones away first
                if away:
                    size = t.servers if role is Role.SERVER else t.workers
                    first = adds_first(len(away), len(away), size, caps[role])
                    if first:
                        parts.append(Part(f"add_{role.value}s", role, first, 2, nodes=nodes))
                    parts.append(Part(f"remove_{role.value}s", role, len(away), 3, leaving=away))
                    if len(away) > first:
                        parts.append(Part(f"add_{role.value}s", role, len(away) - first, 4, nodes=nodes))
        return parts

    @staticmethod
    def _leaving(job: JobState, role: Role, n: int, nodes: list[str]) -> list[str]:
        members = job.ids(role)
        if nodes:
            return pick_leaving_off([(e, job.node_of(e)) for e in members], n, nodes)
        return pick_leaving(members, n)

    @staticmethod
    def _place(job: JobState, t: Target) -> list[Part]:
        parts: list[Part] = []
        caps = dict(zip((Role.WORKER, Role.SERVER), limits(job)))
        for role in (Role.SERVER, Role.WORKER):
            members = job.ids(role)
            leaving, adds = placement_moves([(e, job.node_of(e)) for e in members], t.per_node(role))
            n_add = sum(adds.values())
            now, later = split_counts(adds, adds_first(n_add, len(leaving), len(members), caps[role])
                                      if leaving else n_add)
            if now:
                parts.append(Part(f"add_{role.value}s", role, sum(now.values()), 0, per_node=now))
            if leaving:
                parts.append(Part(f"remove_{role.value}s", role, len(leaving), 1, leaving=list(leaving)))
            if later:
                parts.append(Part(f"add_{role.value}s", role, sum(later.values()), 2, per_node=later))
        return parts

    # -- running it --------------------------------------------------------------------------------
    def begin(self, job: JobState, change: Change, out: list[Instruction]) -> None:
        change.parts = self._parts(job, change)
        self._next_group(job, change, out)

    def _next_group(self, job: JobState, change: Change, out: list[Instruction]) -> None:
        pending = [p for p in change.parts if p.stage == "pending"]
        if change.error and pending and not change.aborted and not any(p.rollback for p in change.parts):
            # Additions that ran before removals (a placement, a relocation) failed in part: the
            # removals do not run, and the newcomers of the additions that did succeed are given
            # back (drained like EPS's remove), so the job never ends above its old shape.
            for p in pending:
                p.stage = "done"
            pending = [Part(f"remove_{p.role.value}s", p.role, len(p.new), 99, leaving=list(p.new), rollback=True)
                       for p in change.parts if p.op.startswith("add") and not p.error and p.new
                       and all(x in job.executors for x in p.new)]
            change.parts.extend(pending)
        elif change.error:
            pending = [p for p in pending if p.rollback]
        if not pending:
            change.stage = "done"
            return
        group = min(p.group for p in pending)
        for p in pending:
            if p.group == group:
                self._advance(job, change, p, out)
        change.stage = f"group {group}"

    def _part_of(self, change: Change, step: int) -> Part:
        return next(p for p in change.parts if step in p.steps)

    def done(self, job: JobState, change: Change, ev: StepDone, out: list[Instruction]) -> None:
        part = self._part_of(change, ev.step)
        part.steps.discard(ev.step)
        if part.stage == "start":
            part.new = [x.executor_id for x in ev.executors]
        if not part.steps:
            if part.stage == "undo":
                part.stage = "done"
            else:
                self._advance(job, change, part, out)
        self._group_done(job, change, out)

    def failed(self, job: JobState, change: Change, ev: StepFailed, out: list[Instruction]) -> None:
        part = self._part_of(change, ev.step)
        part.steps.discard(ev.step)
        if part.stage == "start":
            part.new = [x.executor_id for x in ev.executors]
        part.error = part.error or ev.error
        fail_change(change, f"{part.op}({part.n}) failed: {ev.error}")
        if not part.steps:
            self._rollback(job, change, part, out)
        self._group_done(job, change, out)

    def _group_done(self, job: JobState, change: Change, out: list[Instruction]) -> None:
        if not change.outstanding and all(p.stage in ("done", "pending") for p in change.parts):
            self._next_group(job, change, out)

    def _issue(self, change: Change, part: Part, out: list[Instruction], step: Instruction) -> None:
        part.steps.add(issue(change, out, step))      # type: ignore[arg-type]

    def _advance(self, job: JobState, change: Change, p: Part, out: list[Instruction]) -> None:
        """Issue the part's next stage (module doc), or mark it done."""
        nxt = _NEXT[p.op][p.stage]
        p.stage = nxt
        step = job.new_step
        try:
            if nxt == "start":
                self._issue(change, p, out, StartExecutors(step=step(), role=p.role, count=p.n, nodes=p.nodes,
                                                            per_node=p.per_node))
            elif nxt == "join":
                self._issue(change, p, out, JoinExecutors(step=step(), role=p.role, executors=p.new))
            elif nxt == "move" and p.op == "add_servers":
                current = [s for s in job.ids(Role.SERVER) if s not in p.new]
                p.moves = _moves(balance_onto(job.holdings.blocks, current, p.new))
                self._issue(change, p, out, MoveModelBlocks(step=step(), moves=p.moves))
            elif nxt == "move":          # remove_servers
                remaining = [s for s in job.ids(Role.SERVER) if s not in p.leaving]
                p.moves = _moves(drain(job.holdings.blocks, p.leaving, remaining))
                self._issue(change, p, out, MoveModelBlocks(step=step(), moves=p.moves, drop=p.leaving))
            elif nxt == "stage":
                if p.op == "add_workers":
                    current = [w for w in job.ids(Role.WORKER) if w not in p.new and w in job.holdings.splits]
                    p.moves = _moves(balance_onto(job.holdings.splits, current, p.new))
                else:
                    remaining = [w for w in job.ids(Role.WORKER) if w not in p.leaving]
                    p.moves = _moves(drain(job.holdings.splits, p.leaving, remaining, job.holdings.inactive))
                self._issue(change, p, out, StageSplits(step=step(), moves=[m for m in p.moves if not m.reactivate]))
            elif nxt == "commit":
                adding = p.op == "add_workers"
                self._issue(change, p, out, CommitSplits(step=step(), moves=p.moves, keep_inactive=adding,
                                                         joining=p.new if adding else [],
                                                         leaving=[] if adding else p.leaving))
            elif nxt == "boundary":
                self._issue(change, p, out, WaitClockBoundary(step=step()))
            elif nxt == "retire":
                gone = [w for w in p.leaving if not job.holdings.splits.get(w) and not job.holdings.blocks.get(w)]
                if gone:
                    self._issue(change, p, out, RetireExecutors(step=step(), executors=gone))
                else:
                    p.stage = "done"
        except DecisionError as e:
            p.error = str(e)
            fail_change(change, f"{p.op}({p.n}): {e}")
            p.stage = "done"

    def _rollback(self, job: JobState, change: Change, p: Part, out: list[Instruction]) -> None:
        """An addition gives back the new executors that took nothing over; staged splits that
        will not move are dropped; a removal keeps whoever still holds something."""
        stage, p.stage = p.stage, "done"
        if stage == "undo":
            return
        step = job.new_step
        if p.op.startswith("add"):
            idle = [e for e in p.new if not job.holdings.blocks.get(e) and not job.holdings.splits.get(e)]
            if idle:
                p.stage = "undo"
                self._issue(change, p, out, RetireExecutors(step=step(), executors=idle, released=False))
        if p.op.endswith("workers") and stage in ("stage", "commit") and p.moves:
            p.stage = "undo"
            self._issue(change, p, out, DiscardStaged(step=step(), moves=[m for m in p.moves if not m.reactivate]))
        if p.op == "remove_workers" and stage == "commit":
            gone = [w for w in p.leaving if not job.holdings.splits.get(w)]
            if gone:
                p.stage = "undo"
                self._issue(change, p, out, RetireExecutors(step=step(), executors=gone))


# The stages of each part, in order (after "pending"); "done" ends it.
_NEXT: dict[str, dict[str, str]] = {
    "add_servers": {"pending": "start", "start": "join", "join": "move", "move": "done"},
    "remove_servers": {"pending": "move", "move": "boundary", "boundary": "retire", "retire": "done"},
    "add_workers": {"pending": "start", "start": "join", "join": "stage", "stage": "commit", "commit": "done"},
    "remove_workers": {"pending": "stage", "stage": "commit", "commit": "retire", "retire": "done"},
}


def shape_problem(job: JobState, workers: int, servers: int) -> str:
    """Why the job cannot take this shape ("" if it can): fewer than one of a role, or beyond
    `limits` (its max_workers / max_servers, its input splits, its model blocks), naming them."""
    max_w, max_s = limits(job)
    splits = sum(len(s) for s in job.holdings.splits.values())
    if workers < 1:
        return f"a job keeps at least 1 worker: the change would leave {workers}"
    if servers < 1:
        return f"a job keeps at least 1 server: the change would leave {servers}"
    if workers > max_w:
        return (f"{workers} workers is more than this job's maximum of {max_w} "
                f"(max_workers {job.spec.max_workers or 'unset'}, {splits} input splits)")
    if servers > max_s:
        return (f"{servers} servers is more than this job's maximum of {max_s} "
                f"(max_servers {job.spec.max_servers or 'unset'}, {job.spec.num_blocks} model blocks)")
    return ""


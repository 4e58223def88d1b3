"""The `eps` policy: the H-scheduler of EPS (Algorithm 1), as a typed Decision of new shapes.

Two modes, as in EPS §4:

* **Incoming-job scheduling** (lines 1-27). For each incoming PS job, in submission order: if the
  free resources cannot hold what it still lacks, split the free resources between its workers
  and servers in its worker:server ratio, count the workers (N_w_r) and servers (N_s_r) that do not
  fit, and remove that many round-robin from the running jobs that *have given early feedback*
  and have more than one worker (resp. server), the jobs with the most workers (servers) first.
  (A job spec's `min_workers` / `min_servers` raise that floor: the job is not shrunk below them.)
  The scheduler then hands the released containers to the waiting job.
* **Running-job scheduling** (lines 29-40), only when no job is queued: split the free resources
  in the cluster's worker:server ratio and add one worker (and one server) to each job in its
  training phase round-robin, fewest workers (servers) first, up to the job's max, while they fit.
  Each addition is a trial (`eps_trial`): if the speed the AM reports afterwards dropped, the
  addition is taken back and the job is not grown past that shape again.

Departures from the paper, and why:
* YARN needs an AM container too: an incoming job whose AM is not yet allocated needs its AM's
  resource; what the free resources lack of it is added to the workers to remove.
* Executors may differ in size between jobs, so "N_w_r workers removed" is counted in resources:
  removal stops once the freed resources hold N_w_r of the incoming job's executors. With equal
  executor sizes (the paper's setting) this is exactly N_w_r.
* Algorithm 1 loops forever when too few workers are removable; here, if removing every removable
  worker and server still would not let the job fit, nothing is removed (shrinking running jobs
  would not start it) and later incoming jobs wait behind it, FIFO.
* Resources already promised are accounted: free = cluster free + what running jobs will release
  to reach their directives - what they will take to reach them, so a shrink in flight is not
  asked for twice on the next tick.
* Jobs held back by their queue's AM resource limit (YARN's maximum-am-resource-percent; the
  snapshot's `AppView.am_limited`) are not incoming jobs here: the scheduler will not allocate their
  AM whatever is free, so shrinking running jobs for them would only idle the released resources.
  They still wait in the queue -- a submitted job the cluster has not started, which is what the
  paper's "queued" means (§4; §5 "a new job has to wait in a queue") -- so running-job scheduling,
  which runs only when "there are available resources but no submitted jobs", does not grow
  running jobs while one is held. Additions on trial are not taken back for a held job either
  (that too would free resources it cannot use); the trial runs to its verdict. Once the AM limit
  admits the job it becomes an incoming job and the jobs behind it are served as before. Jobs
  behind a held one are not blocked by it (YARN's activation skips a blocked AM too).
* Resources are counted cluster-wide as the paper's H-scheduler does (getClusterResource), not per
  node. When the free resources are fragmented -- the cluster-wide total holds an incoming job's
  executors but no single node has room for one -- the job counts as fitting, nothing is shrunk for
  it, and it (and running-job growth) waits until a node frees enough. Shrinks do not cure this in
  general either: which nodes a removed executor frees is the AM's choice, not the policy's.

State kept between calls (decide() is deterministic given the sequence of snapshots): the growth
trials in progress and, per job, the shape an addition was taken back from (its growth cap).
Targets themselves are not kept: they are the RM's directives, which the snapshot carries.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from protocol.records import ZERO, Resource

from .decision import Decision, JobDecision
from .eps_jobs import EpsView, IncomingJob, RunningJob, clamp0, classify, units
from .eps_trial import Trial, TrialConfig, TrialEvent, TrialState, advance, observe
from .snapshot import ClusterSnapshot

Shape = tuple[int, int]     # (workers, servers)


@dataclass
class _Round:
    """The working state of one decide() call: each running job's target and why it changed."""

    jobs: dict[str, RunningJob]
    targets: dict[str, Shape]
    reasons: dict[str, str] = field(default_factory=dict)

    def set(self, app_id: str, shape: Shape, reason: str) -> None:
        self.targets[app_id] = shape
        self.reasons[app_id] = reason

    def promised(self) -> Resource:
        """What running jobs will release (+) or take (-) on their way to their targets."""
        out = ZERO
        for app_id, job in self.jobs.items():
            out = out + job.held - job.footprint(*self.targets[app_id])
        return out


class EpsState(msgspec.Struct, forbid_unknown_fields=True):
    """What the `eps` policy keeps between rounds, as the RM stores it (rm/policies/base.py
    `export_state`): the additions under watch, the shapes jobs are capped at, the back-offs."""

    trials: dict[str, Trial]
    caps: dict[str, Shape]
    backoff: dict[str, float]


class EpsPolicy:
    """EPS's H-scheduler (see the module docstring). One instance per RM; keeps trial state."""

    name = "eps"

    def __init__(self, trial_config: TrialConfig | None = None):
        self.cfg = trial_config or TrialConfig()
        self._trials: dict[str, Trial] = {}
        self._caps: dict[str, Shape] = {}
        self._backoff: dict[str, float] = {}     # app -> time before which it is not grown again

    def export_state(self) -> bytes:
        """Trials, caps and back-offs, so a new active RM goes on watching an addition."""
        return msgspec.json.encode(EpsState(dict(sorted(self._trials.items())), dict(sorted(self._caps.items())),
                                            dict(sorted(self._backoff.items()))))

    def restore_state(self, doc: bytes) -> None:
        try:
            st = msgspec.json.decode(doc, type=EpsState)
        except msgspec.DecodeError as e:
            raise ValueError(f"eps policy state: {e}") from None
        self._trials, self._caps, self._backoff = dict(st.trials), dict(st.caps), dict(st.backoff)

    def decide(self, snapshot: ClusterSnapshot) -> Decision:
        """Job decisions for the running jobs whose target changes this round (the RM numbers the
        directives). Jobs are read through their AMs' `JobReport`s (protocol/job_report.py)."""
        view = classify(snapshot)
        jobs = {j.app_id: j for j in view.running}
        rnd = _Round(jobs, {a: (j.workers, j.servers) for a, j in jobs.items()})
        self._forget(snapshot, jobs)
        self._advance_trials(rnd, snapshot.now)
        if view.startable_waiting:
            self._preempt_trials(rnd, snapshot.now)
        free = view.free + rnd.promised()
        if view.incoming:
            self._schedule_incoming(view, rnd, free)
        elif not view.queued:
            self._schedule_running(view, rnd, clamp0(free), snapshot.now)
        return Decision({a: JobDecision(workers=w, servers=s, reason=rnd.reasons.get(a, "eps"))
                         for a, (w, s) in sorted(rnd.targets.items())
                         if (w, s) != (jobs[a].workers, jobs[a].servers)})

    # ----- state between calls ------------------------------------------------------------------
    def _forget(self, snapshot: ClusterSnapshot, jobs: dict[str, RunningJob]) -> None:
        # A trial only makes sense while its job runs; a cap lives as long as the app does.
        self._trials = {a: t for a, t in self._trials.items() if a in jobs}
        alive = {a.app_id for a in snapshot.apps if not a.state.is_final}
        self._caps = {a: c for a, c in self._caps.items() if a in alive}
        self._backoff = {a: t for a, t in self._backoff.items() if a in jobs and t > snapshot.now}

    def _advance_trials(self, rnd: _Round, now: float) -> None:
        for app_id in sorted(self._trials):
            trial = self._trials[app_id]
            report = rnd.jobs[app_id].report
            event = observe(trial, report, now, self.cfg)
            if event is None:
                continue
            trial = advance(trial, event, now, speed_after=report.speed)
            if trial.state == TrialState.MEASURING:
                self._trials[app_id] = trial
                continue
            del self._trials[app_id]
            if trial.state != TrialState.KEPT:
                # A job whose addition was just taken back is not grown again in the same round;
                # one that could not get it waits a settle period before it asks again.
                self._backoff[app_id] = now + (self.cfg.settle_timeout_s
                                               if trial.state == TrialState.ABANDONED else 0.0)
            if trial.state == TrialState.REVERTED:
                # Don't try this addition again: cap the grown role(s) at the shape before it.
                cap = self._caps.get(app_id, (1 << 30, 1 << 30))
                self._caps[app_id] = (trial.before[0] if trial.added_workers else cap[0],
                                      trial.before[1] if trial.added_servers else cap[1])
                rnd.set(app_id, trial.before, f"eps: speed dropped from {trial.speed_before:.3g} to "
                                              f"{report.speed:.3g} it/s after adding; taking the addition back")
            elif trial.state == TrialState.ABANDONED:
                rnd.set(app_id, trial.before, f"eps: addition not in place after "
                                              f"{self.cfg.settle_timeout_s:g}s; taking it back")

    def _preempt_trials(self, rnd: _Round, now: float) -> None:
        """A job is waiting: additions still on trial are given back before anyone is shrunk."""
        for app_id in sorted(self._trials):
            trial = advance(self._trials.pop(app_id), TrialEvent.PREEMPTED, now)
            rnd.set(app_id, trial.before, "eps: a job is waiting; taking back the addition on trial")
            self._backoff[app_id] = now

    # ----- incoming-job scheduling (Algorithm 1, lines 1-27) -------------------------------------
    def _schedule_incoming(self, view: EpsView, rnd: _Round, free: Resource) -> None:
        for job in view.incoming:
            avail = clamp0(free)
            need = job.need
            # Cluster-wide, as in the paper: with the free resources fragmented over nodes the job may
            # "fit" here yet no node can take one of its executors (see the module doc).
            if need.fits_in(avail):
                free = free - need
                continue
            removals = self._plan_removals(job, avail, rnd)
            if removals is None:
                return      # cannot fit even after shrinking: it waits, and so do the jobs behind it
            freed = ZERO
            for app_id, (dw, ds) in sorted(removals.items()):
                w, s = rnd.targets[app_id]
                rnd.set(app_id, (w - dw, s - ds), f"eps: -{dw} workers -{ds} servers to make room "
                                                  f"for incoming job {job.app_id}")
                freed = freed + rnd.jobs[app_id].executor.scale(dw + ds)
            free = free + freed - need

    def _plan_removals(self, job: IncomingJob, avail: Resource, rnd: _Round) -> dict[str, Shape] | None:
        """Workers and servers to remove per running job so `job` fits, or None if it cannot."""
        out_w, out_s = job.outstanding()
        am_lack = ZERO
        if not job.am_granted:
            am_lack = clamp0(job.am - avail)
            avail = clamp0(avail - job.am)
        # Lines 2-4: split the free resources in the job's worker:server ratio.
        n_ava = units(avail, job.executor)
        total = out_w + out_s
        ava_w = min(out_w, n_ava * out_w // total) if total else 0
        ava_s = min(out_s, n_ava - ava_w)
        ava_w = min(out_w, n_ava - ava_s)
        # Lines 7: what must be removed, as resources (see the module doc on executor sizes).
        need_w = job.executor.scale(out_w - ava_w) + am_lack
        need_s = job.executor.scale(out_s - ava_s)
        removed: dict[str, list[int]] = {}
        # Lines 8-16: removable jobs gave early feedback and have more than one of the role.
        eligible = [j for j in rnd.jobs.values() if j.report.early_feedback]
        freed_w = self._round_robin(eligible, rnd, removed, role=0, need=need_w, already=ZERO)
        # Line 27: servers likewise; what the worker pass could not free (too few removable workers)
        # is made up here, and what it freed beyond its share (bigger executors) is counted.
        freed_s = self._round_robin(eligible, rnd, removed, role=1, need=need_w + need_s, already=freed_w)
        if not (need_w + need_s).fits_in(freed_w + freed_s):
            return None
        return {a: (r[0], r[1]) for a, r in removed.items()}

    @staticmethod
    def _round_robin(eligible: list[RunningJob], rnd: _Round, removed: dict[str, list[int]], role: int,
                     need: Resource, already: Resource) -> Resource:
        """Lines 17-26: one of `role` from each job in turn, most first, until `need` is freed."""
        def left(j: RunningJob) -> int:
            return rnd.targets[j.app_id][role] - removed.get(j.app_id, [0, 0])[role]

        def floor(j: RunningJob) -> int:    # one of each, or the job spec's minimum
            return max(1, j.spec.min_workers if role == 0 else j.spec.min_servers)

        queue = sorted((j for j in eligible if left(j) > floor(j)), key=lambda j: (-left(j), j.order))
        freed = already
        while queue and not need.fits_in(freed):
            for j in list(queue):
                removed.setdefault(j.app_id, [0, 0])[role] += 1
                freed = freed + j.executor
                if left(j) <= floor(j):
                    queue.remove(j)
                if need.fits_in(freed):
                    break
        return freed - already

    # ----- running-job scheduling (Algorithm 1, lines 29-40) -------------------------------------
    def _schedule_running(self, view: EpsView, rnd: _Round, avail: Resource, now: float) -> None:
        if avail == ZERO or not view.running:
            return
        cluster_w = sum(w for w, _ in rnd.targets.values())
        cluster_s = sum(s for _, s in rnd.targets.values())
        share_w = cluster_w / max(1, cluster_w + cluster_s)
        # Line 31: the free resources split in the cluster's worker:server ratio.
        budgets = [[avail.memory * share_w, avail.vcores * share_w],
                   [avail.memory * (1 - share_w), avail.vcores * (1 - share_w)]]
        ready = [j for j in view.running
                 if self._can_grow(j, rnd) and self._backoff.get(j.app_id, now - 1) < now]
        added: dict[str, list[int]] = {}
        for role in (0, 1):
            budget = budgets[role]
            limit = [self._limit(j, role) for j in ready]
            order = sorted((j for j, lim in zip(ready, limit) if rnd.targets[j.app_id][role] < lim),
                           key=lambda j: (rnd.targets[j.app_id][role], j.order))
            for j in order:      # one pass: one more of the role per job
                e = j.executor
                if e.memory > budget[0] or e.vcores > budget[1]:
                    continue
                budget[0] -= e.memory
                budget[1] -= e.vcores
                added.setdefault(j.app_id, [0, 0])[role] += 1
        for app_id, (dw, ds) in sorted(added.items()):
            before = rnd.targets[app_id]
            after = (before[0] + dw, before[1] + ds)
            self._trials[app_id] = Trial(app_id, before, after, rnd.jobs[app_id].report.speed, now)
            rnd.set(app_id, after, f"eps: +{dw} worker +{ds} server with free resources (trial)")

    def _can_grow(self, j: RunningJob, rnd: _Round) -> bool:
        """Jobs in their training phase, settled at their target, with a measured speed (the trial
        compares against it), and not already on trial."""
        r = j.report
        return (r.early_feedback and not r.changing and j.app_id not in self._trials
                and (r.workers, r.servers) == rnd.targets[j.app_id]
                and r.speed > 0 and r.speed_iterations >= self.cfg.min_speed_iterations)

    def _limit(self, j: RunningJob, role: int) -> int:
        cap = self._caps.get(j.app_id)
        most = j.spec.max_workers if role == 0 else j.spec.max_servers
        return most if cap is None else min(most, cap[role])


__all__ = ["EpsPolicy", "EpsState"]

"""The `harmony` policy: co-locate PS jobs whose COMP and COMM complement each other (dissertation ch. 4).

Every round it reads the PS jobs from the snapshot, folds their reports into profiles
(harmony_profiles.py), moves each job through its lifecycle (harmony_lifecycle.py) and says, per
job, where it runs:

* **Profiling.** A new job waits until it gets a node of its own (as many as its minimum: see
  machine bounds below), then runs one worker and one server there until its report has
  COMP/COMM timings taken *alone*: no other job's executors on that node (the snapshot's
  `AppView.executors`), for at least `profile_iterations` iterations
  (the AM's times are moving averages: the ones from before the node was clear must wash out).
  Free nodes are used first, every waiting job that finds one at once, whenever that is (at
  start-up: "run as many jobs as possible at initialization, ... the smallest number of machines
  for each job"); once groups hold every node, one node at a time (`profiling_nodes`) is taken
  from the group with the most machines, and the profile waits until that group's executors
  have left it. "Alone" covers the nodes its executors really are on too (the PS AM waits for its
  first directive, `places_new_jobs`, but one that does not starts its executors wherever the
  scheduler found room); one still not alone after `alone_wait_s` is profiled from held times
  anyway rather than never. The times are those the subtasks held their arbiter grants, not
  waited for (harmony_profiles.py). Departure from §4.3.2: the paper profiles a later job in the background
  inside the smallest group ("a job group with the smallest number of machines"), trusting that
  subtasks run one at a time; here a group's executors share the node's cores and caches beyond
  the arbiter's slots, so a profile taken beside them is not the job's own.
* **Initial grouping.** When nothing is grouped and every job being profiled has its profile --
  or `initial_wait_s` has passed since the first profile -- Algorithm 1 (harmony_grouping.py)
  groups the profiled and paused jobs on the free nodes; the jobs it leaves out are paused, and
  the ones still being profiled arrive later (below). Departure from §4.3.2, which groups once
  the jobs run at initialization are profiled: a profile at one worker takes whole iterations
  at DoP 1, so waiting for the slowest one left 80 jobs at DoP 1 for about an hour in the
  simulator (docs/harmony_simulation.md); the bound grouped after 15 minutes and raised the
  mean-JCT gain there (measured: docs/harmony_policy.md).
* **Arrival.** A newly profiled job joins the group (or a new group on free nodes) that raises the
  modelled utilization U the most -- only when no other job is already waiting (profiled or
  paused) and only if U rises; otherwise it is paused and waits. Jobs profiled in the same round
  arrive one after the other (FIFO), each seeing where the ones before it went; one of them left
  waiting makes the later ones wait too.
* **Completion.** A group whose job finished takes a similar waiting job (or bundle) within 5 %
  (harmony_regroup.py); failing that, it and the smallest other groups are regrouped with
  Algorithm 1, the fewest jobs moved unless 5 % better, and nothing changes for under 5 % gain.
* **Free nodes** (a finished profile, a new node, a dissolved group) go to the groups one at a
  time, to the most computation-bound group (C_g/m_g - N_g largest), as the allocation does.
* **Failed moves.** A PS AM moves a job all or nothing, new executors first, and gives up after
  its launch timeout; two groups swapping nodes can each wait for room the other holds. A grouped
  job whose AM acted on its directive (steady report) but whose executors are not on its group's
  nodes for `move_retry_s` is paused and, once its AM has paused, resumed in the same group (a
  resume waits for its executors without a timeout); it stays a member of its group meanwhile,
  not a waiting job. Once per group and node set: a job still misplaced after that is left be.
  Addition to §4.3.2 (which migrates by checkpoint and does not say what a failed migration
  does): without it such jobs stayed where they were, sharing other groups' nodes for hours
  while the model counted them placed.

**Machine bounds** (an addition: the paper gives a job whatever m its group gets). A job runs one
worker and one server per node, so its spec's bounds are node counts: its group may have from
max(min_workers, min_servers) to min(max_workers, max_servers) nodes (`machine_bounds`; only a
maximum the spec states binds -- the view's default maximum is the submitted shape, which Harmony
does not keep). Algorithm 1 groups within them (harmony_grouping.py, `Bounds`); an arrival joins
only a group whose size fits it, and a new group takes no more free nodes than its maximum; a
replacement must fit the group's size; free nodes go to no group at its smallest maximum (they stay
idle); no node is borrowed for profiling from a group at its members' largest minimum, and a member
whose group lost nodes below its minimum is paused. A job is profiled on as many nodes as its
minimum (the paper: on one), all borrowed at once, and its profile is per machine as always
(COMP x the workers measured); a job whose bounds no node count of the cluster meets (minimum above
its maximum, or above the nodes) stays waiting, unprofiled, with a note saying why.

A grouped job runs one worker and one server on every node of its group (`placement`), in `group`
(a stable id such as "g3"), with `executor_resource` sized so the group fits its nodes: a node's
capacity, less the AMs running there and room for AMs not placed yet, split evenly among the group's 2k
containers (k jobs); a job keeps its containers' size while that still fits, from its profiling
size on (a partner leaving does not resize them), they shrink when the group grows. The jobs per group are capped so every container
gets a vcore and at least `min_executor_mb`. A paused or waiting job is told PAUSE with no executors; a job put back in a
group RESUME; a running job moved to other nodes RUN with its new placement (the AM migrates it).

COMM across the link (departure from eq. 4.2, models/harmony.py `net_time`): a profile taken on
one node measures loopback COMM, far below what a job moving MBs per mini-batch pays once its
group spans hosts. With `link_bandwidth_bps` (rm.toml `harmony_link_bandwidth_bps`) a profile also
keeps t_link = the report's bytes per mini-batch over the link, and everywhere a job's T_net enters
the model (grouping, arrivals' scores, replacements, free nodes, `describe()`) it is T_net at its
group's machines, t_net_local + t_link (m-1)/m; 0 (the default) is the paper's model.

Utilization is compared over all running nodes, free ones counting as idle (zero), so giving idle
nodes work raises U. State kept between calls: the jobs' lifecycle states, profiles and groups. The
RM stores them (`export_state`, `HarmonyState`), so a new active RM after a restart or failover
goes on with the same groups, profiles and lifecycle states -- no job is profiled again or regrouped
because the RM changed; what a round recomputes from the snapshot (the nodes, the AMs' room,
who runs where) it is not given.

Overhead, per job (`describe()`, on the snapshots' clock): `profilingS`, the time it spent being
profiled (on its profiling node(s), before its group); `regroupS`, the time it spent grouped but not yet
running as told (after a run, move or resume directive, until its report shows the new shape:
migration and checkpoint restore); `pausedS`, the time it waited paused; `moves`, the directives
that moved it. The issue's target is profiling + regrouping under 5 % of a job's time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Optional

import msgspec
import numpy as np

from models.harmony import CPU_WEIGHT, FloatArray, GroupStats, group_stats, net_time, score
from protocol.config import RMConfig
from protocol.internal_api import NodePlacement, RunState
from protocol.records import ZERO, Resource

from .decision import Decision, JobDecision
from .harmony_grouping import SWAP_BUDGET, Bounds, Grouping, schedule
from .harmony_lifecycle import JobEvent, JobState, advance, step
from .harmony_profiles import EMA_WEIGHT, Profile, ProfileBook
from .harmony_regroup import GAIN, TOLERANCE, Times, fewest_within, replacement, worth_regrouping
from .snapshot import AppView, ClusterSnapshot, NodeView, PSJobView

FINAL = ("FINISHED", "FAILED", "KILLED")
CONTAINERS_PER_JOB = 2      # per node: one worker and one server


@dataclass(frozen=True)
class HarmonyConfig:
    """The policy's knobs (defaults from the dissertation where it gives one)."""

    tolerance: float = TOLERANCE        # "similar" jobs: within 5 %
    gain: float = GAIN                  # no regrouping under a 5 % gain in U
    ema_weight: float = EMA_WEIGHT
    cpu_weight: float = CPU_WEIGHT
    swap_budget: int = SWAP_BUDGET
    min_executor_mb: int = 256
    profiling_nodes: int = 1            # nodes taken from groups to profile on at once
    profile_iterations: int = 1         # iterations alone on its node before a profile is taken
    alone_wait_s: float = 30.0          # then, still not alone: profile from held times anyway
    regroup_options: int = 5            # partial regroupings compared on a completion
    # The initial grouping waits for every job being profiled, but no longer than this after the
    # first profile (None: for all of them); later ones then arrive one by one.
    initial_wait_s: Optional[float] = 600.0
    move_retry_s: float = 60.0          # a move still not placed this long after its AM acted on it: failed
    # The nodes' link bandwidth (bits/s; rm.toml `harmony_link_bandwidth_bps`): a job's COMM on m
    # nodes pays (m-1)/m of its bytes per mini-batch on it (models/harmony.py `net_time`); 0 =
    # unknown, COMM constant in m as in the paper.
    link_bandwidth_bps: float = 0.0

    def __post_init__(self) -> None:
        if not self.link_bandwidth_bps >= 0.0:      # (NaN too)
            raise ValueError(f"harmony link_bandwidth_bps must be >= 0 (bits/s, 0 = unknown), "
                             f"got {self.link_bandwidth_bps}")

    @classmethod
    def from_settings(cls, settings: RMConfig) -> "HarmonyConfig":
        """The defaults with what rm.toml sets (`harmony_link_bandwidth_bps`)."""
        return cls(link_bandwidth_bps=float(settings.harmony_link_bandwidth_bps))


def machine_bounds(spec: PSJobView) -> tuple[int, Optional[int]]:
    """The fewest and most nodes a job may run on under Harmony (None: no most): one worker and one
    server per node, so max(min_workers, min_servers) .. min(max_workers, max_servers). Only a
    maximum the spec states binds: the view's default one is the submitted shape, which Harmony
    does not keep (a default spec, 2 workers and 1 server, would be pinned to one node)."""
    most = [x for x in (spec.spec.max_workers, spec.spec.max_servers) if x is not None]
    return max(1, spec.min_workers, spec.min_servers), min(most) if most else None


@dataclass
class _Job:
    app_id: str
    submit_time: float
    executor: Resource                  # the spec's executor size (for profiling)
    fewest: int = 1                     # its machine bounds (`machine_bounds`)
    most: Optional[int] = None
    state: JobState = JobState.WAITING
    group: Optional[str] = None
    node: Optional[str] = None          # its profiling node (profiling / profiled)
    more_nodes: list[str] = field(default_factory=list)    # its other profiling nodes (fewest > 1)
    run_state: RunState = RunState.RUN
    note: str = ""
    size: Optional[Resource] = None     # its executors' size in its group (kept while it fits)
    # The report's iterations when the job was last found alone on its profiling node (None: not
    # alone there): a profile is taken only `profile_iterations` past it.
    alone_from: Optional[int] = None
    crowded_since: Optional[float] = None   # when it was first found not alone (RM clock)
    # A failed move (see `_retry_failed_moves`): since when its executors are off its group's nodes
    # although its AM acted on the directive; `remigrating`: paused to be resumed in its group.
    misplaced_since: Optional[float] = None
    remigrating: bool = False
    retried: Optional[tuple[str, tuple[str, ...]]] = None   # the (group, nodes) last retried for
    iterations: int = 0                 # its report's iterations, as last seen
    profiled_at: Optional[float] = None     # when its profile was taken (RM clock)
    profiling_s: float = 0.0            # overhead, on the snapshots' clock (see the module doc)
    regroup_s: float = 0.0
    paused_s: float = 0.0
    moves: int = 0

    @property
    def order(self) -> tuple[float, str]:
        return (self.submit_time, self.app_id)


@dataclass
class _Group:
    group_id: str
    jobs: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)


class HarmonyState(msgspec.Struct, forbid_unknown_fields=True):
    """What the `harmony` policy keeps between rounds, as the RM stores it (module doc)."""

    jobs: dict[str, _Job]
    groups: dict[str, _Group]
    profiles: dict[str, Profile]
    next_group: int
    now: Optional[float]


class HarmonyPolicy:
    """Harmony's job scheduler (see the module docstring). One instance per RM; keeps job state."""

    name = "harmony"
    # A new job's first executors go where the policy says (its profiling node), not where first
    # fit puts the submitted shape: its AM waits for the first directive (rm/policies/base.py).
    places_new_jobs = True

    def __init__(self, config: HarmonyConfig | None = None):
        self.cfg = config or HarmonyConfig()
        self.jobs: dict[str, _Job] = {}
        self.groups: dict[str, _Group] = {}
        self.profiles = ProfileBook(self.cfg.ema_weight, self.cfg.link_bandwidth_bps)
        self._next_group = 1
        self._nodes: dict[str, NodeView] = {}
        self._am_on: dict[str, Resource] = {}    # per node: the AMs placed there
        self._am_unplaced = ZERO                  # per node: room kept for AMs not placed yet
        self._min_mb = 1
        self._occupants: dict[str, set[str]] = {}    # per node: the apps with executors there
        self._placed: dict[str, set[str]] = {}       # per app: the nodes its executors are on
        self._now: Optional[float] = None

    # ----- the round -----------------------------------------------------------------------------------------------
    def decide(self, snapshot: ClusterSnapshot) -> Decision:
        """Per tracked PS job its placement, group and run state (the RM numbers changed ones)."""
        self._nodes = {n.node_id: n for n in snapshot.nodes if n.state == "RUNNING"}
        self._min_mb = max(1, snapshot.minimum_allocation_mb)
        apps = {a.app_id: a for a in snapshot.apps}
        # Only PS jobs count: another app's containers are not the policy's to move, and waiting
        # for them to leave a profiling node could wait for ever.
        self._occupants, self._placed = {}, {}
        for a in snapshot.apps:
            if a.state not in FINAL and a.ps is not None:
                for pl in a.executors:
                    if pl.workers + pl.servers > 0:
                        self._occupants.setdefault(pl.node, set()).add(a.app_id)
                        self._placed.setdefault(a.app_id, set()).add(pl.node)
        self._account(apps, snapshot.now)
        finished = self._sync_apps(snapshot)
        self._sync_nodes()
        self._am_on, self._am_unplaced = self._am_room(snapshot)
        self._retry_failed_moves(apps)
        arrivals = self._measure(apps)
        for gid, times in finished:
            self._on_completion(gid, times)
        if not self.groups:
            if self._pool() and (not self._in_state(JobState.PROFILING) or self._waited_enough()):
                self._initial_grouping()
        else:
            for i, app_id in enumerate(arrivals):
                self._on_arrival(app_id, arrivals[i + 1:])
        self._profile_waiting()
        self._give_idle_nodes()
        decision, sizes = self._decision(apps)
        self._keep_sizes(sizes)
        return decision

    def export_state(self) -> bytes:
        """Jobs, groups, profiles (rm/policies/base.py `export_state`)."""
        return msgspec.json.encode(HarmonyState(dict(sorted(self.jobs.items())), dict(sorted(self.groups.items())),
                                                dict(sorted(self.profiles.profiles.items())), self._next_group,
                                                self._now))

    def restore_state(self, doc: bytes) -> None:
        try:
            st = msgspec.json.decode(doc, type=HarmonyState)
        except msgspec.DecodeError as e:
            raise ValueError(f"harmony policy state: {e}") from None
        for gid, g in st.groups.items():
            unknown = [a for a in g.jobs if a not in st.jobs]
            if unknown or gid != g.group_id:
                raise ValueError(f"harmony policy state: group {gid} names jobs it does not hold: {unknown}")
        self.jobs, self.groups = st.jobs, st.groups
        self.profiles.profiles = dict(st.profiles)
        self._next_group, self._now = st.next_group, st.now

    @classmethod
    def from_settings(cls, settings: RMConfig) -> "HarmonyPolicy":
        """The policy with the RM's settings (rm.toml: `harmony_link_bandwidth_bps`)."""
        return cls(HarmonyConfig.from_settings(settings))

    def describe(self) -> dict[str, dict[str, object]]:
        """Per tracked app its Harmony state, group, profiling node and profile (for the RM's pages)."""
        out: dict[str, dict[str, object]] = {}
        for app_id, job in sorted(self.jobs.items()):
            p = self.profiles.get(app_id)
            nodes = len(self.groups[job.group].nodes) if job.group in self.groups else 0
            out[app_id] = {"state": job.state.value, "group": job.group, "node": job.node,
                           "runState": job.run_state.value, "note": job.note,
                           "tCpu1": None if p is None else round(p.t_cpu1, 6),
                           # COMM at its group's nodes (one node while not grouped), and its parts
                           "tNet": None if p is None else round(p.net(max(1, nodes)), 6),
                           "tNetLocal": None if p is None else round(p.t_net_local, 6),
                           "tLink": None if p is None else round(p.t_link, 6),
                           "groupNodes": nodes,
                           "profileSamples": 0 if p is None else p.samples,
                           "profilingS": round(job.profiling_s, 3), "regroupS": round(job.regroup_s, 3),
                           "pausedS": round(job.paused_s, 3), "moves": job.moves,
                           "minNodes": job.fewest, "maxNodes": job.most}
        return out

    def _account(self, apps: dict[str, AppView], now: float) -> None:
        """Add the time since the last round to each job's overhead, by the state it was in: the
        state the last round left it in held until now."""
        dt = 0.0 if self._now is None else max(0.0, now - self._now)
        self._now = now
        for app_id, job in self.jobs.items():
            if job.state is JobState.PROFILING:
                job.profiling_s += dt
            elif job.state is JobState.PAUSED:
                job.paused_s += dt
            elif job.state is JobState.RUNNING and (app_id not in apps or not self._steady(apps[app_id])):
                job.regroup_s += dt

    def _alone(self, app_id: str, nodes: Iterable[str]) -> bool:
        """No other app has executors on any of `nodes` (its own may or may not be there yet)."""
        return all(self._occupants.get(n, set()) <= {app_id} for n in nodes)

    # ----- what the snapshot says ----------------------------------------------------------------------------------
    def _sync_apps(self, snapshot: ClusterSnapshot) -> list[tuple[str, Optional[Times]]]:
        """Track new PS jobs, finish ended ones; returns (group, the finished job's (T_cpu, T_net)
        there) per grouped job that ended."""
        seen = set()
        finished: list[tuple[str, Optional[Times]]] = []
        for app in sorted(snapshot.apps, key=lambda a: (a.submit_time, a.app_id)):
            job = self.jobs.get(app.app_id)
            if app.state in FINAL:
                if job is not None:
                    finished.extend(self._drop(job))
                continue
            if app.am_limited:
                # Its AM cannot start yet (a new attempt held by the queue's AM limit): nothing to
                # direct, but a job already known is alive -- kept with its profile and group,
                # not dropped as if it had finished and profiled afresh when its AM comes back.
                if job is not None:
                    seen.add(app.app_id)
                continue
            if job is None:
                # The spec is read once, when the job is first seen (it does not change).
                spec = app.ps
                if spec is None:
                    continue
                fewest, most = machine_bounds(spec)
                job = self.jobs[app.app_id] = _Job(app.app_id, app.submit_time, spec.executor, fewest, most)
            seen.add(app.app_id)
            self._observe(job, app)
        for app_id in [a for a in self.jobs if a not in seen]:
            finished.extend(self._drop(self.jobs[app_id]))
        return finished

    def _observe(self, job: _Job, app: AppView) -> None:
        """Fold the app's report into its profile where it describes the job's own times: a job on
        its profiling node only once it has run there alone for `profile_iterations`; a grouped
        one from held times (or whole times where it runs alone)."""
        r = app.shape
        if r is not None:
            job.iterations = r.iterations
        if job.state in (JobState.PROFILING, JobState.PROFILED) and job.node is not None:
            # Its profiling node and wherever its executors really are (an AM may have started
            # them elsewhere before it got its directive).
            nodes = set(self._profiling_nodes(job)) | self._placed.get(job.app_id, set())
            if not self._alone(job.app_id, nodes):
                job.alone_from = None
                now = self._now or 0.0
                job.crowded_since = now if job.crowded_since is None else job.crowded_since
                # Not alone for long: held times (its waits for partners' grants left out) rather
                # than no profile at all -- the job would hold up the initial grouping for ever.
                if (now - job.crowded_since >= self.cfg.alone_wait_s and r is not None and self._steady(app)
                        and self.profiles.get(job.app_id) is None):
                    if self.profiles.observe(job.app_id, r, alone=False) is not None:
                        job.note = f"profiled beside other jobs after {now - job.crowded_since:.0f}s (held times)"
                return
            job.crowded_since = None
            if job.alone_from is None or job.iterations < job.alone_from:
                job.alone_from = job.iterations     # (fewer: a new AM attempt counting afresh)
            if (r is not None and self._steady(app)
                    and r.iterations >= job.alone_from + self.cfg.profile_iterations):
                self.profiles.observe(job.app_id, r)
        elif job.state is JobState.RUNNING and self._steady(app):
            g = self.groups.get(job.group or "")
            self.profiles.observe(job.app_id, r, alone=g is not None and self._alone(job.app_id, g.nodes))

    def _retry_failed_moves(self, apps: dict[str, AppView]) -> None:
        """Retry, as a checkpoint migration, a move whose AM gave up on it.

        A PS AM's move is all or nothing and new executors first (appmaster/ps/reconfiguration.py):
        when a regrouping swaps nodes between groups, each moving job asks for room the other still
        holds, both wait out the AM's launch timeout and go on where they were -- and having acted on
        the directive, they report steady, so the policy would count them in groups whose nodes
        they are not on (in the simulator, 32 of 141 moves; their jobs slowed the groups they sat
        in for hours: docs/harmony_simulation.md). A job steady with its executors off its group's
        nodes for `move_retry_s` is paused (checkpoint, executors released) and, once its AM has
        paused, resumed on its group's nodes: a resume waits for its executors without a timeout,
        and the jobs moving the other way have released theirs by then. It stays in its group
        meanwhile (not in the pool)."""
        now = self._now or 0.0
        for job in sorted(self.jobs.values(), key=lambda j: j.order):
            app = apps.get(job.app_id)
            g = self.groups.get(job.group or "")
            if job.state is JobState.PAUSED and job.remigrating:
                if g is None or job.app_id not in g.jobs:
                    job.remigrating, job.group = False, None    # its group went: it waits in the pool
                elif app is not None and self._steady(app):
                    self._fire(job, JobEvent.RESUME)
                    job.remigrating = False
                    job.note = f"resumed on {g.group_id}'s nodes after a failed move"
                continue
            placed = self._placed.get(job.app_id, set())
            # Once per placement: an AM that cannot be placed there even after a restore (or one
            # that places executors its own way) is not paused again and again.
            if (job.state is not JobState.RUNNING or g is None or app is None or not self._steady(app)
                    or placed == set(g.nodes) or job.retried == (g.group_id, tuple(g.nodes))):
                job.misplaced_since = None
                continue
            if job.misplaced_since is None:
                job.misplaced_since = now
            elif now - job.misplaced_since >= self.cfg.move_retry_s:
                self._fire(job, JobEvent.PAUSE)
                job.remigrating, job.misplaced_since = True, None
                job.retried = (g.group_id, tuple(g.nodes))
                job.note = f"paused to migrate: its move to {g.group_id}'s nodes failed"

    @staticmethod
    def _steady(app: AppView) -> bool:
        """The report describes the shape the job was last told to have."""
        r, d = app.shape, app.directive
        return (r is not None and not r.changing and r.directive_version > 0
                and (d is None or r.directive_version >= d.version))

    def _drop(self, job: _Job) -> list[tuple[str, Optional[Times]]]:
        """Forget a finished job; [(its group, its times there)] if it was grouped."""
        advance(job.state, JobEvent.FINISH)
        out: list[tuple[str, Optional[Times]]] = []
        if job.group in self.groups:
            g = self.groups[job.group]
            p = self.profiles.get(job.app_id)
            out.append((g.group_id, None if p is None else p.at(max(1, len(g.nodes)))))
            g.jobs.remove(job.app_id)
        self.jobs.pop(job.app_id)
        self.profiles.forget(job.app_id)
        return out

    def _sync_nodes(self) -> None:
        """Lost nodes leave their groups; a group left without nodes pauses its jobs; a profiling job
        whose node is lost waits again."""
        for gid in sorted(self.groups):
            g = self.groups[gid]
            alive = [n for n in g.nodes if n in self._nodes]
            if alive != g.nodes:
                self._set_nodes(g, alive)
                # A member that may not run on fewer nodes waits (its partners run on).
                for app_id in [a for a in g.jobs if alive and self.jobs[a].fewest > len(alive)]:
                    self._pause(app_id, f"waits: its group lost nodes ({len(alive)} left, it needs "
                                        f"{self.jobs[app_id].fewest})")
            if not g.nodes:
                for app_id in list(g.jobs):
                    self._pause(app_id, "its group's nodes were lost")
                del self.groups[gid]
        for job in self.jobs.values():
            if any(n not in self._nodes for n in self._profiling_nodes(job)):
                job.node, job.more_nodes = None, []
                if job.state is JobState.PROFILING:
                    self._fire(job, JobEvent.REQUEUE)
                elif job.state is JobState.PROFILED:
                    self._pause(job.app_id, "its profiling node was lost")

    def _am_room(self, snapshot: ClusterSnapshot) -> tuple[dict[str, Resource], Resource]:
        """Room the AMs take: per node, the AMs running there (the scheduler packs them, so all of
        them may sit on one node); and, on every node, room for the AMs not placed yet: the largest
        AM times those AMs per node if they were spread evenly."""
        live = [a for a in snapshot.apps if a.state not in FINAL]
        on: dict[str, Resource] = {}
        for a in live:
            if a.am_node is not None:
                on[a.am_node] = on.get(a.am_node, ZERO) + a.am_resource
        unplaced = [a for a in live if a.am_node is None]
        am = Resource(max((a.am_resource.memory for a in live), default=0),
                      max((a.am_resource.vcores for a in live), default=0))
        return on, am.scale(math.ceil(len(unplaced) / max(1, len(self._nodes))))

    def _executor_room(self, node: NodeView) -> Resource:
        """What `node` leaves for executors once its AMs (and the unplaced AMs' share) have room."""
        return node.capacity - self._am_on.get(node.node_id, ZERO) - self._am_unplaced

    def _measure(self, apps: dict[str, AppView]) -> list[str]:
        """Profiling jobs whose reports have timings become profiled; returns them (FIFO)."""
        out = []
        for job in sorted(self.jobs.values(), key=lambda j: j.order):
            if job.state is JobState.PROFILING and self.profiles.get(job.app_id) is not None:
                self._fire(job, JobEvent.MEASURED)
                job.profiled_at = self._now
                out.append(job.app_id)
        return out

    # ----- the model over the cluster ------------------------------------------------------------------------------
    def _profile(self, app_id: str) -> Profile:
        p = self.profiles.get(app_id)
        assert p is not None, f"{app_id} is grouped without a profile"
        return p

    def _stats(self, groups: Iterable[tuple[Iterable[str], int]]) -> GroupStats:
        """Eq. 4.1-4.3 of groups (job ids, machines)."""
        cpu: list[float] = []
        net: list[float] = []
        link: list[float] = []
        group_of: list[int] = []
        machines: list[int] = []
        for i, (jobs, m) in enumerate(groups):
            machines.append(m)
            for a in jobs:
                p = self._profile(a)
                cpu.append(p.t_cpu1)
                net.append(p.t_net_local)
                link.append(p.t_link)
                group_of.append(i)
        return group_stats(np.array(cpu), np.array(net), np.array(group_of, dtype=np.int64),
                           np.array(machines, dtype=np.int64), t_link=np.array(link))

    def _score(self, groups: Iterable[tuple[Iterable[str], int]]) -> float:
        """score(U) of groups (job ids, machines) over all running nodes (the rest idle)."""
        stats = self._stats(groups)
        if stats.machines.size == 0:
            return 0.0
        u = (stats.machines[:, None] * stats.utilization).sum(axis=0) / max(1, len(self._nodes))
        return score(u, self.cfg.cpu_weight)

    def _scores_with(self, groups: list[_Group], app_id: str) -> FloatArray:
        """For each of `groups` (all with jobs), the cluster's score(U) if `app_id` joined it (the
        others as they are): eq. 4.1-4.4 updated group by group, vectorised."""
        stats = self._stats((g.jobs, len(g.nodes)) for g in groups)
        p = self._profile(app_id)
        m = stats.machines
        p_net = net_time(p.t_net_local, p.t_link, m)       # its COMM at each group's m
        cpu, net = stats.cpu + p.t_cpu1 / m, stats.net + p_net
        t = np.maximum(np.maximum(cpu, net), np.maximum(stats.max_job, p.t_cpu1 / m + p_net))
        joined = np.stack([cpu / t, net / t], axis=1)
        total = max(1, len(self._nodes))
        base = (m[:, None] * stats.utilization).sum(axis=0)
        u = (base[None, :] + m[:, None] * (joined - stats.utilization)) / total
        out: FloatArray = self.cfg.cpu_weight * u[:, 0] + (1.0 - self.cfg.cpu_weight) * u[:, 1]
        return out

    def _current(self) -> list[tuple[list[str], int]]:
        return [(g.jobs, len(g.nodes)) for _, g in sorted(self.groups.items()) if g.jobs]

    def _cap(self) -> int:
        """How many jobs a group may hold: every container needs a vcore and `min_executor_mb`."""
        if not self._nodes:
            return 1
        room = [self._executor_room(n) for n in self._nodes.values()]
        vcores = min(r.vcores for r in room)
        mem = min(r.memory for r in room)
        return max(1, min(vcores // CONTAINERS_PER_JOB, mem // (CONTAINERS_PER_JOB * self.cfg.min_executor_mb)))

    def _schedule(self, job_ids: list[str], machines: int) -> Grouping:
        cpu = np.array([self._profile(a).t_cpu1 for a in job_ids])
        net = np.array([self._profile(a).t_net_local for a in job_ids])
        link = np.array([self._profile(a).t_link for a in job_ids])
        jobs = [self.jobs[a] for a in job_ids]
        bounds = Bounds.of([j.fewest for j in jobs], [machines if j.most is None else j.most for j in jobs])
        return schedule(cpu, net, machines, self._cap(), swap_budget=self.cfg.swap_budget,
                        cpu_weight=self.cfg.cpu_weight, bounds=bounds, t_link=link)

    # ----- machine bounds ------------------------------------------------------------------------------------------
    @staticmethod
    def _fits(job: _Job, machines: int) -> bool:
        """The job may run on a group of `machines` nodes."""
        return job.fewest <= machines and (job.most is None or machines <= job.most)

    def _group_most(self, g: _Group) -> Optional[int]:
        """The most nodes g may have: its members' smallest maximum (None: no maximum)."""
        return min((m for a in g.jobs if (m := self.jobs[a].most) is not None), default=None)

    def _group_fewest(self, g: _Group) -> int:
        return max((self.jobs[a].fewest for a in g.jobs), default=1)

    def _unsatisfiable(self, job: _Job) -> Optional[str]:
        """Why no group can run the job now (None: one can)."""
        if job.most is not None and job.fewest > job.most:
            return (f"waits: its spec admits no node count (at least {job.fewest}, at most {job.most}: "
                    "one worker and one server per node)")
        if job.fewest > len(self._nodes):
            return f"waits: needs at least {job.fewest} nodes (min workers / servers), the cluster has {len(self._nodes)}"
        return None

    @staticmethod
    def _profiling_nodes(job: _Job) -> list[str]:
        return [] if job.node is None else [job.node] + job.more_nodes

    # ----- pools ---------------------------------------------------------------------------------------------------
    def _in_state(self, *states: JobState) -> list[str]:
        return [j.app_id for j in sorted(self.jobs.values(), key=lambda j: j.order) if j.state in states]

    def _pool(self) -> list[str]:
        """Jobs waiting for a group: profiled and paused, FIFO (not a job paused only to be
        resumed in its own group: `_retry_failed_moves`)."""
        return [a for a in self._in_state(JobState.PROFILED, JobState.PAUSED) if self.jobs[a].group is None]

    def _nodes_of(self, app_ids: Iterable[str]) -> list[str]:
        """The profiling nodes these jobs hold."""
        return [n for a in app_ids for n in self._profiling_nodes(self.jobs[a])]

    def _idle_nodes(self) -> list[str]:
        used = {n for g in self.groups.values() for n in g.nodes}
        used |= {n for j in self.jobs.values() for n in self._profiling_nodes(j)}
        return sorted(n for n in self._nodes if n not in used)

    # ----- scheduling events ---------------------------------------------------------------------------------------
    def _waited_enough(self) -> bool:
        """The initial grouping has waited `initial_wait_s` since the first waiting job's profile."""
        if self.cfg.initial_wait_s is None:
            return False
        first = min((t for t in (self.jobs[a].profiled_at for a in self._pool()) if t is not None), default=None)
        return first is not None and (self._now or 0.0) - first >= self.cfg.initial_wait_s

    def _initial_grouping(self) -> None:
        pool = self._pool()
        nodes = sorted(set(self._idle_nodes()) | set(self._nodes_of(pool)))
        if not nodes:
            return
        self._install(self._schedule(pool, len(nodes)), pool, nodes, [], "initial grouping")

    def _on_arrival(self, app_id: str, later: list[str]) -> None:
        """Place a newly profiled job; `later`: the jobs profiled in the same round after it (they
        are not waiting before it)."""
        job = self.jobs[app_id]
        if job.state is not JobState.PROFILED:
            return
        # (A job no group can run now holds up nobody.)
        waiting = [a for a in self._pool()
                   if a != app_id and a not in later and self._unsatisfiable(self.jobs[a]) is None]
        if waiting:
            self._pause(app_id, f"waits: {len(waiting)} profiled/paused job(s) wait before it")
            return
        current = self._current()
        base = self._score(current)
        cap = self._cap()
        best: Optional[tuple[float, Optional[str]]] = None
        live = [g for _, g in sorted(self.groups.items()) if g.jobs]
        if live:
            scores = self._scores_with(live, app_id)
            scores[np.array([len(g.jobs) >= cap or not self._fits(job, len(g.nodes)) for g in live])] = -np.inf
            i = int(np.argmax(scores))
            if np.isfinite(scores[i]):
                best = (float(scores[i]), live[i].group_id)
        # Its own profiling nodes first, as many as its maximum allows; none below its minimum.
        free = (self._profiling_nodes(job) + self._idle_nodes())[:job.most]
        if len(free) >= job.fewest:
            s = self._score(current + [([app_id], len(free))])
            if best is None or s > best[0]:
                best = (s, None)
        if best is None or best[0] <= base:
            self._pause(app_id, f"waits: no group it raises U in (U={base:.3f})")
            return
        if best[1] is None:
            g = self._new_group()
            self._set_nodes(g, sorted(free))
            self._join(app_id, g, f"new group on free nodes (U {base:.3f} -> {best[0]:.3f})")
        else:
            self._join(app_id, self.groups[best[1]], f"joins {best[1]} (U {base:.3f} -> {best[0]:.3f})")

    def _on_completion(self, gid: str, times: Optional[Times]) -> None:
        g = self.groups.get(gid)
        if g is None:
            return
        pool = self._pool()
        if pool and times is not None and self._replace(g, times, pool):
            return
        if pool or g.jobs:
            if self._regroup_around(g):
                return
        if not g.jobs:
            del self.groups[gid]    # its nodes fall idle and go to the other groups

    def _replace(self, g: _Group, finished: Times, pool: list[str]) -> bool:
        """Put a waiting job (or bundle) similar to the finished job (within `tolerance`, at the
        group's machines) in its place."""
        m = len(g.nodes)
        found = replacement(finished, [(a, self._profile(a).at(m)) for a in pool if self._fits(self.jobs[a], m)],
                            self.cfg.tolerance)
        if found is None or len(g.jobs) + len(found) > self._cap():
            return False
        for a in found:
            self._join(a, g, f"replaces a finished job of {g.group_id}")
        return True

    def _regroup_around(self, g: _Group) -> bool:
        """Algorithm 1 on g's jobs, the waiting ones and more and more of the smallest groups."""
        pool = self._pool()
        others = sorted((x for x in self.groups.values() if x is not g and x.jobs),
                        key=lambda x: (len(x.jobs), x.group_id))
        idle = self._idle_nodes()
        base = self._score(self._current())
        options: list[tuple[int, float, Grouping, list[str], list[str], list[_Group]]] = []
        k = 0
        while k <= len(others) and len(options) < self.cfg.regroup_options:
            sel = [g] + others[:k]
            running = sorted((a for x in sel for a in x.jobs), key=lambda a: self.jobs[a].order)
            job_ids = running + pool
            nodes = sorted({n for x in sel for n in x.nodes} | set(idle) | set(self._nodes_of(pool)))
            grouping = self._schedule(job_ids, len(nodes))
            kept = [(x.jobs, len(x.nodes)) for x in others[k:]]
            new = [([job_ids[i] for i in grp], m) for grp, m in zip(grouping.groups, grouping.machines)]
            options.append((len(running), self._score(kept + new), grouping, job_ids, nodes, sel))
            k = 1 if k == 0 else 2 * k
        i = fewest_within([(o[0], o[1]) for o in options], self.cfg.gain)
        _, s, grouping, job_ids, nodes, sel = options[i]
        if not worth_regrouping(base, s, self.cfg.gain):
            self._note(g, f"kept: regrouping would change U {base:.3f} -> {s:.3f} (< {self.cfg.gain:.0%} gain)")
            return False
        self._install(grouping, job_ids, nodes, sel, f"regrouped (U {base:.3f} -> {s:.3f})")
        return True

    def _profile_waiting(self) -> None:
        """Give waiting jobs nodes of their own to be profiled on, as many as the job's minimum
        (`fewest`, usually one): free nodes (the roomiest), else (up to `profiling_nodes` jobs at
        once) the last nodes of the groups with the most machines -- never taking a group below
        its members' minimum. A job no group could run (`_unsatisfiable`) is not profiled."""
        # The free node with the most room for executors first: the scheduler packs AMs, so the
        # node holding them may not fit even one worker and one server of the spec's size.
        idle = sorted(self._idle_nodes(), key=lambda n: -self._executor_room(self._nodes[n]).memory)
        borrowed = sum(1 for j in self.jobs.values() if j.state is JobState.PROFILING) if self.groups else 0
        for app_id in self._in_state(JobState.WAITING):
            job = self.jobs[app_id]
            why = self._unsatisfiable(job)
            if why is not None:
                job.note = why
                continue
            need = job.fewest
            # What each group can lend: its nodes above its members' minimum (and its last one).
            spare = {gid: len(g.nodes) - self._group_fewest(g) for gid, g in self.groups.items()
                     if len(g.nodes) > max(1, self._group_fewest(g))}
            lend = bool(self.groups) and borrowed < self.cfg.profiling_nodes
            if len(idle) < need and not (lend and len(idle) + sum(spare.values()) >= need):
                job.note = f"waits for {'a node' if need == 1 else f'{need} nodes'} to be profiled on"
                continue
            nodes, idle = idle[:need], idle[need:]
            taken: dict[str, int] = {}
            while len(nodes) < need:
                donor = max((self.groups[gid] for gid in spare if spare[gid] > taken.get(gid, 0)),
                            key=lambda x: (len(x.nodes) - taken.get(x.group_id, 0), x.group_id))
                taken[donor.group_id] = taken.get(donor.group_id, 0) + 1
                nodes.append(donor.nodes[-taken[donor.group_id]])
            for gid, k in sorted(taken.items()):
                self._set_nodes(self.groups[gid], self.groups[gid].nodes[:-k])
            borrowed += 1 if taken else 0
            self._fire(job, JobEvent.PROFILE)
            job.node, job.more_nodes = nodes[0], nodes[1:]
            # Alone from now if no other job's executors are there (its own report's iterations
            # count from here); else from when the snapshot shows them gone (`_observe`).
            job.alone_from = job.iterations if self._alone(app_id, nodes) else None
            job.note = f"profiling on {', '.join(nodes)}"

    def _give_idle_nodes(self) -> None:
        """Idle nodes go to the groups one by one, the most computation-bound group first."""
        live = [g for _, g in sorted(self.groups.items()) if g.jobs]
        if not live:
            return
        idle = self._idle_nodes()
        if not idle:
            return
        # C/m - N(m) = (C + L)/m - (N + L), L the summed link times (harmony_grouping.py's allocation)
        lk = np.array([sum(self._profile(a).t_link for a in g.jobs) for g in live])
        c = np.array([sum(self._profile(a).t_cpu1 for a in g.jobs) for g in live]) + lk
        n = np.array([sum(self._profile(a).t_net_local for a in g.jobs) for g in live]) + lk
        m = np.array([len(g.nodes) for g in live], dtype=np.float64)
        # A group at its members' smallest maximum takes none (the node stays idle).
        most = np.array([np.inf if (x := self._group_most(g)) is None else x for g in live], dtype=np.float64)
        extra: dict[int, list[str]] = {}
        for node in idle:
            value = np.where(m < most, c / np.maximum(m, 1.0) - n, -np.inf)
            i = int(np.argmax(value))
            if not np.isfinite(value[i]):
                break
            extra.setdefault(i, []).append(node)
            m[i] += 1
        for i, nodes in sorted(extra.items()):
            self._set_nodes(live[i], live[i].nodes + nodes)

    # ----- changing jobs and groups --------------------------------------------------------------------------------
    def _new_group(self) -> _Group:
        gid = f"g{self._next_group}"
        self._next_group += 1
        g = self.groups[gid] = _Group(gid)
        return g

    @staticmethod
    def _fire(job: _Job, event: JobEvent) -> None:
        """Apply `event` to the job: its state and run state both come from the lifecycle's table."""
        job.state, job.run_state = step(job.state, job.run_state, event)
        if event in (JobEvent.RUN, JobEvent.MOVE, JobEvent.RESUME):
            job.moves += 1      # each one a migration or a restore the job pays for

    def _note(self, g: _Group, note: str) -> None:
        for a in g.jobs:
            self.jobs[a].note = note

    def _set_nodes(self, g: _Group, nodes: list[str]) -> None:
        """Move group g to `nodes`; its running jobs are moved with it."""
        if nodes == g.nodes:
            return
        g.nodes = list(nodes)
        for a in g.jobs:
            job = self.jobs[a]
            if job.state is JobState.RUNNING:
                self._fire(job, JobEvent.MOVE)

    def _join(self, app_id: str, g: _Group, note: str) -> None:
        job = self.jobs[app_id]
        if job.state is JobState.PAUSED:
            self._fire(job, JobEvent.RESUME)
        elif job.state is JobState.PROFILED:
            self._fire(job, JobEvent.RUN)
        elif job.state is JobState.RUNNING:
            self._fire(job, JobEvent.MOVE)
            if job.group in self.groups and job.group != g.group_id and app_id in self.groups[job.group].jobs:
                self.groups[job.group].jobs.remove(app_id)
        else:
            raise AssertionError(f"{app_id} cannot join a group while {job.state.value}")
        if app_id not in g.jobs:
            g.jobs.append(app_id)
        job.group = g.group_id
        job.node, job.more_nodes = None, []
        job.note = note
        job.remigrating = False

    def _pause(self, app_id: str, note: str) -> None:
        job = self.jobs[app_id]
        if job.state is not JobState.PAUSED:     # a paused job's run state is PAUSE already
            self._fire(job, JobEvent.PAUSE)
        if job.group in self.groups and app_id in self.groups[job.group].jobs:
            self.groups[job.group].jobs.remove(app_id)
        job.group = None
        job.node, job.more_nodes = None, []
        job.note = note
        job.remigrating = False

    def _install(self, grouping: Grouping, job_ids: list[str], nodes: list[str], replaced: list[_Group],
                 note: str) -> None:
        """Replace `replaced` groups by `grouping` of `job_ids` on `nodes`: a new group keeps the id
        (and as many nodes as it gets) of the old group it shares the most jobs with; jobs left out
        are paused."""
        old = {g.group_id: g for g in replaced}
        old_nodes = {g.group_id: list(g.nodes) for g in replaced}
        members = [[job_ids[i] for i in grp] for grp in grouping.groups]
        ids: list[Optional[str]] = []
        for mem in members:
            overlap = sorted(((sum(1 for a in mem if a in g.jobs), gid) for gid, g in old.items()
                              if gid not in ids), key=lambda x: (-x[0], x[1]))
            ids.append(overlap[0][1] if overlap and overlap[0][0] > 0 else None)
        free = list(nodes)
        placed: list[list[str]] = []
        for gid, m in zip(ids, grouping.machines):
            keep = [n for n in old_nodes.get(gid or "", []) if n in free][:m]
            for n in keep:
                free.remove(n)
            placed.append(keep)
        for keep, m in zip(placed, grouping.machines):
            while len(keep) < m and free:
                keep.append(free.pop(0))
        chosen = {a for mem in members for a in mem}
        before = {a: self.jobs[a].group for a in job_ids}
        for gid in old:
            del self.groups[gid]
        for a in job_ids:
            if a in chosen:
                continue
            if self.jobs[a].state is not JobState.PAUSED:
                self._pause(a, f"waits: left out by {note}")
            elif self.jobs[a].remigrating:      # paused to migrate; its group is gone: it waits
                self.jobs[a].group, self.jobs[a].remigrating = None, False
        for gid, mem, keep in zip(ids, members, placed):
            g = self._new_group() if gid is None else self.groups.setdefault(gid, _Group(gid))
            g.nodes = keep
            for a in mem:
                job = self.jobs[a]
                if job.state is JobState.RUNNING:
                    if before[a] != g.group_id or old_nodes.get(g.group_id) != keep:
                        self._fire(job, JobEvent.MOVE)
                    job.group = g.group_id
                    job.note = note
                    g.jobs.append(a)
                else:
                    self._join(a, g, note)

    # ----- the decision --------------------------------------------------------------------------------------------
    def _room(self, nodes: Iterable[str]) -> Resource:
        """What one node of these leaves for executors (the smallest of them, less the AMs' room)."""
        room = [self._executor_room(self._nodes[n]) for n in nodes if n in self._nodes]
        if not room:
            return ZERO
        return Resource(max(0, min(r.memory for r in room)), max(0, min(r.vcores for r in room)))

    def _executor(self, room: Resource, containers: int, ceiling: Optional[Resource] = None) -> Resource:
        mem = room.memory // max(1, containers)
        vcores = max(1, room.vcores // max(1, containers))
        if ceiling is not None:
            mem, vcores = min(mem, ceiling.memory), min(vcores, ceiling.vcores)
        mem = max(self._min_mb, mem // self._min_mb * self._min_mb)
        return Resource(mem, vcores)

    def _decision(self, apps: dict[str, AppView]) -> tuple[Decision, dict[str, Optional[Resource]]]:
        """The round's decision from the jobs' state, changing nothing; with it, per job whose
        executor size it settles, that size (None: no group size to keep), which `_keep_sizes`
        records for the next round."""
        out: dict[str, JobDecision] = {}
        sizes: dict[str, Optional[Resource]] = {}
        # Per group, once: its placement (a worker and a server on each node) and container share.
        per_group = {gid: (tuple(NodePlacement(node=n, workers=1, servers=1) for n in g.nodes),
                           self._executor(self._room(g.nodes), CONTAINERS_PER_JOB * len(g.jobs)))
                     for gid, g in self.groups.items() if g.jobs}
        for app_id, job in sorted(self.jobs.items()):
            if app_id not in apps:
                continue
            why = f"harmony: {job.state.value}" + (f" in {job.group}" if job.group else "") + (
                f"; {job.note}" if job.note else "")
            if job.state is JobState.RUNNING and job.group in per_group:
                placement, share = per_group[job.group]
                # Containers keep their size while it fits (a job leaving the group does not
                # make its partners restart theirs); they shrink when the group grows.
                size = job.size if job.size is not None and job.size.fits_in(share) else share
                sizes[app_id] = size
                out[app_id] = JobDecision(len(placement), len(placement), placement, group=job.group,
                                          run_state=job.run_state, reason=why, executor_resource=size)
            elif job.state in (JobState.PROFILING, JobState.PROFILED) and job.node is not None:
                nodes = self._profiling_nodes(job)
                size = self._executor(self._room(nodes), CONTAINERS_PER_JOB, job.executor)
                # Kept into its first group while it fits the group's share: a new size means new
                # containers, i.e. a checkpoint-restart (9 s on the testbed) for a job that may not
                # even move; the group's share only shrinks it.
                sizes[app_id] = size
                out[app_id] = JobDecision(len(nodes), len(nodes),
                                          tuple(NodePlacement(node=n, workers=1, servers=1) for n in nodes),
                                          run_state=RunState.RUN, reason=why, executor_resource=size)
            else:
                sizes[app_id] = None
                out[app_id] = JobDecision(0, 0, run_state=RunState.PAUSE, reason=why)
        return Decision(out), sizes

    def _keep_sizes(self, sizes: dict[str, Optional[Resource]]) -> None:
        """Record the executor sizes a decision settled (kept while they fit the group's share)."""
        for app_id, size in sizes.items():
            self.jobs[app_id].size = size


__all__ = ["HarmonyConfig", "HarmonyPolicy", "HarmonyState"]

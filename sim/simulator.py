"""Runs a trace through the real RM core and a policy on the virtual clock (see sim/__init__.py).

`simulate(trace, policy, nodes, ...)` builds a `ResourceManagerCore` whose clock is the event
loop's, registers `nodes` simulated NMs, schedules the periodic work a real RM and its daemons do
(NM heartbeats, the core's liveness tick, policy rounds: rm/server.py's timers) and each job's
arrival, and runs events until every job has finished (or `max_virtual_s` passes). After every
event it drains the core's effects (AM launches go to their simulated AM) as the RM server does.

The policy is built as the RM server builds it, `policies.create(name, rm_config)` (Dorm's
thresholds and the other policy settings come from `SimConfig.rm`). Whenever the executors that
train change anywhere, every training job's epoch time is asked of `SimConfig.iteration_time`
(sim/iteration_time.py: the default slows the executors of an oversubscribed node; a co-location
model plugs in there), and `Simulator.policy` may be replaced before `run` (sim/optimus_truth.py's policy
is built from the jobs' true epochs and speed functions, which only the simulator knows).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Mapping, Optional, Sequence

import msgspec

from appmaster.ps.controller import Phase
from protocol.config import ClusterConfig, RMConfig
from protocol.ps_job_spec import PSJobSpec
from protocol.records import Resource
from rm import policies
from rm.core import ResourceManagerCore
from rm.policies.optimus import OptimusPolicy
from rm.policy_runner import run_policy

from .calibration import Calibration
from .iteration_time import ClusterLoad, CoreContention, ExecutorLoad, IterationTimeModel, JobLoad
from .event_loop import EventLoop
from .optimus_truth import JobTruth, OptimusTruthPolicy, TruthInputs
from .metrics import Demand, Sample, Summary, fairness_loss, summarize, utilization
from .job_record import JobRecord
from .sim_job import JobTimings, SimJob
from .sim_node import SimNode
from .trace import TraceJob

# The controller's phases in which a job holds executors that train or change: a job outside
# them (waiting for its first executors, paused, resuming or migrating onto new ones, finished)
# does not keep a run from being called stalled.
ACTIVE = frozenset({Phase.INITIALISING, Phase.RESTORING, Phase.TRAINING, Phase.RESHAPING, Phase.RESTARTING,
                    Phase.EXECUTING_PLAN, Phase.CHECKPOINTING, Phase.RECOVERING, Phase.PAUSING, Phase.FINISHING})
T0 = 1_000_000_000.0        # virtual epoch: IDs and tokens look like a real RM's; records are relative to it
SIM_SECRET = "elastane-simulator-secret"
# The simulator-only policies (sim/optimus_truth.py): they need the jobs' truth. optimus-truth is
# Optimus's rule on the true curves; the other two are the `optimus` policy itself with one of its
# estimates replaced by the truth (what that estimate costs it).
OPTIMUS_TRUTH = "optimus-truth"
OPTIMUS_TRUE_SPEED = "optimus-true-speed"
OPTIMUS_TRUE_EPOCHS = "optimus-true-epochs"
SIM_POLICIES = (OPTIMUS_TRUTH, OPTIMUS_TRUE_SPEED, OPTIMUS_TRUE_EPOCHS)
AM_LABEL = "am"             # the label of SimConfig.am_nodes


def known_policies() -> list[str]:
    """Every policy a simulation can run: the RM's registered ones and the simulator's own."""
    return sorted(set(policies.known()) | set(SIM_POLICIES))


@dataclass(frozen=True)
class SimConfig:
    """The simulated cluster and the RM's timers (defaults: a real RM's, rm/server.py)."""

    nodes: int = 8
    node_memory_mb: int = 8192
    node_vcores: int = 8
    # The cores a node really has, in the vcores its apps were calibrated at (None: node_vcores).
    # Fewer than node_vcores models an NM that declares more vcores than it has cores (YARN's
    # non-strict CPU mode): executors that train together on it then slow each other
    # (sim/iteration_time.py); with it unset, the scheduler's vcore accounting keeps nodes within
    # their cores and only a co-location model slows jobs down.
    node_cores: Optional[int] = None
    # Extra nodes for the AMs only (the papers' master instance, Harmony §4.4 / docs/testbed.md's
    # am_host): registered with node label `AM_LABEL`, which the RM config then makes the only
    # place AMs go (and where executors never go); 0: AMs share the nodes with executors.
    am_nodes: int = 0
    am_node_memory_mb: int = 65536
    am_node_vcores: int = 64
    heartbeat_s: float = 1.0
    tick_s: float = 0.5
    policy_interval_s: float = 1.0
    sample_s: float = 5.0
    max_virtual_s: float = 30 * 86400.0
    # Stop when, after the last arrival, no job has trained for this long (jobs each holding part of
    # what they asked for can wait on each other forever: YARN grants no gangs); they stay unfinished.
    stall_s: float = 3600.0
    timings: JobTimings = JobTimings()
    # How long an epoch takes where a job runs (sim/iteration_time.py); None: CoreContention().
    iteration_time: Optional[IterationTimeModel] = None
    rm: RMConfig = field(default_factory=lambda: RMConfig(nm_expiry_s=10.0, am_expiry_s=10.0))

    def coarse(self, step_s: float) -> "SimConfig":
        """This config at event granularity `step_s`: NM heartbeats, core ticks, policy rounds and AM
        allocates (pending or not) every `step_s`, liveness expiries 10 steps. A 100-node cluster
        running hours of jobs then takes minutes to simulate; times are off by up to a step."""
        if step_s <= 0:
            raise ValueError(f"step_s must be positive, got {step_s}")
        rm = msgspec.structs.replace(self.rm, nm_expiry_s=max(self.rm.nm_expiry_s, 10 * step_s),
                                     am_expiry_s=max(self.rm.am_expiry_s, 10 * step_s))
        return replace(self, heartbeat_s=step_s, tick_s=step_s, policy_interval_s=step_s, rm=rm,
                       timings=replace(self.timings, allocate_interval_s=step_s, pending_interval_s=step_s))


@dataclass
class SimResult:
    """A finished run: per-job records, cluster samples over time and the summary."""

    policy: str
    records: list[JobRecord]
    samples: list[Sample]
    summary: Summary
    t0: float = T0
    # Jobs that trained at a shape beyond their app's measured calibration range
    # (AppCalibration.beyond_range: more workers or servers than any calibration run had), whose
    # epoch times are the fit's extrapolation; the share is over all jobs (0.0 for an empty trace).
    extrapolated_jobs: list[str] = field(default_factory=list)

    @property
    def extrapolated_job_share(self) -> float:
        return len(self.extrapolated_jobs) / len(self.records) if self.records else 0.0

    def record_lines(self) -> list[dict[str, object]]:
        return [r.to_json(self.t0) for r in self.records]


class Simulator:
    """One run's state: the loop, the core, the nodes and the jobs."""

    def __init__(self, trace: Sequence[TraceJob], policy_name: str, calibration: Calibration,
                 cfg: SimConfig = SimConfig(), specs: Mapping[str, PSJobSpec] = MappingProxyType({}),
                 am_logs: bool = False):
        """`specs`: the PS job spec a trace job (by name) runs with instead of the one made from the
        trace (sim/am_replay.py runs a real job's spec); `am_logs`: every simulated AM records its
        controller's events and instructions (SimJob.log)."""
        for j in trace:
            calibration.app(j.app)      # CalibrationError now rather than mid-run
        self.cfg = cfg
        self.loop = EventLoop(T0)
        rm_cfg = msgspec.structs.replace(cfg.rm, policy=policy_name,
                                         nm_heartbeat_interval_ms=int(cfg.heartbeat_s * 1000))
        if cfg.am_nodes > 0:
            rm_cfg = msgspec.structs.replace(rm_cfg, node_labels=sorted({*rm_cfg.node_labels, AM_LABEL}),
                                             am_node_label=AM_LABEL)
        self.core = ResourceManagerCore(rm_cfg, ClusterConfig(secret=SIM_SECRET, admins=["root"]), self.loop.clock)
        self.policy_name = policy_name
        self.policy: policies.Policy
        if policy_name == OPTIMUS_TRUTH:
            self.policy = OptimusTruthPolicy(self.truth)
        elif policy_name in (OPTIMUS_TRUE_SPEED, OPTIMUS_TRUE_EPOCHS):
            self.policy = OptimusPolicy(rm_cfg, known=TruthInputs(self.truth, speed_known=policy_name == OPTIMUS_TRUE_SPEED,
                                                                  epochs_known=policy_name == OPTIMUS_TRUE_EPOCHS))
        else:
            self.policy = policies.create(policy_name, rm_cfg)
        self.iteration_time: IterationTimeModel = cfg.iteration_time or CoreContention()
        self.nodes = {n.node_id: n for n in (
            SimNode(f"sim-{i:05d}:8042", Resource(cfg.node_memory_mb, cfg.node_vcores)) for i in range(cfg.nodes))}
        self.nodes.update({n.node_id: n for n in (
            SimNode(f"sim-am-{i:03d}:8042", Resource(cfg.am_node_memory_mb, cfg.am_node_vcores), labels=(AM_LABEL,))
            for i in range(cfg.am_nodes))})
        self.calibration = calibration
        self.jobs = [SimJob(j, calibration.app(j.app), self.loop, self.core, self.nodes, cfg.timings, self._done,
                            self._load_changed, spec=specs.get(j.name), log=am_logs)
                     for j in trace]
        self.by_app: dict[str, SimJob] = {}
        self.samples: list[Sample] = []
        self.finished = 0
        self.last_active = self.loop.now
        self.stalled = False

    # ----- periodic work ----------------------------------------------------------------------
    def _heartbeat(self, node: SimNode) -> None:
        node.heartbeat(self.core)
        self.loop.after(self.cfg.heartbeat_s, self._heartbeat, node)

    def _tick(self) -> None:
        self.core.tick()
        self.loop.after(self.cfg.tick_s, self._tick)

    def _policy_round(self) -> None:
        run_policy(self.core, self.policy)
        self.loop.after(self.cfg.policy_interval_s, self._policy_round)

    def _sample(self) -> None:
        self.samples.append(self.sample())
        if any(j.phase in ACTIVE for j in self.jobs) or len(self.by_app) < len(self.jobs):
            self.last_active = self.loop.now
        elif self.loop.now - self.last_active > self.cfg.stall_s:
            self.stalled = True
            return
        self.loop.after(self.cfg.sample_s, self._sample)

    def _arrive(self, job: SimJob) -> None:
        job.submit()
        self.by_app[job.app_id] = job

    def _done(self, job: SimJob) -> None:
        self.finished += 1

    def truth(self, app_id: str) -> Optional[JobTruth]:
        """A job's true remaining epochs and speed (optimus-truth's input); None for an unknown app."""
        job = self.by_app.get(app_id)
        return job.truth() if job is not None else None

    def _load_changed(self, job: SimJob) -> None:
        """Some job's training executors changed: every training job's epoch time is asked again."""
        load = self.cluster_load()
        for jl in load.jobs:
            self.by_app[jl.app_id].set_epoch_time(self.iteration_time.epoch_time(jl, load))

    def cluster_load(self) -> ClusterLoad:
        """Every node's vcores and the executors of every training job (sim/iteration_time.py)."""
        jobs = []
        for job in self.jobs:
            execs = job.training_executors()
            if not execs:
                continue
            w, s = job.active
            jobs.append(JobLoad(job.app_id, job.job.app, w, s, job.solo_epoch_s, tuple(
                ExecutorLoad(job.app_id, job.job.app, h.role, h.node, h.resource.vcores) for _, h in execs)))
        cores = self.cfg.node_cores
        return ClusterLoad.of({n.node_id: cores if cores is not None else n.capability.vcores
                               for n in self.nodes.values()}, tuple(jobs))

    def _drain(self) -> None:
        for eff in self.core.take_effects():
            self.by_app[eff.app_id].am_launched(eff)
        self.core.take_dirty()

    # ----- measurement ------------------------------------------------------------------------
    def sample(self) -> Sample:
        core = self.core
        total = core.nodes.total
        used = Resource(0, 0)
        for q in core.scheduler.queues.values():
            used = used + q.used
        # The AM nodes (SimConfig.am_nodes) are the papers' master instance, not the cluster: their
        # capacity and the AMs on them count in neither the total nor the use.
        for node in self.nodes.values():
            if AM_LABEL in node.labels:
                total = total - node.capability
                for job in self.jobs:
                    if job.am_node == node.node_id and job.am_container in node.running:
                        used = used - Resource(self.cfg.timings.am_memory_mb, 1)
        demands = []
        running = waiting = 0
        for job in self.jobs:
            if not job.app_id or job.phase.is_final:
                continue
            sa = core.scheduler.apps.get(job.app_id)
            held = sa.used if sa is not None else Resource(0, 0)
            w, s = job.job.shape_max
            demands.append(Demand(job.app_id, Resource(self.cfg.timings.am_memory_mb, 1),
                                  Resource(job.job.executor_memory_mb, job.job.executor_vcores), w + s, held))
            if job.record.start is None:
                waiting += 1
            else:
                running += 1
        useful = Resource(0, 0)
        for job in self.jobs:
            for _, h in job.training_executors():
                useful = useful + h.resource
        return Sample(t=self.loop.now - T0, utilization=utilization(used, total), memory_used=used.memory,
                      useful_utilization=utilization(useful, total), useful_vcores=useful.vcores,
                      vcores_used=used.vcores, running=running, waiting=waiting,
                      fairness_loss=fairness_loss(demands, total) if demands else 0.0)

    # ----- the run ----------------------------------------------------------------------------
    def run(self) -> SimResult:
        wall = time.perf_counter()
        loop, cfg = self.loop, self.cfg
        # As the RM server tells its core (rm/server.py): a policy that places new jobs (Harmony)
        # has the AMs wait for their first directive. Read here: `policy` may be replaced before run.
        self.core.policy_places_new_jobs = policies.places_new_jobs(self.policy)
        n = max(1, len(self.nodes))
        for i, node in enumerate(self.nodes.values()):
            node.register(self.core)
            # Spread the heartbeats over the interval, as independent NMs would be.
            loop.after(cfg.heartbeat_s * (i + 1) / n, self._heartbeat, node)
        for job in self.jobs:
            loop.at(T0 + job.job.arrival_s, self._arrive, job)
        loop.after(cfg.tick_s, self._tick)
        loop.after(cfg.policy_interval_s, self._policy_round)
        loop.at(T0 + (self.jobs[0].job.arrival_s if self.jobs else 0.0), self._sample)
        total = len(self.jobs)
        loop.run(stop=lambda: self.finished >= total or self.stalled, until=T0 + cfg.max_virtual_s, on_event=self._drain)
        self.samples.append(self.sample())
        records = [j.record for j in self.jobs]
        summary = summarize([r.jct for r in records], [r.arrival - T0 for r in records],
                            [None if r.end is None else r.end - T0 for r in records], self.samples,
                            sum(r.reshapes for r in records), loop.now - T0, time.perf_counter() - wall,
                            loop.processed)
        summary = replace(summary, failed=sum(r.failed for r in records))
        beyond = [j.job.name for j in self.jobs
                  if any(self.calibration.app(j.job.app).beyond_range(w, s) for _, w, s in j.record.shapes)]
        return SimResult(self.policy_name, records, self.samples, summary, extrapolated_jobs=beyond)


def simulate(trace: Sequence[TraceJob], policy: str, calibration: Calibration,
             cfg: Optional[SimConfig] = None) -> SimResult:
    """Run `trace` under `policy` (a registered name) on the simulated cluster `cfg`."""
    return Simulator(trace, policy, calibration, cfg or SimConfig()).run()


__all__ = ["AM_LABEL", "OPTIMUS_TRUE_EPOCHS", "OPTIMUS_TRUE_SPEED", "OPTIMUS_TRUTH", "SIM_POLICIES", "SimConfig", "known_policies", "SimResult", "Simulator", "T0", "simulate"]

"""One PS job in the simulator, given directives at given times: the log its AM's controller wrote.

Issue 35 part 5: a cluster test records the real AM's (event, instruction) log through an EPS add,
a Cruise plan, a Harmony pause and resume and an executor kill; the simulator, given the same spec
and the same directives at the same times, must go through the same phases and issue the same
instruction kinds. `replay_directives` is the simulator's half: it runs the job alone on a
simulated cluster whose RM policy (a script, `ScriptedDirectives`) gives the job each directive
from its time on (seconds after the job's submission; the RM core turns it into a versioned
directive as it does a real policy's decision), kills the executors `losses` name at their times
(the node reports the container ended, as an NM does), and returns what the simulated AM's
controller went through.

What comes from outside the controller and the simulator does not model is given as recorded:
`outside` events at their times (a scale request at the AM's endpoint, a plan Cruise's optimizer
proposed; each handed over with the simulated time as its `at`), and `plans`, the ops Cruise's
optimizer answered the job's ComputePlan steps with (an RM directive under optimizer "cruise"),
in order. The optimizer's decisions rest on measured timings, so like the directives they are
inputs of the replay, not something it predicts.

Nodes: a directive's node names are mapped onto the simulated nodes in the order the directives
first name them (a real cluster's host names mean nothing to the simulator); with more nodes
named than simulated, ValueError.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Optional, Sequence

import msgspec

from appmaster.ps.controller import Phase
from appmaster.ps.controller import events as cev
from appmaster.ps.controller.instructions import STEP_TYPES
from appmaster.ps.controller.records import PlanOp, Role
from appmaster.ps.controller.state import ExecutorState
from protocol.internal_api import NodePlacement, ShapeDirective
from protocol.ps_job_spec import PSJobSpec
from rm import policies

from .calibration import Calibration
from .job_record import JobRecord
from .sim_job import SimJob
from .simulator import T0, SimConfig, Simulator
from .trace import TraceJob

JOB = "replayed"
STEP_KINDS = frozenset(t.__name__ for t in STEP_TYPES)
# A job that sets no convergence threshold runs to its epoch limit (what a recorded cluster run
# with a fixed epoch count does).
NO_THRESHOLD = 1e-12
SIGKILLED = 137         # a process killed by SIGKILL, as its NM reports it (128 + 9)


@dataclass(frozen=True)
class Loss:
    """Kill an executor `at` seconds after submission: the newest ready one of `role`."""

    at: float
    role: Role
    exit_status: int = SIGKILLED


@dataclass
class AmReplay:
    """What the simulated AM's controller went through (module doc)."""

    phases: list[Phase]
    instructions: list[str]
    events: list[tuple[float, str, Phase]]      # (time after submission, event kind, phase after it)
    record: JobRecord
    killed: list[str] = field(default_factory=list)     # the executors `losses` killed

    per_event: list[tuple[Phase, list[str]]] = field(default_factory=list)

    def segments(self) -> list[tuple[Phase, Counter[str]]]:
        """The step kinds each stretch of one phase issued (see `step_segments`)."""
        return step_segments(self.per_event)

    def steps(self) -> list[str]:
        """The step instructions' kinds, in order (what the job did, without the bookkeeping
        instructions: launches, reports, replies)."""
        return [k for k in self.instructions if k in STEP_KINDS]


def step_segments(per_event: Sequence[tuple[Phase, Sequence[str]]]) -> list[tuple[Phase, Counter[str]]]:
    """Per stretch of consecutive events after which the job was in the same phase, the step
    instruction kinds those events issued (an event's instructions belong to the phase it led to).
    A change's concurrent parts (EPS's two roles, a plan's ready ops) interleave their steps by
    timing, so within a stretch the kinds are a multiset; the stretches themselves are in order."""
    out: list[tuple[Phase, Counter[str]]] = []
    for phase, kinds in per_event:
        if not out or out[-1][0] is not phase:
            out.append((phase, Counter()))
        out[-1][1].update(k for k in kinds if k in STEP_KINDS)
    return out


class ScriptedDirectives:
    """An RM policy that gives the job each scripted directive from its time on."""

    name = "scripted-directives"

    def __init__(self, script: Sequence[tuple[float, ShapeDirective]], nodes: dict[str, str]):
        self.script = sorted(script, key=lambda td: td[0])
        self.nodes = nodes

    def decide(self, snapshot: policies.ClusterSnapshot) -> policies.Decision:
        now = snapshot.now - T0
        due = [d for t, d in self.script if t <= now]
        if not due:
            return policies.Decision()
        d = due[-1]
        placement = tuple(NodePlacement(node=self.nodes[p.node], workers=p.workers, servers=p.servers)
                          for p in d.placement)
        decision = policies.JobDecision(d.workers, d.servers, placement, group=d.group, run_state=d.run_state,
                                        reason=d.reason or "scripted", executor_resource=d.executor_resource)
        return policies.Decision({a.app_id: decision for a in snapshot.apps})


def trace_job(spec: PSJobSpec, data_scale: float = 1.0) -> TraceJob:
    """The trace job of a PS job spec (the simulator's own description of a job)."""
    return TraceJob(name=JOB, arrival_s=0.0, app=spec.app, threshold=spec.convergence_threshold or NO_THRESHOLD,
                    workers=spec.workers, servers=spec.servers, data_scale=data_scale,
                    min_workers=spec.min_workers, min_servers=spec.min_servers,
                    max_workers=spec.max_workers or spec.workers, max_servers=spec.max_servers or spec.servers,
                    sync=spec.sync, elastic_mode=spec.elastic_mode, executor_memory_mb=spec.executor_memory_mb,
                    executor_vcores=spec.executor_vcores, max_epochs=spec.max_epochs,
                    early_feedback_iterations=spec.early_feedback_iterations, weight=spec.weight)


def node_map(script: Sequence[tuple[float, ShapeDirective]], sim_nodes: Sequence[str]) -> dict[str, str]:
    """The directives' node names onto the simulated nodes, in the order they are first named."""
    out: dict[str, str] = {}
    for _, d in sorted(script, key=lambda td: td[0]):
        for name in [p.node for p in d.placement]:
            if name not in out:
                if len(out) == len(sim_nodes):
                    raise ValueError(f"the directives name more nodes than the {len(sim_nodes)} simulated")
                out[name] = sim_nodes[len(out)]
    return out


def replay_directives(spec: PSJobSpec, script: Sequence[tuple[float, ShapeDirective]], calibration: Calibration,
                      losses: Sequence[Loss] = (), cfg: Optional[SimConfig] = None,
                      data_scale: float = 1.0, outside: Sequence[tuple[float, cev.Event]] = (),
                      plans: Sequence[list[PlanOp]] = ()) -> AmReplay:
    """Run `spec` alone in the simulator with `script`'s directives and `losses` (module doc)."""
    cfg = cfg or SimConfig(nodes=4, am_nodes=1)
    job = trace_job(spec, data_scale)
    sim = Simulator([job], "static", calibration, cfg, specs={JOB: spec}, am_logs=True)
    workers = sorted(n for n, node in sim.nodes.items() if not node.labels)
    sim.policy = ScriptedDirectives(script, node_map(script, workers))
    sj = sim.jobs[0]
    killed: list[str] = []
    for loss in losses:
        sim.loop.at(T0 + loss.at, _kill, sim, sj, loss, killed)
    sj.plans.extend(list(ops) for ops in plans)
    for at, e in outside:
        sim.loop.at(T0 + at, _outside, sim, sj, e)
    record = sim.run().records[0]
    assert sj.log is not None
    phases = [Phase.STARTING] + [to for _, _, to in sj.state.history]
    return AmReplay(phases=[p for i, p in enumerate(phases) if i == 0 or p is not phases[i - 1]],
                    instructions=list(sj.log.instructions), record=record, killed=killed,
                    per_event=list(sj.log.per_event),
                    events=[(t - sj.record.arrival, kind, phase) for t, kind, phase in sj.log.events])


def _outside(sim: Simulator, job: SimJob, e: cev.Event) -> None:
    job.outside(msgspec.structs.replace(e, at=sim.loop.now))


def _kill(sim: Simulator, job: SimJob, loss: Loss, killed: list[str]) -> None:
    """The newest ready executor of the loss's role ends: its node reports the container ended."""
    ready = [e.info for e in job.state.executors.values() if e.role is loss.role and e.state is ExecutorState.READY]
    if not ready:
        return
    victim = max(ready, key=lambda x: int(x.executor_id.rsplit("-", 1)[1]))
    sim.nodes[victim.node].exit(victim.container_id, loss.exit_status, "killed (simulated executor loss)")
    killed.append(victim.executor_id)


__all__ = ["AmReplay", "JOB", "Loss", "ScriptedDirectives", "node_map", "replay_directives", "step_segments",
           "trace_job"]

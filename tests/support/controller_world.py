"""A scripted world for the PS-job controller's unit tests: it carries out the controller's step
instructions at once (or holds them for the test to answer), the way the AM's interpreter would,
with executors named by role and count and the first set-up placing blocks and splits
round-robin. No processes, no sleeps: tests step events and read what came out."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from appmaster.ps.controller import Phase
from appmaster.ps.controller import events as ev
from appmaster.ps.controller import instructions as ins
from appmaster.ps.controller.core import handle
from appmaster.ps.controller.records import ExecutorInfo, Holdings, PlanOp, Role
from appmaster.ps.controller.state import JobState
from protocol import ps_job_spec


def job_state(**spec: object) -> JobState:
    fields: dict[str, object] = {"app": "mlr", "workers": 2, "servers": 1}
    fields.update(spec)
    return JobState(spec=ps_job_spec.validate(fields))


@dataclass
class World:
    """Drives one JobState: `send` an event, the instructions come back in `log`; steps are
    answered automatically unless their kind is in `hold` (then `answer` / `fail` them)."""

    job: JobState
    hold: set[type] = field(default_factory=set)
    nodes: tuple[str, ...] = ("n1", "n2", "n3")
    log: list[ins.Instruction] = field(default_factory=list)
    held: dict[int, ins.StepInstruction] = field(default_factory=dict)
    now: float = 0.0
    plan: list[PlanOp] = field(default_factory=list)     # what Cruise's optimizer answers ComputePlan with
    _count: dict[Role, int] = field(default_factory=lambda: {Role.WORKER: 0, Role.SERVER: 0})

    def send(self, event: ev.Event) -> list[ins.Instruction]:
        self.now = max(self.now, event.at) + 1.0
        _, out = handle(self.job, event)
        self.log.extend(out)
        for i in out:
            if isinstance(i, ins.STEP_TYPES):
                if type(i) in self.hold:
                    self.held[i.step] = i      # type: ignore[assignment]
                else:
                    self.answer(i)             # type: ignore[arg-type]
        return out

    def at(self) -> float:
        return self.now

    def start(self, **registered: object) -> None:
        self.send(ev.Registered(at=self.at(), **registered))   # type: ignore[arg-type]

    def _new(self, role: Role, node: str) -> ExecutorInfo:
        self._count[role] += 1
        n = self._count[role]
        return ExecutorInfo(executor_id=f"{role.value}-{n}", role=role, container_id=f"c-{role.value}-{n}", node=node)

    def answer(self, step: ins.StepInstruction, holdings: Optional[Holdings] = None) -> list[ins.Instruction]:
        self.held.pop(step.step, None)
        done = ev.StepDone(at=self.at(), step=step.step)
        if isinstance(step, ins.StartExecutors):
            nodes = [n for n, c in step.per_node.items() for _ in range(c)] or \
                [(step.nodes or list(self.nodes))[i % len(step.nodes or self.nodes)] for i in range(step.count)]
            done = ev.StepDone(at=self.at(), step=step.step, executors=[self._new(step.role, n) for n in nodes])
        elif isinstance(step, ins.SetupTraining):
            done = ev.StepDone(at=self.at(), step=step.step, holdings=holdings or self.round_robin())
        elif isinstance(step, ins.RestoreCheckpoint):
            done = ev.StepDone(at=self.at(), step=step.step, holdings=holdings or self.round_robin())
        elif isinstance(step, ins.ComputePlan):
            done = ev.StepDone(at=self.at(), step=step.step, ops=list(self.plan))
        elif isinstance(step, ins.WriteCheckpoint):
            done = ev.StepDone(at=self.at(), step=step.step, directory=f"ckpt/epoch-{step.epoch}")
        elif holdings is not None:
            done = ev.StepDone(at=self.at(), step=step.step, holdings=holdings)
        return self.send(done)

    def fail(self, step: ins.StepInstruction, error: str = "boom", cancelled: bool = False,
             executors: Optional[list[ExecutorInfo]] = None) -> list[ins.Instruction]:
        """Answer `step` with StepFailed; `executors`: those it started before it failed."""
        self.held.pop(step.step, None)
        return self.send(ev.StepFailed(at=self.at(), step=step.step, error=error, cancelled=cancelled,
                                       executors=executors or []))

    def round_robin(self) -> Holdings:
        servers, workers = self.job.ids(Role.SERVER), self.job.ids(Role.WORKER)
        blocks: dict[str, list[int]] = {s: [] for s in servers}
        for b in range(self.job.spec.num_blocks):
            blocks[servers[b % len(servers)]].append(b)
        splits: dict[str, list[int]] = {w: [] for w in workers}
        for b in range(8 * max(1, len(workers))):
            splits[workers[b % len(workers)]].append(b)
        return Holdings(blocks=blocks, splits=splits)

    def of(self, kind: type) -> list[ins.Instruction]:
        return [i for i in self.log if isinstance(i, kind)]

    def kinds(self) -> list[str]:
        return [type(i).__name__ for i in self.log]

    def steps_since(self, n: int) -> list[str]:
        """The kinds of the step instructions issued after the log's first `n` entries."""
        return [type(i).__name__ for i in self.log[n:] if isinstance(i, ins.STEP_TYPES)]

    def held_of(self, kind: type) -> list[ins.StepInstruction]:
        """The held steps of `kind`, in the order they were issued."""
        return sorted((s for s in self.held.values() if isinstance(s, kind)), key=lambda s: s.step)

    def triggers(self) -> list[str]:
        """The lifecycle triggers the job went through, in order."""
        return [t for _, t, _ in self.job.history]


def started(**spec: object) -> World:
    """A world whose job (these spec fields over a 2-worker, 1-server MLR job) is training."""
    w = World(job_state(**spec))
    w.start()
    assert w.job.phase is Phase.TRAINING, w.job.diagnostics
    return w

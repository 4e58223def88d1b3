"""The Cruise Optimizer (dissertation §3.3.1): metrics -> cost-model inputs -> solver -> plan.

The PS AM feeds it worker and server reports, tells it the current configuration (executors,
roles, blocks) and the slots it may use, and asks `maybe_decide()` after reports; it executes the
returned plan with the Elastic Runtime operations and calls `reconfigured()` when the plan is
done. `on_capacity_change()` re-solves when the RM grants or reclaims containers. Every decision,
taken or skipped, is kept with its predicted before/after epoch times for the job status.
Identical slots (one class) use the closed form of eq. 3.5, otherwise the class MILP.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

from models.cruise_cost import Assignment, CostModelError, JobProfile, NodeProfile, model_inputs_json, predict

from .metrics import DEFAULT_ALPHA, MetricsBook
from .plan import Plan
from .plan_builder import (DEFAULT_GAIN_THRESHOLD, ExecutorState, build_plan, predicted_gain,
                           should_reconfigure)
from .profiling import (ProfilingError, SlotInfo, derive_profiles, isolate_from_shape, measured_bytes_per_batch,
                        pool_by_class)
from .solver_homogeneous import solve_homogeneous_target
from .solver_milp import DEFAULT_CLASS_TOLERANCE, DEFAULT_TIME_LIMIT_S, SolverError, group_classes, solve_milp_target
from .targets import Role, Slot, Target
from .trigger import TriggerPolicy

MAX_DECISIONS_KEPT = 100
MAX_NODES_IN_INPUTS = 64


@dataclass(frozen=True)
class CruiseConfig:
    """Optimizer knobs (defaults from the dissertation where it gives them)."""

    min_batches: int = 10                      # per worker since the last reconfiguration
    min_interval_s: float = 30.0               # between two decisions
    gain_threshold: float = DEFAULT_GAIN_THRESHOLD
    ema_alpha: float = DEFAULT_ALPHA
    class_tolerance: float = DEFAULT_CLASS_TOLERANCE
    milp_time_limit_s: float = DEFAULT_TIME_LIMIT_S
    pool_classes: bool = False                 # slots of one declared node class are identical


@dataclass(frozen=True)
class JobSizes:
    """What the job spec fixes: block counts, instances per input block, mini-batch size, and
    the nominal bytes a worker exchanges per mini-batch (used until workers report bytes)."""

    input_blocks: int
    samples_per_block: float
    model_blocks: int
    batch_size: int
    nominal_bytes_per_batch: float
    max_workers: Optional[int] = None      # the spec's bounds, kept by every target (None: none)
    max_servers: Optional[int] = None


@dataclass
class Decision:
    """One optimizer decision, for the job status."""

    time: float
    trigger: str                     # "metrics" or "capacity"
    action: str                      # "reconfigure" or "skip"
    reason: str
    before_s: Optional[float]
    after_s: Optional[float]
    current_shape: tuple[int, int]
    target: Optional[Target] = None
    plan: Optional[Plan] = None
    inputs: Optional[dict] = None    # the cost model's inputs it was priced with (job, node profiles)

    @property
    def gain(self) -> Optional[float]:
        if self.before_s is None or self.after_s is None:
            return None
        return predicted_gain(self.before_s, self.after_s)

    def to_json(self) -> dict:
        return {"time": self.time, "trigger": self.trigger, "action": self.action, "reason": self.reason,
                "predicted_epoch_before_s": self.before_s, "predicted_epoch_after_s": self.after_s,
                "predicted_gain": self.gain, "current_shape": list(self.current_shape),
                "chosen_shape": list(self.target.shape) if self.target else None,
                "target": self.target.to_json() if self.target else None,
                "plan": self.plan.to_json() if self.plan else None, "inputs": self.inputs}


class CruiseOptimizer:
    """Cost-based optimizer of one job's shape (see the module doc)."""

    def __init__(self, job: JobSizes, config: CruiseConfig = CruiseConfig(),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.job = job
        self.config = config
        self.clock = clock
        self.metrics = MetricsBook(config.ema_alpha)
        self.trigger = TriggerPolicy(config.min_batches, config.min_interval_s, clock)
        self.decisions: list[Decision] = []
        self.executors: list[ExecutorState] = []
        self.slots: list[SlotInfo] = []            # every slot the job may use, executors' included
        self.in_progress: Optional[Decision] = None

    # ---- inputs -------------------------------------------------------------------------------
    def record_worker(self, executor: str, batches: int, samples: float, compute_s: float, comm_s: float,
                      bytes_moved: Optional[float] = None) -> None:
        self.metrics.record_worker(executor, batches, samples, compute_s, comm_s, bytes_moved)

    def record_server(self, executor: str, requests: float, busy_s: float, bytes_served: float) -> None:
        self.metrics.record_server(executor, requests, busy_s, bytes_served)

    def set_configuration(self, executors: Sequence[ExecutorState], slots: Sequence[SlotInfo]) -> None:
        """The executors as they are now and the slots the job may use (each executor's slot must
        be among them; extra slots are granted capacity with no executor yet)."""
        ids = {s.slot_id for s in slots}
        missing = sorted(e.executor_id for e in executors if e.executor_id not in ids)
        if missing:
            raise ValueError(f"executors {missing} have no slot")
        self.executors, self.slots = list(executors), list(slots)

    def reconfigured(self, executors: Sequence[ExecutorState], slots: Optional[Sequence[SlotInfo]] = None) -> None:
        """The plan of the last decision finished: the new configuration, measurements restart."""
        gone = {e.executor_id for e in self.executors} - {e.executor_id for e in executors}
        for e in gone:
            self.metrics.forget(e)
        self.set_configuration(executors, slots if slots is not None else self.slots)
        self.metrics.mark_reconfigured()
        self.trigger.reconfigured()
        self.in_progress = None

    # ---- decisions ----------------------------------------------------------------------------
    def why_not_ready(self) -> Optional[str]:
        if self.in_progress is not None:
            return "a reconfiguration is in progress"
        workers = {e.executor_id: self.metrics.batches_since_reconfiguration(e.executor_id)
                   for e in self.executors if e.role is Role.WORKER}
        return self.trigger.why_not(workers)

    def maybe_decide(self) -> Optional[Decision]:
        """A decision if the trigger policy allows one now, else None."""
        if self.why_not_ready() is not None:
            return None
        return self.decide("metrics")

    def on_capacity_change(self, capacity: Union[int, Sequence[SlotInfo]]) -> Decision:
        """Re-solve for the capacity the RM grants or reclaims: a slot list (executors whose slot
        is absent are reclaimed, unknown slots are new capacity), or a slot count (new slots copy
        the first slot's class; on a shrink the executors holding the fewest blocks go)."""
        if isinstance(capacity, int):
            slots = self._slots_for_count(capacity)
        else:
            slots = list(capacity)
        return self.decide("capacity", slots)

    def _slots_for_count(self, n: int) -> list[SlotInfo]:
        if n < 2:
            raise ValueError(f"capacity must be >= 2 slots (one worker, one server), got {n}")
        own = {e.executor_id for e in self.executors}
        slots = [s for s in self.slots if s.slot_id in own]
        if n < len(slots):
            keep = sorted(self.executors, key=lambda e: (-len(e.blocks), e.executor_id))[:n]
            keep_ids = {e.executor_id for e in keep}
            return [s for s in slots if s.slot_id in keep_ids]
        template = self.slots[0] if self.slots else SlotInfo("free-0")
        taken = {s.slot_id for s in self.slots}
        extra = [s for s in self.slots if s.slot_id not in own]
        k = 0
        while len(slots) + len(extra) < n:
            sid = f"free-{k}"
            k += 1
            if sid not in taken:
                extra.append(SlotInfo(sid, template.node_class, template.vcores))
        return slots + extra[:n - len(slots)]

    def decide(self, trigger: str = "metrics", slots: Optional[Sequence[SlotInfo]] = None) -> Decision:
        """Solve for `slots` (default: the current ones) and decide whether to reconfigure."""
        now = self.clock()
        self.trigger.attempted()
        slots = list(slots if slots is not None else self.slots)
        shape = (sum(e.role is Role.WORKER for e in self.executors),
                 sum(e.role is Role.SERVER for e in self.executors))
        reclaimed = sorted({e.executor_id for e in self.executors} - {s.slot_id for s in slots})
        try:
            job, target, before, profiles = self._solve(slots)
        except (ProfilingError, CostModelError, SolverError) as e:
            return self._record(Decision(now, trigger, "skip", f"cannot decide: {e}", None, None, shape))
        if reclaimed:
            action, reason = "reconfigure", f"executors {reclaimed} are reclaimed"
        elif before is not None and not should_reconfigure(before, target.epoch_s, self.config.gain_threshold):
            action = "skip"
            reason = (f"predicted gain {predicted_gain(before, target.epoch_s):.1%} < "
                      f"{self.config.gain_threshold:.0%}")
        else:
            action, reason = "reconfigure", "predicted gain above threshold" if before else "no valid configuration"
        plan = build_plan(self.executors, target) if action == "reconfigure" else None
        if plan is not None and not plan.ops:
            action, reason, plan = "skip", "target equals the current configuration", None
        # The inputs go into the job status with the decision: per node, so only for small jobs.
        inputs = model_inputs_json(job, profiles) if len(profiles) <= MAX_NODES_IN_INPUTS else None
        decision = Decision(now, trigger, action, reason, before, target.epoch_s, shape, target, plan, inputs)
        if action == "reconfigure":
            self.in_progress = decision
            self.slots = slots
        return self._record(decision)

    def _solve(self, slots: Sequence[SlotInfo]) -> tuple[JobProfile, Target, Optional[float], dict[str, NodeProfile]]:
        own_slots = {s.slot_id for s in slots}
        # Profiles for the offered slots and for current executors (the "before" prediction).
        every = list(slots) + [s for s in self.slots if s.slot_id not in own_slots]
        job = JobProfile(self.job.input_blocks, self.job.samples_per_block, self.job.model_blocks,
                         measured_bytes_per_batch(self.metrics, self.job.nominal_bytes_per_batch),
                         self.job.batch_size, self.metrics.compute_parallelism(), overlap=True,
                         max_workers=self.job.max_workers, max_servers=self.job.max_servers)
        current = Assignment({e.executor_id: len(e.blocks) for e in self.executors if e.role is Role.WORKER},
                             {e.executor_id: len(e.blocks) for e in self.executors if e.role is Role.SERVER})
        derived = isolate_from_shape(derive_profiles(self.metrics, every), job, current, self.metrics)
        if self.config.pool_classes:
            derived = pool_by_class(derived, every)
        profiles = {p.node_id: p for p in derived}
        held = {e.executor_id: e for e in self.executors}
        slot_list = [Slot(profiles[s.slot_id], held[s.slot_id].role if s.slot_id in held else None,
                          len(held[s.slot_id].blocks) if s.slot_id in held else 0) for s in slots]
        classes = group_classes([s.profile for s in slot_list], self.config.class_tolerance)
        if len(classes) == 1:
            target = solve_homogeneous_target(job, slot_list)
        else:
            target = solve_milp_target(job, slot_list, self.config.class_tolerance, self.config.milp_time_limit_s)
        try:
            before: Optional[float] = predict(job, profiles, current).epoch_s
        except CostModelError:
            before = None           # e.g. no executors yet, or blocks not all placed
        return job, target, before, profiles

    def _record(self, decision: Decision) -> Decision:
        self.decisions.append(decision)
        del self.decisions[:-MAX_DECISIONS_KEPT]
        return decision

    def to_json(self) -> dict:
        return {"why_not_ready": self.why_not_ready(), "metrics": self.metrics.to_json(),
                "decisions": [d.to_json() for d in self.decisions]}

"""What an elastic PS AM reports about its job on every allocate (`AllocateRequest.shape`).

A `JobReport` travels typed: the RM decodes it with the `AllocateRequest` (a bad field is a 400
naming it, e.g. `$.shape.workers`), keeps it on the app (`/ws/v1/cluster/apps/{id}/shape` shows it
as JSON) and the policies (`eps`, later `optimus`, `dorm`, `harmony`) read its fields directly.
Example (JSON)::

    {"workers": 3, "servers": 2, "started": true, "changing": false,
     "iterations": 240, "early_feedback": true, "early_feedback_iterations": 100,
     "speed": 1.8, "speed_iterations": 40,
     "executor_resource": {"memory": 512, "vCores": 1}, "directive_version": 2,
     "phase": "TRAINING", "epoch": 4, "epoch_time_s": 2.1, "objective": 0.41,
     "epoch_times": [2.4, 2.2, 2.1], "initial_objective": 0.69,
     "objectives": [{"epoch": 0, "objective": 0.6}, ..., {"epoch": 4, "objective": 0.41}],
     "worker_times": {"compute_s": 0.020, "comm_s": 0.008, "workers": 3,
                      "compute_held_s": 0.015, "comm_held_s": 0.008,
                      "compute_wait_s": 0.005, "comm_wait_s": 0.0, "bytes_per_batch": 16384.0},
     "server_times": {"service_s": 0.0004, "servers": 2},
     "memory_mb": 1310.5, "spilled_mb": 0.0}

Fields, and what the AM must put in them:

- `workers`, `servers`: executors running in each role now (granted, launched and serving). While
  the job is starting they count what has come up so far.
- `started`: the job holds the workers and servers it was submitted with and training has begun.
  Until then the policies treat the job as still waiting (an *incoming* job in EPS's words).
- `changing`: a reconfiguration (add / remove workers or servers) is under way; `workers` and
  `servers` are the counts before it completes.
- `iterations`: iterations (clock ticks of the whole job: one pull-compute-push round of every
  worker) completed since the job started.
- `early_feedback`: the job has finished its early-feedback phase, i.e. `iterations >=
  early_feedback_iterations` (the job option, EPS §2.1: "e.g. the first 100 iterations"). The EPS
  H-scheduler never removes workers or servers from a job before that, nor adds any.
- `early_feedback_iterations`: that job option, echoed so operators see it in the job status.
- `speed`: training speed in iterations per second, measured over the iterations completed since
  the last reconfiguration finished (so it describes the current shape); 0.0 when unknown.
- `speed_iterations`: how many iterations `speed` was measured over (resets to 0 when a
  reconfiguration finishes). Policies only trust a speed measured over enough iterations.
- `executor_resource`: the resource of one executor container as granted (after the RM's rounding).
- `directive_version`: the version of the last shape directive the AM has acted on (0: none).
- `directive_refused`: why the job lacks that version's shape on purpose -- a change the job cannot
  make (more workers than input splits, ...), acted on as no change; or a later `/scale` of the
  job's own that superseded it (the user reshaped the job through its AM); "" otherwise. The RM
  does not send such a directive again (rm/directive_retry.py).
- `phase`: the PS job's phase (appmaster.ps.job.JobPhase value: STARTING ... TRAINING, FINISHING,
  SUCCEEDED ...); "" when the AM does not say.
- `epoch`: the number of the last finished epoch (0-based, as the AM's status numbers them; None
  until the first ends), `epoch_time_s` its training time and `objective` its objective.
- `epoch_times`: the training times of the most recent epochs, oldest first, at most
  `MAX_EPOCH_TIMES` (20).
- `initial_objective`: the objective of the initial model, before any training (None: unknown).
- `objectives`: the objective history, `{epoch, objective}` per finished epoch, oldest first: the
  most recent `MAX_OBJECTIVES` (200) epochs, enough for Optimus's loss-curve fit (which also gets
  `initial_objective`, the curve's start). Only finite objectives are reported.
- `clock_objectives`: the training objective every few clocks, `{iteration, epochs, objective}`
  (clocks done, fractional epochs trained then, the objective), oldest first, at most
  `MAX_CLOCK_OBJECTIVES` (200, thinned evenly when longer): Optimus fits its loss curve on them
  too, so a job of a few epochs is fitted during its first. The PS AM samples the exact epoch
  objective at BSP clock boundaries, paced by its cost (appmaster/ps/clock_objectives.py); empty
  when the AM has none (SSP jobs, older AMs).
- `worker_times`: per-mini-batch compute and communication time of a worker (seconds), the mean
  over the workers of each one's moving average; `workers` is how many workers had measurements
  (0: none yet, and the times are 0.0). Under Harmony's arbiter a subtask first waits for a grant;
  `compute_s` / `comm_s` include that wait, `compute_wait_s` / `comm_wait_s` are the waits and
  `compute_held_s` / `comm_held_s` the times the subtasks ran holding their slots (time - wait:
  the job's own T_cpu / T_net, dissertation §4.3.2, not inflated by its partners' subtasks).
  Without an arbiter the waits are 0 and held = time. An older AM sends no held / wait fields
  (all 0.0 with `workers` > 0): read `compute_s` / `comm_s` then. `bytes_per_batch`: the bytes
  (keys and values) one worker pulls and pushes per mini-batch through its store client, whatever
  server they go to (the mean over the workers that count them; 0.0: none does). Harmony divides
  it by the link bandwidth for the COMM a job pays across hosts (models/harmony.py `net_time`).
- `server_times`: a server's mean service time of one data-plane request (seconds), the mean over
  the servers that served any; `servers` counts them (0: unknown).
- `memory_mb`: memory in use: the total RSS of the job's live executors (MB) as last sampled.
- `spilled_mb`: input / model data the job's executors have spilled to disk (MB); 0 until spill
  (Harmony) reports it.
- `paused`: the job is paused (or pausing / resuming) on a directive's run state (Harmony): its
  model is checkpointed and it holds no executors (`workers` = `servers` = 0 while paused).
- `alpha`: the job's disk block ratio (Harmony spill, §4.3.3): the mean over its spilling workers
  of the fraction of their input blocks kept on disk; None when the job does not spill.

Unknown fields are ignored, so a newer AM may report more than this RM reads; older AMs that send
only workers / servers (and any subset of the rest) still decode.
"""
from __future__ import annotations

import math
from typing import Annotated, Iterable, Optional

import msgspec

from .json_types import JsonObject
from .records import Resource

MAX_EPOCH_TIMES = 20
MAX_OBJECTIVES = 200
MAX_CLOCK_OBJECTIVES = 200
MAX_REFUSAL_CHARS = 500
MAX_DIRECTIVE_VERSION = 2 ** 53

NonNeg = Annotated[int, msgspec.Meta(ge=0)]
NonNegFloat = Annotated[float, msgspec.Meta(ge=0.0)]


class EpochObjective(msgspec.Struct, frozen=True):
    """The objective at the end of one epoch."""

    epoch: NonNeg
    objective: float


class ClockObjective(msgspec.Struct, frozen=True):
    """The training objective after `iteration` clocks, `epochs` (fractional) epochs trained."""

    iteration: NonNeg
    epochs: NonNegFloat
    objective: float


class WorkerTiming(msgspec.Struct, kw_only=True, frozen=True):
    """A worker's measured per-mini-batch times (seconds), averaged over `workers` workers."""

    compute_s: NonNegFloat = 0.0
    comm_s: NonNegFloat = 0.0
    workers: NonNeg = 0
    compute_held_s: NonNegFloat = 0.0     # compute_s less the wait for a CPU grant
    comm_held_s: NonNegFloat = 0.0        # comm_s less the waits for network grants
    compute_wait_s: NonNegFloat = 0.0
    comm_wait_s: NonNegFloat = 0.0
    bytes_per_batch: NonNegFloat = 0.0    # bytes one worker pulls + pushes per mini-batch (0: not counted)


class ServerTiming(msgspec.Struct, kw_only=True, frozen=True):
    """A server's measured service time per request (seconds), averaged over `servers` servers."""

    service_s: NonNegFloat = 0.0
    servers: NonNeg = 0


class JobReport(msgspec.Struct, kw_only=True):
    """One elastic job's shape, progress and measurements as its AM reports them (see the module doc)."""

    workers: NonNeg
    servers: NonNeg
    started: bool = False
    changing: bool = False
    iterations: NonNeg = 0
    early_feedback: bool = False
    early_feedback_iterations: NonNeg = 0
    speed: NonNegFloat = 0.0
    speed_iterations: NonNeg = 0
    executor_resource: Optional[Resource] = None
    # At most 2**53: versions count directives one by one, and a larger one would not survive the
    # RM's next directive (+1) as a JSON number every client (the web UI's JavaScript) reads exactly.
    directive_version: Annotated[int, msgspec.Meta(ge=0, le=MAX_DIRECTIVE_VERSION)] = 0
    # Why the job acted on `directive_version` as no change although it lacks that shape (a change it
    # cannot make, as its AM's planner said); "" when it made the change or had the shape.
    directive_refused: Annotated[str, msgspec.Meta(max_length=MAX_REFUSAL_CHARS)] = ""
    phase: str = ""
    epoch: Optional[NonNeg] = None
    epoch_time_s: Optional[NonNegFloat] = None
    objective: Optional[float] = None
    epoch_times: Annotated[list[NonNegFloat], msgspec.Meta(max_length=MAX_EPOCH_TIMES)] = []
    initial_objective: Optional[float] = None
    objectives: Annotated[list[EpochObjective], msgspec.Meta(max_length=MAX_OBJECTIVES)] = []
    clock_objectives: Annotated[list[ClockObjective], msgspec.Meta(max_length=MAX_CLOCK_OBJECTIVES)] = []
    worker_times: WorkerTiming = msgspec.field(default_factory=WorkerTiming)
    server_times: ServerTiming = msgspec.field(default_factory=ServerTiming)
    memory_mb: NonNegFloat = 0.0
    spilled_mb: NonNegFloat = 0.0
    paused: bool = False
    alpha: Optional[Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]] = None

    def refused(self, version: int) -> bool:
        """The job acted on directive `version` as a change it cannot make (`directive_refused`)."""
        return bool(self.directive_refused) and self.directive_version == version

    def to_json(self) -> JsonObject:
        """The report as JSON-ready builtins (what the REST API and the web UI show)."""
        out: JsonObject = msgspec.to_builtins(self)
        return out

    @classmethod
    def decode(cls, obj: object) -> "JobReport":
        """Decode a report from builtins (any object msgspec.convert reads); `msgspec.ValidationError` names the bad field."""
        return msgspec.convert(obj, cls, strict=True)


def finite(x: Optional[float]) -> Optional[float]:
    """`x` if it is a finite number, else None (JSON has no NaN: it would arrive as null)."""
    return x if x is not None and math.isfinite(x) else None


def recent_epoch_times(times: Iterable[float]) -> list[float]:
    """The last `MAX_EPOCH_TIMES` of `times` (finite, non-negative ones), oldest first."""
    kept = [t for t in times if math.isfinite(t) and t >= 0.0]
    return kept[-MAX_EPOCH_TIMES:]


def recent_objectives(history: Iterable[tuple[int, float]]) -> list[EpochObjective]:
    """The last `MAX_OBJECTIVES` finite `(epoch, objective)` pairs of `history`, oldest first."""
    kept = [EpochObjective(e, o) for e, o in history if math.isfinite(o)]
    return kept[-MAX_OBJECTIVES:]


def recent_clock_objectives(points: Iterable[tuple[int, float, float]]) -> list[ClockObjective]:
    """`(iteration, epochs, objective)` points as the report carries them: finite ones, oldest first,
    at most `MAX_CLOCK_OBJECTIVES` spread evenly over the history (the last always kept)."""
    kept = [ClockObjective(i, e, o) for i, e, o in points if math.isfinite(o) and math.isfinite(e) and e >= 0]
    if len(kept) <= MAX_CLOCK_OBJECTIVES:
        return kept
    n = len(kept)
    return [kept[(j * (n - 1)) // (MAX_CLOCK_OBJECTIVES - 1)] for j in range(MAX_CLOCK_OBJECTIVES)]


__all__ = ["ClockObjective", "EpochObjective", "JobReport", "MAX_CLOCK_OBJECTIVES", "MAX_EPOCH_TIMES",
           "MAX_OBJECTIVES", "ServerTiming", "WorkerTiming", "finite", "recent_clock_objectives",
           "recent_epoch_times", "recent_objectives"]

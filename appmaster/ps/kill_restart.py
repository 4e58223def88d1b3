"""The kill-based baseline of elastic scaling (Optimus §5.4, Dorm §III-C; "kill-based" in EPS §6).

Selected by the job option `elastic_mode = "kill"`. To change the job's shape it does what those
systems do, one step after the other:

1. pause at an iteration boundary: training stops at the next BSP clock boundary (between clocks no
   push is in flight, so the model is a consistent cut); mid-epoch, every input block's place in
   the epoch is collected from the workers and the objective at the pause is measured;
2. checkpoint the model -- every server block, sent to the AM over the data plane -- to the AM's
   durable dir (appmaster.ps.checkpoints);
3. stop every executor container of the job and release them to the RM;
4. start the job again with the new shape: ask the RM for the containers, launch executors in them,
   place the blocks round-robin over the new servers, regenerate each worker's input partition;
5. restore the model from the checkpoint (the AM sends each new server its blocks over the data
   plane) and continue training from the same epoch and place: each
   regenerated block gets its place back, so no mini-batch of the epoch runs twice or never.

No progress is lost: the restored objective equals the one at the pause (checked and recorded), and the
epoch count, objective history and learning-rate schedule carry on. Each change records its
duration, the time of each step and the training time lost (all of it: nothing trains meanwhile)
in the job's shape history, as the EPS ops do for theirs.

Optimus and Dorm checkpoint only the servers' model; apps that keep training state on the workers
(NMF's user factors, LDA's topic assignments) would lose it in such a restart, so their checkpoints
also hold every worker's block state, taken at the same clock boundary, and the restart puts it
back (appmaster.ps.reconfiguration: checkpoint, restart_on).

`RestartPhase` / `RestartEvent` / `RESTART_TRANSITIONS` (a TransitionTable) / `RestartTimeline` are the pure part: the steps, their
order and their timing with an injected clock. `KillRestart` does the I/O on the PS AM.
"""
from __future__ import annotations

import asyncio
import enum
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, Union

from protocol.checkpoint_manifest import JobRecord
from protocol.internal_api import NodePlacement
from protocol.ps_job_spec import PSJobSpec
from protocol.remote_exception import BadRequest, Conflict
from protocol.state_machine import TransitionTable
from protocol.shape_history import ExecutorCounts, KillRestartChange
from psruntime.apps.base import AnyPSApp

from .clock_loop import EpochHook
from .directives import Shape
from .job import JobPhase
from .reconfiguration import Reconfiguration, keeps_worker_state
from .suspension import RELEASE_TIMEOUT_S, restart_from, settle, start_placed, take_cut
from protocol.errors import StateError

log = logging.getLogger(__name__)



# ===== pure part ==================================================================================

class RestartPhase(str, enum.Enum):
    """Where a kill-based reshape is."""

    REQUESTED = "REQUESTED"          # waiting for the epoch running now to end
    PAUSED = "PAUSED"                # at the boundary: training stopped
    CHECKPOINTED = "CHECKPOINTED"    # every server block on disk
    RELEASED = "RELEASED"            # every old executor container stopped and released
    ALLOCATED = "ALLOCATED"          # the new containers granted and their executors ready
    RESTORED = "RESTORED"            # blocks placed, data regenerated, model restored: training resumes
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"          # the job finished training before the boundary: nothing to do


class RestartEvent(str, enum.Enum):
    """What happens to a kill-based reshape: each step ending, a failure, or a cancellation."""

    BOUNDARY = "boundary"            # training stopped at the iteration boundary
    CHECKPOINT = "checkpoint"        # the checkpoint is written
    RELEASE = "release"              # the old executors are released
    ALLOCATE = "allocate"            # the new executors are ready
    RESTORE = "restore"              # the model is restored: training resumes
    FAIL = "fail"
    CANCEL = "cancel"                # training ended before the boundary


_ORDER = [RestartPhase.REQUESTED, RestartPhase.PAUSED, RestartPhase.CHECKPOINTED, RestartPhase.RELEASED,
          RestartPhase.ALLOCATED, RestartPhase.RESTORED]
_STEP_EVENTS = [RestartEvent.BOUNDARY, RestartEvent.CHECKPOINT, RestartEvent.RELEASE, RestartEvent.ALLOCATE,
                RestartEvent.RESTORE]


class RestartTransitionError(StateError, RuntimeError):
    """A reshape step out of order."""

    def __init__(self, phase: RestartPhase, event: RestartEvent):
        super().__init__(f"reshape cannot take {event.value} in {phase.value}")
        self.phase = phase
        self.event = event


# The steps in order, each able to fail; only a request still waiting for the boundary can be
# cancelled. RESTORED, FAILED and CANCELLED are final.
RESTART_TRANSITIONS: TransitionTable[RestartPhase, RestartEvent, RestartPhase] = TransitionTable({
    **{(a, ev): b for a, ev, b in zip(_ORDER, _STEP_EVENTS, _ORDER[1:])},
    **{(a, RestartEvent.FAIL): RestartPhase.FAILED for a in _ORDER[:-1]},
    (RestartPhase.REQUESTED, RestartEvent.CANCEL): RestartPhase.CANCELLED,
}, RestartTransitionError)

# The step each phase ends, as reported in the shape history.
STEP_NAMES = {RestartPhase.PAUSED: "wait_boundary_s", RestartPhase.CHECKPOINTED: "checkpoint_s",
              RestartPhase.RELEASED: "release_s", RestartPhase.ALLOCATED: "allocate_s",
              RestartPhase.RESTORED: "restore_s"}


@dataclass
class RestartTimeline:
    """One kill-based reshape: its phases with the time each was reached (injected clock)."""

    before: tuple[int, int]              # (workers, servers)
    after: tuple[int, int]
    clock: Callable[[], float] = time.perf_counter
    phase: RestartPhase = RestartPhase.REQUESTED
    reached: dict[RestartPhase, float] = field(default_factory=dict)
    error: str = ""

    def __post_init__(self) -> None:
        self.reached[RestartPhase.REQUESTED] = self.clock()

    def on(self, event: RestartEvent, error: str = "") -> None:
        """Take `event` through RESTART_TRANSITIONS (RestartTransitionError if out of order)."""
        nxt = RESTART_TRANSITIONS.next(self.phase, event)
        self.phase = nxt
        self.reached[nxt] = self.clock()
        if error:
            self.error = error

    def steps(self) -> dict[str, float]:
        """Seconds spent in each step reached so far."""
        out: dict[str, float] = {}
        prev = self.reached[RestartPhase.REQUESTED]
        for p in _ORDER[1:]:
            if p not in self.reached:
                break
            out[STEP_NAMES[p]] = self.reached[p] - prev
            prev = self.reached[p]
        return out

    @property
    def seconds(self) -> float:
        """The reshape's duration: from the pause to training resuming (or the failure)."""
        start = self.reached.get(RestartPhase.PAUSED)
        return 0.0 if start is None else self.reached[self.phase] - start

    @property
    def lost_s(self) -> float:
        """Training time lost: nothing trains from the pause until the restored job resumes."""
        return self.seconds


def check_target(workers: int, servers: int, max_workers: Optional[int], max_servers: Optional[int]) -> None:
    """BadRequest naming the field when a requested shape is impossible (changes nothing)."""
    for name, v, most in (("workers", workers, max_workers), ("servers", servers, max_servers)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise BadRequest(f"{name} must be an integer >= 1, got {v!r}")
        if most is not None and v > most:
            raise BadRequest(f"{name}: {v} is above the job's max_{name} ({most})")


# ===== the I/O ====================================================================================

# What a resize answers: the restart's record, or `{mode, workers, servers, changed: False}` when
# the job already has that shape (nothing is recorded then).
ResizeReply = Union[KillRestartChange, dict[str, Any]]


@dataclass
class _Request:
    workers: int
    servers: int
    timeline: RestartTimeline
    done: "asyncio.Future[KillRestartChange]"
    nodes: tuple[str, ...] = ()
    placement: tuple[NodePlacement, ...] = ()


class KillRestart:
    """The kill-based reshape of one PS job; the same entry points as EPS's ops, built from the
    job's reconfiguration steps (pause, checkpoint, retire, start, restore).

    The master runs training through `train_with_restarts` instead of the clock loop's `train`;
    each finished (or failed) restart is passed to `on_record` for the job's shape history.
    """

    mode = "kill"

    def __init__(self, spec: PSJobSpec, app: AnyPSApp, steps: Reconfiguration, phase: Callable[[], JobPhase],
                 on_record: Callable[[KillRestartChange], None], clock: Callable[[], float] = time.perf_counter,
                 wall_clock: Callable[[], float] = time.time,
                 job_record: Callable[[], JobRecord] = JobRecord) -> None:
        self.spec = spec
        self.app = app
        self.steps = steps
        self.training = steps.training
        self.phase = phase
        self.on_record = on_record
        self.job_record = job_record            # what a checkpoint says about the job (the master's)
        self.clock = clock
        self.wall_clock = wall_clock
        self._lock = asyncio.Lock()          # one reshape at a time
        self._request: Optional[_Request] = None

    # -- EPS's entry points ---------------------------------------------------------------------
    def _shape(self) -> tuple[int, int]:
        return self.training.membership.shape()

    async def add_workers(self, n: int) -> ResizeReply:
        w, s = self._shape()
        return await self.resize(w + _count(n), s)

    async def add_servers(self, n: int) -> ResizeReply:
        w, s = self._shape()
        return await self.resize(w, s + _count(n))

    async def remove_workers(self, n: int) -> ResizeReply:
        w, s = self._shape()
        return await self.resize(w - _count(n), s)

    async def remove_servers(self, n: int) -> ResizeReply:
        w, s = self._shape()
        return await self.resize(w, s - _count(n))

    @property
    def changing(self) -> bool:
        return self._lock.locked()

    async def reshape(self, target: Shape, nodes: tuple[str, ...] = (),
                      placement: Sequence[NodePlacement] = ()) -> ResizeReply:
        """An RM directive (appmaster.ps.directives.Reshaper): one restart with the target shape,
        its executors on `nodes` when the directive names them (per node as `placement` says)."""
        return await self.resize(target.workers, target.servers, nodes, tuple(placement))

    async def resize(self, workers: int, servers: int, nodes: tuple[str, ...] = (),
                     placement: tuple[NodePlacement, ...] = ()) -> ResizeReply:
        """Restart the job with `workers` and `servers`; returns the shape-history record once
        training has resumed. BadRequest / Conflict (nothing changed) when it cannot be done."""
        spec = self.spec
        check_target(workers, servers, spec.max_workers, spec.max_servers)
        async with self._lock:
            self._check_training()
            before = self._shape()
            placed = self.training.pool.placed(nodes, placement)
            if (workers, servers) == before and placed:
                return {"mode": self.mode, "workers": workers, "servers": servers, "changed": False}
            fut: asyncio.Future[KillRestartChange] = asyncio.get_running_loop().create_future()
            self._request = _Request(workers, servers, RestartTimeline(before, (workers, servers), self.clock), fut,
                                     nodes, placement)
            log.info("kill-based reshape %s -> %s workers/servers: stopping at the next clock boundary",
                     before, (workers, servers))
            self.steps.pause()      # the running clock ends, then train() returns
            return await fut

    def _check_training(self) -> None:
        phase = self.phase()
        if phase is not JobPhase.TRAINING or self.training.loop.converged:
            raise Conflict(f"the job is {phase.value.lower()}, not training: its shape can only change while it trains")

    # -- the master's training loop -------------------------------------------------------------
    async def train_with_restarts(self, on_epoch: EpochHook) -> None:
        """Train to the end, restarting the job whenever a reshape asks for it at a clock boundary."""
        while True:
            await self.training.loop.train(on_epoch)
            if not await self._restart_if_requested():
                return

    async def _restart_if_requested(self) -> bool:
        req, self._request = self._request, None
        if req is None:
            return False
        if self.training.loop.converged or self.phase() is not JobPhase.TRAINING:
            req.timeline.on(RestartEvent.CANCEL)
            settle(req.done, Conflict("the job finished training before the reshape could start"))
            return False
        try:
            record = await self._restart(req)
        except BaseException as e:
            if req.timeline.phase not in (RestartPhase.FAILED, RestartPhase.RESTORED):
                req.timeline.on(RestartEvent.FAIL, f"{type(e).__name__}: {e}")
            self.on_record(self._record(req))
            settle(req.done, e if isinstance(e, Exception) else Conflict("the job stopped during the reshape"))
            raise                # the job's executors are gone: the job fails with this error
        settle(req.done, record)
        return True

    async def _restart(self, req: _Request) -> KillRestartChange:
        steps, tl = self.steps, req.timeline
        tl.on(RestartEvent.BOUNDARY)
        cut = await take_cut(steps, self.job_record(), reason="reshape")
        tl.on(RestartEvent.CHECKPOINT)
        await steps.retire_all(RELEASE_TIMEOUT_S)
        tl.on(RestartEvent.RELEASE)
        servers, workers = await start_placed(steps, req.workers, req.servers, req.placement, req.nodes)
        tl.on(RestartEvent.ALLOCATE)
        restored = await restart_from(steps, cut, servers, workers)
        tl.on(RestartEvent.RESTORE)
        record = self._record(req)
        record.epoch, record.mid_epoch, record.checkpoint = cut.epoch, cut.mid_epoch, cut.checkpoint["dir"]
        record.objective_before, record.objective_restored = cut.objective, restored
        self.on_record(record)
        log.info("kill-based reshape to %d workers, %d servers done in %.2fs (%s)", req.workers, req.servers,
                 tl.seconds, ", ".join(f"{k} {v:.2f}" for k, v in tl.steps().items()))
        return record

    def _record(self, req: _Request) -> KillRestartChange:
        tl = req.timeline
        return KillRestartChange(
            changed=tl.phase is RestartPhase.RESTORED, phase=tl.phase.value,
            before=ExecutorCounts(tl.before[0], tl.before[1]),
            workers=req.workers, servers=req.servers, time=self.wall_clock(),
            seconds=round(tl.seconds, 4), lost_s=round(tl.lost_s, 4),
            steps={k: round(v, 4) for k, v in tl.steps().items()}, error=tl.error,
            # the keys of an EPS op's record too (older readers of `shape_history` read them)
            op="kill_restart", requested=abs(req.workers - tl.before[0]) + abs(req.servers - tl.before[1]),
            after=ExecutorCounts(req.workers, req.servers), duration_s=round(tl.seconds, 4),
            training_time_lost_s=round(tl.lost_s, 4), ok=not tl.error)


def _count(n: int) -> int:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise BadRequest(f"the number of executors to add or remove must be an integer >= 1, got {n!r}")
    return n


__all__ = ["KillRestart", "RESTART_TRANSITIONS", "RestartEvent", "RestartPhase", "RestartTimeline", "RestartTransitionError",
           "check_target", "keeps_worker_state"]

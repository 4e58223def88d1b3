"""The PS AM's side of the RM's elastic policies: act on shape directives, report the shape back.

The RM's policy (`eps`, later `optimus`, `dorm`) sends `ShapeDirective(workers, servers, version)`
in allocate responses; the AM library surfaces each new one as a `ShapeChanged` event. Here:

- `diff` turns (current shape, target shape) into the calls to make: removals first (they free
  resources the policy may be handing to another job), then additions.
- `DirectiveTracker` is the pure state machine deciding what to do with a directive: apply it now,
  ignore it (a version already seen), or keep it for later (a change is running, or training has
  not started yet) -- only the latest kept directive is applied once the change ends.
- `DirectiveHandler` drives it: it runs each change in its own task (never in the AM's event pump,
  which must keep launching the containers the change asks for) through the job's `Reshaper` --
  EPS's functions (appmaster.ps.elastic_ops), the kill-based baseline (appmaster.ps.kill_restart)
  or Cruise (appmaster.ps.cruise_driver), all compositions of the reconfiguration layer. A
  directive that names nodes is obeyed: executors are asked for on exactly those nodes, and
  executors elsewhere move there.
- `ProgressTracker` (pure, injected times) keeps what the AM reports in `AllocateRequest.shape`
  (protocol.job_report.JobReport): iterations, early feedback, speed since the last change, the
  directive version acted on.
"""
from __future__ import annotations

import asyncio
import enum
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional, Protocol, Sequence

from protocol.internal_api import NodePlacement, RunState, ShapeDirective
from protocol.job_report import JobReport
from protocol.ps_status import DirectiveRecord
from protocol.records import Resource
from protocol.shape_history import ExecutorCounts
from protocol.state_machine import TransitionTable
from protocol.errors import StateError

log = logging.getLogger(__name__)

DEFAULT_EARLY_FEEDBACK_ITERATIONS = 100   # EPS §2.1: "e.g. the first 100 iterations"
RESUME_TRIES = 5            # a paused job's resume that got no executors is tried this often
RESUME_RETRY_S = 5.0


# ===== what a directive is carried out with ====================================================

class Reshaper(Protocol):
    """A job's reshaping mechanism, as a directive drives it: EPS's functions (appmaster.ps.
    elastic_ops), the kill-based baseline (appmaster.ps.kill_restart) or Cruise (appmaster.ps.
    cruise_driver). `nodes`: the only nodes the job may run executors on (empty: anywhere);
    `placement`: how many of each role on each node (empty: the node set is all it says)."""

    async def reshape(self, target: "Shape", nodes: tuple[str, ...],
                      placement: Sequence[NodePlacement] = ()) -> object: ...


class Suspender(Protocol):
    """Pauses and resumes the job (appmaster.ps.suspension.JobSuspension): what a directive's
    run state asks for."""

    @property
    def paused(self) -> bool: ...

    async def pause(self) -> object: ...

    async def resume(self, workers: int, servers: int, placement: Sequence[NodePlacement] = (),
                     nodes: Sequence[str] = (), resource: Optional[Resource] = None) -> object: ...


# ===== pure parts ================================================================================

@dataclass(frozen=True)
class Shape:
    """Workers and servers of a job."""

    workers: int
    servers: int


@dataclass(frozen=True)
class ShapeDelta:
    """Signed change of each role: positive adds, negative removes."""

    workers: int
    servers: int

    @property
    def empty(self) -> bool:
        return self.workers == 0 and self.servers == 0

    def steps(self) -> list[tuple[str, int]]:
        """The ElasticOps calls to make, removals first (they free resources), then additions."""
        out: list[tuple[str, int]] = []
        if self.servers < 0:
            out.append(("remove_servers", -self.servers))
        if self.workers < 0:
            out.append(("remove_workers", -self.workers))
        if self.servers > 0:
            out.append(("add_servers", self.servers))
        if self.workers > 0:
            out.append(("add_workers", self.workers))
        return out


def diff(current: Shape, target: Shape) -> ShapeDelta:
    return ShapeDelta(target.workers - current.workers, target.servers - current.servers)


def target_of(d: ShapeDirective, max_workers: Optional[int] = None, max_servers: Optional[int] = None,
              min_workers: int = 1, min_servers: int = 1) -> Shape:
    """The shape a directive asks for, kept within [the job's min_workers / min_servers (at least 1),
    its max_workers / max_servers]: a job always keeps one worker and one server (EPS's rule 2), and
    never leaves its bounds."""
    w = max(1, min_workers, d.workers if max_workers is None else min(d.workers, max_workers))
    s = max(1, min_servers, d.servers if max_servers is None else min(d.servers, max_servers))
    return Shape(w, s)


class TrackerState(str, enum.Enum):
    WAITING = "WAITING"       # training has not started: directives are kept for later
    IDLE = "IDLE"             # no change running
    CHANGING = "CHANGING"     # a change is running; newer directives are kept for after it


class TrackerEvent(str, enum.Enum):
    READY = "READY"           # training started
    NEW = "NEW"               # a directive with a version not seen before
    STALE = "STALE"           # a directive whose version was already seen
    DONE = "DONE"             # the running change ended


class Decision(str, enum.Enum):
    APPLY = "APPLY"
    KEEP = "KEEP"
    IGNORE = "IGNORE"
    NOTHING = "NOTHING"


# (state, event) -> (next state, what to do). DONE / READY go to CHANGING+APPLY instead when a
# directive is kept (see DirectiveTracker._settle).
TRANSITIONS: TransitionTable[TrackerState, TrackerEvent, tuple[TrackerState, Decision]] = TransitionTable({
    (TrackerState.WAITING, TrackerEvent.NEW): (TrackerState.WAITING, Decision.KEEP),
    (TrackerState.WAITING, TrackerEvent.STALE): (TrackerState.WAITING, Decision.IGNORE),
    (TrackerState.WAITING, TrackerEvent.READY): (TrackerState.IDLE, Decision.NOTHING),
    (TrackerState.IDLE, TrackerEvent.NEW): (TrackerState.CHANGING, Decision.APPLY),
    (TrackerState.IDLE, TrackerEvent.STALE): (TrackerState.IDLE, Decision.IGNORE),
    (TrackerState.IDLE, TrackerEvent.READY): (TrackerState.IDLE, Decision.NOTHING),
    (TrackerState.CHANGING, TrackerEvent.NEW): (TrackerState.CHANGING, Decision.KEEP),
    (TrackerState.CHANGING, TrackerEvent.STALE): (TrackerState.CHANGING, Decision.IGNORE),
    (TrackerState.CHANGING, TrackerEvent.DONE): (TrackerState.IDLE, Decision.NOTHING),
    (TrackerState.CHANGING, TrackerEvent.READY): (TrackerState.CHANGING, Decision.NOTHING),
}, lambda state, event: TrackerError(f"event {event.value} is not allowed in state {state.value}"))


class TrackerError(StateError, RuntimeError):
    """An event the tracker does not take in its state (e.g. DONE with no change running)."""


@dataclass
class DirectiveTracker:
    """Which directive to act on when (pure: no I/O, no clock).

    Versions are the RM's per-app counter (1, 2, ...); a directive whose version is not above the
    highest seen is a repeat and ignored. While waiting or changing only the newest directive is
    kept: the policy's latest word supersedes the ones before it.
    """

    state: TrackerState = TrackerState.WAITING
    seen_version: int = 0
    applied_version: int = 0          # the last directive acted on (started; reported to the RM)
    running: Optional[ShapeDirective] = None
    kept: Optional[ShapeDirective] = None

    def _step(self, event: TrackerEvent) -> Decision:
        self.state, decision = TRANSITIONS.next(self.state, event)
        return decision

    def offer(self, d: ShapeDirective) -> Optional[ShapeDirective]:
        """A directive arrived; returns it if it is to be applied now (the caller then runs it)."""
        event = TrackerEvent.NEW if d.version > self.seen_version else TrackerEvent.STALE
        decision = self._step(event)
        if event is TrackerEvent.NEW:
            self.seen_version = d.version
        if decision is Decision.KEEP:
            self.kept = d
        elif decision is Decision.APPLY:
            return self._start(d)
        return None

    def ready(self) -> Optional[ShapeDirective]:
        """Training started; returns a kept directive to apply now, if any."""
        self._step(TrackerEvent.READY)
        return self._settle()

    def done(self) -> Optional[ShapeDirective]:
        """The running change ended (well or not); returns the kept directive to apply next, if any."""
        self._step(TrackerEvent.DONE)
        self.running = None
        return self._settle()

    def _settle(self) -> Optional[ShapeDirective]:
        if self.state is TrackerState.IDLE and self.kept is not None:
            d, self.kept = self.kept, None
            self.state = TrackerState.CHANGING
            return self._start(d)
        return None

    def _start(self, d: ShapeDirective) -> ShapeDirective:
        self.running = d
        self.applied_version = d.version
        return d


@dataclass
class ProgressTracker:
    """Training progress for the shape report (pure: the caller passes times and counts).

    An iteration is one pull-compute-push round of every worker: per clock (the AM calls
    `on_clock` after every BSP clock, and `on_epoch` at an epoch's end), the most mini-batches any
    worker ran in it.
    """

    early_feedback_iterations: int = DEFAULT_EARLY_FEEDBACK_ITERATIONS
    iterations: int = 0
    started: bool = False
    changing: bool = False
    _batches_seen: dict[str, int] = field(default_factory=dict)
    _speed_since: Optional[float] = None       # end of the last change (or training start)
    _speed_base: int = 0                       # iterations at that time
    _last_epoch_end: Optional[float] = None

    def start(self, now: float) -> None:
        self.started = True
        self._speed_since, self._speed_base = now, self.iterations

    def on_epoch(self, batches_by_worker: dict[str, int], now: float) -> int:
        """Fold in the workers' cumulative mini-batch counts after a clock or an epoch; returns
        iterations (counts already folded in add nothing)."""
        rounds = 0
        for w, n in batches_by_worker.items():
            rounds = max(rounds, n - self._batches_seen.get(w, 0))
            self._batches_seen[w] = n
        self.iterations += rounds
        self._last_epoch_end = now
        return self.iterations

    on_clock = on_epoch

    def change_started(self) -> None:
        self.changing = True

    def change_ended(self, now: float) -> None:
        self.changing = False
        self._speed_since, self._speed_base = now, self.iterations

    @property
    def early_feedback(self) -> bool:
        return self.iterations >= self.early_feedback_iterations

    @property
    def speed_iterations(self) -> int:
        return self.iterations - self._speed_base

    @property
    def speed(self) -> float:
        """Iterations per second over the epochs finished since the last change."""
        if self._speed_since is None or self._last_epoch_end is None or self.speed_iterations <= 0:
            return 0.0
        elapsed = self._last_epoch_end - self._speed_since
        return self.speed_iterations / elapsed if elapsed > 0 else 0.0

    def report(self, shape: Shape, resource: Optional[Resource], directive_version: int,
               **extra: Any) -> JobReport:
        """The `AllocateRequest.shape` report: this progress plus `extra` JobReport fields (phase,
        epoch, measurements ...: what the AM measured)."""
        return JobReport(workers=shape.workers, servers=shape.servers, started=self.started,
                         changing=self.changing, iterations=self.iterations, early_feedback=self.early_feedback,
                         early_feedback_iterations=self.early_feedback_iterations,
                         speed=self.speed, speed_iterations=self.speed_iterations,
                         executor_resource=resource, directive_version=directive_version, **extra)


# ===== the driver ================================================================================

@dataclass
class DirectiveOutcome:
    """One directive acted on: what it asked, what was done, how long it took, how it ended."""

    version: int
    target: Shape
    before: Shape
    steps: list[tuple[str, int]]
    started: float
    seconds: float = 0.0
    error: str = ""
    reason: str = ""
    nodes: list[str] = field(default_factory=list)
    group: Optional[str] = None
    run_state: str = RunState.RUN.value

    def record(self) -> DirectiveRecord:
        """The outcome as the job status serves it (`directives`, protocol.ps_status)."""
        return DirectiveRecord(version=self.version, workers=self.target.workers, servers=self.target.servers,
                               nodes=list(self.nodes), before=ExecutorCounts(self.before.workers, self.before.servers),
                               steps=list(self.steps), started=self.started, seconds=round(self.seconds, 4),
                               error=self.error, reason=self.reason, group=self.group, run_state=self.run_state)


class DirectiveHandler:
    """Acts on the RM's shape directives for one PS job (see the module doc).

    `reshaper()` returns the job's reshaping mechanism (None: this AM cannot reshape; directives
    are then logged and dropped), `current()` its shape now and `placed(nodes, placement)` whether
    the executors already are where a directive puts them (every one on `nodes`; with a per-node
    `placement`, exactly its counts on each node). `on_change` is told when a change starts
    (True) and ends (False), so the shape report says `changing`. `on_group` is told the Harmony
    group of each directive the tracker applies, as it applies it (the executors launched for it
    run in that group) -- never a stale or superseded directive's.
    """

    def __init__(self, reshaper: Callable[[], Optional[Reshaper]], current: Callable[[], Shape],
                 max_workers: Optional[int] = None, max_servers: Optional[int] = None,
                 on_change: Optional[Callable[[bool], None]] = None,
                 wall_clock: Callable[[], float] = time.time,
                 placed: Callable[[tuple[str, ...], tuple[NodePlacement, ...]], bool] = lambda nodes, placement: True,
                 suspender: Optional[Suspender] = None,
                 min_workers: int = 1, min_servers: int = 1,
                 executor_resource: Callable[[], Optional[Resource]] = lambda: None,
                 on_group: Callable[[Optional[str]], None] = lambda group: None) -> None:
        self.reshaper = reshaper
        self.suspender = suspender
        self.min_workers = min_workers
        self.min_servers = min_servers
        self.executor_resource = executor_resource     # the size the job's executors have now
        self.current = current
        self.placed = placed
        self.max_workers = max_workers
        self.max_servers = max_servers
        self.on_change = on_change
        self.on_group = on_group
        self.wall_clock = wall_clock
        self.tracker = DirectiveTracker()
        self.history: list[DirectiveOutcome] = []
        self._task: Optional[asyncio.Task[None]] = None
        self._offered = asyncio.Event()     # set by every directive offered (first_run_directive)

    @property
    def applied_version(self) -> int:
        return self.tracker.applied_version

    @property
    def busy(self) -> bool:
        return self._task is not None and not self._task.done()

    def on_directive(self, d: ShapeDirective) -> None:
        """A ShapeChanged event: apply, keep or ignore the directive (never blocks)."""
        if self.reshaper() is None:
            log.info("shape directive v%d (%d workers, %d servers) ignored: this job cannot reshape",
                     d.version, d.workers, d.servers)
            return
        now = self.tracker.offer(d)
        self._offered.set()
        if now is not None:
            self._spawn(now)
        elif self.tracker.kept is d:
            log.info("shape directive v%d kept until %s", d.version,
                     "training starts" if self.tracker.state is TrackerState.WAITING else "the running change ends")
        else:
            log.debug("shape directive v%d ignored (already seen v%d)", d.version, self.tracker.seen_version)

    async def first_run_directive(self) -> ShapeDirective:
        """Before training: wait for the first kept directive that runs the job with executors (not
        PAUSE, not 0 / 0), for a policy that places new jobs (Harmony: the node it is profiled on;
        PAUSE while no node is free). The AM starts its first executors as it says; once training
        starts, the tracker applies it and finds it already carried out."""
        while True:
            d = self.tracker.kept
            if d is not None and d.run_state is not RunState.PAUSE and d.workers > 0 and d.servers > 0:
                return d
            self._offered.clear()
            await self._offered.wait()

    def training_started(self) -> None:
        """Training began: a directive kept meanwhile is applied now."""
        if self.tracker.state is TrackerState.WAITING:
            now = self.tracker.ready()
            if now is not None:
                self._spawn(now)

    async def wait_idle(self, timeout_s: Optional[float] = None) -> None:
        """Wait until no change is running (for tests and shutdown)."""
        while self.busy:
            assert self._task is not None
            await asyncio.wait_for(asyncio.shield(self._task), timeout_s)

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def _spawn(self, d: ShapeDirective) -> None:
        self._task = asyncio.create_task(self._run(d), name=f"shape-directive-v{d.version}")

    async def _run(self, d: Optional[ShapeDirective]) -> None:
        while d is not None:
            await self._apply(d)
            d = self.tracker.done()

    async def _apply(self, d: ShapeDirective) -> None:
        self.on_group(d.group)      # before the change asks for any executor
        before = self.current()
        target = target_of(d, self.max_workers, self.max_servers, self.min_workers, self.min_servers)
        delta = diff(before, target)
        nodes = tuple(d.nodes)
        out = DirectiveOutcome(d.version, target, before, delta.steps(), self.wall_clock(), reason=d.reason,
                               nodes=list(nodes), group=d.group, run_state=d.run_state.value)
        self.history.append(out)
        if self.suspender is not None and (d.run_state is RunState.PAUSE or self.suspender.paused):
            await self._suspend_or_resume(d, target, out)
            return
        if (self.suspender is not None and d.executor_resource is not None
                and d.executor_resource != self.executor_resource()):
            # Executors of another size are new containers, every one of them: the job moves by
            # restarting from a cut (release first, then start where the placement says), which
            # also never waits for room its own old executors hold (Harmony §4.3.2 pauses to move).
            await self._suspend_or_resume(d, target, out, restart=True)
            return
        reshaper = self.reshaper()
        placement = tuple(d.placement)
        if reshaper is None or (delta.empty and self.placed(nodes, placement)):
            log.info("shape directive v%d: already %d workers, %d servers%s", d.version, target.workers,
                     target.servers, f" on {list(nodes)}" if nodes else "")
            return
        log.info("shape directive v%d: %d/%d -> %d/%d workers/servers%s (%s)", d.version, before.workers,
                 before.servers, target.workers, target.servers, f" on {list(nodes)}" if nodes else "",
                 d.reason or "no reason given")
        await self._run_change(d, out, lambda: reshaper.reshape(target, nodes, placement))

    async def _suspend_or_resume(self, d: ShapeDirective, target: Shape, out: DirectiveOutcome,
                                 restart: bool = False) -> None:
        """Harmony's run states: PAUSE a running job; any other run state resumes a paused one with
        the directive's shape and placement (RESUME, or RUN from a policy that never paused it).
        `restart`: a running job pauses and resumes at once (a new executor size)."""
        assert self.suspender is not None
        pause = d.run_state is RunState.PAUSE
        if not restart and pause == self.suspender.paused:
            log.info("shape directive v%d: the job is already %s", d.version, "paused" if pause else "running")
            return
        what = ("restart with" if restart else "pause" if pause else "resume with")
        log.info("shape directive v%d: %s%s (%s)", d.version, what, "" if pause else
                 f" {target.workers} workers, {target.servers} servers", d.reason or "no reason given")
        out.steps = [("pause", 1), ("resume", 1)] if restart else [("pause", 1)] if pause else [("resume", 1)]
        suspender = self.suspender

        async def suspend_or_resume() -> None:
            if pause or restart:
                await suspender.pause()
            if not pause:
                await self._resume(d, target)

        await self._run_change(d, out, suspend_or_resume)

    async def _run_change(self, d: ShapeDirective, out: DirectiveOutcome, change: Callable[[], Awaitable[Any]]) -> None:
        """Run one directive's change with `on_change` around it, its time and any error in `out`."""
        t0 = time.perf_counter()
        if self.on_change:
            self.on_change(True)
        try:
            await change()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a refused or failed change must not stop later directives
            out.error = f"{type(e).__name__}: {e}"
            log.warning("shape directive v%d failed: %s", d.version, out.error)
        finally:
            out.seconds = time.perf_counter() - t0
            if self.on_change:
                self.on_change(False)

    async def _resume(self, d: ShapeDirective, target: Shape) -> None:
        """Resume as `d` says; a resume that got no containers leaves the job paused (the
        suspender keeps its cut), so it is tried again a few times, until a newer directive
        arrives (it is applied next instead) or the tries are used up (the error is recorded)."""
        assert self.suspender is not None
        for attempt in range(RESUME_TRIES):
            try:
                await self.suspender.resume(target.workers, target.servers, d.placement, d.nodes,
                                            d.executor_resource)
                return
            except Exception:
                if attempt + 1 == RESUME_TRIES or self.tracker.kept is not None or not self.suspender.paused:
                    raise
                log.warning("shape directive v%d: resume got no executors; trying again in %.0fs", d.version,
                            RESUME_RETRY_S)
                await asyncio.sleep(RESUME_RETRY_S)     # a backoff before asking the RM again


__all__ = ["DEFAULT_EARLY_FEEDBACK_ITERATIONS", "Decision", "DirectiveHandler", "DirectiveOutcome",
           "DirectiveTracker", "ProgressTracker", "Reshaper", "Shape", "ShapeDelta", "Suspender",
           "TrackerError", "TrackerEvent", "TrackerState", "TRANSITIONS", "diff", "target_of"]

"""The real PS AM (appmaster.ps.runtime.master: the PS-job controller and its interpreter) over real
in-process executors: `InProcessAM` stands in for the AM's RM client. An ask is granted at once
(ContainersAllocated on the AM's event queue), a launch starts an `Executor` in this event loop
that announces itself over the data plane to the AM's address as a launched container does, and a
container's end (an AM's stop, an executor's shutdown, or a test's `kill`) is reported as the RM
reports it (ContainersCompleted with its exit status). No RM, no NM, no processes, no sleeps: a
test drives a scenario by what it injects (a subtask runner that dies or freezes, a kill, a
directive, a /scale) and waits on the interpreter (`PsJob.until`).

Shared by the worker replacement, vanished executor, straggler, bytes-per-batch, EPS and
checkpoint-during-reshape tests."""
from __future__ import annotations

import asyncio
import itertools
import types
from pathlib import Path
from typing import Any, Callable, Optional

from appmaster.am_events import AmEvent, ContainersAllocated, ContainersCompleted, ShapeChanged
from appmaster.container_book import AmContainer, AmContainerState
from appmaster.ps.runtime.executor_pool import ExecutorPool
from appmaster.ps.runtime.master import PSApplicationMaster
from protocol import executor_ops as ops
from protocol.internal_api import ShapeDirective
from protocol.job_report import JobReport
from protocol.ps_job_spec import validate
from protocol.records import FinalStatus, Resource
from psruntime.executor import Executor
from psruntime.wire.dataplane_auth import secret_key

SPEC: dict[str, Any] = {"app": "mlr", "workers": 2, "servers": 2, "max_epochs": 3, "convergence_threshold": 1e-12,
                        "audit_updates": True, "clock_batches": 4}
ATTEMPT = "appattempt_1700000000000_0001_000001"
SECRET = "the-job-secret"
KILLED_BY_AM = -105          # YARN: the container was stopped by its AM
NODE_LOST = -100             # YARN: aborted (its node was lost)
RUN_TIMEOUT_S = 120.0        # a harness wait that fails the test rather than hang it


class InProcessAM:
    """Stands in for appmaster.am_client.ApplicationMaster (module doc)."""

    def __init__(self, node: str = "n1:1", work_dir: Optional[Path] = None) -> None:
        self.work_dir = work_dir      # per executor its own dir below it (EPS's inactive splits)
        self.identity = types.SimpleNamespace(attempt_id=ATTEMPT, job_secret=SECRET)
        self.registration = None
        self.node = node
        self.pool: Optional[ExecutorPool] = None          # the master's, set by PsJob
        self.events: asyncio.Queue[AmEvent] = asyncio.Queue()
        self.executors: dict[str, Executor] = {}
        self.asks: list[tuple[str, int, Optional[list[str]]]] = []
        self.reports: list[JobReport] = []
        self.finished: Optional[tuple[str, str]] = None
        self.on_launch: Optional[Callable[[str, Executor], None]] = None   # a test's hook, before it announces
        self.launch_gate: Optional[asyncio.Event] = None    # set by a test: launches wait for it (a slow start)
        # A new attempt's containers taken over from the one before (`previous_containers`), which
        # a test hands over together with their executors (`executors`).
        self.handed: list[AmContainer] = []
        self._containers: dict[str, AmContainer] = {}
        self._seq = itertools.count(2)
        self._tasks: set[asyncio.Task[None]] = set()
        self._ended: set[str] = set()
        self.expected_ends: list[str] = []

    # -- what the master calls -------------------------------------------------------------------
    async def register(self, host: str = "", port: int = -1, tracking_url: str = "") -> None:
        return None

    def previous_containers(self) -> list[AmContainer]:
        return list(self.handed)

    def add_ask(self, count: int, resource: Resource, *, priority: int = 0, nodes: Optional[list[str]] = None,
                relax_locality: bool = True, tag: str = "") -> int:
        self.asks.append((tag, count, nodes))
        granted = []
        for _ in range(count):
            seq = next(self._seq)
            node = nodes[(seq - 2) % len(nodes)] if nodes else self.node
            c = AmContainer(container_id=f"container_1_0001_01_{seq:06d}", node_id=node, node_http_address=node,
                            resource=resource, token="t", ask_id=len(self.asks), tag=tag)
            self._containers[c.container_id] = c
            granted.append(c)
        self.events.put_nowait(ContainersAllocated(granted))
        return len(self.asks)

    def set_ask_count(self, ask_id: int, count: int) -> None:
        return None

    async def next_event(self, timeout_s: Optional[float] = None) -> AmEvent:
        return await self.events.get()

    async def launch(self, container: AmContainer, ctx: object) -> bool:
        assert self.pool is not None
        rec = self.pool.by_container(container.container_id)
        assert rec is not None and self.pool.am_address
        if self.launch_gate is not None:
            await self.launch_gate.wait()
        ex = Executor(rec.executor_id, self.pool.num_blocks, role=rec.role.value, secret=secret_key(SECRET),
                      work_dir=None if self.work_dir is None else self.work_dir / rec.executor_id)
        self.executors[rec.executor_id] = ex
        container.state = AmContainerState.RUNNING
        if self.on_launch is not None:
            self.on_launch(rec.executor_id, ex)
        address = await ex.start()
        ready = ops.ExecutorReady(executor_id=rec.executor_id, address=address, pid=1000 + len(self.executors),
                                  role=rec.role.value)      # type: ignore[arg-type]
        await ex.client.request(self.pool.am_address, ops.to_header(ready))
        self._spawn(self._lifetime(container, ex))
        return True

    async def stop(self, container: AmContainer) -> None:
        rec = self.pool.by_container(container.container_id) if self.pool else None
        ex = self.executors.get(rec.executor_id) if rec else None
        if ex is not None:
            ex.stopped.set()
        else:
            self.complete(container, KILLED_BY_AM)

    async def stop_all(self) -> None:
        for ex in self.executors.values():
            ex.stopped.set()

    def release(self, container: AmContainer) -> None:
        self._containers.pop(container.container_id, None)

    def set_shape(self, report: Optional[JobReport]) -> None:
        if report is not None:
            self.reports.append(report)

    def set_progress(self, progress: float) -> None:
        return None

    def heartbeat_now(self) -> None:
        return None

    def expect_completion(self, container_id: str) -> None:
        """The master saw the connection to this container's executor drop (recorded for tests)."""
        self.expected_ends.append(container_id)

    async def finish(self, final_status: FinalStatus | str, diagnostics: str = "", tracking_url: str = "",
                     timeout_s: float = 30.0) -> bool:
        self.finished = (str(getattr(final_status, "value", final_status)), diagnostics)
        return True

    # -- what the RM would report ------------------------------------------------------------------
    def complete(self, container: AmContainer, exit_status: int, diagnostics: str = "") -> None:
        """The RM's report of `container`'s end (once)."""
        self.complete_together([container], exit_status, diagnostics)

    def complete_together(self, containers: list[AmContainer], exit_status: int, diagnostics: str = "") -> None:
        """The RM's report of these containers' ends in one allocate reply (a lost node's)."""
        done = [AmContainer(c.container_id, c.node_id, c.node_http_address, c.resource, c.token, ask_id=c.ask_id,
                            tag=c.tag, state=AmContainerState.COMPLETED, exit_status=exit_status,
                            diagnostics=diagnostics)
                for c in containers if c.container_id not in self._ended]
        self._ended.update(c.container_id for c in done)
        if done:
            self.events.put_nowait(ContainersCompleted(done))

    def directive(self, d: ShapeDirective) -> None:
        """A policy's shape directive, with the next allocate reply."""
        self.events.put_nowait(ShapeChanged(d))

    async def _lifetime(self, container: AmContainer, ex: Executor) -> None:
        """As the executor's main: serve until told to stop, then the container ends."""
        await ex.stopped.wait()
        await ex.stop()
        self.complete(container, KILLED_BY_AM)

    def _spawn(self, coro: Any) -> None:
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for ex in self.executors.values():
            ex.stopped.set()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for ex in self.executors.values():
            await ex.stop()


class PsJob:
    """One PS job run by the real AM over in-process executors (module doc)."""

    def __init__(self, tmp_path: Path, spec: Optional[dict[str, Any]] = None) -> None:
        self.am = InProcessAM(work_dir=tmp_path / "executors")
        self.spec = validate(dict(spec or SPEC))
        self.master = PSApplicationMaster(self.am, self.spec, tmp_path / "am")   # type: ignore[arg-type]
        self.am.pool = self.master.pool
        self.train_errors: list[BaseException] = []
        self.train_error_clocks: list[int] = []     # the clocks done when each error ended training
        self._run: Optional[asyncio.Task[Optional[FinalStatus]]] = None
        ended = self.master.interp.on_train_end

        def train_ended(err: Optional[BaseException]) -> None:
            if err is not None:
                self.train_errors.append(err)
                self.train_error_clocks.append(self.loop.clocks_done)
            if ended is not None:
                ended(err)
        self.master.interp.on_train_end = train_ended

    # -- the AM's parts ----------------------------------------------------------------------------
    @property
    def training(self) -> Any:
        return self.master.training

    @property
    def loop(self) -> Any:
        return self.master.training.loop

    @property
    def pool(self) -> ExecutorPool:
        return self.master.pool

    @property
    def job(self) -> Any:
        """The controller's JobState."""
        return self.master.job

    @property
    def app(self) -> Any:
        return self.master.app

    @property
    def epochs(self) -> list[Any]:
        return self.master.metrics.epochs

    def executor(self, executor_id: str) -> Executor:
        return self.am.executors[executor_id]

    # -- driving it --------------------------------------------------------------------------------
    def start(self) -> None:
        """The AM starts: it registers and the controller takes the job from there."""
        assert self._run is None
        self._run = asyncio.ensure_future(self.master.run())

    async def run(self) -> Optional[FinalStatus]:
        """Start (unless started) and wait for the AM's final status."""
        if self._run is None:
            self.start()
        assert self._run is not None
        return await asyncio.wait_for(asyncio.shield(self._run), RUN_TIMEOUT_S)

    async def until(self, cond: Callable[[], bool], what: str, timeout_s: float = RUN_TIMEOUT_S) -> None:
        """Wait until `cond()` holds, re-checked after every event the controller is fed."""
        assert await self.master.interp.until(cond, timeout_s), f"timed out waiting for {what}"

    def trigger_after_clock(self, hook: Callable[[], None]) -> None:
        """Call `hook` after every BSP clock (after the master's own per-clock work)."""
        loop = self.loop
        own = loop.on_clock

        def after() -> None:
            if own is not None:
                own()
            hook()
        loop.on_clock = after

    def kill(self, executor_id: str, exit_status: int = NODE_LOST) -> None:
        """`executor_id` dies (its connections close) and the RM reports its container's end."""
        rec = self.pool.executors[executor_id]
        ex = self.am.executors.get(executor_id)
        if ex is not None:
            self.am._spawn(ex.stop())
        self.am.complete(rec.container, exit_status)

    def report_lost(self, *executor_ids: str, exit_status: int = NODE_LOST) -> None:
        """The RM's report of these executors' containers' ends only, in one allocate reply (a
        vanished host: no RST)."""
        self.am.complete_together([self.pool.executors[e].container for e in executor_ids], exit_status)

    async def close(self) -> None:
        if self._run is not None and not self._run.done():
            self.master.request_stop("the test ended")
            try:
                await asyncio.wait_for(self._run, 30)
            except Exception:  # noqa: BLE001 - the test's own failure is what matters
                self._run.cancel()
        await self.am.close()
        await asyncio.gather(*self.am._tasks, return_exceptions=True)

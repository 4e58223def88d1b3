"""The ApplicationMaster of the container-launch benchmark (bench/container_launch.py).

Run by the NM as the app's AM container:

    python bench/container_launch_am.py --containers N --memory MB --vcores V --window W \
        --command 'date +%s%N > "$LAUNCH_STAMP"'

It keeps at most W containers asked-for or running, asks for more as they complete (so
allocations arrive in waves as capacity frees), and launches each container the moment its
allocation arrives. Every container runs the same `--command`, which records CLOCK_REALTIME
(ns) into the file named by `$LAUNCH_STAMP` as its first action; the AM gives each container its
own stamp file under `$BENCH_LAUNCH_STAMP_DIR`.

Per container it records (all `time.time_ns()`, CLOCK_REALTIME, shared with the command):
  alloc_ns    the allocate response carrying the grant was received (before any bookkeeping)
  dispatch_ns the AM's event loop handed the grant to this app
  call_ns     the NM start-container call was issued
  return_ns   the NM answered the start-container call
  started_ns  the container's command recorded its start (read from its stamp file)
and writes them as JSON to `$BENCH_LAUNCH_RESULT` (atomically) before unregistering.
Containers that fail are replaced, up to --max-failures; past that the app FAILS.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from appmaster.am_client import ApplicationMaster  # noqa: E402
from appmaster.am_events import ContainersAllocated, ContainersCompleted, Shutdown  # noqa: E402
from appmaster.container_book import AmContainer  # noqa: E402
from appmaster.rm_client import AmEnvironmentError  # noqa: E402
from protocol import daemon  # noqa: E402
from protocol import internal_api as api  # noqa: E402
from protocol.internal_api import LaunchContext  # noqa: E402
from protocol.records import ExitStatus, FinalStatus, Resource  # noqa: E402

log = logging.getLogger("bench.container_launch_am")

RESULT_ENV = "BENCH_LAUNCH_RESULT"        # where the AM writes its JSON results
STAMP_DIR_ENV = "BENCH_LAUNCH_STAMP_DIR"  # where containers write their start stamps
STAMP_VAR = "LAUNCH_STAMP"                # per-container env: the stamp file the command writes
EXIT_KILLED = 143


@dataclass
class LaunchTiming:
    """One container's timeline, CLOCK_REALTIME nanoseconds (0 = did not happen)."""

    container_id: str
    node_id: str
    alloc_ns: int
    dispatch_ns: int = 0
    call_ns: int = 0
    return_ns: int = 0
    started_ns: int = 0
    exit_status: int = ExitStatus.INVALID
    diagnostics: str = ""
    done: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_status == ExitStatus.SUCCESS and self.started_ns > 0

    @property
    def launch_ms(self) -> float | None:
        """Allocation received -> command started, the benchmark's figure."""
        return (self.started_ns - self.alloc_ns) / 1e6 if self.ok else None


class StampingAM(ApplicationMaster):
    """The AM library, plus the arrival time of every granted container, taken first thing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.alloc_ns: dict[str, int] = {}

    async def on_allocate_response(self, resp: api.AllocateResponse) -> None:
        now = time.time_ns()
        for c in resp.allocated:
            self.alloc_ns.setdefault(c.container_id, now)
        await super().on_allocate_response(resp)


def read_stamp(path: Path) -> int:
    """The ns timestamp a container wrote, or 0 if it wrote none (or garbage)."""
    try:
        return int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


class LaunchBench:
    """Ask in a rolling window, launch on arrival, collect each container's timeline."""

    def __init__(self, am: StampingAM, containers: int, resource: Resource, window: int, command: str,
                 stamp_dir: Path, max_failures: int, deadline_s: float):
        if containers <= 0 or window <= 0:
            raise ValueError("--containers and --window must be positive")
        self.am = am
        self.wanted = containers
        self.resource = resource
        self.window = window
        self.command = command
        self.stamp_dir = stamp_dir
        self.max_failures = max_failures
        self.deadline_s = deadline_s
        self.timings: dict[str, LaunchTiming] = {}
        self.asked = 0
        self.completed = 0
        self.failures = 0
        self.launched = 0
        self._launch_tasks: set[asyncio.Task] = set()
        self.stop_requested = asyncio.Event()

    @property
    def succeeded(self) -> int:
        return sum(1 for t in self.timings.values() if t.ok)

    def request_stop(self) -> None:
        self.stop_requested.set()

    def _refill(self) -> None:
        """Ask for more so that asked-but-not-completed stays <= window; failed ones are replaced."""
        in_flight = self.asked - self.completed
        want_total = self.wanted + self.failures
        n = min(self.window - in_flight, want_total - self.asked)
        if n > 0:
            self.am.add_ask(n, self.resource, tag="launch-bench")
            self.asked += n

    async def run(self) -> tuple[Optional[FinalStatus], str]:
        """Run to completion; (None, why) when stopped without a verdict of our own."""
        await self.am.register(host=socket.gethostname(), port=-1, tracking_url="")
        self._refill()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.deadline_s
        stop_wait = asyncio.create_task(self.stop_requested.wait())
        try:
            while self.succeeded < self.wanted:
                if self.failures > self.max_failures:
                    return FinalStatus.FAILED, f"{self.failures} containers failed: {self._failure_summary()}"
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return FinalStatus.FAILED, (f"timed out after {self.deadline_s:.0f}s with "
                                                f"{self.succeeded}/{self.wanted} containers measured")
                ev_task = asyncio.create_task(self.am.next_event())
                done, _ = await asyncio.wait({ev_task, stop_wait}, timeout=remaining,
                                             return_when=asyncio.FIRST_COMPLETED)
                if ev_task not in done:
                    ev_task.cancel()
                    if stop_wait in done:
                        return None, "stopped by SIGTERM"
                    continue
                ev = ev_task.result()
                if isinstance(ev, ContainersAllocated):
                    self._on_allocated(ev.containers)
                elif isinstance(ev, ContainersCompleted):
                    self._on_completed(ev.containers)
                elif isinstance(ev, Shutdown):
                    return None, ev.reason
                self.am.set_progress(self.succeeded / self.wanted)
        finally:
            stop_wait.cancel()
            await self._drain_launches()
        return FinalStatus.SUCCEEDED, f"{self.succeeded} containers measured ({self.failures} failed)"

    def _on_allocated(self, containers: list[AmContainer]) -> None:
        now = time.time_ns()
        for c in containers:
            t = LaunchTiming(c.container_id, c.node_id, alloc_ns=self.am.alloc_ns.get(c.container_id, now),
                             dispatch_ns=now)
            self.timings[c.container_id] = t
            stamp = self.stamp_dir / c.container_id
            ctx = LaunchContext(commands=[self.command], environment={STAMP_VAR: str(stamp)})
            task = asyncio.create_task(self._launch(c, t, ctx))
            self._launch_tasks.add(task)
            task.add_done_callback(self._launch_tasks.discard)

    async def _launch(self, c: AmContainer, t: LaunchTiming, ctx: LaunchContext) -> None:
        t.call_ns = time.time_ns()
        ok = await self.am.launch(c, ctx)
        t.return_ns = time.time_ns()
        self.launched += ok
        if not ok:
            log.warning("launch of %s failed: %s", c.container_id, c.diagnostics)

    def _on_completed(self, containers: list[AmContainer]) -> None:
        for c in containers:
            t = self.timings.get(c.container_id)
            if t is None:   # e.g. a surplus container the library released for us
                continue
            t.exit_status, t.diagnostics, t.done = c.exit_status, c.diagnostics, True
            t.started_ns = read_stamp(self.stamp_dir / c.container_id)
            self.completed += 1
            if not t.ok:
                self.failures += 1
                log.warning("%s: %s (stamp %s)", c.describe_exit(), c.diagnostics, t.started_ns or "missing")
        self._refill()

    def _failure_summary(self) -> str:
        bad = [t for t in self.timings.values() if t.done and not t.ok]
        return "; ".join(f"{t.container_id} exit {t.exit_status} {t.diagnostics}".strip() for t in bad[:5])

    async def _drain_launches(self) -> None:
        if self._launch_tasks:
            await asyncio.gather(*list(self._launch_tasks), return_exceptions=True)

    def result(self, final_status: Optional[FinalStatus], diagnostics: str) -> dict[str, Any]:
        return {
            "final_status": final_status.value if final_status else None,
            "diagnostics": diagnostics,
            "command": self.command,
            "wanted": self.wanted,
            "window": self.window,
            "resource": self.resource.to_json(),
            "failures": self.failures,
            "containers": [dict(asdict(t), launch_ms=t.launch_ms) for t in self.timings.values()],
        }


def write_json_atomic(path: Path, obj: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj))
    tmp.replace(path)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="container_launch_am.py", description=__doc__.split("\n")[0])
    p.add_argument("--containers", type=int, required=True, help="containers to measure")
    p.add_argument("--memory", type=int, required=True, help="MB per container")
    p.add_argument("--vcores", type=int, default=1)
    p.add_argument("--window", type=int, required=True, help="max containers asked-for or running at once")
    p.add_argument("--command", required=True, help="the container command; must write $LAUNCH_STAMP")
    p.add_argument("--max-failures", type=int, default=10)
    p.add_argument("--deadline-s", type=float, default=150.0)
    ns = p.parse_args(list(argv))
    for label, v in (("--containers", ns.containers), ("--memory", ns.memory), ("--vcores", ns.vcores),
                     ("--window", ns.window), ("--deadline-s", ns.deadline_s)):
        if v <= 0:
            p.error(f"{label} must be positive, got {v}")
    if ns.max_failures < 0:
        p.error(f"--max-failures must be >= 0, got {ns.max_failures}")
    return ns


async def _amain(ns: argparse.Namespace, result_path: Path, stamp_dir: Path) -> int:
    am = StampingAM.from_env()
    bench = LaunchBench(am, ns.containers, Resource(ns.memory, ns.vcores), ns.window, ns.command,
                        stamp_dir, ns.max_failures, ns.deadline_s)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, bench.request_stop)
    try:
        try:
            status, diag = await bench.run()
        except Exception as e:   # still write what was measured, and fail the app with the reason
            log.exception("benchmark AM failed")
            status, diag = FinalStatus.FAILED, f"{type(e).__name__}: {e}"
        write_json_atomic(result_path, bench.result(status, diag))
        if status is None:
            async with asyncio.timeout(15.0):
                await am.stop_all()
            log.info("stopped: %s", diag)
            return EXIT_KILLED
        await am.stop_all()
        await am.finish(status, diag)
        log.info("finished %s: %s", status.value, diag)
        return 0
    finally:
        await am.close()


def main(argv: Sequence[str] | None = None) -> int:
    ns = parse_args(sys.argv[1:] if argv is None else argv)
    daemon.setup_logging("launch-bench-am")
    result, stamp_dir = os.environ.get(RESULT_ENV), os.environ.get(STAMP_DIR_ENV)
    if not result or not stamp_dir:
        print(f"container_launch_am: {RESULT_ENV} and {STAMP_DIR_ENV} must be set in the AM's environment",
              file=sys.stderr)
        return 2
    Path(stamp_dir).mkdir(parents=True, exist_ok=True)
    daemon.install_uvloop()
    try:
        return asyncio.run(_amain(ns, Path(result), Path(stamp_dir)))
    except AmEnvironmentError as e:
        print(f"container_launch_am: {e} (run it through bench/container_launch.py)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
